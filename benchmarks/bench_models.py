"""measure_model on big model shapes: the cost `fit` pays per candidate --ngl.

A Llama-3-70B-shaped header (80 layers, GQA 64/8, q4_K weights, 8k context; offsets left out,
as a model card gives them) and an 8B one, against one 24 GiB device and the CPU. Prints the
time of the first call (which builds the pp and tg graphs) and the best of several calls at
other --ngl values (the graphs re-placed, scheduled and allocated). Figures only.
"""

from __future__ import annotations

import sys
import time

from _common import best_of, machine

from ggmlrun.core.backends.spec import BackendSpec
from ggmlrun.models.arch import llama_tensor_shapes
from ggmlrun.models.hparams.record import HParams
from ggmlrun.models.modelfile import ModelFile, TensorInfo
from ggmlrun.models.options.params import ModelOptions
from ggmlrun.models.reserve import measure_model

GiB = 1 << 30
SHAPES = {"70B": dict(n_layer=80, n_embd=8192, n_head=64, n_head_kv=8, n_ff=28672),
          "8B": dict(n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, n_ff=14336)}


def header(name: str, **shape) -> ModelFile:
    hp = HParams(n_vocab=128256, n_ctx_train=8192, n_rot=128, rope_freq_base=500000.0,
                      **shape)
    tensors = {n: TensorInfo(n, s, "q4_K" if len(s) == 2 else "f32", None)
               for n, s in llama_tensor_shapes(hp).items()}
    return ModelFile(path=None, arch="llama", name=name, hparams=hp, tensors=tensors)


def main() -> None:
    quick = "--quick" in sys.argv
    print(f"# bench_models: {machine()}")
    backends = [BackendSpec(name="SIM0", kind="sim", memory=24 * GiB, alignment=256),
                BackendSpec(name="CPU", kind="cpu", memory=128 * GiB, alignment=32)]
    print(f"{'model':>6} {'nodes':>6} {'first call':>11} {'per --ngl':>10}")
    for name, shape in SHAPES.items():
        if quick and name == "70B":
            continue
        model = header(name, **shape)
        t0 = time.perf_counter()
        first = measure_model(model, backends, ModelOptions(ctx=8192))
        t_first = time.perf_counter() - t0
        n = shape["n_layer"]
        ngls = [0, n // 4, n // 2, n, n + 1]
        per = best_of(lambda: [measure_model(model, backends, ModelOptions(ctx=8192, ngl=g))
                               for g in ngls], 3) / len(ngls)
        print(f"{name:>6} {first.n_nodes:>6} {t_first:>10.3f}s {per:>9.3f}s")


if __name__ == "__main__":
    main()
