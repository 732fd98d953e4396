"""The option table (models/options/table.py) is the one definition of the model options:
the line to paste, its parser, the click options and their help are all made from it, so
for every option a line written and parsed back is the same ModelOptions, in any of
llama.cpp's spellings, and the help names every option with its default."""

from __future__ import annotations

from dataclasses import replace

import random
import shlex

import click
import pytest

from ggmlrun.core.backends.spec import BackendSpec
from ggmlrun.models.options.command_line import (SPELLINGS, llama_cpp_args, llama_cpp_line,
                                                 options_from_line, parse_llama_args)
from ggmlrun.models.options.params import ModelOptions
from ggmlrun.models.options.table import (BY_NAME, OPTIONS, check_values, from_cli,
                                          make_options)
from optionkit import random_options

ONE_DEVICE = [BackendSpec.of_kind("SIM0", "sim"), BackendSpec.of_kind("CPU", "cpu")]
SETS = 400


def _options(seed: int, **kw) -> ModelOptions:
    return make_options(check_values(random_options(random.Random(seed), **kw)))


def _line(opts: ModelOptions) -> list[str]:
    return llama_cpp_args(opts, ONE_DEVICE, ngl=opts.ngl, ctx=opts.ctx or 1)


def _base(opts: ModelOptions) -> ModelOptions:
    """What a llama.cpp line cannot say (ggml's version, a build option, the program whose
    defaults it is for, the draft's context: the vendored llama.cpp has no -cd) comes from
    here."""
    return ModelOptions(ggml=opts.ggml, sched_copies=opts.sched_copies, target=opts.target,
                        ctx_draft=opts.ctx_draft)


def _meaning(opts: ModelOptions) -> ModelOptions:
    """-np and -kvu as the target sets them: `-np 1` for llama-cli, or -np auto's own pair
    (4, unified) for llama-server, are its defaults, which the line leaves unwritten."""
    from ggmlrun.models.options.params import seq_max, unified

    return replace(opts, parallel=seq_max(opts), kv_unified=unified(opts))


def test_a_line_written_and_parsed_back_is_the_same_options():
    """Over many option sets drawn from the table's whole ranges, every option at a value
    other than its default in some of them."""
    moved = set()
    for seed in range(SETS):
        opts = _options(seed, big=True)
        opts = make_options({**vars_of(opts), "ctx": opts.ctx or 4096})
        assert _meaning(options_from_line(shlex.join(_line(opts)), base=_base(opts))) == \
            _meaning(opts), seed
        moved |= {o.name for o in OPTIONS if o.field and getattr(opts, o.name) != o.default}
    assert moved == {o.name for o in OPTIONS if o.field}


