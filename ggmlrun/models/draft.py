"""The draft model of speculative decoding (-md), as llama.cpp loads it beside the target.

llama-server (and llama-cli) build the draft's context from the target's own parameters
(common/speculative.cpp, common_base_params_to_speculative and
common_speculative_init_result): everything the target was given (flash attention, -ub, -b,
-np, -kvu, --swa-full, -nkvo, --no-mmap, -ts, the devices) except

* -ngl: the draft's -ngld, whose default (-1) loads every layer when llama.cpp's own --fit is
  off (llama_model::n_gpu_layers);
* the tensor overrides: the draft's own (none), so --cpu-moe, --n-cpu-moe and -ot stay the
  target's;
* the KV types: -ctkd/-ctvd (f16 by default, whatever the target's -ctk/-ctv);
* the context: llama_n_ctx of the target's context (the target's n_ctx after llama.cpp pads
  it, n_ctx_seq x n_seq_max with a stream per sequence); the vendored llama.cpp has no -cd;
* n_outputs_max = -np (one output per sequence): the pp reserve's outputs are
  min(n_ubatch, -np), not the ubatch's, so the draft's output projection is reserved for as
  many rows as there are sequences.

So the draft is measured by the same reserve as any model (reserve.measure_model) with these
options. A draft whose vocabulary does not match the target's is refused as
common_speculative_are_compatible refuses it (llama-server then logs the error, frees the
draft and serves without speculation).
"""

from __future__ import annotations

from dataclasses import replace

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.options.params import ModelOptions, kv_size, kv_streams, seq_max

SPEC_VOCAB_MAX_SIZE_DIFFERENCE = 128       # common/speculative.cpp
SPEC_VOCAB_CHECK_START_TOKEN_ID = 5

# llama_vocab::load: tokenizer.ggml.model -> (vocab type, default BOS id, default EOS id);
# None: LLAMA_TOKEN_NULL
_TOKENIZERS = {"no_vocab": ("none", None, None), "none": ("none", None, None),
               "llama": ("spm", 1, 2), "bert": ("wpm", 101, None),
               "gpt2": ("bpe", 11, 11), "hybriddna": ("bpe", 11, 11),
               "whitespace": ("bpe", 11, 11), "gemma4": ("bpe", None, None),
               "t5": ("ugm", None, 1), "rwkv": ("rwkv", None, None),
               "test": ("test", None, None), "plamo2": ("plamo2", 1, 2)}
# the defaults of add_bos / add_eos per vocab type (a BPE vocabulary's by its pre-tokenizer)
_ADD = {"spm": (True, False), "wpm": (True, False), "ugm": (False, True),
        "rwkv": (False, False)}
_BPE_ADD_BOS = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                "midm-2.0", "lfm2", "jina-v5-nano", "tekken"}
_BPE_NO_BOS = {"chatglm-bpe", "glm4", "glm5"}


def has_draft(opts: ModelOptions) -> bool:
    return opts.model_draft is not None


def check_draft_options(opts: ModelOptions) -> None:
    """The draft's options without -md: llama.cpp takes them and they change nothing, which
    someone who typed them would not expect; refused."""
    if has_draft(opts):
        return
    for name, flag in (("ngl_draft", "--gpu-layers-draft"), ("ctx_draft", "--ctx-draft"),
                       ("type_k_draft", "--cache-type-k-draft"),
                       ("type_v_draft", "--cache-type-v-draft"),
                       ("devices_draft", "--device-draft")):
        if getattr(opts, name) != getattr(ModelOptions(), name):
            raise InputError(f"{flag} applies to a draft model: give --model-draft MODEL (-md)")


def target_n_ctx(opts: ModelOptions, n_ctx_train: int) -> int:
    """llama_n_ctx(ctx_tgt): the target's context as llama_context made it (padded to 256;
    with a stream per sequence, the padded per-sequence context times the sequences)."""
    return kv_size(opts, n_ctx_train) * kv_streams(opts)


