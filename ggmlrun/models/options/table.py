"""The model options, each once: its ggmlrun flag, its llama.cpp spellings (as common/arg.cpp
spells them), its group, its kind of value (which gives the type, range and how it is read
and written) and its help. The click options (cli/model_options.py), ModelOptions from the
command line's or the Python API's values, the line to paste and its parser
(command_line.py) and the options' JSON are all made from this table, so an option added
here reaches every one of them, and a spelling or a range is never written twice.

The defaults are ModelOptions' (params.py: the one struct the builder, placement and reserve
read, as llama.cpp's params structs are); a row reads its default from there. The groups are
llama.cpp's split of the same options: `model` (llama_model_params: where the weights go),
`context` (llama_context_params: the KV cache and the compute buffers), `server`
(common_params: what common/arg.cpp turns into the other two, and the devices), `ggml`
(ggmlrun's own or a ggml build option: no llama.cpp spelling).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ggmlrun.models.options.kinds import (Choice, Count, Devices, Endpoints, Kind, Layers,
                                          LoadMode, ModelName, OnOff, Overrides, Split, Switch,
                                          Targets)
from ggmlrun.models.options.params import (I32_MAX, KV_TYPES, LLAMA_MAX_SEQ, U32_MAX, ModelOptions,
                                           TARGETS, fa_requested, seq_max, unified)

_FIELD_DEFAULTS = {f.name: f.default for f in fields(ModelOptions)}
_FROM_FIELD = object()      # a row whose default is ModelOptions' field of the same name


# --- the table ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Option:
    name: str                               # ModelOptions' field; the API's keyword
    kind: Kind
    group: str                              # model | context | server | ggml (module docstring)
    help: str
    flag: str | None = None                 # ggmlrun's; None: llama.cpp's only
    llama: tuple[tuple[str, ...], ...] = () # each llama.cpp option setting it: its spellings,
                                            # the one the line writes first
    llama_off: tuple[str, ...] = ()         # llama.cpp's spellings that set a switch back
    dest: str | None = None                 # the click parameter, where not `name`
    default_text: str | None = None         # the default in words, where the value cannot say it
    always: bool = False                    # written even at its default (llama.cpp's differs)
    shared: bool = False                    # its flag is declared with the graph files' options
    own_default: object = _FROM_FIELD       # only for a row ModelOptions has no field for
    aliases: tuple[str, ...] = ()           # ggmlrun's other spellings of `flag` (-ctk)
    sets: tuple[str, ...] = ()              # a row setting other rows' fields, which, given
                                            # too, win (--kv-type: type_k and type_v)

    @property
    def field(self) -> bool:
        return self.own_default is _FROM_FIELD

    @property
    def default(self):
        return _FIELD_DEFAULTS[self.name] if self.field else self.own_default

    @property
    def spelled(self) -> str:
        """llama.cpp's spellings, for the help: -c/--ctx-size."""
        return ", ".join("/".join(s) for s in self.llama)

    @property
    def default_words(self) -> str:
        """A switch's flag is never given by default (--no-op-offload: op offload on)."""
        if not self.kind.takes_value:
            return "off"
        return self.default_text or self.kind.show(self.default)

    def help_text(self) -> str:
        """The click help: `[models]` for an option only models take (a shared one applies
        to graph files too)."""
        where = f" (llama.cpp {self.spelled})" if self.llama else ""
        tag = "" if self.shared else "[models] "
        return f"{tag}{self.help}{where}; default {self.default_words}."


