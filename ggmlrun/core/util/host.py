"""The machine ggmlrun runs on, read in one place and overridable by environment variables.

Why one place: a plan's answer depends on the host (the CPU backend's memory defaults to the
RAM, `run` refuses what MemAvailable cannot give, threads are capped to the cores, ggml-cpu's
repack depends on the CPU flags). Read here and only here, the host can be replaced as a whole
to plan for another machine, or to test as one, without touching /proc:

    GGMLRUN_HOST_RAM=24GiB          physical RAM (the CPU backend's default `memory`)
    GGMLRUN_HOST_AVAILABLE=8GiB     memory available now (MemAvailable)
    GGMLRUN_HOST_LIMIT=4GiB|none    the process's memory limit (RLIMIT_AS, cgroup memory.max)
    GGMLRUN_HOST_CORES=3            usable cores
    GGMLRUN_HOST_CPU_FLAGS=avx2,fma CPU flags (empty: none)
    GGMLRUN_HOST_LOAD=0.5,0.4,0.3   the load average

A value that cannot be read is one line, exit 2. tests/conftest.py sets all of them, so no test
reads the machine it happens to run on; tests/test_host.py checks that nothing else does.
"""

from __future__ import annotations

import functools
import os
import re

from ggmlrun.core.util.errors import InputError

GiB = 1024**3
_UNITS = {"": 1, "b": 1, "kib": 1024, "mib": 1024**2, "gib": GiB, "tib": 1024**4}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*")
MAX_BYTES = 1 << 60
MEMINFO = "/proc/meminfo"
CPUINFO = "/proc/cpuinfo"
CGROUP_FILES = ("/sys/fs/cgroup/memory.max",                       # cgroup v2
                "/sys/fs/cgroup/memory/memory.limit_in_bytes")     # cgroup v1
VARIABLES = ("GGMLRUN_HOST_RAM", "GGMLRUN_HOST_AVAILABLE", "GGMLRUN_HOST_LIMIT",
             "GGMLRUN_HOST_CORES", "GGMLRUN_HOST_CPU_FLAGS", "GGMLRUN_HOST_LOAD")


def _env(name: str) -> str | None:
    value = os.environ.get(name)
    return None if value is None else value.strip()


