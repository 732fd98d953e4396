"""Small messages of issue 34: a CSV with a byte order mark, a name with a newline, a key past
YAML's length limit; each one line, exit 2 where the input is bad."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from clikit import invoke
from ggmlrun.core.util.fmt import clip

CSV = "id,lower,upper,size\n0,0,10,64\n1,5,20,32\n"


def test_a_csv_with_a_byte_order_mark_reads_as_without(tmp_path):
    plain, bom = tmp_path / "a.csv", tmp_path / "b.csv"
    plain.write_text(CSV)
    bom.write_bytes(b"\xef\xbb\xbf" + CSV.encode())
    a, b = invoke("pack", plain, "--json"), invoke("pack", bom, "--json")

    def answer(out):            # the plan, without its timings
        return {k: v for k, v in json.loads(out).items() if "seconds" not in k}
    assert a[0] == b[0] == 0 and answer(a[1]) == answer(b[1])


def test_gen_name_with_a_newline_is_one_line(tmp_path):
    code, _, err = invoke("gen", "llama", "--name", "a\nb")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "a\\nb" in err


def test_a_key_past_yamls_limit_is_named_as_such(tmp_path):
    path = tmp_path / "k.yaml"
    path.write_text("tensors:\n  x: {shape: [4]}\nnodes:\n  - {name: y, op: relu, src: [x], "
                    + "k" * 2000 + ": 1}\n")
    code, _, err = invoke("validate", path)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "1024 characters" in err


@given(st.text(max_size=200))
def test_clip_never_breaks_a_line(text):
    shown = clip(text)
    assert "\n" not in shown and "\r" not in shown and len(shown) <= 80
