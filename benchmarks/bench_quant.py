"""Quantized models, tokens/s: ggmlrun's `run MODEL` beside llama.cpp on the same file.

For each file (the tiny llamas and a one-layer llama at Llama-3-8B's dims, as q8_0, q4_0 and
q4_K; see quant_models.py) it times prompt processing of 32 and 512 tokens (pp32, pp512) and a
single token (tg1), each from an empty cache, and prints tokens/s per side and llama.cpp's
speed over ggmlrun's (the target: ggmlrun's pp512 time <= 2x llama.cpp's). ggmlrun's figure is
the compute of the run (RunResult.run_seconds), not reading the file or planning; llama.cpp's
is `Llama.eval` (n_batch = n_ubatch = 512, n_ctx 1024, n_threads = the cores; q4_0 is
repacked for AVX2 there, which is its real speed). ggmlrun runs in a child process, so its
peak RSS is its own. Both sides run on the CPU with the same thread count, interleaved, best of
a few rounds. A second table times the block decoders alone (gguf.quants vs ggmlrun's), a third the product
by one row of b (decode + GEMV vs ops/onerow.py's integer block sums).

Without llama-cpp-python the script says so and prints ggmlrun's column alone (on the bundled
q8_0 tiny model: the q4 files are made with llama.cpp's quantizer). Figures only.

    python3 benchmarks/bench_quant.py            # all files, the 8B-dims layer too (~2 min)
    python3 benchmarks/bench_quant.py --quick    # the tiny files, pp32 and tg1 only
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

from _common import best_of, machine, table, verdict
from quant_models import llama_cpp_or_none, model_files

THREADS = os.cpu_count() or 1
N_CTX = 1024


def prompt(n_tokens: int, n_vocab: int) -> list[int]:
    return np.random.default_rng(n_tokens).integers(3, n_vocab, n_tokens).tolist()


def peak_rss_bytes() -> int:
    """This process's own peak RSS. VmHWM belongs to the address space exec made; getrusage's
    ru_maxrss survives exec on Linux, so a child started by a parent that already holds
    llama.cpp's models would report the parent's peak."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def phase_of(node) -> str:
    """Where a node's time goes, in the words of the issue: weight products by b's rows,
    attention's products, and every other op by name."""
    if node.op != "mul_mat":
        return node.op
    if any(d != 1 for d in node.src[0].shape[:-2]):      # a matrix per KV head: the cache
        return "mul_mat attention (kq, kqv)"
    rows = node.shape[-2] if len(node.shape) > 1 else 1
    return f"mul_mat weights, {rows} row{'s' if rows > 1 else ''}"


def phases(result) -> dict[str, float]:
    spent: dict[str, float] = {}
    for timing in result.node_timings:
        key = phase_of(timing.node)
        spent[key] = spent.get(key, 0.0) + timing.seconds
    return spent


def ggmlrun_child(path: str, sizes: list[int], rounds: int) -> None:
    """Runs in the child: prints {size: best seconds, "rss": peak bytes} as one JSON line."""
    from ggmlrun.core.backends.spec import default_cpu
    from ggmlrun.models.modelfile import read_gguf
    from ggmlrun.models.options.params import ModelOptions
    from ggmlrun.models.run import run_model

    model = read_gguf(path)
    figures = {}
    for n in sizes:
        tokens = prompt(n, model.hparams.n_vocab)
        best = float("inf")
        for _ in range(rounds):
            _, result = run_model(model, [default_cpu()], ModelOptions(ctx=N_CTX), tokens)
            if result.run_seconds[0] < best:
                best = result.run_seconds[0]
                if n == max(sizes):
                    figures["phases"] = phases(result)
        figures[n] = best
    figures["rss"] = peak_rss_bytes()
    print(json.dumps(figures))


def ggmlrun_times(path, sizes, rounds) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", str(path), json.dumps(sizes),
                          str(rounds)], capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"ggmlrun on {path} failed:\n{out.stderr[-2000:]}")
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    return {(k if k in ("rss", "phases") else int(k)): v for k, v in figures.items()}


def llama_cpp_times(llama_cpp, path, sizes, rounds) -> dict:
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=N_CTX, n_batch=512, n_ubatch=512,
                          n_threads=THREADS, n_threads_batch=THREADS, verbose=False)
    figures = {}
    for n in sizes:
        tokens = prompt(n, llm.n_vocab())

        def once():
            llm.reset()
            llm.eval(tokens)
        once()                                  # warm: first-call allocations, repacking
        figures[n] = best_of(once, rounds)
    llm.close()
    return figures


def silence(llama_cpp):
    """llama.cpp logs every load to stderr; the table is what this script is for."""
    @llama_cpp.llama_log_callback
    def quiet(level, text, user_data):
        return None
    llama_cpp.llama_log_set(quiet, None)
    return quiet                                 # keep the callback alive


