"""Issue 10: does it fit, what-if options, the llama.cpp-style summary, tables at 80 columns,
per-run timings and phases."""

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from ggmlrun import report
from ggmlrun.core import engine
from ggmlrun.core.frontend.loader import load_graph
from ggmlrun.core.memory import fits
from ggmlrun.core.util import host
from ggmlrun.core.util.fmt import human_bytes
from tests.clikit import invoke

ROOT = Path(__file__).resolve().parents[1]
MLP = ROOT / "graphs/mlp.yaml"
CPU_ONLY = ROOT / "graphs/backends/cpu.yaml"


def backends_file(tmp_path, sim_memory="16GiB", name="b.yaml"):
    path = tmp_path / name
    path.write_text(f"backends:\n  - {{name: SIM0, kind: sim, memory: {sim_memory}}}\n"
                    "  - {name: CPU, kind: cpu}\n")
    return path


def llama(tmp_path, *args, name="l.yaml"):
    path = tmp_path / name
    code, _, err = invoke("gen", "llama", "--layers", 6, "--dim", 64, "--heads", 4, "--ffn", 160,
                          "--context", 64, *args, "-o", path)
    assert code == 0, err
    return path


def as_json(*args, code=0):
    got, out, err = invoke(*args, "--json")
    assert code is None or got == code, err
    return json.loads(out), err


# --- fits --------------------------------------------------------------------------------------
def test_measure_json_says_it_fits_per_backend_and_for_the_host():
    data, _ = as_json("measure", MLP)
    assert data["fits"] is True and data["host_fits"] is True
    assert data["host_memory_bytes"] == fits.machine_memory()
    mem = {m["name"]: m for m in data["memory"]}
    assert mem["SIM0"]["memory_bytes"] == 16 * 1024**3 and mem["SIM0"]["fits"] is True
    back = {b["name"]: b for b in data["backends"]}
    assert data["host_bytes"] == sum(b["weights_bytes"] + b["arena_bytes"] for b in back.values())


@pytest.mark.parametrize("command", ["plan", "measure"])
def test_over_a_backends_memory_exits_1_after_the_answer(tmp_path, command):
    data, err = as_json(command, MLP, "--backends", backends_file(tmp_path, "1MiB"), code=1)
    assert data["fits"] is False
    assert {m["name"]: m["fits"] for m in data["memory"]} == {"SIM0": False, "CPU": True}
    assert "backend SIM0 needs" in err and "largest tensors: w1 (4.00 MiB)" in err
    code, out, _ = invoke(command, MLP, "--backends", backends_file(tmp_path, "1MiB"))
    assert code == 1 and "fits" in out and "NO" in out


def test_memory_option_overrides_and_the_table_says_no(tmp_path):
    code, out, err = invoke("measure", MLP, "--memory", "SIM0=1MiB")
    assert code == 1 and "--memory SIM0=SIZE" in err
    assert "NO" in out and "fits" in out


@pytest.mark.host
def test_host_ram_is_checked_as_a_whole(tmp_path, monkeypatch):
    """Every backend passes its own check, but together they exceed the machine."""
    monkeypatch.setenv("GGMLRUN_HOST_RAM", "4MiB")         # a smaller machine (core/util/host.py)
    assert fits.machine_memory() == 4096 * 1024
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:        4096 kB\nMemFree: 1 kB\n")
    assert fits.machine_memory(meminfo) == 4096 * 1024
    small = tmp_path / "b.yaml"
    small.write_text("backends:\n  - {name: SIM0, kind: sim}\n  - {name: CPU, kind: cpu, memory: 1GiB}\n")
    data, err = as_json("measure", MLP, "--backends", small, code=1)
    assert all(m["fits"] for m in data["memory"]) and data["host_fits"] is False
    assert "host RAM" in err and "4194304 bytes" in err


def test_run_refuses_before_generating_any_data(tmp_path, monkeypatch):
    def never(graph):
        raise AssertionError("data generated for a plan that does not fit")

    monkeypatch.setattr(engine, "leaf_values", never)
    code, out, err = invoke("run", MLP, "--memory", "SIM0=64KiB")
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1


