"""Every hyperparameter of every bundled model and card set to each of a list of hostile values,
one at a time: the deterministic companion of tests/test_gguf_fuzz.py's random mutations
(docs/robustness.md gives its counts).

  python3 scripts/sweep_hparams.py gguf    # each tiny model (f16, and gpt-oss's mxfp4): its
                                           # own keys in their stored type, and the newer
                                           # architectures' keys added where absent; `run`
  python3 scripts/sweep_hparams.py cards   # five MoE cards: each key (and the newer keys)
                                           # set to 22 values; validate, fit, measure

A case fails when it ends in a traceback, an internal error, a warning, a kernel's exception,
more than one error line, or (gguf) exit 0 with NaN or infinite logits. Prints each failure
and the exit codes; exits 1 when any case failed. The host is simulated (8 GiB available).
"""

from __future__ import annotations

import collections
import json
import math
import struct
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ggmlrun.core.util import ram  # noqa: E402
from ggmlrun.models import run as model_run  # noqa: E402
from tests import test_gguf_fuzz as F  # noqa: E402
from tests.clikit import invoke  # noqa: E402
from tests.ggufkit import ARRAY, MODELS, kv_bytes, layout, rebuild  # noqa: E402

CARDS = ["gpt-oss-20b-mxfp4", "gemma-4-26b-a4b-q4_k_m", "qwen3.5-35b-a3b-q4_k_m",
         "glm-4.5-air-q4_k_m", "qwen3-30b-a3b-q4_k_m"]
CARD_KEYS = ["n_expert", "n_expert_used", "n_ff_exp", "n_ff_shexp", "n_swa", "swa_pattern",
             "n_layer_nextn", "rope_freq_base_swa", "n_expert_shared", "n_layer_dense_lead",
             "expert_weights_scale", "expert_gating_func", "expert_weights_norm",
             "final_logit_softcapping", "shared_kv_layers", "n_embd_per_layer",
             "full_attention_interval", "n_rot_swa", "n_embd_head_k_swa", "n_ff", "n_head_kv"]
CARD_VALUES = [0, -1, 1, 2, 3, 2**31, 2**32, 2**64, 10**30, 1e300, float("nan"), float("inf"),
               -0.0, 0.5, "x", True, False, [], [1, 2], [0] * 30, None, {"a": 1}]


def failed(code, err, caught, seconds) -> bool:
    lines = [line for line in err.splitlines() if line.strip()]
    return (code not in (0, 1, 2) or "Traceback" in err or "internal error" in err or caught
            or "Warning" in err or "while executing node" in err or seconds > 10
            or code != 0 and (len(lines) != 1 or not lines[0].startswith("ggmlrun: error: ")))


def one(*args):
    t0 = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, out, err = invoke(*args)
    return code, out, err, caught, time.monotonic() - t0


def gguf_cases(raw: bytes):
    lay = layout(raw)
    arch = F._arch(raw, lay)
    for key in [k for k in lay.keys if k.startswith(arch + ".")]:
        at = lay.keys[key][1]
        gtype, at = struct.unpack_from("<i", raw, at)[0], at + 4
        if gtype == ARRAY:
            etype, count = struct.unpack_from("<iQ", raw, at)
            gtype, at = (etype, at + 12) if count else (None, at)
        if gtype not in (4, 5, 6, 7):
            continue
        values = F.F32_VALUES if gtype == 6 else [True, False] if gtype == 7 else F.U32_VALUES
        for v in values:
            v = v - 2**32 if gtype == 5 and v >= 2**31 else v
            yield f"{key}={v}", F._patch(raw, at, v, {4: "<I", 5: "<i", 6: "<f", 7: "<?"}[gtype])
    for key, gtype in F.NEW_KEYS.items():
        if f"{arch}.{key}" not in lay.keys:
            values = F.F32_VALUES if gtype == 6 else [True, False] if gtype == 7 else F.U32_VALUES
            for v in values:
                payload = struct.pack({4: "<I", 6: "<f", 7: "<?"}[gtype], v)
                yield f"+{key}={v}", rebuild(raw, extra_kv=kv_bytes(f"{arch}.{key}", gtype,
                                                                    payload))


def sweep_gguf(tmp: Path, codes, bad):
    models = [m for m in MODELS if ("f16" in m.name and "tied" not in m.name)
              or "mxfp4" in m.name]
    path = tmp / "sweep.gguf"
    for model in models:
        for what, data in gguf_cases(model.read_bytes()):
            path.write_bytes(data)
            code, out, err, caught, seconds = one("run", path, "--tokens", "1,2,3", "--json")
            codes[f"run {code}"] += 1
            nan = False
            if code == 0:
                summary = json.loads(out)["outputs"]["result_output"]
                nan = not (math.isfinite(summary["sum"]) and math.isfinite(summary["l2"]))
            if nan or failed(code, err, caught, seconds):
                bad.append(f"{model.name} {what}: exit {code}{' NaN logits' if nan else ''} "
                           f"{err.strip()[-300:]}")


def sweep_cards(tmp: Path, codes, bad):
    import yaml

    path = tmp / "card.yaml"
    for name in CARDS:
        card = yaml.safe_load((ROOT / "ggmlrun" / "models" / "cards" / f"{name}.yaml")
                              .read_text())
        hp = card["hparams"]
        keys = list(hp) + [k for k in CARD_KEYS if k not in hp]
        changes = [(k, v) for k in keys for v in CARD_VALUES]
        changes += [("n_expert_used", hp.get("n_expert", 8) + 1)]
        for key, value in changes:
            path.write_text(yaml.safe_dump(dict(card, hparams=dict(hp, **{key: value}))))
            for command in (["validate"], ["fit", "--gpu", "24GiB", "--ram", "64GiB"],
                            ["measure"]):
                code, out, err, caught, seconds = one(command[0], path, *command[1:])
                codes[f"{command[0]} {code}"] += 1
                if failed(code, err, caught, seconds):
                    bad.append(f"{name} {key}={value!r} {command[0]}: exit {code} "
                               f"{err.strip()[-300:]}")


def main() -> int:
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what not in ("gguf", "cards"):
        print("usage: python3 scripts/sweep_hparams.py gguf|cards", file=sys.stderr)
        return 2
    ram.available_bytes = lambda: 8 << 30
    model_run.address_space = lambda: None
    codes, bad = collections.Counter(), []
    with tempfile.TemporaryDirectory() as tmp:
        (sweep_gguf if what == "gguf" else sweep_cards)(Path(tmp), codes, bad)
    for line in bad:
        print("FAIL", line)
    print(json.dumps({"sweep": what, "cases": sum(codes.values()), "failed": len(bad),
                      "exit_codes": dict(sorted(codes.items()))}))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
