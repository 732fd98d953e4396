"""Pipeline parallelism as llama.cpp decides it and ggml's scheduler does it (issue 23): the
conditions, the n_copies copies of every split input and graph input, and their lifetimes in
the allocator. The bytes are checked against llama.cpp in test_llamacpp_figures.py (the ts
configurations with --ngl all) and test_llamacpp_devices.py (Llama-3-8B dimensions)."""

from dataclasses import replace
from pathlib import Path

import pytest

from ggmlrun.core.backends.spec import BackendSpec
from ggmlrun.core.memory.alloc import GraphAllocator
from ggmlrun.core.memory.sequence import allocation_sequence
from ggmlrun.core.sched.scheduler import Scheduler
from ggmlrun.models.load import load_model
from ggmlrun.models.options.params import ModelOptions
from ggmlrun.models.reserve import measure_model, pipeline_copies

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "examples" / "models" / "tiny-llama-f16.gguf"


def devices(n: int) -> list[BackendSpec]:
    rpc = [replace(BackendSpec.of_kind(f"RPC{i}", "sim"), alignment=32, offload_min_batch=10**9)
           for i in range(n)]
    return rpc + [replace(BackendSpec.of_kind("CPU", "cpu"), alignment=32, repack="none")]


@pytest.mark.parametrize("n_devices, opts, copies", [
    (2, ModelOptions(ctx=256, ubatch=32), 4),                         # every layer, 2 devices
    (2, ModelOptions(ctx=256, ubatch=32, sched_copies=2), 2),         # -DGGML_SCHED_MAX_COPIES=2
    (2, ModelOptions(ctx=256, ubatch=32, sched_copies=1), 1),         # off
    (1, ModelOptions(ctx=256, ubatch=32), 1),                         # one device
    (2, ModelOptions(ctx=256, ubatch=32, ngl=4), 1),                  # the first layer on the CPU
    (2, ModelOptions(ctx=256, ubatch=32, ngl=5), 4),                  # ngl past n_layer: all
    (2, ModelOptions(ctx=256, ubatch=32, no_kv_offload=True), 1),     # -nkvo
    (2, ModelOptions(ctx=256, ubatch=32, overrides=(("ffn_.*", "CPU"),)), 1),   # -ot
])
def test_when_llamacpp_turns_it_on(n_devices, opts, copies):
    model = load_model(TINY)
    backends = devices(n_devices)
    assert pipeline_copies(model, backends, opts) == copies
    assert measure_model(model, backends, opts).n_copies == copies


def test_the_copies_and_their_lifetimes():
    """n_copies of every split input (on its split's backend) and of every INPUT leaf (on the
    CPU; copy 0 is the leaf itself), placed before the graph's own leafs and never freed."""
    model = load_model(TINY)
    backends = devices(2)
    opts = ModelOptions(ctx=256, ubatch=32)
    sched = measure_model(model, backends, opts).schedule
    inputs = [t for t in sched.leaf_order if t.role == "input"]
    split_inputs = [(s.backend, src, copy) for s in sched.splits for src, copy in s.copy_of.items()]
    assert sched.n_copies == 4
    assert len(sched.parallel_leafs) == 4 * (len(inputs) + len(split_inputs))
    names = [t.name for t in sched.parallel_leafs]
    assert names[:4] == [inputs[0].name] + [f"CPU#{inputs[0].name}#{c}" for c in (1, 2, 3)]
    b, src, copy = split_inputs[0]
    k = names.index(copy.name)
    assert names[k + 1:k + 4] == [f"{backends[b].name}#{src.name}#{c}" for c in (1, 2, 3)]
    plan = GraphAllocator([b.alignment for b in backends]).plan(*allocation_sequence(sched))
    kept = {id(plan.slot_of[t]) for t in sched.parallel_leafs}
    assert all(slot.died is None for slot in plan.slots if id(slot) in kept)
    assert not plan.overlaps()
    # nothing reuses a copy's bytes in place
    assert not any(parent in sched.parallel_leafs for _, parent in plan.inplace)


def test_one_copy_is_the_old_schedule():
    model = load_model(TINY)
    backends = devices(2)
    one = measure_model(model, backends, ModelOptions(ctx=256, ubatch=32, sched_copies=1,
                                                      flash_attn=False, parallel=1))
    assert one.schedule.parallel_leafs == [] and one.n_copies == 1
    assert [b.arena_bytes for b in one.backends] == [205184, 205312, 57984]


def test_scheduler_copies_on_a_graph_file():
    """The scheduler takes n_copies for any graph: a graph file's inputs and split inputs get
    their copies the same way (0.25.3 rules)."""
    from ggmlrun.core.frontend.loader import load_graph

    graph = load_graph(REPO / "graphs" / "mlp.yaml")
    backends = [BackendSpec.of_kind("SIM0", "sim"), BackendSpec.of_kind("CPU", "cpu")]
    one = Scheduler(backends).schedule(graph)
    four = Scheduler(backends, n_copies=4).schedule(graph)
    n_inputs = len([t for t in graph.leafs if t.role == "input"])
    assert len(four.parallel_leafs) == 4 * (n_inputs + one.copy_count)
    a1 = GraphAllocator([b.alignment for b in backends]).plan(*allocation_sequence(one))
    a4 = GraphAllocator([b.alignment for b in backends]).plan(*allocation_sequence(four))
    assert all(x <= y for x, y in zip(a1.arena_bytes, a4.arena_bytes))
    with pytest.raises(Exception):
        Scheduler(backends, n_copies=0)


def test_fit_counts_the_copies():
    """Llama-3-8B Q4_K_M on two 3.8 GiB devices: every layer would fit without the copies
    (--sched-copies 1: -ngl 33) but not with them; one layer fewer turns them off (-ngl 32)."""
    import json

    from tests.clikit import invoke

    card = REPO / "ggmlrun" / "models" / "cards" / "llama-3-8b-q4_k_m.yaml"
    args = ["--gpu", "3.8GiB,3.8GiB", "--ram", "32GiB", "--flash-attn", "off", "--parallel", "1",
            "--json"]
    answers = {}
    for copies in ("4", "1"):
        code, out, err = invoke("fit", card, *args, "--sched-copies", copies)
        assert code == 0, err
        answers[copies] = json.loads(out)["ngl"]
    assert answers == {"4": 32, "1": 33}