OPTIONS: tuple[Option, ...] = (       # in the order the line to paste writes them
    Option("ngl", Layers(), "model", "Layers on the devices, or 'all'; the output layer counts "
           "as one", flag="--ngl", llama=(("-ngl", "--gpu-layers", "--n-gpu-layers"),),
           default_text="all", always=True),
    Option("ctx", Count(1, U32_MAX, "llama.cpp's uint32"), "context", "Context length",
           flag="--ctx", dest="ctx_size", llama=(("-c", "--ctx-size"),),
           default_text="the model's, at most 4096", always=True),
    Option("flash_attn", OnOff(), "context", "Flash attention; auto: on unless a layer's "
           "device lacks it for the model (llama.cpp's probe), on for a quantized V cache",
           flag="--flash-attn", llama=(("-fa", "--flash-attn"),),
           default_text="auto (resolved as llama.cpp resolves it)"),
    Option("batch", Count(1, U32_MAX, "llama.cpp's uint32"), "context",
           "Logical batch: -ub is clamped to it, so it is written only for a larger -ub",
           llama=(("-b", "--batch-size"),), own_default=2048),
    Option("ubatch", Count(1, U32_MAX, "llama.cpp's uint32"), "context",
           "Tokens the graph is reserved for, at most --ctx", flag="--ubatch",
           llama=(("-ub", "--ubatch-size"),)),
    Option("type_k", Choice(KV_TYPES), "context", "K cache type; a block type needs a head "
           "size its blocks divide (with --flash-attn on)", flag="--cache-type-k",
           aliases=("-ctk",), llama=(("-ctk", "--cache-type-k"),)),
    Option("type_v", Choice(KV_TYPES), "context", "V cache type; a block type needs "
           "--flash-attn on and a head size its blocks divide", flag="--cache-type-v",
           aliases=("-ctv",), llama=(("-ctv", "--cache-type-v"),)),
    Option("kv_type", Choice(KV_TYPES), "context", "K and V cache type both (-ctk and -ctv); "
           "--cache-type-k/-v, given too, win", flag="--kv-type", own_default=None,
           default_text="f16", sets=("type_k", "type_v")),
    Option("no_kv_offload", Switch(), "context", "Keep the KV cache on the CPU",
           flag="--no-kv-offload", llama=(("-nkvo", "--no-kv-offload"),),
           llama_off=("-kvo", "--kv-offload")),
    Option("tensor_split", Split(), "model", "Layer proportions over the non-CPU backends in "
           "order", flag="--tensor-split", llama=(("-ts", "--tensor-split"),),
           default_text="by device memory"),
    Option("overrides", Overrides(), "model", "Weights matching REGEX go to BACKEND, "
           "repeatable; the first match wins", flag="--override-tensor", dest="tensor_overrides",
           llama=(("-ot", "--override-tensor"),)),
    Option("op_offload", Switch(), "context", "Never move a CPU-weight op to a device for its "
           "batch", flag="--no-op-offload", dest="no_op_offload",
           llama=(("--no-op-offload",),), llama_off=("--op-offload",), shared=True),
    Option("rpc", Endpoints(), "server", "ggml rpc-servers as devices (from the backends)",
           llama=(("--rpc",),), own_default=()),
    Option("swa_full", Switch(), "context", "Sliding-window layers get a full-size KV cache "
           "(off: a window's worth plus one ubatch)", flag="--swa-full",
           llama=(("--swa-full",),)),
    Option("cpu_moe", Switch(), "server", "Keep every expert tensor of a mixture of experts on "
           "the CPU", flag="--cpu-moe", llama=(("--cpu-moe", "-cmoe"),)),
    Option("n_cpu_moe", Count(0, I32_MAX, "llama.cpp's int32"), "server", "Keep the expert "
           "tensors of the first N layers on the CPU (fit: the fewest that fit)",
           flag="--n-cpu-moe", llama=(("--n-cpu-moe", "-ncmoe"),)),
    Option("parallel", Count(1, LLAMA_MAX_SEQ, "llama.cpp's LLAMA_MAX_SEQ"), "context",
           "Sequences the context serves (n_seq_max): an output buffer each, a KV stream each "
           "unless --kv-unified", flag="--parallel", llama=(("-np", "--parallel"),),
           default_text="llama-server's auto: 4 with a unified cache (--for cli: 1)"),
    Option("kv_unified", Switch(), "context", "One KV cache for all --parallel sequences "
           "(always, under llama-server's -np auto)",
           flag="--kv-unified", llama=(("-kvu", "--kv-unified"),),
           llama_off=("-no-kvu", "--no-kv-unified")),
    Option("cache_ram", Count(-I32_MAX - 1, I32_MAX, "llama.cpp's int32"), "server",
           "llama-server's prompt cache in host RAM, MiB: an upper bound it grows into "
           "(negative: no limit, 0: off)",
           flag="--cache-ram", llama=(("-cram", "--cache-ram"),)),
    Option("ctx_checkpoints", Count(-I32_MAX - 1, I32_MAX, "llama.cpp's int32"), "server",
           "llama-server's context checkpoints kept per slot in host RAM for an SWA, recurrent "
           "or hybrid model (0 or negative: none)", flag="--ctx-checkpoints",
           llama=(("-ctxcp", "--ctx-checkpoints", "--swa-checkpoints"),)),
    Option("target", Choice(TARGETS), "server", "Whose defaults the answer and the line to "
           "paste are for: llama-server's (-np auto: 4 sequences, one unified KV cache) or "
           "llama-cli's (-np 1)", flag="--for"),
    Option("model_draft", ModelName(), "server", "Draft model of speculative decoding (a path, "
           "URL or hf:// name): its weights, KV cache and compute buffers beside the target's",
           flag="--model-draft", aliases=("-md",),
           llama=(("-md", "--model-draft", "--spec-draft-model"),), default_text="none"),
    Option("ngl_draft", Layers(), "model", "The draft's layers on the devices, or 'all'",
           flag="--gpu-layers-draft", aliases=("-ngld",),
           llama=(("-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft", "--spec-draft-ngl"),),
           default_text="all", always=True),
    Option("ctx_draft", Count(1, U32_MAX, "llama.cpp's uint32"), "context", "The draft's "
           "context; the vendored llama.cpp has no -cd and gives the draft the target's, so "
           "another value is a what-if the line to paste cannot ask for", flag="--ctx-draft", aliases=("-cd",),
           default_text="the target's"),
    Option("type_k_draft", Choice(KV_TYPES), "context", "The draft's K cache type (not the "
           "target's -ctk)", flag="--cache-type-k-draft", aliases=("-ctkd",),
           llama=(("-ctkd", "--cache-type-k-draft", "--spec-draft-type-k"),)),
    Option("type_v_draft", Choice(KV_TYPES), "context", "The draft's V cache type (not the "
           "target's -ctv)", flag="--cache-type-v-draft", aliases=("-ctvd",),
           llama=(("-ctvd", "--cache-type-v-draft", "--spec-draft-type-v"),)),
    Option("devices_draft", Devices(), "server", "The devices the draft's layers go to, in "
           "order (a backend's name), or none: the CPU alone; -ts's first proportions split "
           "them", flag="--device-draft", aliases=("-devd",),
           llama=(("-devd", "--device-draft", "--spec-draft-device"),),
           default_text="the target's devices"),
    Option("no_mmap", Switch(), "model", "CPU weights allocated, not memory-mapped",
           flag="--no-mmap", llama=(("--no-mmap",),), llama_off=("--mmap",)),
    Option("load_mode", LoadMode(), "model", "-lm none is --no-mmap; read, never written",
           llama=(("-lm", "--load-mode"),), own_default=None),
    Option("fit_target", Targets(), "server", "llama.cpp's own --fit: MiB it keeps free on "
           "each device (one value: every device's)", llama=(("-fitt", "--fit-target"),),
           own_default=(1024,)),
    Option("fit_ctx", Count(1, U32_MAX, "llama.cpp's uint32"), "server", "llama.cpp's own "
           "--fit: the shortest context it shrinks -c to", llama=(("-fitc", "--fit-ctx"),),
           own_default=4096),
    Option("sched_copies", Count(1, 64), "ggml", "ggml's GGML_SCHED_MAX_COPIES, a build "
           "option: the copies of every input the scheduler keeps when llama.cpp turns on "
           "pipeline parallelism (every layer over 2+ devices); 1 turns it off",
           flag="--sched-copies"),
    Option("ggml", Choice(("0.25", "0.15")), "ggml", "Whose scheduler and allocator rules: "
           "ggml 0.25.3 (llama.cpp's) or 0.15.3", flag="--ggml", shared=True),
)
# --- the multimodal projector (llama-server's --mmproj; models/projector/), a block of its own
OPTIONS += (
    Option("mmproj", ModelName(), "server", "The multimodal projector (a clip GGUF: path, URL "
           "or hf:// file) loaded beside the model: its weights and the vision encoder's "
           "compute buffer, on the main device", flag="--mmproj", llama=(("--mmproj", "-mm"),),
           default_text="none"),
    Option("no_mmproj", Switch(), "server", "Leave the projector out", flag="--no-mmproj",
           llama=(("--no-mmproj", "--no-mmproj-auto"),), llama_off=("--mmproj-auto",)),
    Option("mmproj_offload", Switch(), "server", "The projector on the CPU, not the main "
           "device", flag="--no-mmproj-offload", dest="no_mmproj_offload",
           llama=(("--no-mmproj-offload",),), llama_off=("--mmproj-offload",)),
)
BY_NAME = {o.name: o for o in OPTIONS}
assert {o.name for o in OPTIONS if o.field} == set(_FIELD_DEFAULTS), "a field without a row"


