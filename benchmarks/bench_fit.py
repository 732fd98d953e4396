"""`fit` on the bundled Llama-3 cards: seconds (card reading included), reserves, the answer.

Target (issue 9): under 2 s on the 70B-shaped card (80 layers) for a fixed context. Each row is
a fresh process's worth of work in this one: the per-shape graph cache is cleared first.

    python benchmarks/bench_fit.py           # 8B and 70B, fixed and auto context
    python benchmarks/bench_fit.py --quick   # the 70B fixed-context row only
"""

from __future__ import annotations

import argparse
import time

import _common
from _common import machine, table

from ggmlrun.core.backends.spec import BackendSpec, GiB
from ggmlrun.models import reserve
from ggmlrun.models.cards import CARDS_DIR, read_card
from ggmlrun.models.fit import fit_model
from ggmlrun.models.options import ModelOptions

CASES = [  # card, device memory (GiB, one entry per device), context (None: auto)
    ("llama-3-70b-q4_k_m.yaml", 24, 8192),
    ("llama-3-70b-q4_k_m.yaml", (24, 12), 8192),
    ("llama-3-70b-q4_k_m.yaml", 24, None),
    ("llama-3-70b-q4_k_m.yaml", 48, 8192),
    ("llama-3-8b-q4_k_m.yaml", 8, 8192),
    ("llama-3-8b-q4_k_m.yaml", 6, None),
]


def one(card: str, device_gib, ctx: int | None) -> list[str]:
    reserve._GRAPHS.clear()
    sizes = device_gib if isinstance(device_gib, tuple) else (device_gib,)
    backends = [BackendSpec(f"GPU{i}", "sim", gib * GiB, 32) for i, gib in enumerate(sizes)]
    backends.append(BackendSpec("CPU", "cpu", 64 * GiB, 32))
    t0 = time.perf_counter()
    model = read_card(CARDS_DIR / card)
    result = fit_model(model, backends, ModelOptions(ctx=ctx), GiB, 0, ctx_auto=ctx is None)
    seconds = time.perf_counter() - t0
    answer = f"-ngl {result.ngl} -c {result.ctx}" if result.fits else "nothing fits"
    return [card, " + ".join(f"{g} GiB" for g in sizes), "auto" if ctx is None else str(ctx), answer,
            str(len(result.probes)), f"{seconds:.3f}"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(f"fit on model cards ({machine()})")
    cases = CASES[:1] if args.quick else CASES
    rows = [one(*case) for case in cases]
    print(table(["card", "device", "ctx", "answer", "reserves", "seconds"], rows))


if __name__ == "__main__":
    main()
