"""What llama.cpp's own `--fit` (common_fit_params, common/fit.cpp) picks on these devices.

llama-server runs it by default (`--fit on`, `-fitt 1024` MiB kept free per device, `-fitc
4096`) before it loads a model, on the options the user left unset: it may shrink `-c`, lower
`-ngl`, write `-ts` and `-ot` rules that send expert tensors (and one layer's FFN part) to the
CPU or the next device. It measures each candidate by loading the model with no_alloc and
reading llama's memory breakdown per device (model + context + compute); ggmlrun's
`measure_model` gives those bytes exactly, so the same steps on them make the same choices.

The steps follow common_params_fit_impl in order (each function cites its part of it);
`refused` is the message of the common_params_fit_exception llama.cpp logs when it gives up
(llama-server then carries on with the options as they stood).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ggmlrun.core.backends.spec import BackendSpec
from ggmlrun.models.modelfile import ModelFile
from ggmlrun.models.options.params import ModelOptions, kv_streams
from ggmlrun.models.reserve import measure_model, projector_figures

MiB = 1024 * 1024
FIT_TARGET = 1024 * MiB        # common.h fit_params_target: 1 GiB per device
FIT_CTX = 4096                 # common.h fit_params_min_ctx
U32 = 2**32
MOE_ALL = r"blk\.\d+\.ffn_(up|down|gate_up|gate)_(ch|)exps"
# common_layer_fraction_t: what of a partial layer stays with its device; the rest overflows
ATTN, UP, GATE, MOE = 1, 2, 3, 4
# get_overflow_pattern: the tensors of layer il that leave its device, "blk\\.<il>\\." + these
OVERFLOW = {ATTN: r"ffn_(gate|up|gate_up|down).*", UP: r"ffn_(gate|gate_up|down).*",
            GATE: r"ffn_down.*", MOE: r"ffn_(up|down|gate_up|gate)_(ch|)exps"}


class Refused(Exception):
    """common_params_fit_exception: llama.cpp's fit gives up with this message."""


@dataclass
class LlamaCppFit:
    ctx: int                       # -c llama-server runs with
    ngl: int                       # -ngl (all layers: n_layer + 1)
    override_tensor: list[str] = field(default_factory=list)   # -ot PATTERN=BACKEND, in order
    tensor_split: list[int] | None = None    # -ts (layers per device) over 2+ devices
    refused: str | None = None

    def as_dict(self) -> dict:
        return {"ctx": self.ctx, "ngl": self.ngl, "override_tensor": self.override_tensor,
                "tensor_split": self.tensor_split, "refused": self.refused}


@dataclass
class _Ngl:                        # common_params_fit_impl's ngl_t
    n_layer: int = 0
    n_part: int = 0
    overflow: int = MOE

    @property
    def n_full(self) -> int:
        return self.n_layer - self.n_part


def _step(delta: int, target: int, low: int, high: int) -> int:
    """`uint32_t step_size = int64_t(delta) * (target - mem) / (mem_high - mem)` clamped to
    [1, delta - 1]: C's truncating division, then the cast to uint32 (a negative one wraps)."""
    num, den = delta * (target - low), high - low
    q = abs(num) // abs(den) if den else 0
    q = (-q if (num < 0) != (den < 0) else q) % U32
    return min(max(q, 1), delta - 1)


