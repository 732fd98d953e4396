"""llama.cpp's lfm2moe (src/models/lfm2moe.cpp; LFM2-8B-A1B, LFM2-24B-A2B): lfm2's hybrid
layers (llama.cpp reuses lfm2's graph, models/arch/lfm2.py here) with, after the first
leading_dense_block_count layers, routed experts in place of the dense FFN: expert_gating_func
(required: sigmoid in the real files, or softmax), a selection bias (exp_probs_b), the top
expert_used_count weights normalised, not scaled (the key is not read)."""

from __future__ import annotations

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.arch import lfm2
from ggmlrun.models.arch.base import ROPE_TYPE_NEOX, Arch
from ggmlrun.models.hparams.record import HParams
from ggmlrun.models.hparams.rules import check_experts

GATING = {1: "softmax", 2: "sigmoid"}     # LLAMA_EXPERT_GATING_FUNC_TYPE_*


def read_hparams(get, common: dict) -> HParams:
    func = get("expert_gating_func")
    if func not in GATING:
        raise InputError(f"lfm2moe.expert_gating_func {func} is not built (softmax 1, sigmoid 2)")
    n_expert, n_used = int(get("expert_count", 0) or 0), int(get("expert_used_count", 0) or 0)
    n_ff_exp = check_experts("lfm2moe", n_expert, n_used, common["n_ff"],
                             get("expert_feed_forward_length"), derive_width=False)
    return lfm2.read_hparams(get, common, n_expert=n_expert, n_expert_used=n_used,
                             n_ff_exp=n_ff_exp, gating=GATING[func],
                             n_layer_dense_lead=min(int(get("leading_dense_block_count", 0)),
                                                    common["n_layer"]))


ARCH = Arch(name="lfm2moe", rope_type=ROPE_TYPE_NEOX, tensors=lfm2.tensors, build=lfm2.build,
            read_hparams=read_hparams, hybrid=True, per_layer=lfm2.ARCH.per_layer)
