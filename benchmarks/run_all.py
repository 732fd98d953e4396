"""Run every benchmark, one after another, in one process tree (side by side, same machine).

    python benchmarks/run_all.py           # the full figures (a few minutes, about 8 GiB RSS)
    python benchmarks/run_all.py --quick   # the CI smoke step: seconds, small sizes

Each script prints its own table; the exit status is non-zero only if a script fails to run.
Missing a performance target is reported in the output, never as a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = ["bench_dispatch.py", "bench_compute.py", "bench_scale.py", "bench_memory.py",
           "bench_quant.py", "bench_models.py", "bench_fit.py", "bench_load.py",
           "bench_gguf_header.py"]


def main() -> int:
    extra = sys.argv[1:]
    print(f"load average before: {os.getloadavg()[0]:.2f}\n", flush=True)
    failed = []
    for script in SCRIPTS:
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, str(HERE / script), *extra])
        print(f"[{script}: exit {rc}, {time.perf_counter() - t0:.1f} s]\n", flush=True)
        if rc:
            failed.append(script)
    if failed:
        print("failed: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