class _Fit:
    def __init__(self, model, backends, opts, margins, n_ctx):
        self.model, self.backends, self.opts = model, backends, opts
        self.devices = [b for b in backends if b.kind != "cpu"]
        self.cpu = next((b.name for b in backends if b.kind == "cpu"), "CPU")
        self.margins = margins
        self.n_ctx = n_ctx
        self.seen: dict = {}
        self.weights: dict = {}   # the devices' model bytes, by measure

    def measure(self, ngl: int | None, split, overrides, user_moe=False) -> list[int]:
        """common_get_device_memory_data: model + context + compute per device, then the
        host's last (its CPU_REPACK copy is no host buffer, so llama.cpp leaves it out).
        `user_moe`: with the user's --cpu-moe / --n-cpu-moe (their -ot rules)."""
        key = (self.n_ctx, ngl, split, overrides, user_moe)
        if key not in self.seen:
            opts = replace(self.opts, ctx=self.n_ctx, ngl=ngl, tensor_split=split,
                           overrides=overrides, cpu_moe=user_moe and self.opts.cpu_moe,
                           n_cpu_moe=self.opts.n_cpu_moe if user_moe else 0)
            rows = measure_model(self.model, self.backends, opts).backends
            used = {r.name: r.weights_bytes - r.repack_bytes + r.kv_bytes + r.state_bytes
                    + r.arena_bytes for r in rows}
            self.weights[key] = sum(r.weights_bytes for r in rows if r.kind != "cpu")
            self.seen[key] = [used[d.name] for d in self.devices] + [used.get(self.cpu, 0)]
        return self.seen[key]

    def model_bytes(self, ngl: int | None, split, overrides, user_moe=False) -> int:
        """The devices' model bytes at a placement (sum_projected_model)."""
        self.measure(ngl, split, overrides, user_moe)
        return self.weights[(self.n_ctx, ngl, split, overrides, user_moe)]

    def layers(self, per_device: list[_Ngl], overflow_to: list[str], hp_ngl: int):
        """set_ngl_tensor_split_tbo: -ngl, -ts (layers per device) and the -ot rules of the
        partial layers (the first of a device overflows by its fraction to `overflow_to`, the
        others' experts go to the CPU)."""
        ngl = sum(n.n_layer for n in per_device)
        split = tuple(float(n.n_layer) for n in per_device) if len(per_device) > 1 else None
        rules, il0 = [], hp_ngl + 1 - ngl
        for n, to in zip(per_device, overflow_to):
            il0 += n.n_full
            for il in range(il0, il0 + n.n_part):
                kind = n.overflow if il == il0 else MOE
                rules.append((f"blk\\.{il}\\.{OVERFLOW[kind]}", to if il == il0 else self.cpu))
            il0 += n.n_part
        return ngl, split, tuple(rules)

    def mem(self, per_device, overflow_to, hp_ngl) -> list[int]:
        """get_memory_for_layers."""
        ngl, split, rules = self.layers(per_device, overflow_to, hp_ngl)
        if split is not None and not any(split):
            split = None                  # no layer on any device: the split does not matter
        return self.measure(ngl, split, rules)[:len(self.devices)]


def llamacpp_fit(model: ModelFile, backends: list[BackendSpec], opts: ModelOptions, *,
                 ctx_auto: bool, user_ngl: int | None = None, margins: list[int] | None = None,
                 fit_ctx: int = FIT_CTX, split_mode: str = "layer") -> LlamaCppFit:
    """common_params_fit_impl on ggmlrun's figures. `ctx_auto`: no -c (llama-server's -c 0,
    the training context); `user_ngl`: a -ngl the user gave (llama.cpp then refuses to change
    it); `margins`: --fit-target per device in bytes; `opts` the rest of the user's options
    (its -ts, -ot, --cpu-moe / --n-cpu-moe are the user's and make the fit refuse)."""
    hp = model.hparams
    hp_ngl, hp_nct, hp_nex = hp.n_layer, hp.n_ctx_train, hp.n_expert
    nd = sum(1 for b in backends if b.kind != "cpu")
    margins = with_projector(model, backends, opts,
                             list(margins or [FIT_TARGET] * max(nd, 1)))
    n_streams = kv_streams(opts)
    n_ctx_max = min(hp_nct * n_streams, U32 - 1)
    n_ctx_min_total = min(fit_ctx * n_streams, U32 - 1)
    ctx_auto = ctx_auto or opts.ctx is None
    n_ctx = n_ctx_max if ctx_auto else opts.ctx
    answer = LlamaCppFit(ctx=n_ctx, ngl=hp.n_layer_all + 1 if user_ngl is None else user_ngl)
    if split_mode == "tensor":
        answer.refused = "llama_params_fit is not implemented for SPLIT_MODE_TENSOR, abort"
        return answer
    fit = _Fit(model, backends, opts, margins, n_ctx)
    try:
        _fit(fit, answer, opts, hp_ngl, hp_nex, nd, n_ctx_max, n_ctx_min_total, ctx_auto,
             user_ngl, split_mode)
    except Refused as err:
        answer.refused = str(err)
    answer.ctx = fit.n_ctx
    return answer


