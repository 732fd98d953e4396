"""`fit` over every bundled card, a grid of devices, flash attention off and on, `--ctx auto`
and 8192: each answer, every figure shown and the probes it took, as JSON; `--compare A B`
says which answers differ between two such files (a change to the search must change none)
and how the probes moved.

    python3 scripts/fit_sweep.py out.json            # ~1.5 min on 2 cores
    python3 scripts/fit_sweep.py --compare before.json after.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEVICES = ((8,), (12,), (16,), (24,), (48,), (24, 12))      # GiB per device


def sweep() -> dict:
    from ggmlrun.core.backends.spec import BackendSpec, GiB
    from ggmlrun.models import reserve
    from ggmlrun.models.cards.reader import CARDS_DIR, read_card
    from ggmlrun.models.fit import fit_model
    from ggmlrun.models.options.params import ModelOptions

    out = {}
    for path in sorted(CARDS_DIR.glob("*.yaml")):
        model = read_card(path)
        for fa in (False, True):
            for gibs in DEVICES:
                for ctx in (None, 8192):
                    reserve._GRAPHS.clear()
                    backends = [BackendSpec(f"GPU{i}", "sim", g * GiB, 32)
                                for i, g in enumerate(gibs)]
                    backends.append(BackendSpec("CPU", "cpu", 512 * GiB, 32))
                    r = fit_model(model, backends, ModelOptions(flash_attn=fa, ctx=ctx), GiB, 0,
                                  ctx_auto=ctx is None)
                    out[f"{path.stem}/fa{int(fa)}/{'+'.join(map(str, gibs))}GiB/{ctx or 'auto'}"] = {
                        "answer": [r.ngl, r.ctx, r.n_cpu_moe, r.tensor_split, r.command, r.advice],
                        "figures": [[b.weights_bytes, b.kv_bytes, b.state_bytes, b.arena_bytes]
                                    for b in r.backends],
                        "probes": len(r.probes),
                        "reserved": r.probe_reserved}
    return out


def compare(a: dict, b: dict) -> int:
    differ = [k for k in a if k in b and (a[k]["answer"], a[k]["figures"])
              != (b[k]["answer"], b[k]["figures"])]
    for k in differ[:20]:
        print(f"differs: {k}: {a[k]['answer']} -> {b[k]['answer']}")
    common = [k for k in a if k in b]
    fewer = sum(b[k]["probes"] < a[k]["probes"] for k in common)
    more = [k for k in common if b[k]["probes"] > a[k]["probes"]]
    print(f"{len(common)} runs, answers differing: {len(differ)}; probes "
          f"{sum(a[k]['probes'] for k in common)} -> {sum(b[k]['probes'] for k in common)} "
          f"({fewer} runs fewer, {len(more)} more)")
    for k in more:
        print(f"  more probes: {k}: {a[k]['probes']} -> {b[k]['probes']} {b[k].get('reserved', '')}")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", nargs="?")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        return compare(*(json.loads(Path(p).read_text()) for p in args.compare))
    if not args.out:
        parser.error("give an output file, or --compare BEFORE AFTER")
    t0 = time.perf_counter()
    result = sweep()
    Path(args.out).write_text(json.dumps(result, indent=0))
    print(f"{len(result)} runs in {time.perf_counter() - t0:.1f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