# --- measure --fit -----------------------------------------------------------------------------
def test_fit_answers_what_bisecting_gen_offload_by_hand_answers(tmp_path):
    layers = 6
    base = llama(tmp_path)
    per_k = []
    for k in range(layers + 1):
        data, _ = as_json("measure", llama(tmp_path, "--offload", k, name=f"o{k}.yaml"), code=None)
        sim = next(m for m in data["memory"] if m["name"] == "SIM0")
        per_k.append(sim["need_bytes"])
    assert per_k == sorted(per_k)
    # a memory between the needs of 3 and 4 layers on the device
    memory = (per_k[3] + per_k[4]) // 2
    found, _ = as_json("measure", base, "--fit", "--memory", f"SIM0={memory}B")
    assert found["layer_fit"] == [{"device": "SIM0", "layers": 3, "total": layers,
                                   "base_fits": True, "op_offload": True}]
    code, out, _ = invoke("measure", base, "--fit", "--memory", f"SIM0={memory}B", "--no-op-offload")
    assert code == 0 and "layers fit on SIM0 (op offload off)" in out


def test_fit_needs_layers(tmp_path):
    code, _, err = invoke("measure", MLP, "--fit")
    assert code == 2 and "l<N>" in err


# --- what-if options ---------------------------------------------------------------------------
def test_remap_makes_a_pinned_graph_comparable_on_the_cpu_alone():
    code, _, err = invoke("measure", MLP, "--backends", CPU_ONLY)
    assert code == 2 and "--remap SIM0=CPU" in err and "unknown backend 'SIM0'" in err
    data, _ = as_json("plan", MLP, "--backends", CPU_ONLY, "--remap", "SIM0=CPU")
    assert {n["backend"] for n in data["nodes"]} == {"CPU"} and data["n_splits"] == 1


def test_remap_to_a_missing_backend_is_bad_input():
    code, _, err = invoke("plan", MLP, "--remap", "SIM0=GPU")
    assert code == 2 and "--remap SIM0=GPU" in err


def test_no_op_offload_and_offload_min_batch(tmp_path):
    graph = llama(tmp_path)
    on, err_on = as_json("plan", graph)
    assert any(n["cause"] == "1.off" for n in on["nodes"])
    assert "op offload copies" in err_on and "--no-op-offload" in err_on
    assert on["summary"]["offloaded_weights"]["count"] > 0
    for flags in (("--no-op-offload",), ("--offload-min-batch", 33)):
        off, err_off = as_json("plan", graph, *flags)
        assert not any(n["cause"] == "1.off" for n in off["nodes"])
        assert "op offload" not in err_off and off["n_splits"] < on["n_splits"]


@pytest.mark.host
def test_threads_are_capped_at_the_cores():
    data, _ = as_json("run", MLP, "--threads", 999)
    assert data["timings"]["threads"] == host.cores()


# --- summary -----------------------------------------------------------------------------------
def test_summary_counts_nodes_copies_and_layers(tmp_path):
    data, _ = as_json("measure", llama(tmp_path, "--offload", 2))
    summary = data["summary"]
    assert summary["n_nodes"] == sum(b["nodes"] for b in summary["backends"])
    assert summary["n_splits"] >= 1
    layers = {b["name"]: b["layers"] for b in summary["backends"]}
    assert layers == {"SIM0": [4, 5], "CPU": [0, 1, 2, 3]}
    moved_in = sum(b["copy_in_bytes"] for b in summary["backends"])
    moved_out = sum(b["copy_out_bytes"] for b in summary["backends"])
    assert moved_in == moved_out
    for b in summary["backends"]:
        assert sum(b["causes"].values()) == b["nodes"]
    code, out, _ = invoke("measure", llama(tmp_path, "--offload", 2, name="m.yaml"))
    assert "graph nodes = " in out and "4-5" in out and "0-3" in out


def test_ggml_sched_debug_prints_the_dump_on_stderr(monkeypatch):
    monkeypatch.setenv("GGML_SCHED_DEBUG", "2")
    code, out, err = invoke("plan", MLP, "--json")
    assert code == 0 and "## SPLIT #0: SIM0" in err
    json.loads(out)


def test_format_ggml_alone_prints_the_dump():
    code, out, _ = invoke("plan", MLP, "--format", "ggml")
    assert code == 0 and out.startswith("## SPLIT #0: SIM0")


# --- tables never cut --------------------------------------------------------------------------
def render(table, width):
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(table)
    return console.file.getvalue()


