"""fit is bounded when nothing can fit: the largest context that would fit is found from its
neighbours' answers (the devices only fill up as the context grows) and by halving, not by a
search over every -ngl at every context (deepseek-v3 at --ctx 4294967295: 391 reserves before)."""

from __future__ import annotations

import json
from pathlib import Path

from clikit import invoke

CARD = Path(__file__).resolve().parents[1] / "ggmlrun" / "models" / "cards" / "deepseek-v3-q4_k_m.yaml"


def test_nothing_fits_at_a_huge_context_in_a_bounded_number_of_reserves():
    code, out, err = invoke("fit", CARD, "--gpu", "24GiB", "--ram", "512GiB",
                            "--ctx", "4294967295", "--flash-attn", "off", "--parallel", "1",
                            "--json")
    data = json.loads(out)
    assert code == 1 and "nothing fits" in err
    assert "the largest context that fits is --ctx 91136, with -ngl 0" in err
    assert len(data["probes"]) <= 80
