"""Where llama.cpp puts each weight and KV buffer, and which nodes it pins (llama_model::
load_tensors, llama_model_loader::create_tensor, llama_kv_cache, llama_context's graph callback).

- `--ngl N` counts the output layer as one: i_gpu_start = max(n_layer + 1 - N, 0); layers from
  there on (and the output layer, index n_layer) go to the devices, split by `--tensor-split`
  (default: by each device's memory, as llama.cpp splits by free memory) with llama.cpp's float
  split points and upper_bound.
- The input layer (token_embd) stays on the CPU; `--override-tensor REGEX=BACKEND` is tried on
  every weight's name first, first match wins (std::regex_search).
- A tied output (no output.weight) is token_embd duplicated into the output layer's buffer; on
  the CPU it is the same tensor.
- `--cpu-moe` / `--n-cpu-moe N` are common/arg.cpp's -ot rules after the user's: the expert
  tensors (LLM_FFN_EXPS_REGEX) of every layer / of layers 0..N-1 to the CPU. The per-layer rules
  "blk\\.<i>" + LLM_FFN_EXPS_REGEX match a tensor of layer il exactly when i == il, so they are
  applied as one regex and a layer test (94 rules need not be searched per tensor).
- The KV cache of layer il lives on layer il's device unless `--no-kv-offload`.
- Pins: the rms_norm named "norm-<il>" goes to layer il's device when the ubatch has fewer than
  32 tokens or every layer is offloaded (ngl > n_layer); under --no-kv-offload the attention
  output (no flash attention) is pinned to the CPU.
"""

from __future__ import annotations

import functools
from bisect import bisect_right
from dataclasses import dataclass


from ggmlrun.core.util.float32 import f32, f32_div
from ggmlrun.core.backends.spec import BackendSpec
from ggmlrun.core.util.errors import InputError, did_you_mean
from ggmlrun.models.hparams.record import HParams
from ggmlrun.models.options.params import LLM_FFN_EXPS_REGEX, ModelOptions, compile_override, gpu_layers


# Tensors llama.cpp creates in layer 0's context and TENSOR_DUPLICATED into every other layer's
# (rope frequency factors): the first lives with layer 0, each copy with its own layer.
LAYER_DUPLICATED = ("rope_freqs.", "rope_factors_long.", "rope_factors_short.")
# Tensors without a layer in their name that llama.cpp creates in layer 0's buffer (gemma4's
# per-layer embedding projection: LLM_TENSOR_LAYER_REPEATING with bid 0)
LAYER0_TENSORS = ("per_layer_model_proj.", "per_layer_proj_norm.")


@dataclass
class Placement:
    layer: list[int]                 # backend index per repeating layer
    output: int                      # backend index of the output layer
    kv: list[int]                    # backend index of each layer's KV cache
    weights: dict[str, int]          # GGUF tensor name -> backend index
    output_weight: int               # where result_output's weight lives
    rope_freqs: list[int]            # where each layer's rope_freqs (or its duplicate) lives
    layer_copies: dict[str, list[int]]   # every such layer-0 tensor present: its copy per layer
    full_offload: bool
    no_kv_offload: bool
    cpu: int

    def shared_copies(self) -> tuple:
        """Which layers read the same tensor: llama.cpp's loader hands a TENSOR_DUPLICATED
        tensor whose buffer type already holds it the existing one, so layers whose copies land
        on one backend share a tensor (and a device copies it in once). Per name, each layer's
        representative: the first layer on its backend (layer 0 for the original's)."""
        out = []
        for name, copies in sorted(self.layer_copies.items()):
            first: dict[int, int] = {}
            out.append((name, tuple(first.setdefault(b, il) if b is not None else il
                                    for il, b in enumerate(copies))))
        return tuple(out)


@functools.lru_cache(maxsize=1 << 16)
def is_expert_tensor(name: str) -> bool:
    """Whether --cpu-moe / --n-cpu-moe move this tensor (llama.cpp's LLM_FFN_EXPS_REGEX); asked
    once per name: fit places the same tensors again at every probe."""
    return _experts_regex().search(name) is not None


@functools.cache
def _experts_regex():
    return compile_override(LLM_FFN_EXPS_REGEX)


def _layer_name(name: str) -> int | None:
    if name.startswith("blk."):
        return int(name.split(".", 2)[1])
    return None


