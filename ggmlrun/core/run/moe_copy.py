"""Copying CPU-resident experts into the device that computes their mul_mat_id, as ggml does.

With `--cpu-moe` / `--n-cpu-moe` (or `-ot exps=CPU`) and op offload, a prompt's mul_mat_id runs
on the device and its expert weights are a split input. ggml 0.25.3's
ggml_backend_sched_compute_splits does not copy the whole [E, M, K] tensor then: when the
input is a weight in a host buffer and the split's first node is a MUL_MAT_ID reading the copy
as src[0], it reads the ids (src[2]; the original when the ids are themselves an input of the
split), marks the experts used, and copies each run of consecutive used experts with one
tensor_set, plus min(expert bytes, 512) bytes of the next expert (padding MMQ reads; none after
the last expert). A batch of few tokens uses few experts, so the copy is a fraction of the
tensor; ids with no elements copy nothing. The allocation is still the whole tensor.

The bytes each run moved are counted as it moves them, and the modeled seconds are one link
transfer per run of experts (each tensor_set is its own transfer), in place of the whole
tensor's.
"""

from __future__ import annotations

import numpy as np

from ggmlrun.core.backends import costs

PADDING = 512                 # ggml: std::min<size_t>(expert_size, 512)


def expert_runs(used: np.ndarray) -> list[tuple[int, int]]:
    """(first, last) of each run of consecutive ids in the sorted, distinct `used`."""
    if used.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(used) != 1)
    firsts = np.concatenate(([used[0]], used[breaks + 1]))
    lasts = np.concatenate((used[breaks], [used[-1]]))
    return list(zip(firsts.tolist(), lasts.tolist()))


def copied_spans(used: np.ndarray, n_expert: int, expert_size: int) -> list[tuple[int, int]]:
    """(byte offset, bytes) of each tensor_set ggml makes for these used experts."""
    padding = min(expert_size, PADDING)
    return [(first * expert_size,
             (last - first + 1) * expert_size + (padding if last < n_expert - 1 else 0))
            for first, last in expert_runs(used)]


def expert_copy(executor, step):
    """The copy step as ggml runs it when it copies only the used experts (a function of no
    arguments that moves and counts the bytes), or None where ggml copies the whole tensor."""
    sched = executor.schedule
    split = sched.splits[step.split]
    copy = step.tensor
    if not split.nodes or split.nodes[0].op != "mul_mat_id":
        return None
    node = split.nodes[0]
    srcs = sched.srcs_of[node]
    if srcs[0] is not copy:
        return None
    source = sched.copy_source[copy]
    if source.role != "weight" or source.is_view:
        return None
    src_backend = sched.backend_of[source]
    src_spec, dst_spec = sched.backends[src_backend], sched.backends[step.backend]
    if src_spec.kind != "cpu":                 # a host buffer: the CPU's
        return None
    ids = executor.views[sched.copy_source.get(srcs[2], srcs[2])]
    n_expert, expert_size = source.shape[0], source.strides[0]
    src_buf, src_off = executor._root_location(source)
    dst_buf, dst_off = executor._root_location(copy)
    b = step.backend
    linked = not (src_spec.kind == "cpu" and dst_spec.kind == "cpu")
    whole_s = costs.copy_s(src_spec, dst_spec, copy.nbytes) if linked else 0.0
    count, nbytes, saved = executor.moved_count, executor.moved_bytes, executor.moved_saved_s
    by_copy = executor.moved_by_copy

    def move():
        if ids.size == 0:
            by_copy.setdefault(copy, 0)
            return                             # ggml: `continue`, nothing copied
        used = np.unique(ids)
        if used[0] < 0 or used[-1] >= n_expert:
            bad = used[0] if used[0] < 0 else used[-1]
            raise ValueError(f"expert id {int(bad)} is out of range [0, {n_expert})")
        moved, modeled = 0, 0.0
        for offset, size in copied_spans(used, n_expert, expert_size):
            dst_buf[dst_off + offset:dst_off + offset + size] = \
                src_buf[src_off + offset:src_off + offset + size]
            moved += size
            modeled += costs.copy_s(src_spec, dst_spec, size) if linked else 0.0
        count[b] += 1
        nbytes[b] += moved
        by_copy[copy] = by_copy.get(copy, 0) + moved
        saved[b] += whole_s - modeled
    return move
