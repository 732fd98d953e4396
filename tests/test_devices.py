"""Devices in plain words: --gpu SIZE[,SIZE...] and --ram SIZE on model commands, the header
that says what was planned for and where each size came from, and sizes without a unit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clikit import invoke

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "examples/models/tiny-llama-q8_0.gguf"
CARD_70B = ROOT / "ggmlrun/models/cards/llama-3-70b-q4_k_m.yaml"
GiB = 2**30


@pytest.mark.parametrize("command", ["plan", "measure", "fit"])
def test_gpu_and_ram_make_the_backends(command):
    code, out, err = invoke(command, TINY, "--gpu", "24GiB,12GiB", "--ram", "32GiB", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["planned_for"] == [
        {"name": "GPU0", "kind": "sim", "memory_bytes": 24 * GiB, "source": "--gpu"},
        {"name": "GPU1", "kind": "sim", "memory_bytes": 12 * GiB, "source": "--gpu"},
        {"name": "CPU", "kind": "cpu", "memory_bytes": 32 * GiB, "source": "--ram"}]


def test_run_takes_gpu_and_ram():
    code, out, err = invoke("run", TINY, "--tokens", "1,2", "--gpu", "1GiB", "--ram", "2GiB",
                            "--json")
    assert code == 0, err
    assert json.loads(out)["planned_for"][0]["name"] == "GPU0"


@pytest.mark.parametrize("command", ["plan", "measure", "fit"])
def test_header_names_devices_host_and_sources(command, tmp_path):
    backends = tmp_path / "b.yaml"
    backends.write_text("backends:\n  - {name: DEV, kind: sim, memory: 8GiB}\n"
                        "  - {name: DEV2, kind: sim}\n  - {name: CPU, kind: cpu}\n")
    code, out, err = invoke(command, TINY, "--backends", backends)
    assert code == 0, err
    head = out.split("\n")[0]
    assert head.startswith("planned for: DEV 8.00 GiB (file b.yaml), DEV2 16.00 GiB (kind "
                           "default); host CPU ")
    assert head.endswith("(this machine's RAM)")
    code, out, _ = invoke(command, TINY)
    if command == "plan":      # measure and fit: this machine's GPUs (tests/test_this_machine.py)
        assert out.startswith("planned for: SIM0 16.00 GiB (default); host CPU ")
        code, out, _ = invoke(command, TINY, "--memory", "SIM0=2GiB", "--ram", "4GiB")
        assert out.startswith("planned for: SIM0 2.00 GiB (--memory); host CPU 4.00 GiB (--ram)")
    else:
        assert out.startswith("planned for: no GPU found (GGMLRUN_DEVICES=none): the CPU "
                              "alone; host CPU ")


@pytest.mark.parametrize("args, words", [
    (("--gpu", "12"), "--gpu 12: 12 bytes is less than 1 MiB; give the unit, e.g. --gpu 12GiB"),
    (("--gpu", "24GiB,12"), "--gpu 12: 12 bytes is less than 1 MiB"),
    (("--ram", "32"), "--ram 32: 32 bytes is less than 1 MiB; give the unit, e.g. --ram 32GiB"),
    (("--memory", "SIM0=12"), "--memory SIM0=12: 12 bytes is less than 1 MiB; give the unit, "
                              "e.g. --memory SIM0=12GiB"),
    (("--memory", "12GiB"), "e.g. SIM0=12GiB; for a model, --gpu 12GiB says one GPU of that size"),
    (("--gpu", "24GiB,"), "one SIZE per device"),
    (("--gpu", "12GB"), "use binary units"),
    (("--gpu", "1GiB", "--backends", ROOT / "graphs/backends/sim_cpu.yaml"), "give one of the two"),
    (("--ram", "1GiB", "--memory", "CPU=2GiB"), "both set the host's memory"),
])
def test_sizes_without_a_unit_and_conflicts(args, words):
    code, out, err = invoke("measure", TINY, *args)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("ggmlrun: error: ")
    assert words in err


def test_a_bare_byte_count_of_a_mib_or_more_is_bytes():
    code, out, err = invoke("measure", TINY, "--gpu", str(2**30), "--json")
    assert code == 0, err
    assert json.loads(out)["planned_for"][0]["memory_bytes"] == 2**30


def test_gpu_on_a_graph_file_applies_to_models():
    code, _, err = invoke("measure", ROOT / "graphs/mlp.yaml", "--gpu", "1GiB")
    assert code == 2 and "--gpu applies to models" in err


def test_70b_on_described_devices_does_not_depend_on_this_machine():
    """The README's fit example: devices the user described, the host's RAM included."""
    code, out, err = invoke("fit", CARD_70B, "--gpu", "24GiB", "--ram", "32GiB", "--ctx", "8192",
                            "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["ngl"] == 44 and data["backends"][-1]["memory_bytes"] == 32 * GiB   # -fa auto: on
    code, out, err = invoke("measure", CARD_70B, "--gpu", "24GiB", "--ram", "32GiB", "--ngl", "44",
                            "--ctx", "8192", "--json")
    assert code == 0, err
    assert json.loads(out)["fits"] is True