BIG = [engine.BackendMemory("SIM0", "sim", 184_221_824, 6_610_485_248, 184_221_824,
                            20_800_864_384, 17_179_869_184, 249_561_216, "best"),
       engine.BackendMemory("CPU", "cpu", 1_048_576, 19_831_455_744, 1_048_576, 25_690_240,
                            25_276_063_744, 1_048_576, "best")]


@pytest.mark.parametrize("width", [80, 140])
def test_measure_table_never_cuts_a_figure(width):
    fit = fits.check(BIG, host_memory=25_276_063_744)
    text = render(report.measure_table(BIG, "memory of llama", fit), width)
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= width
    for m in BIG:
        for value in (m.arena_bytes, m.weights_bytes, m.memory):
            assert f"{value:,}" in text or human_bytes(value) in text, (value, text)
    if width == 140:
        assert "19,831,455,744" in text


@pytest.mark.parametrize("width", [80, 140])
def test_assignment_and_split_tables_keep_every_name(tmp_path, width):
    g = load_graph(llama(tmp_path, "--offload", 2))
    sched = engine.schedule(g, engine.resolve_backends(g, None))
    text = render(report.assignment_table(sched), width)
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= width
    cells = {cell.strip() for line in text.splitlines() for cell in line.split("│")}
    assert {n.name for n in g.nodes} <= cells
    out = render(report.split_table(sched), width)
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= width


def test_names_are_cleaned_of_markup_and_control_characters():
    table = report.Table(title="t [/] \x1b[2J")
    table.add_column("name")
    table.add_row("[/]x\x1b[31mred\x07")
    text = render(table, 80)
    assert "\x1b" not in text and "\x07" not in text
    assert "[/]x[31mred" in text and "t [/] [2J" in text


# --- timings and phases ------------------------------------------------------------------------
def test_timings_keep_totals_and_add_per_run():
    data, _ = as_json("run", MLP, "--repeat", 3, "--warmup", 2)
    timings = data["timings"]
    assert timings["repeat"] == 3 and timings["warmup"] == 2
    assert len(timings["per_run"]["runs_s"]) == 3
    assert timings["per_run"]["mean_s"] > 0 and timings["per_run"]["median_s"] > 0
    for b in timings["backends"]:
        assert b["copy_bytes"] == 3 * b["per_run"]["copy_bytes"]
        assert b["compute_s"] == pytest.approx(3 * b["per_run"]["compute_s"])
    assert set(data["phases"]) >= {"load_s", "schedule_s", "plan_s", "data_s", "compute_s"}
    assert len(timings["load_average"]) == 3


def test_run_header_names_warmup_threads_and_load():
    code, out, _ = invoke("run", MLP, "--repeat", 2, "--warmup", 1, "--threads", 1)
    assert code == 0
    assert "2 timed runs after 1 warm-up" in out and "BLAS threads 1" in out
    assert "load average" in out and "median" in out


def test_progress_flag_prints_phase_times_off_a_terminal():
    code, _, err = invoke("measure", MLP, "--progress")
    assert code == 0 and "phases: load" in err and "plan" in err
    code, _, err = invoke("measure", MLP)
    assert "phases:" not in err


# --- hints for the classic mistakes ------------------------------------------------------------
def validate_error(tmp_path, text, name="g.yaml"):
    path = tmp_path / name
    path.write_text(text)
    code, _, err = invoke("validate", path)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    return err


def test_hint_for_a_shape_in_ggml_ne_order(tmp_path):
    err = validate_error(tmp_path, "tensors:\n  w: {shape: [512, 2048]}\n  x: {shape: [32, 512]}\n"
                                   "nodes:\n  - {name: h, op: mul_mat, src: [x, w]}\n")
    assert "shapes are NumPy order, the reverse of ggml's ne" in err and "[2048, 512]" in err
    plain = validate_error(tmp_path, "tensors:\n  w: {shape: [7, 9]}\n  x: {shape: [3, 5]}\n"
                                     "nodes:\n  - {name: h, op: add, src: [x, w]}\n", "p.yaml")
    assert "ggml's ne" not in plain


def test_hint_for_a_tab_in_yaml(tmp_path):
    err = validate_error(tmp_path, "tensors:\n\tw: {shape: [4]}\n")
    assert "tab" in err and ":2:" in err