def speed_table(quick: bool) -> None:
    llama_cpp = llama_cpp_or_none()
    keep = silence(llama_cpp) if llama_cpp else None
    if llama_cpp is None:
        print("llama-cpp-python is not installed: ggmlrun's column alone, bundled q8_0 only")
    files = model_files(big=not quick)
    sizes = [32, 1] if quick else [32, 512, 1]
    headers = ["model", "type", "test", "ggmlrun tok/s"]
    if llama_cpp:
        headers += ["llama.cpp tok/s", "ggmlrun time / llama.cpp", "pp512 <= 2x"]
    rows, rss, spent = [], {}, {}
    for model, by_type in files.items():
        rounds = 2 if model.startswith("llama8b") else 5
        for qtype, path in by_type.items():
            ours = ggmlrun_times(path, sizes, rounds)
            theirs = llama_cpp_times(llama_cpp, path, sizes, rounds) if llama_cpp else {}
            rss[f"{model} {qtype}"] = ours["rss"]
            if model.startswith("llama8b") and "phases" in ours:
                spent[qtype] = ours["phases"]
            for n in sizes:
                row = [model, qtype, f"pp{n}" if n > 1 else "tg1", f"{n / ours[n]:.1f}"]
                if llama_cpp:
                    ratio = ours[n] / theirs[n]
                    row += [f"{n / theirs[n]:.1f}", f"{ratio:.2f}x",
                            verdict(ratio <= 2.0) if n == 512 else ""]
                rows.append(row)
    del keep
    print(f"threads: {THREADS} both sides; n_ctx {N_CTX}; each figure the best of 2 (8B-dims) "
          f"or 5 (tiny) runs from an empty cache")
    print(table(headers, rows))
    print("\nggmlrun peak RSS (its own process: the memory-mapped file's touched pages included)")
    print(table(["file", "peak RSS MiB"], [[k, f"{v / 2**20:.0f}"] for k, v in rss.items()]))
    if spent:
        phase_table(spent, max(sizes))


def phase_table(spent: dict[str, dict[str, float]], n: int) -> None:
    """ms per phase of ggmlrun's best pp-n run on the 8B-dims layer, per type."""
    types = list(spent)
    names = sorted({k for by_phase in spent.values() for k in by_phase},
                   key=lambda k: -max(by_phase.get(k, 0.0) for by_phase in spent.values()))
    rows = [[name] + [f"{spent[t].get(name, 0.0) * 1e3:.1f}" for t in types] for name in names
            if max(spent[t].get(name, 0.0) for t in types) >= 5e-4]
    rows.append(["all nodes"] + [f"{sum(spent[t].values()) * 1e3:.1f}" for t in types])
    print(f"\nwhere ggmlrun's pp{n} time goes on the 8B-dims layer, ms (its best run; nodes of "
          f"0.5 ms or more)")
    print(table(["phase"] + types, rows))


def decoder_table(quick: bool) -> None:
    """ns per decoded value, gguf.quants vs ggmlrun's decoders, on a [M, 4096] weight."""
    from gguf import quants as gq
    from gguf.constants import GGMLQuantizationType as Q

    from ggmlrun.core.ir.blockdecode import DECODERS
    from ggmlrun.core.ir.types import decode_blocks

    rows_m = 256 if quick else 4096
    rng = np.random.default_rng(0)
    rows = []
    for name, (_, block, size) in DECODERS.items():
        raw = rng.integers(0, 256, (rows_m, 4096 // block * size), dtype=np.uint8)
        raw.reshape(-1, size)[:, :2] = np.array([0.01], np.float16).view(np.uint8)
        n = rows_m * 4096
        with np.errstate(all="ignore"):
            slow = best_of(lambda: gq.dequantize(raw, Q[name.upper()]), 1 if not quick else 2)
            fast = best_of(lambda: decode_blocks(raw, name), 3)
        rows.append([name, f"{slow / n * 1e9:.2f}", f"{fast / n * 1e9:.2f}",
                     f"{slow / fast:.1f}x"])
    print(f"\ndecoding a [{rows_m}, 4096] weight to f32, ns per value (best of 3)")
    print(table(["type", "gguf.quants", "ggmlrun", "speed-up"], rows))


def one_row_table(quick: bool) -> None:
    """ns per weight value of a product by ONE row of b, one thread: the decode path (panel
    decoded to f32, then GEMV) beside ops/onerow.py's integer block sums."""
    from ggmlrun.core.ir.blockdecode import DECODERS
    from ggmlrun.core.ir.ops.onerow import TYPES as ONE_ROW_TYPES
    from ggmlrun.core.ir.ops.panels import PanelProduct
    from ggmlrun.core.ir.ops.quant import TypedArray, round_like_vec_dot

    rows_m, k = (256, 4096) if quick else (14336, 4096)
    rng = np.random.default_rng(1)
    b = rng.standard_normal((1, k)).astype(np.float32)
    out = np.empty((1, rows_m), np.float32)
    rows = []
    for name in ONE_ROW_TYPES:
        _, block, size = DECODERS[name]
        raw = rng.integers(0, 256, (rows_m, k // block * size), dtype=np.uint8)
        scales = raw.reshape(-1, size)
        scales[:, :2] = np.array([0.01], np.float16).view(np.uint8)
        if name == "q4_K":
            scales[:, 2:4] = np.array([0.002], np.float16).view(np.uint8)
        weight = raw.view(TypedArray)
        weight.ggml_type = name
        product = PanelProduct(weight, name, k, None, n=1)
        decode = best_of(lambda: product(out, round_like_vec_dot(b, name)), 3)
        integer = best_of(lambda: product.one_row(out, b), 3)
        n = rows_m * k
        rows.append([name, f"{decode / n * 1e9:.2f}", f"{integer / n * 1e9:.2f}",
                     f"{decode / integer:.1f}x"])
    print(f"\none row of b through a [{rows_m}, {k}] weight, one thread, ns per weight value "
          f"(best of 3)")
    print(table(["type", "decode + GEMV", "integer block sums", "speed-up"], rows))


def main() -> None:
    quick = "--quick" in sys.argv
    print(f"# bench_quant: {machine()}")
    t0 = time.perf_counter()
    speed_table(quick)
    decoder_table(quick)
    one_row_table(quick)
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        ggmlrun_child(sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