def with_projector(model: ModelFile, backends: list[BackendSpec], opts: ModelOptions,
                   margins: list[int]) -> list[int]:
    """The --fit-target llama-server's fit runs with: with a projector (--mmproj, or an hf://
    repository's) it first adds the projector's bytes on each device to that device's target
    (mtmd_get_memory_usage, server-context.cpp), so the model is fitted around it."""
    mmproj, _ = projector_figures(model, backends, opts)
    if mmproj is None:
        return margins
    devices = [b for b in backends if b.kind != "cpu"]
    return [m + (mmproj.bytes_on(devices[i].name) if i < len(devices) else 0)
            for i, m in enumerate(margins)]


def _fit(fit, answer, opts, hp_ngl, hp_nex, nd, n_ctx_max, n_ctx_min_total, ctx_auto,
         user_ngl, split_mode):
    """Steps 1 (anything to change?), 2 (a shorter context) and the refusals, then the
    layers (_layers)."""
    user = (user_ngl, opts.tensor_split, tuple(opts.overrides))
    full = fit.measure(*user, user_moe=True)
    model_bytes = fit.model_bytes(*user, user_moe=True)
    devices = fit.devices
    if nd == 0:
        sum_used = full[-1]
        sum_free = next(b.memory for b in fit.backends if b.kind == "cpu")
        if sum_free - sum_used >= fit.margins[0]:
            return
    else:
        sum_used = sum(full[:nd])
        sum_free = sum(d.memory for d in devices)
        if all(d.memory - u >= m for d, u, m in zip(devices, full, fit.margins)):
            return
    # step 2: a shorter context, when the user left it unset
    surplus = sum_free - sum_used - sum(fit.margins[:max(nd, 1)])
    if surplus < 0 and ctx_auto and n_ctx_max > n_ctx_min_total:
        target = sum_free - sum(fit.margins[:max(nd, 1)])
        if nd > 1:
            per_layer = model_bytes // max(1, min(U32 - 1 if user_ngl is None else user_ngl,
                                                  hp_ngl))
            target -= (nd + 1) * per_layer // (2 if hp_nex == 0 else 6)
        fit.n_ctx = n_ctx_min_total
        at_min = fit.measure(*user, user_moe=True)
        used_min = at_min[-1] if nd == 0 else sum(at_min[:nd])
        if target > used_min:
            n = n_ctx_min_total + (n_ctx_max - n_ctx_min_total) * (target - used_min) \
                // (sum_used - used_min)
            align = 256 * kv_streams(opts)   # whole streams
            fit.n_ctx = max(n - n % align, n_ctx_min_total)
            if nd <= 1:
                return
    if nd == 0:
        raise Refused("was unable to fit model into system memory by reducing context, abort")
    if user_ngl is not None:
        raise Refused(f"n_gpu_layers already set by user to {user_ngl}, abort")
    if nd > 1:
        if opts.tensor_split is not None and any(opts.tensor_split):
            raise Refused("model_params::tensor_split already set by user, abort")
        if split_mode == "row":
            raise Refused("changing weight allocation for LLAMA_SPLIT_MODE_ROW not "
                          "implemented, abort")
    if opts.overrides or opts.cpu_moe or opts.n_cpu_moe:
        raise Refused("model_params::tensor_buft_overrides already set by user, abort")
    _layers(fit, answer, hp_ngl, hp_nex, nd, full)