def test_did_you_mean_comes_first(tmp_path):
    err = validate_error(tmp_path, "tensors:\n  w: {shape: [4, 4]}\n"
                                   "nodes:\n  - {name: h, op: matmul, src: [w, w]}\n")
    assert "unknown op 'matmul'; known: mul_mat, " in err and err.rstrip().endswith(
        "did you mean 'mul_mat'?")


def test_missing_files_name_the_nearest(tmp_path):
    (tmp_path / "embed.npy").write_bytes(b"")
    err = validate_error(tmp_path, "tensors:\n  w: {shape: [4], file: emb.npy}\n")
    assert "'embed.npy'" in err
    code, _, err = invoke("validate", ROOT / "graphs/mlp.yam")
    assert code == 2 and "nearest name" in err and "'mlp.yaml'" in err


# --- profile by node or shape ------------------------------------------------------------------
@pytest.mark.parametrize("by", ["op", "node", "shape"])
def test_profile_groups_sorts_and_keeps_the_top(by):
    data, _ = as_json("run", MLP, "--profile", "--profile-by", by, "--top", 2, "--sort", "calls")
    rows = data["profile"]["ops"]
    assert len(rows) == 2 and rows[0]["calls"] >= rows[1]["calls"]
    full, _ = as_json("run", MLP, "--profile", "--profile-by", by, "--sort", "name")
    names = [r["name"] for r in full["profile"]["ops"]]
    assert names == sorted(names)
    if by == "node":
        assert sorted(names) == sorted(n["name"] for n in full["nodes"])
    if by == "shape":
        assert "mul_mat [32, 2048]" in names


# --- README ------------------------------------------------------------------------------------
def test_readme_is_true_in_a_clone():
    text = (ROOT / "README.md").read_text()
    assert "../shared" not in text and "Python >= 3.11" in text and "Graphviz" in text
    import re

    for path in set(re.findall(r"\b((?:graphs|examples|docs)/[\w./-]+\.(?:yaml|csv|md))", text)):
        assert (ROOT / path).is_file(), path
    for csv in (ROOT / "examples/pack").glob("*.csv"):
        assert csv.stat().st_size < 20_000
    assert "scratch/" in (ROOT / ".gitignore").read_text()


@pytest.mark.parametrize("command", ["validate", "plan", "measure", "run"])
def test_markup_and_escape_codes_in_names_and_paths_print_as_text(tmp_path, command):
    folder = tmp_path / "x [/y]"
    folder.mkdir(parents=True)
    graph = folder / "g.yaml"
    graph.write_text(MLP.read_text().replace("name: mlp", 'name: "[/]\\x1b[2Jm"'))
    code, out, err = invoke(command, graph)
    assert code == 0, err
    assert "\x1b" not in out + err and "internal error" not in err
    if command != "validate":
        assert "[/]" in out


def test_bare_ggmlrun_prints_the_help_and_exits_0():
    code, out, err = invoke()
    assert code == 0 and err == ""
    assert "Usage:" in out and "measure" in out and "fit" in out


def test_measure_fit_exits_1_when_the_host_does_not_fit(tmp_path, monkeypatch):
    """--fit answers for the devices; a plan over the host's RAM is still a failure (exit 1,
    one line), whatever the layers say."""
    path = llama(tmp_path, "--offload", 6)
    code, out, _ = invoke("measure", path, "--fit", "--memory", "SIM0=64GiB")
    assert code == 0 and "fits" in out
    monkeypatch.setenv("GGMLRUN_HOST_RAM", "1MiB")
    code, out, err = invoke("measure", path, "--fit", "--memory", "SIM0=64GiB")
    assert code == 1 and "does NOT fit" in out
    assert len(err.strip().splitlines()) == 1 and "host RAM" in err


def test_expert_options_on_a_dense_model_warn_and_change_nothing():
    dense = ROOT / "examples/models/tiny-llama-f16.gguf"
    code, plain, _ = invoke("measure", dense, "--json")
    for flag in (("--n-cpu-moe", 2), ("--cpu-moe",)):
        code, out, err = invoke("measure", dense, *flag, "--json")
        assert code == 0 and "moves nothing" in err
        assert json.loads(out)["backends"] == json.loads(plain)["backends"]
    code, _, err = invoke("measure", ROOT / "examples/models/tiny-qwen3moe-f16.gguf",
                          "--n-cpu-moe", 1)
    assert code == 0 and "moves nothing" not in err