def check_values(given: dict) -> dict:
    """Python values by option name (the API's keywords), checked and read as the command
    line reads its text; ValueError naming the option. Only ModelOptions' fields."""
    out = {}
    for name, value in given.items():
        option = BY_NAME.get(name)
        if option is None or not (option.field or option.sets):
            known = ", ".join(o.name for o in OPTIONS if o.field or o.sets)
            raise ValueError(f"no option {name!r}; the options: {known}")
        try:
            out[name] = option.default if value is None else option.kind.check(value)
        except ValueError as err:
            raise ValueError(f"{name}={value!r}: {err}") from None
    return out


def make_options(values: dict) -> ModelOptions:
    """ModelOptions from checked values by name; a value left out or None is the default. A
    row that sets others (--kv-type) gives their value where they are not given."""
    fields = {name: value for name, value in values.items()
              if value is not None and BY_NAME[name].field}
    for name, value in values.items():
        if value is not None:
            for target in BY_NAME[name].sets:
                fields.setdefault(target, value)
    return ModelOptions(**fields)


def given(value, takes_value: bool = True, repeatable: bool = True) -> bool:
    """Whether click got the option: not None, no repeat (() of a repeatable option; -devd
    none is () given) or, for a switch, not False; 0 and off are values given (`--ngl 0`,
    `--flash-attn off`), though 0 == False."""
    return (value is not None and (value != () or not repeatable)
            and (takes_value or value is not False))


