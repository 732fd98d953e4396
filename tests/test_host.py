"""Issue 19: the host (RAM, available memory, limits, cores, CPU flags, load) is read in one
place, core/util/host.py, and every answer can be injected, so that a plan can be made for
another machine and the suite passes on any machine."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from clikit import invoke
from ggmlrun.core.backends.spec import BackendSpec, default_backends
from ggmlrun.core.memory import fits
from ggmlrun.core.util import host, ram

pytestmark = pytest.mark.host      # every test here reads the injected host's answers

ROOT = Path(__file__).resolve().parent.parent
MLP = ROOT / "graphs" / "mlp.yaml"
ODD_RAM = 17179869184 + 4096 * 123


def test_every_answer_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("GGMLRUN_HOST_RAM", str(ODD_RAM))
    monkeypatch.setenv("GGMLRUN_HOST_AVAILABLE", "3GiB")
    monkeypatch.setenv("GGMLRUN_HOST_LIMIT", "none")
    monkeypatch.setenv("GGMLRUN_HOST_CORES", "3")
    monkeypatch.setenv("GGMLRUN_HOST_CPU_FLAGS", "AVX2, fma")
    monkeypatch.setenv("GGMLRUN_HOST_LOAD", "1,2,3")
    assert host.ram_total() == ODD_RAM
    assert host.ram_available() == 3 * 1024**3 == ram.available_bytes()
    assert host.memory_limit() is None
    assert host.cores() == 3
    assert host.cpu_flags() == {"avx2", "fma"} and host.repack() == "avx2"
    assert host.load_average() == (1.0, 2.0, 3.0)
    # everything that used to read the machine itself
    assert BackendSpec.of_kind("CPU", "cpu").memory == ODD_RAM
    assert default_backends()[-1].memory == ODD_RAM
    assert fits.machine_memory() == ODD_RAM
    monkeypatch.setenv("GGMLRUN_HOST_CPU_FLAGS", "")
    assert host.cpu_flags() == frozenset() and host.repack() == "none"


def test_a_memory_limit_caps_what_is_available(monkeypatch):
    monkeypatch.setenv("GGMLRUN_HOST_AVAILABLE", "8GiB")
    monkeypatch.setenv("GGMLRUN_HOST_LIMIT", "2GiB")
    monkeypatch.setattr(host, "read_address_space_used", lambda: 512 * 1024**2)
    assert host.memory_limit() == 2 * 1024**3
    assert host.ram_available() == 1536 * 1024**2


@pytest.mark.parametrize("name, value", [
    ("GGMLRUN_HOST_RAM", "24GB"), ("GGMLRUN_HOST_RAM", "0"), ("GGMLRUN_HOST_AVAILABLE", "lots"),
    ("GGMLRUN_HOST_CORES", "0"), ("GGMLRUN_HOST_CORES", "2.5"), ("GGMLRUN_HOST_LOAD", "1,2"),
])
def test_a_bad_value_is_one_line_exit_2(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    code, _, err = invoke("run", MLP)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"ggmlrun: error: {name}=") and "internal error" not in err


def test_the_readers_parse_the_kernels_files(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24684084 kB\nMemFree: 1 kB\nMemAvailable:  2048 kB\n"
                       "HugePages_Total:       0\n")
    fields = host.read_meminfo(str(meminfo))
    assert fields["MemTotal"] == 24684084 * 1024 and fields["MemAvailable"] == 2048 * 1024
    assert fields["HugePages_Total"] == 0
    assert fits.machine_memory(meminfo) == 24684084 * 1024
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f fma\n\nprocessor\t: 1\n")
    assert host.read_cpu_flags(str(x86), "x86_64") == {"fpu", "sse2", "avx2", "avx512f", "fma"}
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd evtstrm crc32\n")
    assert "neon" in host.read_cpu_flags(str(arm), "aarch64")
    v1, v2 = tmp_path / "limit_in_bytes", tmp_path / "memory.max"
    v1.write_text("9223372036854771712\n")        # cgroup v1's "no limit"
    v2.write_text("max\n")
    assert host.read_limit((str(v1), str(v2))) in (None, host.read_limit(()))
    v2.write_text("1073741824\n")
    assert host.read_limit((str(v1), str(v2))) <= 1073741824


@pytest.mark.real_host
def test_the_real_host_reads_without_error():
    facts = host.describe()
    assert facts["ram_bytes"] > 0 and facts["cores"] >= 1


def test_the_suite_cannot_read_the_real_host(monkeypatch):
    """tests/conftest.py: a test reaching the machine through host.py fails loudly."""
    monkeypatch.delenv("GGMLRUN_HOST_RAM")
    with pytest.raises(AssertionError, match="read the real host"):
        host.ram_total()


def test_a_command_plans_for_the_injected_machine(monkeypatch):
    """The CPU's memory and the host RAM check follow GGMLRUN_HOST_RAM, in this process and in
    a fresh one (the environment is the injection)."""
    monkeypatch.setenv("GGMLRUN_HOST_RAM", str(ODD_RAM))
    code, out, _ = invoke("measure", MLP, "--json")
    data = json.loads(out)
    assert code == 0 and data["host_memory_bytes"] == ODD_RAM
    assert {m["name"]: m["memory_bytes"] for m in data["memory"]}["CPU"] == ODD_RAM
    env = {**__import__("os").environ, "GGMLRUN_HOST_RAM": "1MiB", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "ggmlrun", "measure", str(MLP), "--json"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 1 and json.loads(proc.stdout)["host_memory_bytes"] == 1024**2


def test_threads_are_capped_at_the_injected_cores(monkeypatch, tmp_path):
    monkeypatch.setenv("GGMLRUN_HOST_CORES", "3")
    backends = tmp_path / "b.yaml"
    backends.write_text("backends:\n  - {name: CPU, kind: cpu, threads: 64}\n")
    code, out, err = invoke("run", MLP, "--backends", backends, "--remap", "SIM0=CPU", "--json")
    assert code == 0, err
    assert json.loads(out)["timings"]["threads"] == 3 and "capped to the 3 cores" in err


READS = re.compile(r"os\.cpu_count|sched_getaffinity|sysconf|/proc/(meminfo|cpuinfo)"
                   r"|getloadavg|getrlimit|/sys/fs/cgroup|psutil")


@pytest.mark.parametrize("folder", ["ggmlrun", "tests"])
def test_only_host_py_reads_the_host(folder):
    """Everything else asks core/util/host.py (tests included: they inject). A test may still
    read its own process's figures (/proc/self/status's peak memory): those are not the host."""
    allowed = {ROOT / "ggmlrun/core/util/host.py", ROOT / "tests/conftest.py", Path(__file__)}
    found = [f"{path.relative_to(ROOT)}:{n}" for path in sorted((ROOT / folder).rglob("*.py"))
             if path not in allowed
             for n, line in enumerate(path.read_text().splitlines(), 1) if READS.search(line)]
    assert found == []


def test_fits_meminfo_can_still_be_pointed_at_a_file(tmp_path, monkeypatch):
    """The older way to play a smaller machine keeps working beside GGMLRUN_HOST_RAM."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:        4096 kB\n")
    monkeypatch.setattr(fits, "MEMINFO", meminfo)
    assert fits.machine_memory() == 4096 * 1024
