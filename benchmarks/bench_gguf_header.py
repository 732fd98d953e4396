"""Reading a GGUF header with a real vocabulary: the old reader (gguf's GGUFReader, which decodes
every metadata array item by item) against ggmlrun's own (gguf_header.py: sizes checked, arrays
skipped by size), and `fit` on the GGUF against `fit` on the same model's card.

The file: a 4-layer llama (n_embd 64, f16 matrices, f32 norms) with Llama-3's vocabulary size,
128,256 tokens, and the arrays a Llama-3 GGUF carries for it (tokens as strings, scores, token
types; `--merges` adds Llama-3's 280,147 merge strings too). Each row is timed two ways, in
fresh processes, interleaved: the command as a user runs it (`python -m ggmlrun ...`: wall and
CPU seconds, the fastest of `--trials`), and the same command in-process in a fresh interpreter
(`ggmlrun.cli.main`, the old reader put in place of the new one for the "old" row) for the
header read's own time and the peak RSS (VmHWM). Python's bytecode cache is used as an
installed package uses it (PYTHONDONTWRITEBYTECODE is dropped for the children, which write
it on a first, untimed run): compiling ggmlrun's modules from source costs `validate` 0.04 s
of CPU (0.09 s before the lazy imports; docs/benchmarks.md).

Targets (issue 19): `validate` <= 0.15 s and <= 60 MB; `fit` on the GGUF within 1.2x of `fit`
on the card.

    python benchmarks/bench_gguf_header.py            # validate old/new, fit GGUF/card
    python benchmarks/bench_gguf_header.py --merges   # the file with merges as well
    python benchmarks/bench_gguf_header.py --quick    # a 32k vocabulary, one trial (CI smoke)
    python benchmarks/bench_gguf_header.py --source   # ggmlrun compiled from source every run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import _common  # noqa: F401  (sys.path)
from _common import ROOT, machine, table, verdict

N_VOCAB = 128_256
N_MERGES = 280_147
TARGET_S, TARGET_MB, TARGET_FIT = 0.15, 60, 1.2


def legacy_read_gguf(path):
    """The reader ggmlrun had before issue 19: gguf.GGUFReader over the whole header."""
    from gguf import GGUFReader

    from ggmlrun.core.ir.types import BY_ID
    from ggmlrun.models.arch import from_metadata
    from ggmlrun.models.modelfile import ModelFile, TensorInfo, check_tensors

    path = Path(path)
    reader = GGUFReader(path, "r")
    arch = reader.fields["general.architecture"].contents()
    fields = {key: f.contents() for key, f in reader.fields.items()
              if key.startswith(f"{arch}.") or key == "general.name"}
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is not None:
        fields["tokenizer.ggml.tokens"] = range(len(tokens.data))
    hparams = from_metadata(fields, arch)
    tensors = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        tensors[t.name] = TensorInfo(t.name, shape, BY_ID[int(t.tensor_type)].name,
                                     int(t.data_offset))
    check_tensors(hparams, tensors, str(path))
    return ModelFile(path=path, arch=arch, name=str(fields.get("general.name")),
                     hparams=hparams, tensors=tensors)


def write_model(path: Path, n_vocab: int, merges: bool) -> None:
    import gguf

    from ggmlrun.models.arch import llama_tensor_shapes
    from ggmlrun.models.hparams.record import HParams

    rng = np.random.default_rng(0)
    hp = HParams(n_layer=4, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_vocab=n_vocab,
                      n_ctx_train=8192, n_rot=16)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("llama-3-shaped-tiny")
    w.add_block_count(hp.n_layer)
    w.add_context_length(hp.n_ctx_train)
    w.add_embedding_length(hp.n_embd)
    w.add_feed_forward_length(hp.n_ff)
    w.add_head_count(hp.n_head)
    w.add_head_count_kv(hp.n_head_kv)
    w.add_rope_dimension_count(hp.n_rot)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(500000.0)
    w.add_vocab_size(n_vocab)
    w.add_file_type(1)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    lengths = rng.integers(1, 14, n_vocab)
    w.add_token_list([f"t{i:x}" + "x" * int(n) for i, n in enumerate(lengths)])
    w.add_token_scores(rng.standard_normal(n_vocab).astype(np.float32).tolist())
    w.add_token_types([1] * n_vocab)
    if merges:
        w.add_token_merges([f"m{i:x} {'y' * (i % 9)}" for i in range(N_MERGES)])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for name, shape in llama_tensor_shapes(hp).items():
        data = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        w.add_tensor(name, data if len(shape) == 1 else data.astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    card = path.with_suffix(".yaml")
    card.write_text(f"architecture: llama\nname: llama-3-shaped-tiny card\nhparams:\n"
                    f"  n_layer: {hp.n_layer}\n  n_embd: {hp.n_embd}\n  n_head: {hp.n_head}\n"
                    f"  n_head_kv: {hp.n_head_kv}\n  n_ff: {hp.n_ff}\n  n_vocab: {n_vocab}\n"
                    f"  n_ctx_train: {hp.n_ctx_train}\n  rope_freq_base: 500000.0\n"
                    f"  norm_rms_eps: 1.0e-5\nweights: f16\n")


# One fresh interpreter: install the reader asked for, time the header read, run the command.
CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
sys.path.insert(0, sys.argv[1] + "/benchmarks")
sys.path.insert(0, sys.argv[1])
reader, argv = sys.argv[2], sys.argv[3:]
spent = []
if argv[:1] != ["--version"]:           # --version loads no model code: leave it so
    from ggmlrun.models import load
    read = load.read_gguf
    if reader == "old":
        from bench_gguf_header import legacy_read_gguf as read
    def timed(path):
        t = time.perf_counter()
        try:
            return read(path)
        finally:
            spent.append(time.perf_counter() - t)
    load.read_gguf = timed
from ggmlrun.cli import main
code = 0
try:
    main(argv)
except SystemExit as done:
    code = done.code or 0
sys.stdout.flush()
use = resource.getrusage(resource.RUSAGE_SELF)          # since the fork: this process's own
with open("/proc/self/status") as status:               # ru_maxrss outlives exec; VmHWM does not
    hwm = next(int(line.split()[1]) for line in status if line.startswith("VmHWM"))
print(json.dumps({"code": code, "header_s": sum(spent), "cpu_s": use.ru_utime + use.ru_stime,
                  "rss_kb": hwm}), file=sys.stderr)
"""


