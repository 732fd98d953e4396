import os

import pytest
from hypothesis import HealthCheck, settings

# `default` keeps the suite fast; `nightly` (HYPOTHESIS_PROFILE=nightly) digs much deeper.
settings.register_profile("default", max_examples=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("nightly", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# The suite runs on a simulated host (core/util/host.py), never on the machine it happens to
# be on: the same answers everywhere, in this process and in every command it starts. A value
# already in the environment wins, so that `.ci/run` can run the tests marked `host` (those
# whose answer depends on the host) again as another machine, and one bound to these exact
# figures fails there.
SIMULATED_HOST = {
    "GGMLRUN_HOST_RAM": "32GiB",
    "GGMLRUN_HOST_AVAILABLE": "16GiB",
    "GGMLRUN_HOST_LIMIT": "none",
    "GGMLRUN_HOST_CORES": "4",
    "GGMLRUN_HOST_CPU_FLAGS": "sse2,avx,avx2,fma,f16c",
    "GGMLRUN_HOST_LOAD": "0.5,0.5,0.5",
}
for _name, _value in SIMULATED_HOST.items():
    os.environ.setdefault(_name, _value)
# The suite's parallelism is pytest-xdist's workers, one per core: each worker's BLAS computes
# on one thread, as OpenBLAS's busy-waiting threads, one per core in every worker, otherwise
# contend for the same cores (numpy is not loaded yet here; a value already set wins).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# This machine's GPUs (core/util/devices.py), read by `fit` and `measure` of a model without
# --gpu/--backends: none, unless a test injects a list (or a fake NVML/AMD SMI module); a
# test that reaches a real reader fails (no_real_devices).
os.environ.setdefault("GGMLRUN_DEVICES", "none")
# The terminal is the host's too: a test that wants a width sets COLUMNS itself; the runner's
# (a terminal's, or the 80 pytest-xdist's workers are given) never reaches a command's tables.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)


def pytest_configure(config):
    config.addinivalue_line("markers", "real_host: the test reads the real machine on purpose "
                                       "(core/util/host.py's readers)")
    config.addinivalue_line("markers", "host: the test's answer depends on the host "
                                       "(core/util/host.py's answers); .ci/run runs these again "
                                       "as another machine (-m host)")


def pytest_collection_modifyitems(items):
    """A test that reads the real machine depends on the host by definition."""
    for item in items:
        if item.get_closest_marker("real_host"):
            item.add_marker(pytest.mark.host)


@pytest.fixture(autouse=True)
def no_real_host(request, monkeypatch):
    """A test that reaches the real machine through core/util/host.py fails, naming the reader
    (a reader given a file of its own, a test's fake /proc, is allowed)."""
    if request.node.get_closest_marker("real_host"):
        yield
        return
    from ggmlrun.core.util import host

    def refuse(name, real):
        def guarded(*args, **kwargs):
            if args or kwargs:
                return real(*args, **kwargs)
            raise AssertionError(f"this test read the real host (host.{name}); inject it with "
                                 f"GGMLRUN_HOST_* (tests/conftest.py) or mark it real_host")
        return guarded

    for name in ("read_meminfo", "read_sysconf_ram", "read_limit", "read_address_space_used",
                 "read_cores", "read_cpu_flags", "read_load"):
        monkeypatch.setattr(host, name, refuse(name, getattr(host, name)))
    yield


@pytest.fixture(autouse=True)
def no_real_devices(monkeypatch):
    """A test that reaches this machine's GPU readers (NVML, AMD SMI, Metal) without handing
    them a fake module fails, naming the reader."""
    from ggmlrun.core.util import devices

    def refuse(name, real):
        def guarded(modules=None, **kwargs):
            if modules is not None:
                return real(modules=modules, **kwargs)
            raise AssertionError(f"this test read the real GPUs (devices.{name}); inject them "
                                 f"with GGMLRUN_DEVICES or fake modules")
        return guarded

    readers = tuple((label, refuse(reader.__name__, reader))
                    for label, reader in devices.READERS)
    monkeypatch.setattr(devices, "READERS", readers)
    yield
