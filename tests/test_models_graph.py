"""llama.cpp's llama graph: node counts, order, names, shapes; placement; reserve figures.

The expected node lists are read off llama.cpp 0.3.36's sources (src/models/llama.cpp,
llama-graph.cpp, llama-kv-cache.cpp) and ggml's depth-first graph walk; tests/
test_models_oracle.py compares with llama.cpp's own dumps where they exist.
"""

from __future__ import annotations

import pytest

from ggmlrun.core.backends.spec import BackendSpec
from ggmlrun.core.ir.ops import OPS
from ggmlrun.core.ir.ops.registry import make_node
from ggmlrun.core.util.errors import InputError
from ggmlrun.models.arch.build import build_graph
from ggmlrun.models.modelfile import read_gguf
from ggmlrun.models.options.params import ModelOptions, kv_size, ubatch_size
from ggmlrun.models.memory.placement import place, split_points
from ggmlrun.models.reserve import measure_model
from tests.test_models_gguf import write_tiny_llama

GiB = 1 << 30


@pytest.fixture(scope="module")
def gqa(tmp_path_factory):
    return read_gguf(write_tiny_llama(tmp_path_factory.mktemp("m") / "gqa.gguf", n_layer=3))


def rpc_backends(*memories):
    devs = [BackendSpec(name=f"RPC{i}", kind="sim", memory=m, alignment=32,
                        offload_min_batch=1 << 40) for i, m in enumerate(memories or (64 * GiB,))]
    return devs + [BackendSpec(name="CPU", kind="cpu", memory=64 * GiB, alignment=32)]


LAYER = ["norm", "attn_norm", "Qcur", "Qcur", "Qcur", "Vcur", "Vcur", "Kcur", "Kcur", "Kcur"]
NO_FA = ["Kcur (view)", "cache_k (view)", "Vcur (reshaped)", "Vcur (reshaped) (reshaped)",
         "cache_v (reshaped)", "cache_v (reshaped) (view)", "cache_v (view)",
         "cache_v (view) (permuted)", "cache_k (view)", "cache_k (view) (permuted)",
         "Qcur (view)", "Qcur (view) (permuted)", "kq", "kq_soft_max", "kqv", "kqv (permuted)",
         "kqv_out"]
FA = ["Kcur (view)", "cache_k (view)", "Vcur (view)", "cache_v (view)", "Qcur (view)",
      "Qcur (view) (permuted)", "cache_k (view)", "cache_k (view) (permuted)", "cache_v (view)",
      "cache_v (view) (permuted)", "node", "kqv_out"]
FFN = ["attn_out", "ffn_inp", "norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_swiglu", "ffn_out",
       "l_out"]


def _generic(name: str) -> str:
    """Layer numbers out: "Qcur-0 (view)" -> "Qcur (view)", "cache_k_l1" -> "cache_k"."""
    import re
    name = re.sub(r"-\d+", "", name)
    name = re.sub(r"_l\d+", "", name)
    return re.sub(r"node_\d+", "node", name)


@pytest.mark.parametrize("flash_attn", [False, True])
def test_node_list_is_llama_cpps(gqa, flash_attn):
    mg = build_graph(gqa, 32, 32, 256, 256, flash_attn, "f16")
    names = [_generic(n.name) for n in mg.graph.nodes]
    attn = FA if flash_attn else NO_FA
    layer = LAYER + attn + FFN
    last = LAYER + attn + ["attn_out", "node", "node"] + FFN[1:]
    assert names == ["embd"] + layer * 2 + last + ["norm", "result_norm", "result_output"]
    assert len(mg.graph.nodes) == 1 + 3 * len(layer) + 2 + 3
    leafs = [t.name for t in mg.graph.leafs[:13]]
    assert leafs[:6] == ["token_embd.weight", "inp_tokens", "inp_embd", "blk.0.attn_q.weight",
                         "blk.0.attn_norm.weight", "inp_pos"]
    assert {"attn_inp_k_idxs", "attn_inp_v_idxs", "attn_inp_kq_mask"} <= set(leafs)
    assert "out_ids" in [t.name for t in mg.graph.leafs]


