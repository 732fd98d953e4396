"""Issue 30 item 7: without --gpu/--backends, `fit` and `measure` of a model plan for this
machine's GPUs with their free memory now (core/util/devices.py), and say so; with none found
they plan for the CPU alone and say that. The GPUs are injected (GGMLRUN_DEVICES, or fake
NVML / AMD SMI / Metal modules in sys.modules): no test reads the machine's own."""

from __future__ import annotations

import functools
import json
import sys
import types
from pathlib import Path

import pytest

import ggmlrun
from clikit import invoke
from ggmlrun.core.util import devices

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "examples/models/tiny-llama-q8_0.gguf"
MLP = ROOT / "graphs/mlp.yaml"
GiB, MiB = 2**30, 2**20
# the real readers, Metal's as on Linux (it reads nothing there), whatever runs the tests
REAL_READERS = (("NVML", devices.read_nvml), ("AMD SMI", devices.read_amdsmi),
                ("Metal", functools.partial(devices.read_metal, platform="linux")))


def fake_nvml(gpus, init_error=None, fail=None):
    """A stand-in for nvidia-ml-py's pynvml: `gpus` [(name, uuid, total, free)]; nvmlInit
    raises NVMLError(init_error), and `fail` (an exception) is raised by the memory query."""
    nvml = types.ModuleType("pynvml")

    class NVMLError(Exception):
        def __init__(self, value):
            super().__init__(f"NVML error {value}")
            self.value = value

    def init():
        if init_error is not None:
            raise NVMLError(init_error)

    def memory(handle):
        if fail is not None:
            raise fail
        return types.SimpleNamespace(total=handle[2], free=handle[3], used=handle[2] - handle[3])

    nvml.NVMLError, nvml.NVML_ERROR_LIBRARY_NOT_FOUND, nvml.NVML_ERROR_DRIVER_NOT_LOADED = \
        NVMLError, 12, 9
    nvml.shutdowns = 0

    def shutdown():
        nvml.shutdowns += 1

    nvml.nvmlInit, nvml.nvmlShutdown = init, shutdown
    nvml.nvmlDeviceGetCount = lambda: len(gpus)
    nvml.nvmlDeviceGetHandleByIndex = lambda i: gpus[i]
    nvml.nvmlDeviceGetName = lambda h: h[0].encode()        # older bindings: bytes
    nvml.nvmlDeviceGetUUID = lambda h: h[1]
    nvml.nvmlDeviceGetMemoryInfo = memory
    return nvml


def fake_amdsmi(gpus):
    """A stand-in for amdsmi: `gpus` [(name, total, used)]."""
    amd = types.ModuleType("amdsmi")
    amd.AmdSmiException = type("AmdSmiException", (Exception,), {})
    amd.AmdSmiMemoryType = types.SimpleNamespace(VRAM="vram")
    amd.amdsmi_init = amd.amdsmi_shut_down = lambda *a: None
    amd.amdsmi_get_processor_handles = lambda: list(gpus)
    amd.amdsmi_get_gpu_memory_total = lambda h, kind: h[1] if kind == "vram" else 0
    amd.amdsmi_get_gpu_memory_usage = lambda h, kind: h[2] if kind == "vram" else 0
    amd.amdsmi_get_gpu_asic_info = lambda h: {"market_name": h[0]}
    return amd


@pytest.fixture
def machine(monkeypatch):
    """The real readers over fake libraries: `machine(pynvml=..., amdsmi=...)`; a library not
    given is not installed."""
    def install(**libraries):
        monkeypatch.delenv("GGMLRUN_DEVICES", raising=False)
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        for name in ("pynvml", "amdsmi", "Metal"):
            monkeypatch.setitem(sys.modules, name, libraries.get(name))  # None: ImportError
        monkeypatch.setattr(devices, "READERS", REAL_READERS)
    return install


def _json(*args):
    code, out, err = invoke(*args, "--json")
    assert code == 0, err
    return json.loads(out), err


@pytest.mark.parametrize("command", ["fit", "measure"])
def test_found_gpus_are_planned_for_with_their_free_memory(command, machine):
    machine(pynvml=fake_nvml([("NVIDIA GeForce RTX 4090", "GPU-aa11", 24 * GiB, 20 * GiB),
                              ("NVIDIA GeForce RTX 3060", "GPU-bb22", 12 * GiB, 11 * GiB)]),
            amdsmi=fake_amdsmi([("AMD Radeon RX 7900 XTX", 24 * GiB, 4 * GiB)]))
    data, _ = _json(command, TINY)
    assert [(p["name"], p["memory_bytes"], p.get("device"), p.get("total_bytes"), p["source"])
            for p in data["planned_for"][:-1]] == [
        ("GPU0", 20 * GiB, "NVIDIA GeForce RTX 4090", 24 * GiB, "NVML"),
        ("GPU1", 11 * GiB, "NVIDIA GeForce RTX 3060", 12 * GiB, "NVML"),
        ("GPU2", 20 * GiB, "AMD Radeon RX 7900 XTX", 24 * GiB, "AMD SMI")]
    assert [b["memory_bytes"] for b in data["backends"][:-1]] == [20 * GiB, 11 * GiB, 20 * GiB]
    assert data["gpus_read"] == ["NVML: 2 GPUs", "AMD SMI: 1 GPU"]
    code, out, _ = invoke(command, TINY)
    head = " ".join(out.split("planned for:")[1].split("\n")[:3])
    assert "GPU0 20.00 GiB free of 24.00 GiB (NVIDIA GeForce RTX 4090, NVML)" in " ".join(
        head.split())


