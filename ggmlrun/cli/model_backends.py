"""The backends a model is planned for, from the command line: `--gpu` (devices of the sim
kind), `--backends FILE` or the default set, then `--memory NAME=SIZE` and `--ram`; and where
each memory size came from, which every model command prints before its figures (a size the
user did not give is named as a default, never passed off as theirs).
"""

from __future__ import annotations

from pathlib import Path

from ggmlrun.core.util.errors import InputError


def planned_backends(backends_file, model_kw: dict, overrides, this_machine: bool = False):
    """The backends a model is planned for, where each memory size came from, and what was
    read of this machine's GPUs (None when they were not read): `--gpu` (devices GPU0.. of
    the sim kind), `--backends FILE`, else with `this_machine` (fit, measure) the GPUs found
    here with their free memory now, else the default set; then `--memory NAME=SIZE` and
    `--ram` (the CPU's). Sources: the flag, 'file NAME', 'default', 'this machine's RAM', the
    reader's name."""
    from dataclasses import replace

    from ggmlrun.cli.common import memory_size
    from ggmlrun.core.backends.spec import default_backends, default_cpu, default_sim

    gpu, ram = model_kw.get("gpu_sizes"), model_kw.get("ram_size")
    machine = None
    if gpu is not None and backends_file:
        raise InputError("--gpu describes the devices and --backends lists them: give one of "
                         "the two (or --memory NAME=SIZE to resize a device of the file)")
    if backends_file:
        from ggmlrun.core.frontend.backends_file import load_backends

        backends = load_backends(backends_file)
        given = _file_memory_keys(backends_file)
        sources = {b.name: (f"file {Path(backends_file).name}" if b.name in given
                            else "this machine's RAM" if b.kind == "cpu" else "kind default")
                   for b in backends}
    elif gpu is not None:
        parts = [p for p in str(gpu).split(",")]
        if not all(p.strip() for p in parts):
            raise InputError(f"--gpu {gpu!r}: one SIZE per device, separated by commas, e.g. "
                             f"--gpu 24GiB,12GiB")
        backends = [replace(default_sim(f"GPU{i}"), memory=memory_size(p, "--gpu"))
                    for i, p in enumerate(parts)] + [default_cpu()]
        sources = {b.name: "--gpu" for b in backends[:-1]}
        sources[backends[-1].name] = "this machine's RAM"
    elif this_machine:
        backends, sources, machine = _this_machines()
    else:
        backends = default_backends()
        sources = {backends[0].name: "default", backends[-1].name: "this machine's RAM"}
    memory = dict(overrides.memory) if overrides is not None else {}
    cpu = backends[-1].name
    if ram is not None:
        if cpu in memory:
            raise InputError(f"--ram and --memory {cpu}=... both set the host's memory: give one")
        memory[cpu] = memory_size(ram, "--ram")
    backends = _with_memory(backends, memory, machine is not None)
    if overrides is not None and overrides.threads is not None:
        backends = backends[:-1] + [replace(backends[-1], threads=overrides.threads)]
    for name in memory:
        sources[name] = "--ram" if name == cpu and ram is not None else "--memory"
    return backends, sources, machine


def _this_machines():
    """GPU0.. of the sim kind, one per GPU found here, each as large as its free memory now
    (what llama.cpp's fit plans with), then the CPU; a reader that failed is one warning."""
    from dataclasses import replace

    import click

    from ggmlrun.core.backends.spec import default_cpu, default_sim
    from ggmlrun.core.util import devices

    found = devices.find()
    for warning in found.warnings:
        click.echo(f"ggmlrun: warning: {warning}", err=True)
    backends = [replace(default_sim(f"GPU{i}"), memory=d.free)
                for i, d in enumerate(found.devices)] + [default_cpu()]
    sources = {f"GPU{i}": d.source for i, d in enumerate(found.devices)}
    sources[backends[-1].name] = "this machine's RAM"
    return backends, sources, found


def _file_memory_keys(backends_file) -> set[str]:
    """The backends a backends file gives a `memory:` (the others take their kind's default)."""
    from ggmlrun.core.frontend.yamlfile import read_yaml

    data, _ = read_yaml(backends_file)
    items = data.get("backends") if isinstance(data, dict) else None
    return {str(item.get("name")) for item in items or () if isinstance(item, dict)
            and "memory" in item}


def _with_memory(backends, memory: dict[str, int], this_machine: bool = False):
    """--memory NAME=SIZE on a model's backends (the default set when no file is given)."""
    from dataclasses import replace

    from ggmlrun.core.backends.spec import default_backends

    backends = backends or default_backends()
    names = [b.name for b in backends]
    for name in memory:
        if name not in names:
            why = ("; fit and measure of a model plan for this machine's GPUs (GPU0, ...) "
                   "unless --gpu or --backends says otherwise, not for the default SIM0"
                   if this_machine else "")
            raise InputError(f"--memory {name}=...: no backend '{name}'; backends: "
                             f"{', '.join(names)}{why}")
    return [replace(b, memory=memory[b.name]) if b.name in memory else b for b in backends]