# the children as an installed package runs: bytecode cached (see the docstring)
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
ENV["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [ENV.get("PYTHONPATH")])])


def command_run(argv: list[str]) -> tuple[float, float]:
    """`python -m ggmlrun ARGV` as a user runs it: wall and CPU (user + sys) seconds."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-m", "ggmlrun", *argv], cwd=ROOT, env=ENV,
                                 stdout=subprocess.DEVNULL, stderr=err)
        _, status, use = os.wait4(child.pid, 0)      # the child's own CPU time, not ours
        wall = time.perf_counter() - t0
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode:
            err.seek(0)
            raise SystemExit(f"ggmlrun {' '.join(argv)}: exit {child.returncode}: "
                             f"{err.read().decode(errors='replace')}")
    return wall, use.ru_utime + use.ru_stime


def one_run(reader: str, argv: list[str]) -> dict:
    """The in-process child (header read time, peak RSS); for the new reader, the command as
    a user runs it as well (wall, CPU)."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), reader, *argv],
                          capture_output=True, text=True, cwd=ROOT, env=ENV)
    wall = time.perf_counter() - t0
    figures = json.loads(done.stderr.strip().splitlines()[-1])
    figures["wall_s"] = figures["process_s"] = wall
    if figures["code"]:
        raise SystemExit(f"{reader} {' '.join(argv)}: exit {figures['code']}: {done.stderr}")
    if reader == "new":
        figures["process_s"], figures["cpu_s"] = command_run(argv)
    return figures


def bare_interpreter() -> tuple[float, float]:
    """`python -c pass`: what any Python command costs here before its first import."""
    t0 = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", "pass"], env=ENV)
    _, status, use = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - t0, use.ru_utime + use.ru_stime


