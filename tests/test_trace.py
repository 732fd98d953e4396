"""`run --trace`: a Chrome/Perfetto trace JSON with tracks, slices, counters and flows."""

import json
from collections import Counter
from pathlib import Path

import pytest
from ggmlrun.core import engine
from ggmlrun.core.frontend.loader import load_graph
from ggmlrun.core.observe.trace import build_trace
from tests.clikit import invoke

ROOT = Path(__file__).resolve().parents[1]



def traced(tmp_path, graph, *extra):
    path = tmp_path / "trace.json"
    code, out, err = invoke("run", ROOT / "graphs" / graph, "--trace", path, *extra)
    assert code == 0, err
    return json.loads(path.read_text()), out, err


def schedule_of(graph):
    g = load_graph(ROOT / "graphs" / graph)
    return engine.schedule(g, engine.resolve_backends(g, None))


@pytest.mark.parametrize("graph", ["mlp.yaml", "llama_block.yaml", "pins.yaml", "llama_offload.yaml"])
def test_trace_has_every_step_once_per_run_flows_paired_and_counters_bounded(tmp_path, graph):
    repeat = 2
    trace, _, err = traced(tmp_path, graph, "--repeat", repeat)
    assert "wrote" in err
    events = trace["traceEvents"]
    assert isinstance(events, list) and all("ph" in e for e in events)
    sched = schedule_of(graph)
    backends = [b.name for b in sched.backends]

    # one named track per backend
    names = {e["tid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert sorted(names) == list(range(1, len(backends) + 1))
    assert [names[i + 1].split()[0] for i in range(len(backends))] == backends
    assert any(e["ph"] == "M" and e["name"] == "process_name" for e in events)

    # one X per op and copy of the schedule, per run, on its backend's track
    slices = [e for e in events if e["ph"] == "X"]
    steps = sched.execution_steps()
    want = Counter((run, s.tensor.name) for run in range(repeat) for s in steps)
    got = Counter((e["args"]["run"], e["name"]) for e in slices)
    assert got == want
    for e in slices:
        assert e["ts"] >= 0 and e["dur"] >= 0
        args = e["args"]
        for key in ("kind", "op", "shape", "dtype", "bytes", "buffer", "offset", "backend", "cause"):
            assert key in args, (e["name"], key)
        assert names[e["tid"]].startswith(args["backend"] + " ")
        if args["kind"] == "copy":
            assert args["op"] == "copy" and args["to"] == args["backend"] and args["from"] != args["to"]
        else:
            assert "src_shapes" in args and args["buffer"].startswith(args["backend"])
    copies = [e for e in slices if e["args"]["kind"] == "copy"]
    assert len(copies) == repeat * sched.copy_count

    # flows: every s has exactly one f with its id, and each binds to a slice (same tid and ts)
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert len(starts) == sum(1 for e in events if e["ph"] == "s")
    assert starts.keys() == ends.keys()
    at = {(e["tid"], e["ts"], e["cat"]) for e in slices}
    for fid, s in starts.items():
        f = ends[fid]
        assert f["bp"] == "e" and s["cat"] == f["cat"] and s["ts"] <= f["ts"]
        assert (s["tid"], s["ts"], s["cat"]) in at and (f["tid"], f["ts"], f["cat"]) in at
    if sched.copy_count:
        assert starts, "copies but no flow arrows"

    # counters: one per arena, never above it, and reaching the lower bound
    code, out, _ = invoke("measure", ROOT / "graphs" / graph, "--json")
    memory = {b["name"]: b for b in json.loads(out)["backends"]}
    counters = [e for e in events if e["ph"] == "C"]
    seen = {}
    for e in counters:
        name = e["name"].removeprefix("arena ")
        seen[name] = max(seen.get(name, 0), e["args"]["live_bytes"])
        assert 0 <= e["args"]["live_bytes"] <= memory[name]["arena_bytes"]
    assert set(seen) == {n for n, b in memory.items() if b["arena_bytes"] > 0}
    for name, peak in seen.items():
        assert peak == memory[name]["lower_bound_bytes"]


def test_flows_go_producer_to_copy_to_consumer():
    sched = schedule_of("mlp.yaml")
    g = sched.graph
    plan, _ = engine.plan_memory(sched)
    result = engine.execute(sched, plan, engine.leaf_values(g), record_events=True)
    trace = build_trace(sched, plan, result)
    flows = {e["name"] for e in trace["traceEvents"] if e["ph"] == "s"}
    # x is an input (a leaf): no producer arrow into its copy
    assert flows == {"SIM0#x -> h", "y0 -> CPU#y0", "CPU#y0 -> y"}


def test_trace_with_json_keeps_stdout_one_object(tmp_path):
    path = tmp_path / "t.json"
    code, out, err = invoke("run", ROOT / "graphs/mlp.yaml", "--trace", path, "--json")
    assert code == 0, err
    assert json.loads(out)["graph"] == "mlp"
    assert json.loads(path.read_text())["otherData"]["graph"] == "mlp"
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]   # no temporary left behind


def test_trace_into_a_missing_directory_is_one_line_exit_2(tmp_path):
    """Checked before any work, as bad input (docs/robustness.md)."""
    code, _, err = invoke("run", ROOT / "graphs/mlp.yaml", "--trace", tmp_path / "no" / "t.json")
    assert code == 2 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and "--trace" in err and "does not exist" in err
