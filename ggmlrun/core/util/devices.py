"""This machine's GPUs and their free memory now, read as llama.cpp's own `--fit` reads them,
so that `fit` and `measure` of a model answer for the machine they run on when no `--gpu` or
`--backends` says otherwise.

llama.cpp's fit (common/fit.cpp) asks each device for (free, total) through
ggml_backend_dev_memory: cudaMemGetInfo on CUDA, hipMemGetInfo on ROCm, and on Metal the
recommended working-set size less what is allocated. The same figures are read here without a
GPU runtime, each through its vendor's management library, all optional (`pip install
'ggmlrun[gpu]'`) and imported only when called:

    NVIDIA   NVML (nvidia-ml-py, `import pynvml`): nvmlDeviceGetMemoryInfo's free and total,
             of the devices CUDA_VISIBLE_DEVICES leaves (by index or UUID), in NVML's order
             (PCI bus order: CUDA's with CUDA_DEVICE_ORDER=PCI_BUS_ID)
    AMD      AMD SMI (`import amdsmi`): VRAM total less VRAM used
    Apple    Metal (pyobjc-framework-Metal, `import Metal`): recommendedMaxWorkingSetSize less
             currentAllocatedSize, llama.cpp's own figures; only on macOS

A reader whose library is not installed, or finds no driver, finds no device and says so; a
reader that fails otherwise is a warning, never a traceback. GGMLRUN_DEVICES replaces them all
(as core/util/host.py's GGMLRUN_HOST_* replace the host), so that tests and CI never read the
machine they run on and a plan can be made for another one:

    GGMLRUN_DEVICES=none                               no GPU
    GGMLRUN_DEVICES="RTX 4090=20GiB/24GiB,RTX 3060=12GiB"   NAME=FREE/TOTAL (or NAME=SIZE: all free)
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from ggmlrun.core.util.errors import InputError

VARIABLE = "GGMLRUN_DEVICES"
INSTALL = "pip install 'ggmlrun[gpu]'"


@dataclass(frozen=True)
class Device:
    name: str            # the vendor's name for it (NVIDIA GeForce RTX 4090)
    total: int           # bytes
    free: int            # bytes free now: what llama.cpp's fit plans with
    source: str          # the reader: NVML, AMD SMI, Metal, GGMLRUN_DEVICES


@dataclass
class Found:
    """The devices found, what each reader said (`NVML: 2 GPUs`, `AMD SMI: not installed`),
    and the warnings of readers that failed."""
    devices: list[Device] = field(default_factory=list)
    said: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _import(name: str, modules):
    """The reader's library: from `modules` (a test's fake), else imported; None when it is
    not installed, or installed without the vendor's shared library it loads on import (the
    amdsmi package without ROCm's libamd_smi: OSError)."""
    if modules is not None:
        return modules.get(name)
    import importlib

    try:
        return importlib.import_module(name)
    except (ImportError, OSError):
        return None


def _text(value) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


# --- the readers: each returns its devices, or None when it cannot look (and why) -----------
def read_nvml(modules=None, environ=None) -> tuple[list[Device] | None, str]:
    nvml = _import("pynvml", modules)
    if nvml is None:
        return None, "not installed"
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as err:
        if getattr(err, "value", None) in (nvml.NVML_ERROR_LIBRARY_NOT_FOUND,
                                           nvml.NVML_ERROR_DRIVER_NOT_LOADED):
            return None, "no NVIDIA driver"
        raise
    try:
        devices = []
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            devices.append((i, _text(nvml.nvmlDeviceGetUUID(handle)),
                            Device(_text(nvml.nvmlDeviceGetName(handle)), int(memory.total),
                                   int(memory.free), "NVML")))
    finally:
        nvml.nvmlShutdown()
    visible = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES")
    return _cuda_visible(devices, visible), ""


def _cuda_visible(devices: list[tuple[int, str, Device]], visible: str | None) -> list[Device]:
    """The devices CUDA shows under CUDA_VISIBLE_DEVICES, in its order: indices or (prefixes
    of) UUIDs, up to the first entry that names none, as CUDA stops there."""
    if visible is None:
        return [d for _, _, d in devices]
    shown: list[int] = []
    for entry in (e.strip() for e in visible.split(",")):
        match = [i for i, uuid, _ in devices
                 if (entry.isdigit() and int(entry) == i)
                 or (entry.startswith("GPU-") and uuid.startswith(entry))]
        if len(match) != 1 or match[0] in shown:
            break
        shown.append(match[0])
    return [devices[i][2] for i in shown]