def test_shapes_types_and_cache(gqa):
    mg = build_graph(gqa, 32, 32, 512, 512, False, "f16")
    g = mg.graph
    by = {n.name: n for n in g.nodes}
    assert by["kq-0"].shape == (1, 4, 32, 512)            # [1, n_head, T, n_kv]
    assert by["kqv_out-0"].shape == (32, 64)
    assert by["result_output"].shape == (32, 300)
    cache = mg.cache.k[0]
    assert (cache.name, cache.shape, cache.dtype, cache.role) == \
        ("cache_k_l0", (1, 512, 32), "f16", "weight")
    inputs = {t.name: t for t in g.inputs}
    assert inputs["attn_inp_kq_mask"].shape == (1, 1, 32, 512)
    assert inputs["attn_inp_kq_mask"].dtype == "f32"
    assert inputs["attn_inp_v_idxs"].shape == (32 * 32,) and inputs["attn_inp_v_idxs"].dtype == "i64"
    fa = build_graph(gqa, 1, 1, 512, 512, True, "q8_0").graph
    assert {t.name: t.dtype for t in fa.inputs}["attn_inp_kq_mask"] == "f16"
    assert [o.name for o in fa.outputs] == ["result_norm", "result_output"]


def test_registered_ops_agree_with_the_builder(gqa):
    """Every node whose op the registry knows re-infers to the builder's shape and layout."""
    for flash_attn in (False, True):
        for node in build_graph(gqa, 32, 32, 256, 256, flash_attn, "f16").graph.nodes:
            spec = OPS.get(node.op)
            if spec is None or (node.op == "cont" and "shape" not in spec.params):
                continue
            made = make_node(node.name, node.op, node.src, node.params)
            assert (made.shape, made.dtype, made.strides, made.view_src, made.view_offset) == \
                (node.shape, node.dtype, node.strides, node.view_src, node.view_offset), node.name


def test_ngl_counts_the_output_layer(gqa):
    hp = gqa.hparams                                  # 3 layers
    b = rpc_backends()
    p = place(hp, gqa.tensors, b, ModelOptions(ngl=2))
    assert p.layer == [1, 1, 0] and p.output == 0 and not p.full_offload
    assert p.weights["token_embd.weight"] == 1 and p.weights["output.weight"] == 0
    assert p.weights["blk.2.ffn_up.weight"] == 0 and p.kv == [1, 1, 0]
    full = place(hp, gqa.tensors, b, ModelOptions())
    assert full.layer == [0, 0, 0] and full.full_offload
    assert place(hp, gqa.tensors, b, ModelOptions(ngl=0)).layer == [1, 1, 1]
    nkvo = place(hp, gqa.tensors, b, ModelOptions(no_kv_offload=True))
    assert nkvo.kv == [1, 1, 1] and nkvo.layer == [0, 0, 0]


def test_tensor_split_and_overrides(gqa):
    hp = gqa.hparams
    b = rpc_backends(8 * GiB, 24 * GiB)
    assert split_points(b[:2], None) == [0.25, 1.0]
    p = place(hp, gqa.tensors, b, ModelOptions())     # 4 offloaded layers incl. output
    assert p.layer == [0, 1, 1] and p.output == 1
    p = place(hp, gqa.tensors, b, ModelOptions(tensor_split=(1.0, 1.0)))
    assert p.layer == [0, 0, 1] and p.output == 1
    p = place(hp, gqa.tensors, b, ModelOptions(overrides=((r"ffn_(up|down)", "CPU"),
                                                           (r"blk\.0\.", "RPC1"))))
    assert p.weights["blk.0.ffn_up.weight"] == 2 and p.weights["blk.0.attn_q.weight"] == 1
    with pytest.raises(InputError, match="unknown backend 'GPU9'"):
        place(hp, gqa.tensors, b, ModelOptions(overrides=(("x", "GPU9"),)))
    with pytest.raises(InputError, match="tensor-split has 1 values"):
        place(hp, gqa.tensors, b, ModelOptions(tensor_split=(1.0,)))


