"""Fuzzing the whole command line: graph files, backends files, pack CSVs and arguments.

Whatever the input, ggmlrun must answer with exit 0, 1 or 2, one message and never a
traceback, "internal error" or a RuntimeWarning, in bounded time. The default profile runs a
few dozen cases per test (~30 s in all); HYPOTHESIS_PROFILE=nightly digs much deeper.
"""

import os
import re
import warnings
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from clikit import invoke
from tests.hang import no_hang

ROOT = Path(__file__).resolve().parent.parent
BASES = [p.read_text() for p in sorted((ROOT / "graphs").glob("*.yaml"))
         if p.stat().st_size < 4000]
EXTREMES = ["0", "-1", "1", str(2**31), str(2**63), str(2**70), str(2**1100), "1e308",
            "1e-320", "1e999", "-1e999", ".nan", ".inf", "-.inf", "'1e300TiB'", "x", "[]", "{}",
            "null", "true", "'[/]'", "\"\\x1b[31m\"", "*a", "&a 3", "2.5", "'a: b'", "~"]
NUMBER = re.compile(r"(?<![A-Za-z_])-?\d+(?:\.\d+)?(?:e-?\d+)?")
NIGHTLY = os.environ.get("HYPOTHESIS_PROFILE") == "nightly"
LOG = os.environ.get("GGMLRUN_FUZZ_LOG")     # a file to count the exit codes of a long run


def check(*args):
    """Run `ggmlrun ARGS` and assert the invariants; return the exit code."""
    with no_hang(f"ggmlrun {args[0]}"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, out, err = invoke(*args)
    assert code in (0, 1, 2), (args, code, err[-2000:])
    assert "Traceback" not in err and "internal error" not in err, err[-2000:]
    assert "RuntimeWarning" not in err, err[-2000:]
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)], caught
    assert len(err) < 20_000, err[:500]
    if LOG:
        with open(LOG, "a") as handle:
            handle.write(f"{args[0]} {code}\n")
    return code


@st.composite
def mutated_graph(draw):
    text = draw(st.sampled_from(BASES))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["number", "drop", "dup", "char"]))
        if kind == "number":
            spots = list(NUMBER.finditer(text))
            if spots:
                spot = draw(st.sampled_from(spots))
                text = text[:spot.start()] + draw(st.sampled_from(EXTREMES)) + text[spot.end():]
        elif kind in ("drop", "dup"):
            lines = text.splitlines()
            i = draw(st.integers(0, len(lines) - 1))
            lines[i:i + 1] = [] if kind == "drop" else [lines[i], lines[i]]
            text = "\n".join(lines) + "\n"
        else:
            i = draw(st.integers(0, len(text)))
            text = text[:i] + draw(st.sampled_from(list("[]{}:,-'\"&*!#|> \n\t\x00é"))) + text[i:]
    return text


FAST = settings(suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow], deadline=None,
                max_examples=2000 if NIGHTLY else 120)


@FAST
@given(text=mutated_graph(), command=st.sampled_from(["validate", "plan", "measure", "run"]),
       policy=st.sampled_from(["ggml", "cost"]))
def test_fuzz_graph_files(tmp_path_factory, text, command, policy):
    path = tmp_path_factory.mktemp("g") / "g.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    args = [command, path] + (["--policy", policy] if command != "validate" else [])
    check(*args)


BACKEND_FIELDS = {"memory": EXTREMES + ["'8GiB'", "'1.5GiB'", "'64 KiB'", "'8GB'"],
                  "alignment": EXTREMES + ["64", "3"], "threads": EXTREMES + ["64"],
                  "flops": EXTREMES + ["50e12"], "mem_bw": EXTREMES, "link_bw": EXTREMES,
                  "link_latency": EXTREMES + ["1e-6"], "supports": ["[add]", "[nope]", "3"],
                  "offload_min_batch": EXTREMES}


@FAST
@given(fields=st.dictionaries(st.sampled_from(sorted(BACKEND_FIELDS)), st.integers(0, 40),
                              max_size=3),
       kind=st.sampled_from(["cpu", "sim", "gpu", "x"]),
       command=st.sampled_from(["validate", "plan", "measure", "run"]))
def test_fuzz_backends_files(tmp_path_factory, fields, kind, command):
    folder = tmp_path_factory.mktemp("b")
    entries = ", ".join(f"{key}: {BACKEND_FIELDS[key][i % len(BACKEND_FIELDS[key])]}"
                        for key, i in fields.items())
    name = "CPU" if kind == "cpu" else "SIM0"
    extra = "" if kind == "cpu" else "  - {name: CPU, kind: cpu}\n"
    (folder / "b.yaml").write_text(f"backends:\n  - {{name: {name}, kind: {kind}"
                                   f"{', ' if entries else ''}{entries}}}\n{extra}")
    policy = "cost" if "flops" in fields or "link_latency" in fields else "ggml"
    check(command, ROOT / "graphs" / "mlp.yaml", "--backends", folder / "b.yaml",
          *(["--policy", policy] if command != "validate" else []))


CSV_VALUES = ["0", "1", "8", "-1", str(2**62), str(2**63), str(2**70), "1e3", "x", "", "2.5"]


@FAST
@given(rows=st.lists(st.tuples(st.sampled_from(CSV_VALUES), st.sampled_from(CSV_VALUES),
                               st.sampled_from(CSV_VALUES)), max_size=12),
       junk=st.binary(max_size=20), capacity=st.sampled_from([None, "64", "1e999", "x", "1MiB"]))
def test_fuzz_pack_csv(tmp_path_factory, rows, junk, capacity):
    path = tmp_path_factory.mktemp("p") / "b.csv"
    body = "".join(f"b{i},{lo},{hi},{size}\n" for i, (lo, hi, size) in enumerate(rows))
    path.write_bytes(b"id,lower,upper,size\n" + body.encode() + junk)
    check("pack", path, "--time-limit", "0.2",
          *(["--capacity", capacity] if capacity is not None else []))


@FAST
@given(args=st.lists(st.sampled_from(
    ["--repeat", "0", "1", str(2**70), "--out", "", ".", "o.npz", "o.txt", "/dev/null",
     "--trace", "t.json", "--check", "--json", "--input", "x=", "x=/dev/zero", "=",
     "--planner", "best", "ggml", "--policy", "cost", "--profile", "g.yaml"]), max_size=6))
def test_fuzz_run_arguments(tmp_path_factory, monkeypatch, args):
    folder = tmp_path_factory.mktemp("a")
    (folder / "g.yaml").write_text((ROOT / "graphs" / "mlp.yaml").read_text())
    monkeypatch.chdir(folder)
    check("run", "g.yaml", *args)
    assert (folder / "g.yaml").read_text() == (ROOT / "graphs" / "mlp.yaml").read_text()
