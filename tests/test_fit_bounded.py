"""fit is bounded when nothing can fit: the largest context that would fit is found from its
neighbours' answers (the devices only fill up as the context grows) and by halving, not by a
search over every -ngl at every context (deepseek-v3 at --ctx 4294967295: 391 reserves before;
the search is the same on every model, so a lighter card states it here)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from clikit import invoke

CARDS = Path(__file__).resolve().parents[1] / "ggmlrun" / "models" / "cards"
CARD = CARDS / "llama-3-8b-q4_k_m.yaml"


def test_nothing_fits_at_a_huge_context_in_a_bounded_number_of_reserves():
    """The advice names the edge: fit at that context answers with that -ngl, and 256 more
    cells (one KV step) fit nothing."""
    def fit(ctx):
        code, out, err = invoke("fit", CARD, "--gpu", "24GiB", "--ram", "512GiB", "--ctx",
                                str(ctx), "--flash-attn", "off", "--parallel", "1", "--json")
        return code, json.loads(out), err

    code, data, err = fit(4294967295)
    assert code == 1 and "nothing fits" in err
    assert len(data["probes"]) <= 80
    ctx, ngl = map(int, re.search(r"the largest context that fits is --ctx (\d+), with -ngl "
                                  r"(\d+)", err).groups())
    code, at, _ = fit(ctx)
    assert code == 0 and at["ngl"] == ngl
    code, beyond, _ = fit(ctx + 256)
    assert code == 1 and beyond["ngl"] is None


CARD_70B = CARDS / "llama-3-70b-q4_k_m.yaml"


def test_dense_split_searched_in_a_bounded_number_of_reserves():
    """Llama-3-70B on 24 + 12 GiB (issue 30 item 4): llama.cpp's split by memory holds 62
    layers with 2 GiB of GPU0 unused; the split fit searches holds 66 (67 fit no split: each
    one leaves a device short), and with --ctx auto the longest context those 66 reach with
    some split; a handful of reserves beyond llama.cpp's."""
    def fit(*extra):
        code, out, err = invoke("fit", CARD_70B, "--gpu", "24GiB,12GiB", "--ram", "32GiB",
                                "--flash-attn", "on", "--parallel", "1", "--json", *extra)
        assert code == 0, err
        return json.loads(out)

    fixed = fit("--ctx", "4096")
    assert (fixed["ngl"], fixed["tensor_split"]) == (66, [46, 20])
    assert "-ngl 66 -c 4096 -fa on -ts 46,20" in fixed["command"]
    assert len(fixed["probes"]) <= 12
    # layers stay on the CPU: what one more step frees (flash attention is on already)
    assert [(st["option"], st["on"]) for st in fixed["one_more_step"]] == \
        [("-ctk q8_0 -ctv q8_0", ["GPU0", "GPU1"])]
    assert fixed["one_more_step"][0]["saves_bytes"] > 0
    given = fit("--ctx", "4096", "--tensor-split", "24,12")      # llama.cpp's own split
    assert given["ngl"] == 62 and given.get("tensor_split") is None
    auto = fit("--ctx", "auto")
    assert (auto["ngl"], auto["ctx"]) == (66, 6144) and len(auto["probes"]) <= 24
