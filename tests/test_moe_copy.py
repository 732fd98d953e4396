"""CPU-resident experts copied into a device with op offload: only the experts the ids use,
grouped into runs, as ggml 0.25.3's ggml_backend_sched_compute_splits copies them (issue 21)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from ggmlrun.core.backends import costs
from ggmlrun.core.backends.spec import BackendSpec
from ggmlrun.core.run import moe_copy
from ggmlrun.models.modelfile import read_gguf
from ggmlrun.models.options.params import ModelOptions
from ggmlrun.models.run import run_model

MODEL = Path(__file__).resolve().parents[1] / "examples" / "models" / "tiny-qwen3moe-q8_0.gguf"
GiB = 1 << 30


def ggml_loop(ids: list[int], n_expert: int, expert_size: int) -> list[tuple[int, int]]:
    """ggml's loop, line by line: a bitset of the used ids, then consecutive ids grouped and
    each group set with min(expert_size, 512) bytes more unless it ends at the last expert."""
    used = [False] * n_expert
    for i in ids:
        used[i] = True
    sets = []

    def copy_experts(first, last):
        padding = min(expert_size, 512)
        sets.append((first * expert_size, (last - first + 1) * expert_size
                     + (padding if last < n_expert - 1 else 0)))
    i = 0
    while not used[i]:
        i += 1
    first = last = i
    for i in range(i + 1, n_expert):
        if not used[i]:
            continue
        if i == last + 1:
            last = i
            continue
        copy_experts(first, last)
        first = last = i
    copy_experts(first, last)
    return sets


def test_copied_spans_are_ggmls():
    rng = random.Random(21)
    for _ in range(2000):
        n_expert = rng.choice([1, 2, 8, 128])
        expert_size = rng.choice([64, 512, 2176, 100000])
        ids = [rng.randrange(n_expert) for _ in range(rng.randint(1, 3 * n_expert))]
        used = np.unique(np.array(ids, dtype=np.int32))
        assert moe_copy.copied_spans(used, n_expert, expert_size) == \
            ggml_loop(ids, n_expert, expert_size), (ids, n_expert, expert_size)


def devices():
    # offload_min_batch 1: the expert products go to the device for any batch (a CUDA device
    # offloads from 32 tokens; 1 keeps the test's batch small)
    return [BackendSpec("SIM0", "sim", 8 * GiB, 32, offload_min_batch=1, link_bw=1e9,
                        link_latency=1e-5),
            BackendSpec("CPU", "cpu", 8 * GiB, 32)]


@pytest.mark.parametrize("tokens", [[7], [1, 15, 100, 7, 42, 3]])
def test_run_copies_only_the_experts_the_ids_use(tokens, monkeypatch):
    model = read_gguf(MODEL)
    seen = []                        # what each expert copy moved, as the copy saw the ids
    original = moe_copy.copied_spans

    def spying(used, n_expert, expert_size):
        spans = original(used, n_expert, expert_size)
        seen.append((used.copy(), n_expert, expert_size, spans))
        return spans
    monkeypatch.setattr(moe_copy, "copied_spans", spying)
    logits, result = run_model(model, devices(), ModelOptions(ctx=256, n_cpu_moe=4), tokens,
                               repeat=2, warmup=1)
    sched = result.schedule
    expert_copies = [c for s in sched.splits for c in s.copies
                     if s.nodes and s.nodes[0].op == "mul_mat_id"
                     and sched.srcs_of[s.nodes[0]][0] is c]
    assert len(expert_copies) == 3 * 4 and len(seen) == 3 * 12   # up, gate, down of 4 layers
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(seen, seen[12:]))
    whole = sum(c.nbytes for s in sched.splits if s.backend == 0 for c in s.copies)
    other = whole - sum(c.nbytes for c in expert_copies)
    seen = seen[:len(expert_copies)]          # the warm-up and the runs see the same ids
    moved = sum(size for *_, spans in seen for _, size in spans)
    dev = result.timings[0]
    assert dev.copy_bytes == other + moved < whole
    for used, n_expert, expert_size, spans in seen:
        assert n_expert == 8 and 1 <= len(used) <= min(8, 2 * len(tokens))   # top-2 of 8
        assert sum(size for _, size in spans) >= len(used) * expert_size
    if len(tokens) == 1:
        assert all(len(used) == 2 for used, *_ in seen)
    # modeled: the whole copies as before, each run of experts one transfer of its bytes
    src, dst = devices()[1], devices()[0]
    modeled = (sum(costs.copy_s(sched.backends[sched.backend_of[sched.copy_source[c]]], dst,
                                c.nbytes)
                   for s in sched.splits if s.backend == 0 for c in s.copies
                   if c not in expert_copies)
               + sum(costs.copy_s(src, dst, size) for *_, spans in seen for _, size in spans))
    assert dev.copy_modeled_s == pytest.approx(modeled, rel=1e-9)
    # run --profile's bytes per route are the bytes moved too
    from ggmlrun.core.observe.profile import profile

    routes = profile(sched, result).copies
    assert sum(r.bytes for r in routes if r.dst == "SIM0") == dev.copy_bytes * result.repeat
    # the products read only the experts copied: the logits are those with every expert on
    # the device
    ref, _ = run_model(model, devices(), ModelOptions(ctx=256), tokens)
    np.testing.assert_array_equal(logits, ref)


def test_without_op_offload_nothing_is_copied_for_the_experts():
    model = read_gguf(MODEL)
    no_offload = [BackendSpec("SIM0", "sim", 8 * GiB, 32, offload_min_batch=10**9),
                  BackendSpec("CPU", "cpu", 8 * GiB, 32)]
    _, result = run_model(model, no_offload, ModelOptions(ctx=256, n_cpu_moe=4), [1, 2, 3])
    sched = result.schedule
    assert not any(s.nodes and s.nodes[0].op == "mul_mat_id" and s.backend == 0
                   for s in sched.splits)
