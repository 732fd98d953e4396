"""A clip (mmproj) GGUF's header as libmtmd's clip_model_loader reads it for a vision encoder:
the projector type, the encoder's hyperparameters and the tensor table.

Keys as clip.cpp's load_hparams reads them (KEY_* of tools/mtmd/clip-impl.h): the projector
type from `clip.projector_type` (or `clip.vision.projector_type` in a mixed-modality file);
`clip.vision.{embedding_length, attention.head_count, feed_forward_length, block_count,
projection_dim, attention.layer_norm_epsilon}` required, `attention.head_count_kv` and
`attention.head_dim` optional; `clip.vision.image_size` and `patch_size`; `clip.use_gelu` /
`clip.use_silu` (neither: gelu_quick). clip's get_u32 / get_f32 take only their own GGUF type.
Per projector type, what load_hparams adds: gemma3's pooling kernel `n_merge` (4, or
`clip.vision.projector.scale_factor`) and its warm-up image size (`image_size`); qwen3vl's
spatial merge (`clip.vision.spatial_merge_size`, 2) and its warm-up of 46x46 merged tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from ggmlrun.core.ir.types import BY_ID
from ggmlrun.core.util.errors import InputError
from ggmlrun.models.gguf.header import shown

SUPPORTED = ("gemma3", "qwen3vl_merger")
# clip-impl.h's PROJECTOR_TYPE_NAMES: known to libmtmd, not (yet) sized by ggmlrun
KNOWN = ("mlp", "ldp", "ldpv2", "resampler", "adapter", "qwen2vl_merger", "qwen2.5vl_merger",
         "ling3vl", "step3vl", "gemma3nv", "gemma3na", "gemma4v", "gemma4a",
         "gemma4uv", "gemma4ua", "phi4", "idefics3", "pixtral", "ultravox", "internvl",
         "llama4", "qwen2a", "qwen3a", "glma", "qwen2.5o", "voxtral", "meralion",
         "musicflamingo", "lfm2", "kimivl", "paddleocr", "lightonocr", "cogvlm", "janus_pro",
         "dots_ocr", "dots3note_v", "dots3note_a", "deepseekocr", "deepseekocr2", "deepseek4v",
         "lfm2a", "glm4v", "glm5v", "youtuvl", "yasa2", "kimik25", "nemotron_v2_vl",
         "exaone4_5", "hunyuanvl", "minicpmv4_6", "granite_speech", "mimovl", "minimax_m3",
         "granite4_vision", "mimo_audio", "parakeet", "qwen3tts_spkenc", "qwen3tts_gen",
         "pockettts_spkenc", "pockettts_gen")


@dataclass(frozen=True)
class ClipTensor:
    name: str
    shape: tuple[int, ...]        # NumPy order
    dtype: str


@dataclass(frozen=True)
class ClipHParams:
    projector_type: str
    image_size: int
    patch_size: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_embd_head: int              # 0: n_embd / n_head
    n_ff: int
    n_layer: int
    projection_dim: int
    eps: float
    ffn_op: str                   # gelu | silu | gelu_quick
    n_merge: int                  # gemma3: the avg-pool kernel; qwen3vl: the spatial merge
    warmup_image_size: int

    @property
    def d_head(self) -> int:
        return self.n_embd_head if self.n_embd_head > 0 else self.n_embd // self.n_head


@dataclass(frozen=True)
class ClipModel:
    name: str
    source: str
    hparams: ClipHParams
    tensors: dict[str, ClipTensor]


def _get(kv: dict, types: dict, key: str, gtype: str, default=None):
    if key not in kv:
        if default is None:
            raise InputError(f"clip GGUF lacks key '{key}' (libmtmd: Key not found)")
        return default
    if types.get(key) != gtype:
        raise InputError(f"clip key '{key}' is {types.get(key)}, libmtmd reads it as {gtype}")
    return kv[key]


def clip_hparams(kv: dict, types: dict) -> ClipHParams:
    arch = kv.get("general.architecture")
    if arch != "clip":
        raise InputError(f"--mmproj: architecture '{shown(str(arch))}' is not a projector "
                         f"(libmtmd reads 'clip' files)")
    if not kv.get("clip.has_vision_encoder"):
        kind = "an audio" if kv.get("clip.has_audio_encoder") else "no vision"
        raise InputError(f"--mmproj: the file has {kind} encoder; ggmlrun sizes vision "
                         f"projectors only ({', '.join(SUPPORTED)})")
    ptype = kv.get("clip.projector_type") or kv.get("clip.vision.projector_type") or ""
    if ptype not in SUPPORTED:
        said = f"'{shown(str(ptype))}'" if ptype else "(none given)"
        which = "known to libmtmd but not sized by ggmlrun" if ptype in KNOWN else "unknown"
        raise InputError(f"--mmproj: projector type {said} is {which}; ggmlrun sizes: "
                         f"{', '.join(SUPPORTED)}")
    u32 = lambda key, default=None: int(_get(kv, types, key, "u32", default))  # noqa: E731
    v = "clip.vision."
    use_gelu = bool(_get(kv, types, "clip.use_gelu", "bool", False))
    use_silu = bool(_get(kv, types, "clip.use_silu", "bool", False))
    if use_gelu and use_silu:
        raise InputError("clip: both use_gelu and use_silu are set (libmtmd refuses it)")
    n_head = u32(v + "attention.head_count")
    hp = ClipHParams(
        projector_type=ptype, image_size=u32(v + "image_size"), patch_size=u32(v + "patch_size"),
        n_embd=u32(v + "embedding_length"), n_head=n_head,
        n_head_kv=u32(v + "attention.head_count_kv", n_head),
        n_embd_head=u32(v + "attention.head_dim", 0), n_ff=u32(v + "feed_forward_length"),
        n_layer=u32(v + "block_count"), projection_dim=u32(v + "projection_dim"),
        eps=float(_get(kv, types, v + "attention.layer_norm_epsilon", "f32")),
        ffn_op="gelu" if use_gelu else "silu" if use_silu else "gelu_quick",
        n_merge=0, warmup_image_size=u32(v + "image_size"))
    hp = _per_type(hp, kv, types)
    if not 0 < hp.image_size <= 8192 or hp.patch_size <= 0 or hp.image_size < hp.patch_size:
        raise InputError(f"clip: image_size {hp.image_size} with patch_size {hp.patch_size} "
                         f"makes no patch (libmtmd: image_size at most 8192)")
    if hp.n_head <= 0 or hp.n_embd % hp.n_head or hp.n_layer <= 0 or hp.n_merge <= 0:
        raise InputError(f"clip: {hp.n_embd} wide with {hp.n_head} heads, {hp.n_layer} "
                         f"blocks, pooling {hp.n_merge}: not a vision encoder")
    return hp


def _per_type(hp: ClipHParams, kv: dict, types: dict) -> ClipHParams:
    """What load_hparams' switch adds per projector type: the merge (gemma3's pooling kernel,
    qwen3vl's spatial merge) and the warm-up image (set_warmup_n_tokens: side tokens x patch
    x merge)."""
    from dataclasses import replace

    if hp.projector_type == "gemma3":
        return replace(hp, n_merge=int(_get(kv, types, "clip.vision.projector.scale_factor",
                                            "u32", 4)))
    n_merge = int(_get(kv, types, "clip.vision.spatial_merge_size", "u32", 2))  # qwen3vl
    return replace(hp, n_merge=n_merge, warmup_image_size=46 * hp.patch_size * n_merge)


def read_clip(name) -> ClipModel:
    """The clip GGUF `name` names (a path, URL or hf:// file), by its header alone."""
    from ggmlrun.models.gguf.source import read_headers

    headers = read_headers(name)
    first = headers.shards[0]
    header = first.header
    try:
        hp = clip_hparams(header.kv, header.kv_types)
    except InputError as err:
        raise err.located(file=first.name)
    tensors = {}
    for shard in headers.shards:
        for t in shard.header.tensors:
            tensors[t.name] = ClipTensor(t.name, tuple(reversed(t.ne)), BY_ID[t.type_id].name)
    label = header.kv.get("general.name")
    label = shown(label) if isinstance(label, str) and label.strip() else first.name
    return ClipModel(name=label, source=headers.name, hparams=hp, tensors=tensors)