def draft_options(opts: ModelOptions, target_hp) -> ModelOptions:
    """The draft's options from the target's, as common_base_params_to_speculative and
    common_speculative_init_result derive them (module docstring). With -devd the target's
    -ts is read over the draft's devices as llama.cpp reads its float array: the first
    proportions, one per device (all 0: by memory, as no -ts). The projector is the
    target's alone (llama-server gives libmtmd the target's --mmproj, or -hf's repository's)."""
    ctx = opts.ctx_draft if opts.ctx_draft is not None else target_n_ctx(opts,
                                                                          target_hp.n_ctx_train)
    split = opts.tensor_split
    if opts.devices_draft is not None and split is not None:
        split = tuple(split[:len(opts.devices_draft)])
        split += (0.0,) * (len(opts.devices_draft) - len(split))
        split = split if any(split) else None
    return replace(opts, ngl=opts.ngl_draft, ctx=ctx, type_k=opts.type_k_draft,
                   type_v=opts.type_v_draft, overrides=(), cpu_moe=False, n_cpu_moe=0,
                   tensor_split=split, model_draft=None, ngl_draft=None, ctx_draft=None,
                   devices_draft=None, mmproj=None, no_mmproj=True)


def draft_backends(backends: list, opts: ModelOptions) -> list:
    """The backends the draft is loaded on: -devd's devices in its order (none: no device),
    then the CPU; without -devd, the target's."""
    if opts.devices_draft is None:
        return backends
    by_name = {b.name: b for b in backends}
    return [by_name[name] for name in opts.devices_draft] + [backends[-1]]


def draft_outputs(opts: ModelOptions) -> int:
    """The draft context's n_outputs_max: one output per sequence (-np)."""
    return seq_max(opts)


def measure_draft(draft, backends, opts: ModelOptions, target_hp, enough=None):
    """The draft's figures (reserve.ModelMeasure) beside a target with options `opts`."""
    import re

    from ggmlrun.models.reserve import BackendFigures, measure_model

    own = draft_backends(backends, opts)
    try:
        m = measure_model(draft, own, draft_options(opts, target_hp), enough,
                          outputs_max=draft_outputs(opts))
    except InputError as err:      # reserve names the target's flags: these are the draft's
        said = re.sub(r"--cache-type-([kv])", r"--cache-type-\1-draft", err.message)
        raise InputError(f"the draft {draft.name}: {said}", file=err.file) from None
    if own is backends:
        return m
    rows = {r.name: r for r in m.backends}       # -devd: nothing on the others
    return replace(m, backends=[rows.get(b.name) or BackendFigures(
        name=b.name, kind=b.kind, weights_bytes=0, kv_bytes=0, arena_bytes=0,
        memory_bytes=b.memory, kv_linear_bytes=0) for b in backends])


# --- the vocabularies ---------------------------------------------------------------------------
def _vocab(model) -> dict | None:
    """What common_speculative_are_compatible compares, from the GGUF's metadata (llama_vocab's
    defaults per tokenizer, then the file's keys); None for a model card (no vocabulary)."""
    kv = model.kv
    if kv is None:
        return None
    name = kv.get("tokenizer.ggml.model")
    if name is None or name not in _TOKENIZERS:
        return None
    vtype, bos, eos = _TOKENIZERS[name]
    pre = kv.get("tokenizer.ggml.pre", "default")
    add_bos, add_eos = _ADD.get(vtype, (False, False))
    if vtype == "bpe":
        add_bos, add_eos = pre in _BPE_ADD_BOS, False
        if pre in _BPE_NO_BOS:
            bos = None
    n_vocab = model.hparams.n_vocab
    bos = None if bos is not None and bos >= n_vocab else bos
    eos = None if eos is not None and eos >= n_vocab else eos
    bos = kv.get("tokenizer.ggml.bos_token_id", bos)
    eos = kv.get("tokenizer.ggml.eos_token_id", eos)
    add_bos = bool(kv.get("tokenizer.ggml.add_bos_token", add_bos))
    add_eos = bool(kv.get("tokenizer.ggml.add_eos_token", add_eos))
    if pre == "gemma4":
        add_bos = True
    return {"type": vtype, "add_bos": add_bos, "bos": bos, "add_eos": add_eos, "eos": eos,
            "n_vocab": n_vocab}


