"""llama.cpp's sizes of a sequence's state, for tests/test_host_share.py: what llama-server's
context checkpoint holds (llama_state_seq_get_size_ext with LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
and what its prompt cache copies (flags 0), after a prompt of N tokens in sequence 1 of a
context with llama-server's -np auto (4 sequences, one unified KV cache), on the CPU alone.
N is past every tiny model's window, so an SWA model's checkpoint holds its whole window.

The models: a dense llama (no checkpoint: its partial state is the full cache's), gemma3 and
gpt-oss (iSWA: the SWA cache's window), llama4 (chunked SWA), lfm2 and granitehybrid (hybrid:
the recurrent state), qwen35 (hybrid with M-RoPE cells), each with flash attention on and off;
gemma3 and qwen35 with a q8_0 K and V cache too.
Needs llama-cpp-python 0.3.36.

    python3 scripts/llamacpp/record_host_share.py   # -> tests/data/llamacpp/host_share.json
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "tests" / "data" / "llamacpp" / "host_share.json"
EXAMPLES = REPO / "examples" / "models"
MODELS = ("tiny-llama-f16", "tiny-gemma3-q8_0", "tiny-gpt-oss-f16", "tiny-llama4-f16",
          "tiny-lfm2-f16", "tiny-granitehybrid-f16", "tiny-qwen35-q8_0")
CTX, TOKENS, SEQ, N_SEQ = 1024, 300, 1, 4


def sizes(model_name: str, flash_attn: bool, kv_type: str = "f16") -> dict:
    import llama_cpp as L

    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = L.llama_model_load_from_file(str(EXAMPLES / f"{model_name}.gguf").encode(), mp)
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = CTX, 512, 512, N_SEQ
    cp.kv_unified = True
    cp.type_k = cp.type_v = {"f16": L.GGML_TYPE_F16, "q8_0": L.GGML_TYPE_Q8_0}[kv_type]
    cp.flash_attn_type = (L.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn
                          else L.LLAMA_FLASH_ATTN_TYPE_DISABLED)
    ctx = L.llama_init_from_model(model, cp)
    batch = L.llama_batch_init(TOKENS, 0, 1)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    for i in range(TOKENS):
        batch.token[i] = (7 * i + 3) % n_vocab
        batch.pos[i] = i
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = SEQ
        batch.logits[i] = i == TOKENS - 1
    batch.n_tokens = TOKENS
    if L.llama_decode(ctx, batch) != 0:
        raise RuntimeError(f"{model_name}: llama_decode failed")
    out = {"model": model_name, "flash_attn": flash_attn, "kv_type": kv_type, "ctx": CTX, "tokens": TOKENS,
           "parallel": N_SEQ,
           "full_bytes": L.llama_state_seq_get_size_ext(ctx, SEQ, L.LLAMA_STATE_SEQ_FLAGS_NONE),
           "partial_bytes": L.llama_state_seq_get_size_ext(
               ctx, SEQ, L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)}
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    return out


def main() -> None:
    entries = [sizes(m, fa) for m in MODELS for fa in (True, False)]
    entries += [sizes(m, True, "q8_0") for m in ("tiny-gemma3-q8_0", "tiny-qwen35-q8_0")]
    OUT.write_text(json.dumps({"llama_cpp_python": "0.3.36", "entries": entries}, indent=1)
                   + "\n")
    print(f"{len(entries)} entries -> {OUT}")


if __name__ == "__main__":
    main()