def test_context_and_ubatch_clamps():
    assert kv_size(ModelOptions(ctx=300), 2048) == 512
    assert kv_size(ModelOptions(), 8192) == 4096 and kv_size(ModelOptions(), 100) == 256
    assert ubatch_size(ModelOptions(ctx=100, ubatch=512), 2048) == 100


def test_measure_figures(gqa):
    b = rpc_backends()
    fa_off = dict(flash_attn=False, parallel=1)       # the node count is the non-FA graph's
    cpu_only = measure_model(gqa, b, ModelOptions(ctx=256, ubatch=32, ngl=0, **fa_off))
    assert cpu_only.n_splits == 1 and cpu_only.n_nodes == 1 + 3 * 36 + 2 + 3
    rpc, cpu = cpu_only.backends
    assert rpc.weights_bytes == rpc.kv_bytes == rpc.arena_bytes == 0
    assert cpu.kv_bytes == 3 * 2 * 256 * 32 * 2              # layers x (K, V) x cells x gqa x f16
    first = min(t.offset for t in gqa.tensors.values())
    last = max(t.offset + 4 * _n(t.shape) for t in gqa.tensors.values())
    assert cpu.weights_bytes == last - first                 # the mmap'd range
    full = measure_model(gqa, b, ModelOptions(ctx=256, ubatch=32, **fa_off))
    assert full.n_splits == 2 and full.ngl == 4
    rpc, cpu = full.backends
    assert cpu.kv_bytes == 0 and rpc.kv_bytes == 3 * 2 * 256 * 32 * 2
    assert cpu.weights_bytes == 300 * 64 * 4                 # only the input layer stays
    assert rpc.arena_bytes > 0 and cpu.arena_bytes > 0


def test_tied_output_is_duplicated_on_the_device(tmp_path):
    m = read_gguf(write_tiny_llama(tmp_path / "t.gguf", tied=True))
    b = rpc_backends()
    full = measure_model(m, b, ModelOptions(ctx=256, ubatch=32))
    assert full.backends[0].weights_bytes >= 300 * 64 * 4     # the duplicate
    assert full.backends[1].weights_bytes == 300 * 64 * 4
    cpu = measure_model(m, b, ModelOptions(ctx=256, ubatch=32, ngl=1))
    assert cpu.backends[0].weights_bytes == (300 + 1) * 64 * 4   # output layer: dup + norm


def test_bad_options(gqa):
    with pytest.raises(InputError, match="needs --flash-attn on"):
        measure_model(gqa, rpc_backends(), ModelOptions(kv_type="q8_0", flash_attn=False))
    with pytest.raises(InputError, match="--cache-type-k q4"):
        measure_model(gqa, rpc_backends(), ModelOptions(kv_type="q4"))


def _n(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def test_op_offload_and_its_switch(gqa):
    """A device with ggml's op offload (batch >= 32) takes the CPU layers' matrix products."""
    b = [BackendSpec(name="SIM0", kind="sim", memory=8 * GiB, alignment=32),
         BackendSpec(name="CPU", kind="cpu", memory=8 * GiB, alignment=32)]
    on = measure_model(gqa, b, ModelOptions(ctx=256, ubatch=32, ngl=0))
    off = measure_model(gqa, b, ModelOptions(ctx=256, ubatch=32, ngl=0, op_offload=False))
    assert on.n_splits > 1 and on.backends[0].arena_bytes > 0
    assert off.n_splits == 1 and off.backends[0].arena_bytes == 0
    assert on.backends[0].weights_bytes == off.backends[0].weights_bytes == 0