def split_points(devices: list[BackendSpec], tensor_split: tuple[float, ...] | None) -> list[float]:
    """Cumulative, normalised split points in float32, as llama.cpp computes them."""
    if tensor_split is not None and len(tensor_split) != len(devices):
        raise InputError(f"--tensor-split has {len(tensor_split)} values but there are "
                         f"{len(devices)} non-CPU backends")
    if tensor_split is None or all(x == 0 for x in tensor_split):
        raw = [float(d.memory) for d in devices]
    else:
        raw = list(tensor_split)
    acc = 0.0
    points = []
    for x in raw:
        acc = f32(acc + f32(x))
        points.append(acc)
    return [f32_div(p, acc) for p in points]


def place(hp: HParams, tensor_names, backends: list[BackendSpec],
          opts: ModelOptions) -> Placement:
    cpu = len(backends) - 1
    devices = list(range(cpu))
    n_layer = hp.n_layer_all           # NextN layers count for -ngl and the split
    ngl = gpu_layers(opts, n_layer)
    if ngl < 0:
        raise InputError(f"--ngl must be >= 0, got {ngl}")
    points = split_points(backends[:cpu], opts.tensor_split) if devices else []
    i_gpu_start = max(n_layer + 1 - ngl, 0)
    act = min(ngl, n_layer + 1) if devices else 0

    def layer_backend(il: int) -> int:
        if il < i_gpu_start or il - i_gpu_start >= act:
            return cpu
        frac = f32_div(f32(il - i_gpu_start), f32(act))
        return devices[min(bisect_right(points, frac), len(devices) - 1)]

    layer = [layer_backend(il) for il in range(n_layer)]
    output = layer_backend(n_layer)
    index = {b.name: i for i, b in enumerate(backends)}
    rules = []
    for pattern, backend in opts.overrides:
        if backend not in index:
            raise InputError(f"--override-tensor {pattern}={backend}: unknown backend "
                             f"'{backend}'; {did_you_mean(backend, index)}")
        try:
            rules.append((compile_override(pattern), index[backend]))
        except ValueError as err:
            raise InputError(f"--override-tensor {pattern}={backend}: bad regex: {err}") from None

    moves_experts = bool(opts.cpu_moe or opts.n_cpu_moe)

    def where(name: str, default: int) -> int:
        for rx, b in rules:
            if rx.search(name):
                return b
        if moves_experts and is_expert_tensor(name):
            il = _layer_name(name)
            if opts.cpu_moe or (il is not None and il < opts.n_cpu_moe):
                return cpu
        return default

    from ggmlrun.models.hparams.rope import rope_freqs_layers

    dup_layers = rope_freqs_layers(hp)
    weights = {}
    for name in tensor_names:
        il = _layer_name(name)
        if il is not None and hp.n_layer <= il < n_layer:
            continue          # a NextN layer's tensors: TENSOR_SKIP, never loaded
        if il is not None:
            default = layer[il] if il < n_layer else cpu
        elif name.startswith("output") or name == hp.output_norm:   # lfm2: token_embd_norm
            default = output
        elif name.startswith(LAYER_DUPLICATED):     # a repeating-layer tensor, made at layer 0
            default = layer[dup_layers[0]] if layer else cpu   # (gemma4: its first full one)
        elif name.startswith(LAYER0_TENSORS):       # repeating-layer tensors of layer 0
            default = layer[0] if layer else cpu
        else:                 # token_embd and anything else of the input layer
            default = cpu
        weights[name] = where(name, default)
    output_weight = weights.get("output.weight")
    if output_weight is None:
        output_weight = where("token_embd.weight", output)
    kv = [cpu if opts.no_kv_offload else layer[il] for il in range(hp.n_layer)]
    holders = set(dup_layers)           # None: a layer that reads no copy
    layer_copies = {name: [b if il == dup_layers[0] else where(name, layer[il])
                           if il in holders else None for il in range(n_layer)]
                    for name, b in weights.items() if name.startswith(LAYER_DUPLICATED)}
    first = weights.get("rope_freqs.weight")
    rope_freqs = layer_copies.get("rope_freqs.weight", [first] * n_layer)
    return Placement(layer=layer, output=output, kv=kv, weights=weights,
                     output_weight=output_weight, rope_freqs=rope_freqs,
                     layer_copies=layer_copies, full_offload=ngl > n_layer,
                     no_kv_offload=opts.no_kv_offload, cpu=cpu)