def test_every_llama_cpp_spelling_reads_the_same():
    """The line rewritten with any of llama.cpp's spellings of each option (-c or --ctx-size,
    -ncmoe or --n-cpu-moe, ...) gives the same options."""
    rng = random.Random(7)
    for seed in range(SETS // 4):
        opts = _options(seed, big=True)
        opts = make_options({**vars_of(opts), "ctx": opts.ctx or 4096})
        words = [rng.choice(_alternatives(w)) for w in _line(opts)]
        assert _meaning(options_from_line(words, base=_base(opts))) == _meaning(opts), words


def _alternatives(word: str) -> list[str]:
    if word not in SPELLINGS:
        return [word]                     # a value
    option, index = SPELLINGS[word]
    return list(option.llama[index]) if index is not None else [word]


def test_a_switch_set_back_by_its_other_spelling():
    """llama.cpp's negative spellings (--mmap, -kvo, -no-kvu, --op-offload) set the default
    back; the last use wins."""
    for option in OPTIONS:
        for off in option.llama_off:
            on = option.llama[0][0]
            assert parse_llama_args([on, off])[option.name] == option.default, off
            assert parse_llama_args([off, on])[option.name] != option.default, on


def test_two_devices_pin_the_memory_split():
    """Without -ts, ggmlrun splits by device memory; the line writes that split (the sizes in GiB), since
    llama.cpp would split by the free memory it finds."""
    two = [BackendSpec.of_kind("GPU0", "sim"), BackendSpec.of_kind("GPU1", "sim"),
           BackendSpec.of_kind("CPU", "cpu")]
    two[1] = type(two[1])(**{**vars(two[1]), "memory": two[1].memory // 2})
    again = options_from_line(llama_cpp_line(ModelOptions(), two, ngl=3, ctx=256))
    assert again.tensor_split == check_values({"tensor_split": (16, 8)})["tensor_split"]


@pytest.mark.parametrize("line,named", [
    ("-m model.gguf", "-m"), ("-hf owner/repo:Q4_K_M", "-hf"), ("-sm row", "-sm"),
    ("-mmu https://x/p.gguf", "-mmu"), ("-cd 4096", "-cd"), ("--fit on", "--fit"),
    ("--fit-target x", "whole number"), ("--fit-ctx 0", "--fit-ctx"),
    ("--cache-ram x", "--cache-ram"), ("-ctxcp 1.5", "-ctxcp"),
    ("--no-repack", "--no-repack"), ("-nr", "-nr"),
    ("-ngl 3 --temp 0.5", "--temp"), ("-c", "-c"), ("-np 0", "-np"), ("-fa maybe", "maybe"),
    ("-ctk q3_K", "q3_K"), ("-ot ffn", "REGEX=BACKEND"),
    ("-lm mlock", "mlock"), ("-lm dio", "dio"),
])
def test_what_the_parser_does_not_model_is_named(line, named):
    """issue 30's "check my command": an option ggmlrun does not model, or a value it cannot
    take, is a ValueError naming it, never dropped."""
    with pytest.raises(ValueError, match=named.replace("+", r"\+")):
        parse_llama_args(line)


def test_llama_cpp_reads_lists_and_load_modes():
    """-ot takes a comma-separated list, split at each rule's first '='; -lm none is
    --no-mmap (llama.cpp 0.3.36 spells it so), -lm mmap maps."""
    fields = parse_llama_args(["-ot", "a=CPU,b=GPU0", "-ot", "c=CPU", "-lm", "none"])
    assert fields["overrides"] == (("a", "CPU"), ("b", "GPU0"), ("c", "CPU"))
    assert fields["no_mmap"] is True and parse_llama_args("-lm mmap")["no_mmap"] is False


def _cli_words(values: dict) -> list[str]:
    words = []
    for name, value in values.items():
        option = BY_NAME[name]
        if not option.kind.takes_value:
            words += [option.flag] if value != option.default else []
        elif option.kind.repeatable:
            for rule in value:
                words += [option.flag, option.kind.write(rule)]
        else:
            words += [option.flag, option.kind.write(value)]
    return words


def test_the_command_line_and_the_api_make_the_same_options():
    """The click options made from the table read each option's text as the API reads the
    value: `measure`'s parameters for a drawn option set give the same ModelOptions."""
    from ggmlrun.cli.common import cli

    command = cli.commands["measure"]
    for seed in range(SETS // 4):
        values = check_values(random_options(random.Random(seed), big=True))
        ctx = command.make_context("measure", ["model.gguf", *_cli_words(values)])
        assert make_options(from_cli(ctx.params)) == make_options(values), seed


def test_help_lists_every_option_with_its_default():
    from ggmlrun.cli.common import cli

    for name in ("measure", "plan", "run", "dot", "fit"):
        command = cli.commands[name]
        ctx = click.Context(command, info_name=name, terminal_width=1000,
                            max_content_width=1000)
        text = " ".join(command.get_help(ctx).split())
        skipped = {"ctx", "ngl"} if name == "fit" else set()   # fit has its own --ctx
        for option in OPTIONS:
            if option.flag and option.name not in skipped and (not option.shared or
                                                                option.flag in text):
                assert f"{option.flag} " in text, (name, option.flag)
                assert f"default {option.default_words}." in text, (name, option.flag)


LOWEST = {"Count": lambda k: str(k.lo), "Layers": lambda k: "0", "OnOff": lambda k: "off",
          "Choice": lambda k: k.values[0], "Split": lambda k: "1", "Overrides": lambda k: "a=CPU",
          "ModelName": lambda k: "d.gguf", "Devices": lambda k: "none"}


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.flag and not o.shared],
                         ids=lambda o: o.flag)
def test_a_model_option_on_a_graph_file_is_refused(option):
    """Every option of the table, at its lowest value too (`--ngl 0`, `--n-cpu-moe 0`), applies
    to models only: on a graph file it exits 2 naming it."""
    from clikit import invoke
    from test_docs import ROOT

    value = [LOWEST[type(option.kind).__name__](option.kind)] if option.kind.takes_value else []
    code, _, err = invoke("measure", ROOT / "graphs" / "mlp.yaml", option.flag, *value)
    assert code == 2 and f"{option.flag} applies to models" in err, err


def vars_of(opts: ModelOptions) -> dict:
    return {o.name: getattr(opts, o.name) for o in OPTIONS if o.field}