@pytest.mark.parametrize("command", ["fit", "measure"])
def test_no_gpu_is_the_cpu_alone_and_said(command, machine):
    machine()                                   # no library installed
    data, _ = _json(command, TINY)
    assert [p["kind"] for p in data["planned_for"]] == ["cpu"]
    assert data["gpus_read"] == ["NVML: not installed", "AMD SMI: not installed"]
    code, out, _ = invoke(command, TINY)
    assert out.startswith("planned for: no GPU found (NVML: not installed")
    assert "the CPU alone;" in out.split("host CPU")[0]
    machine(pynvml=fake_nvml([], init_error=12))          # NVML without a driver: said, no warning
    data, err = _json(command, TINY)
    assert data["gpus_read"][0] == "NVML: no NVIDIA driver" and not err


@pytest.mark.parametrize("command", ["fit", "measure"])
def test_a_reader_that_fails_is_one_warning_and_the_cpu_alone(command, machine):
    for nvml in (fake_nvml([("X", "GPU-1", GiB, GiB)], fail=RuntimeError("GPU is lost")),
                 fake_nvml([], init_error=999)):
        machine(pynvml=nvml)
        code, out, err = invoke(command, TINY, "--json")
        assert code == 0 and "Traceback" not in err
        assert len(err.strip().splitlines()) == 1 and "NVML" in err and "warning" in err
        assert [p["kind"] for p in json.loads(out)["planned_for"]] == ["cpu"]
    assert nvml.shutdowns == 0                   # init failed: nothing to shut down


def test_given_devices_graphs_and_other_commands_keep_their_backends(monkeypatch):
    """--gpu, --backends, a graph file and the other model commands never read the GPUs."""
    monkeypatch.setenv("GGMLRUN_DEVICES", "BIG=80GiB")
    assert _json("fit", TINY, "--gpu", "2GiB")[0]["planned_for"][0]["memory_bytes"] == 2 * GiB
    data = _json("measure", TINY, "--backends", ROOT / "graphs/backends/sim_cpu.yaml")[0]
    assert "gpus_read" not in data
    assert all(p["source"] != "GGMLRUN_DEVICES" for p in data["planned_for"])
    assert _json("plan", TINY)[0]["planned_for"][0]["name"] == "SIM0"
    code, out, err = invoke("measure", MLP)
    assert code == 0 and "BIG" not in out and "GGMLRUN_DEVICES" not in out
    monkeypatch.setenv("GGMLRUN_DEVICES", "BIG=60GiB/80GiB")
    assert ggmlrun.fit(TINY)["planned_for"][0]["memory_bytes"] == 60 * GiB     # the API too


def test_cuda_visible_devices_chooses_and_orders_nvml_devices():
    gpus = [("A", "GPU-aaaa", 8 * GiB, 8 * GiB), ("B", "GPU-bbbb", 8 * GiB, 4 * GiB),
            ("C", "GPU-cccc", 8 * GiB, 2 * GiB)]
    nvml = {"pynvml": fake_nvml(gpus)}
    for visible, names in ((None, "ABC"), ("2,0", "CA"), ("GPU-bb,0", "BA"), ("", ""),
                           ("1,7,2", "B"), ("-1", ""), ("0,0", "A")):
        environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
        found, _ = devices.read_nvml(modules=nvml, environ=environ)
        assert "".join(d.name for d in found) == names, visible


def test_metal_reads_llama_cpps_working_set_on_macs_only():
    device = types.SimpleNamespace(name=lambda: "Apple M3 Max",
                                   recommendedMaxWorkingSetSize=lambda: 96 * GiB,
                                   currentAllocatedSize=lambda: 2 * GiB)
    metal = types.SimpleNamespace(MTLCreateSystemDefaultDevice=lambda: device)
    found, _ = devices.read_metal(modules={"Metal": metal}, platform="darwin")
    assert [(d.name, d.total, d.free, d.source) for d in found] == [
        ("Apple M3 Max", 96 * GiB, 94 * GiB, "Metal")]
    assert devices.read_metal(modules={}, platform="darwin") == (
        None, "unsupported without pyobjc-framework-Metal")
    assert devices.read_metal(modules={"Metal": metal}, platform="linux") == (None, "")


@pytest.mark.parametrize("value, devices_", [
    ("none", []), ("", []),
    ("RTX 4090=20GiB/24GiB", [("RTX 4090", 24 * GiB, 20 * GiB)]),
    ("a=1GiB, b = 512MiB", [("a", GiB, GiB), ("b", 512 * MiB, 512 * MiB)]),
])
def test_devices_from_the_environment(value, devices_):
    assert [(d.name, d.total, d.free) for d in devices.parse(value)] == devices_


@pytest.mark.parametrize("value", ["x", "=1GiB", "a=lots", "a=2GiB/1GiB", "a=1GiB,"])
def test_a_bad_devices_variable_is_one_line_exit_2(value, monkeypatch):
    monkeypatch.setenv("GGMLRUN_DEVICES", value)
    code, out, err = invoke("fit", TINY)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "GGMLRUN_DEVICES" in err and "Traceback" not in err


def test_the_default_sim0_is_named_when_it_is_not_there():
    """`--memory SIM0=...` on fit/measure of a model, which no longer plan for SIM0 by
    default: exit 2, one line saying why."""
    code, _, err = invoke("measure", TINY, "--memory", "SIM0=4GiB")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "SIM0" in err and "this machine's GPUs" in err and "--gpu" in err