def _size(name: str, text: str) -> int:
    match = _SIZE.fullmatch(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise InputError(f"{name}={text[:40]}: not a size; write bytes or e.g. '24GiB', '512MiB'")
    size = int(float(match.group(1)) * _UNITS[unit]) if "." in match.group(1) else \
        int(match.group(1)) * _UNITS[unit]
    if not 1 <= size <= MAX_BYTES:
        raise InputError(f"{name}={text[:40]}: must be from 1 byte to 1 EiB")
    return size


# --- the real machine: only these functions read it (tests replace them) ---------------------
def read_meminfo(path: str = MEMINFO) -> dict[str, int]:
    """/proc/meminfo's fields in bytes ({} where there is no /proc)."""
    fields = {}
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            for line in handle:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    fields[key.strip()] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    except OSError:
        pass
    return fields


def read_sysconf_ram() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return None


def read_limit(cgroup_files=CGROUP_FILES) -> int | None:
    """The tightest memory limit on this process: RLIMIT_AS and the cgroup's, None if none."""
    limits = []
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY and soft > 0:
            limits.append(soft)
    except (ImportError, OSError, ValueError):  # pragma: no cover - non-POSIX
        pass
    for path in cgroup_files:
        try:
            with open(path, encoding="ascii") as handle:
                text = handle.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < MAX_BYTES:     # v1 says "no limit" with ~2**63
            limits.append(int(text))
    return min(limits) if limits else None


def read_address_space_used(path: str = "/proc/self/status") -> int:
    """VmSize: what RLIMIT_AS counts already (0 where unknown)."""
    return read_meminfo(path).get("VmSize", 0)


def read_cores() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


@functools.lru_cache(maxsize=4)
def read_cpu_flags(path: str = CPUINFO, machine: str | None = None) -> frozenset[str]:
    """x86's `flags` line (avx2, avx512f, fma, ...), arm's `Features` (asimd is NEON, named
    `neon` here as ggml names it); aarch64 always has NEON."""
    import platform

    machine = machine or platform.machine().lower()
    flags: set[str] = set()
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            for line in handle:
                key, _, rest = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    flags.update(rest.split())
                    break
    except OSError:
        pass
    if "asimd" in flags or machine in ("aarch64", "arm64"):
        flags.add("neon")
    return frozenset(flags)


def read_load() -> tuple[float, float, float] | None:
    return os.getloadavg() if hasattr(os, "getloadavg") else None


# --- the answers ---------------------------------------------------------------------------
def ram_total() -> int:
    """Physical RAM: GGMLRUN_HOST_RAM, else MemTotal, else sysconf's figure, else 16 GiB."""
    text = _env("GGMLRUN_HOST_RAM")
    if text is not None:
        return _size("GGMLRUN_HOST_RAM", text)
    return read_meminfo().get("MemTotal") or read_sysconf_ram() or 16 * GiB


def memory_limit() -> int | None:
    """The process's memory limit (RLIMIT_AS or cgroup), None when there is none."""
    text = _env("GGMLRUN_HOST_LIMIT")
    if text is not None:
        return None if text.lower() in ("", "none") else _size("GGMLRUN_HOST_LIMIT", text)
    return read_limit()


def ram_available() -> int | None:
    """What a new allocation can have now: MemAvailable (MemTotal on old kernels), less what
    the memory limit leaves; None when nothing is known."""
    text = _env("GGMLRUN_HOST_AVAILABLE")
    if text is not None:
        free = _size("GGMLRUN_HOST_AVAILABLE", text)
    else:
        fields = read_meminfo()
        free = fields.get("MemAvailable", fields.get("MemTotal"))
    limit = memory_limit()
    if limit is not None:
        headroom = max(0, limit - read_address_space_used())
        free = headroom if free is None else min(free, headroom)
    return free


def cores() -> int:
    """Usable cores: GGMLRUN_HOST_CORES, else the CPUs this process may run on."""
    text = _env("GGMLRUN_HOST_CORES")
    if text is not None:
        if not text.isdigit() or not 1 <= int(text) <= 1 << 16:
            raise InputError(f"GGMLRUN_HOST_CORES={text[:40]}: must be a whole number of cores "
                             "from 1 to 65536")
        return int(text)
    return read_cores()


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags, lower case: GGMLRUN_HOST_CPU_FLAGS (comma-separated) or the
    CPU's own."""
    text = _env("GGMLRUN_HOST_CPU_FLAGS")
    if text is not None:
        return frozenset(f.strip().lower() for f in text.split(",") if f.strip())
    return read_cpu_flags()


def repack() -> str:
    """Which ggml-cpu repack the flags allow (SPEC.md section 3's default): avx512, avx2,
    neon or none."""
    flags = cpu_flags()
    for name, flag in (("avx512", "avx512f"), ("avx2", "avx2"), ("neon", "neon")):
        if flag in flags:
            return name
    return "none"


def load_average() -> tuple[float, float, float] | None:
    text = _env("GGMLRUN_HOST_LOAD")
    if text is not None:
        try:
            values = tuple(float(v) for v in text.split(","))
        except ValueError:
            values = ()
        if len(values) != 3:
            raise InputError(f"GGMLRUN_HOST_LOAD={text[:40]}: give three numbers like 0.5,0.4,0.3")
        return values
    return read_load()


def describe() -> dict:
    """Every answer, for `--json` reports and bug reports."""
    return {"ram_bytes": ram_total(), "available_bytes": ram_available(),
            "limit_bytes": memory_limit(), "cores": cores(), "cpu_flags": sorted(cpu_flags())}
