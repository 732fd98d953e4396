"""llama-server's host growth (models/memory/host_share.py) as JSON and as a line: upper
bounds the server grows into after it starts, beside the host's share taken at start."""

from __future__ import annotations

from ggmlrun.core.util.fmt import human_bytes
from ggmlrun.report.table import pack_line, plain


def host_growth_dict(growth, free_bytes: int) -> dict:
    """`host_growth`: `free_bytes` is what the host has left after what
    is taken at start (fit: after the margin too), `fits` whether the upper bounds fit it."""
    g = growth
    return {"upper_bounds": True, "slots": g.slots,
            "prompt_cache_bytes": g.prompt_cache_bytes, "prompt_cache_bound": g.prompt_cache_bound,
            "cache_ram_mib": g.cache_ram_mib, "checkpoint_bytes": g.checkpoint_bytes,
            "checkpoints_per_slot": g.checkpoints_per_slot,
            "checkpoints_bytes": g.checkpoints_bytes, "total_bytes": g.total_bytes,
            "host_free_bytes": free_bytes, "fits": g.total_bytes <= free_bytes}


def _cache_text(g: dict) -> list[str]:
    if g["prompt_cache_bound"] == "off":
        return ["prompt cache off", "(--cache-ram 0),"]
    if g["prompt_cache_bound"] == "cache-ram":
        return [f"prompt cache {human_bytes(g['prompt_cache_bytes'])}",
                f"(--cache-ram {g['cache_ram_mib']}),"]
    return [f"prompt cache about {human_bytes(g['prompt_cache_bytes'])}",
            f"(--cache-ram {g['cache_ram_mib']}: the context's tokens),"]


def host_growth_lines(backends, growth: dict | None, width: int = 80) -> list[str]:
    """`host CPU grows into (llama-server, upper bounds): ...` from host_growth_dict's
    record."""
    cpu = next((b for b in backends if b.kind == "cpu"), None)
    if growth is None or cpu is None:
        return []
    g, free = growth, growth["host_free_bytes"]
    ckpt = ([f"context checkpoints {human_bytes(g['checkpoints_bytes'])}",
             f"({g['slots']} slots x {g['checkpoints_per_slot']} x "
             f"{human_bytes(g['checkpoint_bytes'])});"]
            if g["checkpoint_bytes"] else ["no context checkpoints", "(the model needs none);"])
    left = "within the" if g["fits"] else "past the"
    items = ["(llama-server, upper bounds)", *_cache_text(g), *ckpt,
             f"{human_bytes(g['total_bytes'])} in all,", left,
             f"{human_bytes(max(0, free))} free after start"]
    return pack_line(f"host {plain(cpu.name)} grows into:", items, width)


def host_growth_warning(growth: dict | None) -> str | None:
    """A warning, not a failure, when only the upper bounds overrun the host: what keeps
    them within it."""
    if growth["fits"]:
        return None
    free = growth["host_free_bytes"]
    room = (free - growth["checkpoints_bytes"]) // 2**20
    fix = (f"--cache-ram {room} keeps them within it" if room > 0
           else "--cache-ram 0 and fewer --ctx-checkpoints keep them smaller")
    return (f"llama-server's prompt cache and context checkpoints may grow to "
            f"{human_bytes(growth['total_bytes'])} on the host, past the "
            f"{human_bytes(max(0, free))} left after start; {fix}")