def from_cli(kw: dict) -> dict:
    """The command line's values (by click parameter) by option name: a switch given is the
    field away from its default, an option not given is left out."""
    out = {}
    for option in OPTIONS:
        value = kw.get(option.dest or option.name)
        if not option.flag or not given(value, option.kind.takes_value,
                                        option.kind.repeatable):
            continue
        out[option.name] = (not option.default) if not option.kind.takes_value else value
    return out


def options_json(opts: ModelOptions, flash_attn: bool | None = None) -> dict:
    """The options as JSON, by name (the API's keywords); `kv_type` is K's and V's type when
    they are one, else null; `parallel` and `kv_unified` as llama-server sets them (-np auto:
    4, true); `flash_attn` the flash attention planned for (`flash_attn`: -fa auto resolved
    on the placement; null when auto was not resolved), `flash_attn_mode` what was asked
    (on, off, auto)."""
    out = {o.name: o.kind.json(getattr(opts, o.name)) for o in OPTIONS if o.field}
    out["kv_type"] = opts.type_k if opts.type_k == opts.type_v else None
    out["parallel"], out["kv_unified"] = seq_max(opts), unified(opts)   # -np auto as set
    out["flash_attn_mode"] = OnOff().write(opts.flash_attn)
    out["flash_attn"] = fa_requested(opts) if flash_attn is None else flash_attn
    return out


def check_fields(opts: ModelOptions) -> None:
    """Each field of a ModelOptions made in code (not read by the table) in its range, as the
    command line would have checked it: ValueError naming the flag."""
    for option in OPTIONS:
        value = getattr(opts, option.name) if option.field else None
        if value is not None and value != option.default:
            try:
                option.kind.check(value)
            except ValueError as err:
                shown = value if isinstance(value, (str, int, float)) else repr(value)
                raise ValueError(f"{option.flag or option.name} {shown}: {err}") from None
