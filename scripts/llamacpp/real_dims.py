"""A spot check at real dimensions: a qwen3 file shaped like Qwen3-0.6B (n_embd 1024, 16 heads of
128 over 8 KV heads, n_ff 3072; 4 of its 28 layers and the tiny vocabulary, q8_0, 68 MB, not
committed), recorded with real llama.cpp as record.py records, then compared with ggmlrun's
measure and run. The committed tiny models cannot show a head of 128 with a quantized cache
(llama.cpp's Hadamard rotation of K and V) or compute buffers of realistic size.

    python3 scripts/llamacpp/real_dims.py [--out /tmp/realdim]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(REPO), str(HERE)]

import make_tiny_gguf as mk  # noqa: E402
import record as rec  # noqa: E402

MODEL = mk.TinyModel("qwen3-realdim-q8_0", "q8_0", n_embd=1024, n_head=16, n_head_kv=8,
                     n_ff=3072, n_layer=4, seed=99, arch="qwen3", head_dim=128, qk_norm=True)
CONFIGS = ([dict(ctx=4096, ubatch=512, flash_attn=fa, ngl=ngl)
            for fa in (False, True) for ngl in (0, 2, "all")]
           + [dict(ctx=4096, ubatch=512, flash_attn=True, ngl="all", kv_type="q8_0"),
              dict(ctx=4096, ubatch=32, flash_attn=False, ngl=2)])


def record(path: Path) -> list[dict]:
    entries = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        shim = rec.compile_shim(workdir)
        server, endpoint = rec.start_rpc_server()
        try:
            for opts in CONFIGS:
                cfg = {"model": MODEL.name, "no_kv_offload": False, "kv_type": "f16",
                       "overrides": [], "tensor_split": []} | opts
                cfg["id"] = rec.config_id(MODEL.name, cfg["ctx"], cfg["ubatch"], cfg["flash_attn"],
                                          cfg["ngl"], "" if cfg["kv_type"] == "f16" else cfg["kv_type"])
                cfg.update(path=str(path), n_layer=MODEL.n_layer)
                entries.append(rec.record_one(cfg, [endpoint], shim, workdir)[0])
        finally:
            server.kill()
            server.wait()
    return entries


def compare(path: Path, entry: dict, out: Path) -> str:
    from tests.clikit import invoke

    o = entry["options"]
    args = ["--backends", str(REPO / "graphs/backends/llamacpp_rpc.yaml"), "--ctx", str(o["ctx"]),
            "--ubatch", str(o["ubatch"]), "--flash-attn", "on" if o["flash_attn"] else "off",
            "--ngl", str(o["ngl"]), "--kv-type", o["kv_type"]]
    code, text, err = invoke("measure", path, "--json", *args)
    assert code == 0, err
    got = json.loads(text)
    by = {b["name"]: b for b in got["backends"]}
    diffs = [f"{k} {got[k]} vs {entry[k]}" for k in ("n_nodes", "n_splits") if got[k] != entry[k]]
    diffs += [f"{name}.{k} {by[name][k]} vs {v}" for name, want in entry["backends"].items()
              for k, v in want.items() if by[name][k] != v]
    code, text, err = invoke("run", path, "--tokens", ",".join(map(str, rec.TOKENS)), "--json",
                             "--out", out / "logits.npz", *args)
    assert code == 0, err
    logits = np.load(out / "logits.npz")["result_output"].reshape(-1)
    want = np.asarray(entry["logits"])
    error = np.abs(logits - want).max() / np.abs(want).max()
    return f"{'equal' if not diffs else '; '.join(diffs)}, logits {error:.1e}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/realdim"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{MODEL.name}.gguf"
    if not path.exists():
        mk.write_model(MODEL, args.out)
    for entry in record(path):
        print(f"{entry['id']}: nodes {entry['n_nodes']}, splits {entry['n_splits']}: "
              f"{compare(path, entry, args.out)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