def check_compatible(target, draft) -> None:
    """common_speculative_are_compatible's checks, in its order: the vocab type, BOS (added
    or not, and its id when added), EOS alike, the sizes at most 128 apart, and every token's
    text from id 5 on equal (read from local files; a remote model's texts are not fetched,
    so that check is skipped for it). A model card has no vocabulary: only the sizes."""
    said = (f"the draft {draft.name} does not match the target {target.name}: llama.cpp "
            f"refuses it for speculation (")
    end = "); llama-server would load it, then free it and serve without a draft"
    t, d = _vocab(target), _vocab(draft)
    if t is not None and d is not None:
        if t["type"] != d["type"]:
            raise InputError(f"{said}vocab type {d['type']} against {t['type']}{end}")
        for side in ("bos", "eos"):
            add = f"add_{side}"
            if t[add] != d[add] or (t[add] and t[side] != d[side]):
                raise InputError(f"{said}{side.upper()} token: add {int(d[add])}, id {d[side]} "
                                 f"against add {int(t[add])}, id {t[side]}{end}")
    n_t, n_d = target.hparams.n_vocab, draft.hparams.n_vocab
    if abs(n_t - n_d) > SPEC_VOCAB_MAX_SIZE_DIFFERENCE:
        raise InputError(f"{said}{n_d} tokens against {n_t}, more than "
                         f"{SPEC_VOCAB_MAX_SIZE_DIFFERENCE} apart{end}")
    if t is None or d is None or not (target.files and draft.files):
        return
    from ggmlrun.models.gguf.vocab import all_token_texts

    texts_t, texts_d = all_token_texts(target.path), all_token_texts(draft.path)
    if texts_t is None or texts_d is None:
        return
    for i in range(SPEC_VOCAB_CHECK_START_TOKEN_ID, min(n_t, n_d, len(texts_t), len(texts_d))):
        if texts_t[i] != texts_d[i]:
            raise InputError(f"{said}token {i} is {texts_d[i].decode('utf-8', 'replace')!r} "
                             f"against {texts_t[i].decode('utf-8', 'replace')!r}{end}")


# --- the deployment: target and draft on the same backends ------------------------------------
_SUMMED = ("weights_bytes", "kv_bytes", "arena_bytes", "output_bytes", "mapped_bytes",
           "repack_bytes", "state_bytes")


def add_figures(target: list, draft: list) -> list:
    """Each backend's buffers of both models (BackendFigures rows, the same backends in the
    same order): the process holds both, so each backend's totals are their sums."""
    out = []
    for t, d in zip(target, draft):
        summed = {k: getattr(t, k) + getattr(d, k) for k in _SUMMED}
        linear = (None if t.kv_linear_bytes is None and d.kv_linear_bytes is None
                  else t.kv_linear + d.kv_linear)
        out.append(replace(t, **summed, kv_linear_bytes=linear))
    return out


def with_draft(target, draft):
    """The target's ModelMeasure with the draft's buffers added to each backend (nodes,
    splits, context and -ngl stay the target's)."""
    return replace(target, backends=add_figures(target.backends, draft.backends), draft=draft)


def main_backend(draft) -> int:
    """The backend holding most of the draft's bytes: of the devices, the one with the most
    (the first on a tie); the CPU when no device holds any (-ngld 0 and the KV on the CPU)."""
    rows = draft.backends
    held = [r.weights_bytes + r.kv_bytes + r.arena_bytes + r.state_bytes
            if r.kind != "cpu" else -1 for r in rows]
    best = max(range(len(rows)), key=lambda i: (held[i], -i))
    return best if held[best] > 0 else len(rows) - 1