def read_amdsmi(modules=None, environ=None) -> tuple[list[Device] | None, str]:
    amd = _import("amdsmi", modules)
    if amd is None:
        return None, "not installed"
    try:
        amd.amdsmi_init()
    except amd.AmdSmiException:
        return None, "no AMD driver"
    try:
        vram = amd.AmdSmiMemoryType.VRAM
        devices = []
        for handle in amd.amdsmi_get_processor_handles():
            total = int(amd.amdsmi_get_gpu_memory_total(handle, vram))
            used = int(amd.amdsmi_get_gpu_memory_usage(handle, vram))
            name = _text(amd.amdsmi_get_gpu_asic_info(handle).get("market_name") or "AMD GPU")
            devices.append(Device(name, total, max(total - used, 0), "AMD SMI"))
    finally:
        amd.amdsmi_shut_down()
    return devices, ""


def read_metal(modules=None, environ=None, platform: str | None = None
               ) -> tuple[list[Device] | None, str]:
    if (platform or sys.platform) != "darwin":
        return None, ""                  # not a Mac: nothing to say
    metal = _import("Metal", modules)
    if metal is None:
        return None, "unsupported without pyobjc-framework-Metal"
    device = metal.MTLCreateSystemDefaultDevice()
    if device is None:
        return [], ""
    total = int(device.recommendedMaxWorkingSetSize())
    used = int(device.currentAllocatedSize())
    return [Device(_text(device.name()), total, max(total - used, 0), "Metal")], ""


READERS = (("NVML", read_nvml), ("AMD SMI", read_amdsmi), ("Metal", read_metal))


# --- the answer ------------------------------------------------------------------------------
def find(readers=None, modules=None, environ=None) -> Found:
    """This machine's GPUs: GGMLRUN_DEVICES when set, else what every reader finds
    (`readers`: (label, reader) pairs, READERS by default; `modules`: fake libraries by import
    name, for tests)."""
    environ = os.environ if environ is None else environ
    readers = READERS if readers is None else readers
    text = environ.get(VARIABLE)
    if text is not None:
        devices = parse(text)
        return Found(devices, [f"{VARIABLE}={text.strip()}"])
    found = Found()
    for name, reader in readers:
        try:
            devices, why = reader(modules=modules, environ=environ)
        except Exception as err:  # noqa: BLE001 - a vendor library's failure is a warning
            found.warnings.append(f"reading the GPUs through {name} failed "
                                  f"({type(err).__name__}: {_text(err)[:200]}); planning "
                                  f"without them")
            continue
        if devices:
            found.devices += devices
            found.said.append(f"{name}: {len(devices)} GPU{'s' if len(devices) > 1 else ''}")
        elif why:
            found.said.append(f"{name}: {why}")
        elif devices is not None:
            found.said.append(f"{name}: none")
    return found


def parse(text: str) -> list[Device]:
    """GGMLRUN_DEVICES: `none`, or NAME=SIZE / NAME=FREE/TOTAL, comma-separated."""
    from ggmlrun.core.util.host import _size

    text = text.strip()
    if text.lower() in ("", "none"):
        return []
    devices = []
    for item in text.split(","):
        name, eq, sizes = item.rpartition("=")
        free_text, _, total_text = sizes.partition("/")
        if not eq or not name.strip() or not free_text.strip():
            raise InputError(f"{VARIABLE}={text[:60]}: write none, or NAME=SIZE or "
                             f"NAME=FREE/TOTAL per device, comma-separated, e.g. "
                             f"'RTX 4090=20GiB/24GiB'")
        free = _size(VARIABLE, free_text)
        total = _size(VARIABLE, total_text) if total_text.strip() else free
        if free > total:
            raise InputError(f"{VARIABLE}: {name.strip()} has {free_text.strip()} free of "
                             f"{total_text.strip()}: free memory cannot exceed the total")
        devices.append(Device(name.strip(), total, free, VARIABLE))
    return devices