def _layers(fit, answer, hp_ngl, hp_nex, nd, full):
    """Steps 3 and 4: dense layers (for a MoE, layers without their experts) filled back to
    front by false position, then, for a MoE whose dense part fits, those layers made whole
    front to back, one more layer part overflowing to the next device or the CPU."""
    devices = fit.devices
    surplus_cpu_moe = 0
    if hp_nex > 0:
        cpu_moe = fit.measure(None, None, ((MOE_ALL, fit.cpu),))
        surplus_cpu_moe = sum(d.memory - u - m
                              for d, u, m in zip(devices, cpu_moe, fit.margins))
    targets = [d.memory - m for d, m in zip(devices, fit.margins)]
    to = [fit.cpu] * nd
    per = [_Ngl() for _ in range(nd)]
    mem = fit.mem(per, to, hp_ngl)
    for id in range(nd - 1, -1, -1):
        unassigned = hp_ngl + 1 - sum(per[j].n_layer for j in range(id + 1, nd))
        high = [replace(n) for n in per]
        high[id].n_layer = unassigned
        if hp_nex > 0:
            high[id].n_part = high[id].n_layer if id < nd - 1 else high[id].n_layer - 1
        if high[id].n_layer == 0:
            continue
        mem_high = fit.mem(high, to, hp_ngl)
        if mem_high[id] > targets[id]:
            delta = high[id].n_layer - per[id].n_layer
            while delta > 1:
                step = _step(delta, targets[id], mem[id], mem_high[id])
                test = [replace(n) for n in per]
                test[id].n_layer += step
                if hp_nex:
                    test[id].n_part += step - 1 if id == nd - 1 and test[id].n_part == 0 \
                        else step
                mem_test = fit.mem(test, to, hp_ngl)
                if mem_test[id] <= targets[id]:
                    per, mem = test, mem_test
                else:
                    high, mem_high = test, mem_test
                delta = high[id].n_layer - per[id].n_layer
        else:
            per, mem = high, mem_high
    if hp_nex > 0 and surplus_cpu_moe > 0:
        per, to = _whole_layers(fit, per, to, mem, targets, hp_ngl, nd)
    answer.ngl, split, rules = fit.layers(per, to, hp_ngl)
    # llama-fit-params prints -ts only when a device has a layer
    answer.tensor_split = [int(s) for s in split] if split and any(split) else None
    answer.override_tensor = [f"{p}={b}" for p, b in rules]


def _whole_layers(fit, per, to, mem, targets, hp_ngl, nd):
    """Step 4 of common_params_fit_impl (MoE only)."""
    dense_start = nd
    for id in range(nd - 1, -1, -1):
        if per[id].n_layer > 0:
            dense_start = id
            continue
        break
    id = 0
    while id <= dense_start and dense_start < nd:
        high = [replace(n) for n in per]
        for jd in range(dense_start, nd):
            move = high[jd].n_layer if jd < nd - 1 else high[jd].n_layer - 1
            high[id].n_layer += move
            high[jd].n_layer -= move
            high[jd].n_part = 0
        dense_start_high = nd - 1
        mem_high = fit.mem(high, to, hp_ngl)
        if mem_high[id] > targets[id]:
            delta = high[id].n_full - per[id].n_full
            while delta > 1:
                step = _step(delta, targets[id], mem[id], mem_high[id])
                test = [replace(n) for n in per]
                ds_test, converted = dense_start, 0
                while ds_test < nd:
                    c = min(step - converted, test[ds_test].n_part)
                    test[ds_test].n_layer -= c
                    test[ds_test].n_part -= c
                    test[id].n_layer += c
                    converted += c
                    if test[ds_test].n_part > 0:
                        break
                    ds_test += 1
                mem_test = fit.mem(test, to, hp_ngl)
                if mem_test[id] <= targets[id]:
                    per, mem, dense_start = test, mem_test, ds_test
                else:
                    high, mem_high, dense_start_high = test, mem_test, ds_test
                delta = high[id].n_full - per[id].n_full
        else:
            per, mem, dense_start = high, mem_high, dense_start_high
        # try to fit at least part of one more layer
        if per[dense_start].n_layer > (0 if id < nd - 1 else 1):
            test = [replace(n) for n in per]
            ds_test = dense_start
            test[ds_test].n_layer -= 1
            test[ds_test].n_part -= 1
            test[id].n_layer += 1
            test[id].n_part += 1
            if test[ds_test].n_part == 0:
                ds_test += 1
            test[id].overflow = UP
            to_test = list(to)
            if id < nd - 1:
                to_test[id] = fit.devices[id + 1].name

            def fits(m):
                return m[id] < targets[id] and (id + 1 == nd or m[id + 1] < targets[id + 1])
            mem_test = fit.mem(test, to_test, hp_ngl)
            if fits(mem_test):
                per, to, mem, dense_start = test, to_test, mem_test, ds_test
                test = [replace(n) for n in test]
                test[id].overflow = GATE
                mem_test = fit.mem(test, to_test, hp_ngl)
                if fits(mem_test):
                    per, to, mem, dense_start = test, to_test, mem_test, ds_test
            else:
                test[id].overflow = ATTN
                mem_test = fit.mem(test, to_test, hp_ngl)
                if fits(mem_test):
                    per, to, mem, dense_start = test, to_test, mem_test, ds_test
        id += 1
    return per, to
