"""flash_attn_ext masks of every rank the docs allow (2-D [Tpad, KV], 3-D [M2, Tpad, KV],
4-D [M3, M2, Tpad, KV]) broadcast as ggml-cpu broadcasts them (sequence s reads mask batch
s mod M3, head h mask head h mod M2), in the kernel and in the reference evaluator's own
formula (core/run/reference_ops.py, which shares no code with the kernel)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ggmlrun.core.ir.graph import Tensor
from ggmlrun.core.ir.ops import get_op, make_node
from ggmlrun.core.run import reference_ops

ROOT = Path(__file__).resolve().parents[1]
PARAMS = {"scale": 0.5, "max_bias": 0.0, "logit_softcap": 0.0, "prec": "f32"}


def kernel(q, k, v, mask, **params):
    leafs = [Tensor(name=f"s{i}", shape=a.shape, dtype={np.float32: "f32", np.float16: "f16"}[
        a.dtype.type], role="input") for i, a in enumerate((q, k, v, mask))]
    node = make_node("fa", "flash_attn_ext", leafs, {**PARAMS, **params})
    out = np.empty(node.shape, np.float32)
    get_op("flash_attn_ext").kernel(out, q, k, v, mask, **node.params)
    return out


def formula(q, k, v, mask, **params):
    out = np.empty((q.shape[0], q.shape[2], q.shape[1], v.shape[-1]), np.float64)
    reference_ops.flash_attn_ext(out, q, k, v, mask, **{**PARAMS, **params})
    return out


@st.composite
def problems(draw):
    s, hkv = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    h = hkv * draw(st.integers(1, 3))
    t, kv, d = draw(st.integers(1, 4)), draw(st.integers(1, 6)), draw(st.sampled_from((4, 8)))
    rank = draw(st.sampled_from((2, 3, 4)))
    m2 = draw(st.sampled_from([x for x in range(1, h + 1) if h % x == 0])) if rank >= 3 else 1
    m3 = draw(st.sampled_from([x for x in range(1, s + 1) if s % x == 0])) if rank == 4 else 1
    tpad = t + draw(st.integers(0, 2))
    seed = draw(st.integers(0, 2**16))
    alibi = draw(st.sampled_from((0.0, 8.0)))
    return s, h, hkv, t, kv, d, rank, m2, m3, tpad, seed, alibi


def arrays(s, h, hkv, t, kv, d, rank, m2, m3, tpad, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((s, h, t, d)).astype(np.float32)
    k = rng.standard_normal((s, hkv, kv, d)).astype(np.float32)
    v = rng.standard_normal((s, hkv, kv, d)).astype(np.float32)
    full = (rng.standard_normal((m3, m2, tpad, kv)) * 3).astype(np.float16)
    full[rng.random(full.shape) < 0.3] = -np.inf
    mask = full.reshape(full.shape[4 - rank:]) if rank < 4 else full
    return q, k, v, mask, full


@given(problems())
def test_every_mask_rank_broadcasts_as_ggml_in_kernel_and_reference(p):
    *dims, seed, alibi = p
    q, k, v, mask, full = arrays(*dims, seed)
    s, h = q.shape[:2]
    tiled = np.tile(full, (s // full.shape[0], h // full.shape[1], 1, 1))   # [S, H, Tpad, KV]
    got = kernel(q, k, v, mask, max_bias=alibi)
    want = formula(q, k, v, tiled, max_bias=alibi)
    assert np.allclose(got, want, rtol=0, atol=1e-5 * max(1.0, np.abs(want).max()))
    assert np.allclose(formula(q, k, v, mask, max_bias=alibi), want, rtol=0, atol=1e-12)


def test_a_3d_mask_of_2_heads_over_4_heads_gives_each_head_its_mask_head():
    q, k, v, mask, _ = arrays(1, 4, 2, 3, 5, 8, 3, 2, 1, 3, 7)
    got = kernel(q, k, v, mask)
    for h in range(4):          # head h alone, with mask head h mod 2 as a 2-D mask
        one = kernel(q[:, h:h + 1], k[:, h // 2:h // 2 + 1], v[:, h // 2:h // 2 + 1],
                     np.ascontiguousarray(mask[h % 2]))
        assert np.allclose(got[:, :, h], one[:, :, 0], rtol=0, atol=1e-6)


def test_run_check_of_a_graph_with_a_2d_mask_passes_against_the_independent_reference(tmp_path):
    path = tmp_path / "fa.yaml"
    path.write_text(
        "backends:\n  - {name: CPU, kind: cpu}\ntensors:\n"
        "  q: {shape: [1, 4, 3, 8]}\n  k: {shape: [1, 2, 5, 8], dtype: f16}\n"
        "  v: {shape: [1, 2, 5, 8], dtype: f16}\n"
        "  m: {shape: [2, 3, 5], dtype: f16, init: uniform, low: -4, high: 4}\n"
        "nodes:\n  - {name: o, op: flash_attn_ext, src: [q, k, v, m], params: {scale: 0.3}}\n")
    proc = subprocess.run([sys.executable, "-m", "ggmlrun", "run", str(path), "--check"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-400:]
