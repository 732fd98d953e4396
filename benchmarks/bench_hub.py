"""`fit hf://OWNER/REPO:Q4_K_M` of a split model with a 128k-token vocabulary, against a stand-in
for the Hugging Face Hub on loopback: bytes fetched, requests and wall time, first ask and
cached ask, beside the headers' size and the same question on the local files.

The model: bench_gguf_header's 4-layer llama with Llama-3's 128,256-token vocabulary (tokens,
scores, token types and its 280,147 merges: a header of about 7 MiB, as a real Llama-3 GGUF's),
split in 3 shards as llama-gguf-split writes them (tests/hubkit.py), served as the Hub serves a
repository: the tree API, `resolve` redirecting to a "CDN" host with the file's commit, ETag and
size, the CDN honouring Range (tests/hubkit.py's Server). Every ask is `python -m ggmlrun fit
... --json` in a fresh process, as a user runs it, with its own header cache dir; `--rtt 0.05`
(the default adds a row set with it) makes the server wait 50 ms before every answer, a round
trip to a faraway Hub.

Targets (issue 29): bytes fetched <= 1.5x the headers; the first ask <= 2 s with 50 ms round
trips; a cached ask within 1.2x of the same question on the local file.

    python benchmarks/bench_hub.py              # loopback, then 50 ms round trips
    python benchmarks/bench_hub.py --trials 1   # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401  (sys.path)
from _common import ROOT, machine, table, verdict

sys.path.insert(0, str(ROOT / "tests"))

from bench_gguf_header import N_VOCAB, write_model  # noqa: E402
from hubkit import Server, split_gguf  # noqa: E402

REPO = "org/Llama-3-tiny-GGUF"
NAME = f"hf://{REPO}:Q4_K_M"
FIT = ("--gpu", "8GiB", "--ram", "32GiB", "--json")
TARGET_BYTES, TARGET_S, TARGET_CACHED = 1.5, 2.0, 1.2


def ask(model, cache: Path, endpoint: str, max_age: str = "600") -> tuple[float, dict]:
    env = {**os.environ, "HF_ENDPOINT": endpoint, "XDG_CACHE_HOME": str(cache),
           "GGMLRUN_HEADER_MAX_AGE": max_age, "HF_HUB_DISABLE_TELEMETRY": "1",
           "PYTHONPATH": str(ROOT)}
    env.pop("HF_TOKEN", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "ggmlrun", "fit", str(model), *FIT], env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        raise SystemExit(f"fit {model}: {done.stderr.strip()}")
    data = json.loads(done.stdout)
    data.pop("seconds", None)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return Timed(wall, cpu), data


class Timed(tuple):
    """(wall, cpu) seconds, ordered by wall; shown as "wall (cpu)"."""

    def __new__(cls, wall: float, cpu: float):
        return super().__new__(cls, (wall, cpu))

    def __str__(self):
        return f"{self[0]:.2f} ({self[1]:.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--rtt", type=float, default=0.05)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-hub-"))
    try:
        run(work, args.trials, args.rtt)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(work: Path, trials: int, rtt: float) -> None:
    from ggmlrun.models.gguf.header import read_header

    whole = work / "llama3-tiny.gguf"
    write_model(whole, N_VOCAB, merges=True)
    shards = split_gguf(whole, 3)
    names = [f"llama3-tiny-Q4_K_M-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    for name, blob in zip(names, shards):
        (work / name).write_bytes(blob)
    heads = [read_header(work / name).header_end for name in names]
    headers = sum(heads)
    print(f"# bench_hub: {machine()}")
    print(f"model: {N_VOCAB:,}-token vocabulary with merges, 3 shards of "
          f"{', '.join(f'{(work / n).stat().st_size:,}' for n in names)} bytes; headers "
          f"{', '.join(f'{h:,}' for h in heads)} bytes ({headers:,} in all)")

    local_whole = min(ask(whole, work / "c-local", "http://127.0.0.1:9")[0] for _ in range(trials))
    local_split, reference = min(
        (ask(work / names[0], work / "c-local", "http://127.0.0.1:9") for _ in range(trials)),
        key=lambda r: r[0])
    rows = [["local whole file", "", "", str(local_whole), ""],
            ["local split set", "", "", str(local_split), ""]]
    verdicts = []
    for delay in (0.0, rtt):
        label = "loopback" if not delay else f"{delay * 1000:.0f} ms round trips"
        with Server(repos={REPO: dict(zip(names, shards))}, delay=delay) as server:
            first = []
            for i in range(trials):
                cache = work / f"c-{delay}-{i}"
                server.counts.reset()
                wall, data = ask(NAME, cache, server.endpoint)
                assert data == reference, "hf:// and the local split set disagree"
                first.append((wall, server.counts.requests, server.counts.bytes, cache))
            wall, requests, nbytes, cache = min(first)
            rows.append([f"first ask, {label}", f"{nbytes:,} ({nbytes / headers:.2f}x)",
                         requests, str(wall), ""])
            verdicts.append((f"bytes fetched <= {TARGET_BYTES}x the headers ({label})",
                             nbytes <= TARGET_BYTES * headers))
            if delay:
                verdicts.append((f"first ask <= {TARGET_S} s ({label})",
                                 wall[0] <= TARGET_S))
            for max_age, what in (("600", "cached ask (fresh)"),
                                  ("0", "cached ask (revalidated)")):
                best, local = None, None
                for _ in range(trials):      # interleaved with the local question: same load
                    here = ask(work / names[0], work / "c-local", "http://127.0.0.1:9")[0]
                    local = here if local is None else min(local, here)
                    server.counts.reset()
                    w, data = ask(NAME, cache, server.endpoint, max_age)
                    assert data == reference
                    got = (w, server.counts.requests, server.counts.bytes)
                    best = got if best is None or got < best else best
                w, requests, nbytes = best
                rows.append([f"{what}, {label}", f"{nbytes:,}", requests, str(w),
                             f"{w[0] / local[0]:.2f}x (local {local[0]:.2f})"])
                if not delay and max_age == "600":
                    verdicts.append((f"cached ask within {TARGET_CACHED}x of the local set",
                                     w[0] <= TARGET_CACHED * local[0]))
    print(table(["question: fit " + NAME, "bytes fetched", "requests", "wall s (cpu)",
                 "vs local set, same moment"], rows))
    for what, ok in verdicts:
        print(f"{verdict(ok)}: {what}")


if __name__ == "__main__":
    main()