def modules_imported(argv: list[str]) -> tuple[int, int]:
    """How many modules `python -m ggmlrun ARGV` imports (-X importtime), the interpreter's own
    start-up (site, .pth files) included."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "ggmlrun", *argv], cwd=ROOT,
                          env=ENV, capture_output=True, text=True)
    names = [line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
             if line.startswith("import time:") and "|" in line][1:]      # [0]: the header
    return len(names), sum(name.startswith("ggmlrun") for name in names)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="32k vocabulary, one trial")
    ap.add_argument("--merges", action="store_true", help="Llama-3's 280k merges in the file too")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--source", action="store_true",
                    help="no bytecode cache for ggmlrun (PYTHONDONTWRITEBYTECODE=1 and its "
                         "__pycache__ folders removed): every run compiles its modules")
    args = ap.parse_args()
    if args.source:
        import shutil

        ENV["PYTHONDONTWRITEBYTECODE"] = "1"
        for cache in (ROOT / "ggmlrun").rglob("__pycache__"):
            shutil.rmtree(cache)
    n_vocab = 32_000 if args.quick else N_VOCAB
    trials = 1 if args.quick else args.trials
    print(f"bench_gguf_header: 4-layer llama, n_embd 64, {n_vocab:,} tokens"
          f"{f', {N_MERGES:,} merges' if args.merges else ''} ({machine()}); ggmlrun "
          f"{'compiled from source' if args.source else 'from its bytecode cache'}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "llama3-vocab.gguf"
        write_model(path, n_vocab, args.merges)
        card = path.with_suffix(".yaml")
        print(f"file: {path.stat().st_size / 2**20:.1f} MiB; best of {trials} (fresh processes, "
              f"interleaved)")
        runs = {"validate old": ("old", ["validate", path]),
                "validate new": ("new", ["validate", path]),
                "fit GGUF (new)": ("new", ["fit", path]), "fit card": ("new", ["fit", card]),
                "process start": ("new", ["--version"])}
        if args.quick:          # the old reader takes seconds even at 32k tokens
            del runs["validate old"]
        got = {name: [] for name in runs}
        for reader, argv in runs.values():          # untimed: writes the bytecode cache
            if reader == "new":
                command_run([str(a) for a in argv])
        bare = [bare_interpreter() for _ in range(max(trials, 3))]
        counts = {name: modules_imported([str(a) for a in argv])
                  for name, (reader, argv) in runs.items() if reader == "new"}
        for i in range(trials):
            for name, (reader, argv) in runs.items():
                if name != "validate old" or i < min(trials, 2):     # the old one is slow
                    got[name].append(one_run(reader, [str(a) for a in argv]))
        figures = {name: {"process_s": min(r["process_s"] for r in rs),
                          "wall_s": min(r["wall_s"] for r in rs),
                          "cpu_s": min(r["cpu_s"] for r in rs),
                          "header_s": min(r["header_s"] for r in rs),
                          "rss_mb": max(r["rss_kb"] for r in rs) / 1024}
                   for name, rs in got.items()}
    rows = [[name, f"{f['process_s']:.3f}", f"{f['cpu_s']:.3f}", f"{f['header_s'] * 1e3:.1f}",
             f"{f['rss_mb']:.0f}", "%d (%d ggmlrun)" % counts[name] if name in counts else ""]
            for name, f in figures.items()]
    print(table(["command", "wall s", "CPU s", "header read ms", "peak RSS MiB", "modules"],
                rows))
    print(f"(the old reader's row: its in-process child; a bare `python -c pass`: "
          f"{min(b[0] for b in bare):.3f} s wall, {min(b[1] for b in bare):.3f} s CPU)")
    new, fit, fit_card = figures["validate new"], figures["fit GGUF (new)"], figures["fit card"]
    start = figures["process start"]
    over = new["process_s"] - start["process_s"]
    print(f"validate (new): {new['process_s']:.3f} s wall ({over:.3f} s over `ggmlrun --version`), "
          f"{new['cpu_s']:.3f} s CPU, target {TARGET_S} s: "
          f"{verdict(new['process_s'] <= TARGET_S)} (CPU: {verdict(new['cpu_s'] <= TARGET_S)}); "
          f"{new['rss_mb']:.0f} MiB, target {TARGET_MB} MB: "
          f"{verdict(new['rss_mb'] * 2**20 <= TARGET_MB * 1e6)}")
    old = figures.get("validate old")
    if old:
        print(f"old/new: {old['wall_s'] / new['wall_s']:.1f}x wall (in-process), header read "
              f"{old['header_s'] / max(new['header_s'], 1e-9):.0f}x, peak RSS "
              f"{old['rss_mb'] / new['rss_mb']:.1f}x")
    for key, unit in (("process_s", "wall"), ("cpu_s", "CPU")):
        ratio = fit[key] / fit_card[key]
        print(f"fit GGUF / fit card ({unit}): {ratio:.2f}x, target {TARGET_FIT}x: "
              f"{verdict(ratio <= TARGET_FIT)}")


if __name__ == "__main__":
    main()
