"""Hyperparameters bounded where they overflow float32 (as rope.scaling.attn_factor is):
deepseek2's expert_weights_scale and rope.scaling.yarn_log_multiplier at 3.4e38 or 1e30 gave
NaN logits; each is refused at load, naming the key, and real values still load."""

from __future__ import annotations

import pytest

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.arch import from_metadata
from tests.test_deepseek2 import fields


@pytest.mark.parametrize("key,bad", [("expert_weights_scale", 3.4e38),
                                     ("expert_weights_scale", 1e4),
                                     ("rope.scaling.yarn_log_multiplier", 1e30),
                                     ("rope.scaling.yarn_log_multiplier", 3.4e38)])
def test_an_overflowing_value_is_refused_naming_the_key(key, bad):
    meta = fields()
    meta[f"deepseek2.{key}"] = bad
    with pytest.raises(InputError, match=key.replace(".", r"\.")):
        from_metadata(meta, "deepseek2")


@pytest.mark.parametrize("key,good", [("expert_weights_scale", 2.5),
                                      ("rope.scaling.yarn_log_multiplier", 0.0707)])
def test_real_values_still_load(key, good):
    meta = fields()
    meta[f"deepseek2.{key}"] = good
    from_metadata(meta, "deepseek2")
