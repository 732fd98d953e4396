"""llama.cpp's figures at Llama-3-8B dimensions (issue 23 item 8): 4-layer llama files with
Meta-Llama-3-8B's widths (n_embd 4096, 32 heads of 128 over 8 KV heads, n_ff 14336, the
128,256-token vocabulary, rope theta 500000), f16 and the Q4_K_M mix llama.cpp's own quantizer
picks, recorded as record.py records (bytes per backend through the shim, nodes, splits,
pipeline parallelism) at ctx 4096, 8192 and 32768, one and two RPC devices (-ts 1,1 and 3,1),
-ngl all and partial, -nkvo and -ot; then `fit`'s answers for a few device sizes, each recorded
at the answer and one step beyond (one more layer, or 256 more cells of context).

The bytes do not depend on the weights' values, so the files hold zeros: the header is written
and the data left as a hole (a sparse file: 3.8 GB that take no disk). llama.cpp reads exactly
that file, and the test writes it again, byte for byte (the header's sha256 is recorded), in a
few seconds. The quantizer runs once, on the f16 file, only to learn which type it gives each
tensor; the Q4_K_M file recorded is then written the same way with those types.

    nice python3 scripts/llamacpp/record_real_dims.py [--only SUBSTRING] [--work /tmp/realdims]
      -> tests/data/llamacpp/figures_real_dims.json (resumable; --fresh redoes all)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFWriter

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(REPO), str(HERE)]

import make_tiny_gguf as mk  # noqa: E402
import record as rec  # noqa: E402

OUT = REPO / "tests" / "data" / "llamacpp" / "figures_real_dims.json"
BACKENDS_1 = REPO / "graphs" / "backends" / "llamacpp_rpc.yaml"
BACKENDS_2 = REPO / "graphs" / "backends" / "llamacpp_rpc2.yaml"
# Meta-Llama-3-8B's config.json, 4 of its 32 layers
HPARAMS = {"n_layer": 4, "n_embd": 4096, "n_head": 32, "n_head_kv": 8, "n_ff": 14336,
           "n_vocab": 128256, "n_ctx_train": 8192, "rope_freq_base": 500000.0, "rms_eps": 1e-5}
F16 = "l3dims-f16"
Q4_K_M = "l3dims-q4_K_M"
FILE_TYPE = {F16: 1, Q4_K_M: 15}          # LLAMA_FTYPE_MOSTLY_F16, _Q4_K_M
MEMORY = 16 << 30   # address space of the RPC servers and each child: a 3.8 GB map, 2 GB buffers


def tensor_table() -> list[tuple[str, tuple[int, ...]]]:
    """(name, NumPy shape) in llama.cpp's load order (make_tiny_gguf's llama layout)."""
    h = HPARAMS
    n, hd = h["n_embd"], h["n_embd"] // h["n_head"]
    table = [("token_embd.weight", (h["n_vocab"], n))]
    for i in range(h["n_layer"]):
        table += [(f"blk.{i}.attn_norm.weight", (n,)),
                  (f"blk.{i}.attn_q.weight", (h["n_head"] * hd, n)),
                  (f"blk.{i}.attn_k.weight", (h["n_head_kv"] * hd, n)),
                  (f"blk.{i}.attn_v.weight", (h["n_head_kv"] * hd, n)),
                  (f"blk.{i}.attn_output.weight", (n, h["n_head"] * hd)),
                  (f"blk.{i}.ffn_norm.weight", (n,)),
                  (f"blk.{i}.ffn_gate.weight", (h["n_ff"], n)),
                  (f"blk.{i}.ffn_up.weight", (h["n_ff"], n)),
                  (f"blk.{i}.ffn_down.weight", (n, h["n_ff"]))]
    return table + [("output_norm.weight", (n,)), ("output.weight", (h["n_vocab"], n))]


def f16_types() -> dict[str, str]:
    return {name: "F32" if len(shape) == 1 else "F16" for name, shape in tensor_table()}


def nbytes(shape: tuple[int, ...], type_name: str) -> int:
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    return int(np.prod(shape)) // block * size


def write_sparse(path: Path, name: str, types: dict[str, str]) -> str:
    """The GGUF header (the llama keys, the 128k vocabulary, the tensor infos), then a hole as
    long as the tensors' data; returns the header's sha256 (everything before the data)."""
    h = HPARAMS
    tmp = path.with_name(path.name + ".tmp")
    writer = GGUFWriter(str(tmp), "llama")
    writer.add_name(name)
    writer.add_context_length(h["n_ctx_train"])
    writer.add_embedding_length(h["n_embd"])
    writer.add_block_count(h["n_layer"])
    writer.add_feed_forward_length(h["n_ff"])
    writer.add_head_count(h["n_head"])
    writer.add_head_count_kv(h["n_head_kv"])
    writer.add_rope_dimension_count(h["n_embd"] // h["n_head"])
    writer.add_rope_freq_base(h["rope_freq_base"])
    writer.add_layer_norm_rms_eps(h["rms_eps"])
    writer.add_vocab_size(h["n_vocab"])
    writer.add_file_type(FILE_TYPE[name])
    if FILE_TYPE[name] != 1:
        writer.add_quantization_version(2)
    tokens, scores, token_types = mk.vocabulary(h["n_vocab"])
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(token_types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    end = 0
    for tensor, shape in tensor_table():
        qtype = GGMLQuantizationType[types[tensor]]
        size = nbytes(shape, types[tensor])
        writer.add_tensor_info(tensor, shape, np.dtype(np.float32), size, raw_dtype=qtype)
        end = GGUFWriter.ggml_pad(end, writer.data_alignment) + size
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    fout = writer.fout[0]
    writer.write_padding(fout, fout.tell())
    data_start = fout.tell()
    writer.close()
    os.truncate(tmp, data_start + end)          # the data: a hole of zeros
    with open(tmp, "rb") as f:
        digest = hashlib.sha256(f.read(data_start)).hexdigest()
    tmp.replace(path)
    return digest


def quantizer_types(source: Path, workdir: Path) -> dict[str, str]:
    """The type llama.cpp's quantizer (llama_model_quantize, Q4_K_M) gives each tensor; the
    quantized file itself is read for that and deleted."""
    out = workdir / "q4_k_m.gguf"
    code = ("import ctypes, sys, llama_cpp as l\n"
            "p = l.llama_model_quantize_default_params(); p.ftype = 15; p.nthread = 2\n"
            "sys.exit(l.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), "
            "ctypes.byref(p)))")
    subprocess.run([sys.executable, "-c", code, str(source), str(out)], check=True,
                   capture_output=True, preexec_fn=cap_memory)
    types = {t.name: t.tensor_type.name for t in GGUFReader(out).tensors}
    out.unlink()
    return types


def cap_memory() -> None:
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


# ---------------------------------------------------------------- the configurations

BASE = {"ctx": 4096, "ubatch": 512, "flash_attn": False, "ngl": "all", "kv_type": "f16",
        "no_kv_offload": False, "overrides": [], "tensor_split": [], "swa_full": False}
FFN_CPU = [["ffn_.*", "CPU"]]


def grid(model: str) -> list[tuple[str, dict]]:
    """(suffix, options) of one model: one device at three contexts, flash attention off and on,
    -ngl 0, 3 (two layers and the output) and all; two devices at -ts 1,1 and 3,1, all and 3;
    -nkvo and -ot with one and two devices; --no-mmap."""
    one = [("", {"ctx": c, "flash_attn": fa, "ngl": n})
           for c in (4096, 8192, 32768) for fa in (False, True) for n in (0, 3, "all")]
    two = [(f"ts{a}-{b}", {"tensor_split": [a, b], "ngl": n})
           for a, b in ((1, 1), (3, 1)) for n in ("all", 3)]
    two += [("ts1-1", {"tensor_split": [1, 1], "ctx": 32768, "flash_attn": True}),
            ("ts3-1", {"tensor_split": [3, 1], "ctx": 8192, "flash_attn": True})]
    options = [("nkvo", {"ctx": 8192, "no_kv_offload": True, "flash_attn": fa})
               for fa in (False, True)]
    options += [("ts1-1-nkvo", {"tensor_split": [1, 1], "no_kv_offload": True}),
                ("ot-ffn-cpu", {"overrides": FFN_CPU}),
                ("ot-ffn-cpu", {"overrides": FFN_CPU, "flash_attn": True, "ctx": 32768}),
                ("ot-blk1-rpc", {"ngl": 0, "overrides": [["blk\\.1\\.", "RPC0"]]}),
                ("ts1-1-ot-ffn-cpu", {"tensor_split": [1, 1], "overrides": FFN_CPU})]
    # --no-mmap: the CPU's weights allocated, not mapped (the q4_K ones repacked either way)
    options += [("nommap", {"ngl": n, "use_mmap": False}) for n in (0, 3)]
    return [(model, suffix, opts) for suffix, opts in one + two + options]


def configure(model: str, suffix: str, opts: dict) -> dict:
    cfg = BASE | opts | {"model": model}
    cfg["id"] = rec.config_id(model, cfg["ctx"], cfg["ubatch"], cfg["flash_attn"], cfg["ngl"], suffix)
    return cfg


# fit's questions: (model, the devices' memory, ctx or "auto", flash attention), sizes chosen so
# that the answer is not every layer at the model's whole context (there is a step beyond: one
# more layer, or 256 more cells). The margin is 0 so the edge is the devices' own bytes; the
# CPU has room (128 GiB) so the devices decide. Two devices: fit splits by their memory (-ts).
FIT_QUESTIONS = [(F16, ["2GiB"], 4096, False), (F16, ["3000MiB"], 8192, True),
                 (Q4_K_M, ["1GiB"], 4096, False), (Q4_K_M, ["1500MiB"], 32768, True),
                 (F16, ["3300MiB"], "auto", False), (Q4_K_M, ["1250MiB"], "auto", True),
                 (F16, ["2GiB", "1536MiB"], 4096, False), (Q4_K_M, ["768MiB", "768MiB"], 8192, True)]


def fit_backends(memories: list[str], path: Path) -> Path:
    """llamacpp_rpc*.yaml with the devices' memory set to the sizes asked."""
    text = (BACKENDS_2 if len(memories) == 2 else BACKENDS_1).read_text()
    for i, size in enumerate(memories):
        text = text.replace(f"name: RPC{i}, kind: sim, alignment: 32, memory: 64GiB",
                            f"name: RPC{i}, kind: sim, alignment: 32, memory: {size}")
    path.write_text(text.replace("name: CPU, kind: cpu,", "name: CPU, kind: cpu, memory: 128GiB,"))
    return path


def fit_args(ctx, flash_attn: bool, backends: Path) -> list[str]:
    return ["--backends", str(backends), "--ctx", str(ctx), "--flash-attn",
            "on" if flash_attn else "off", "--ubatch", "512", "--margin", "0"]


def ask_fit(path: Path, memories: list[str], ctx, flash_attn: bool, workdir: Path) -> dict:
    from tests.clikit import invoke

    backends = fit_backends(memories, workdir / "fit.yaml")
    code, out, err = invoke("fit", path, "--json", *fit_args(ctx, flash_attn, backends))
    if code != 0:
        raise RuntimeError(f"fit {memories} {ctx}: {err}")
    return json.loads(out)


def beyond(answer: dict, auto: bool) -> tuple[int | str, int]:
    """One step past the answer: 256 more cells for --ctx auto, else one more layer."""
    n = HPARAMS["n_layer"] + 1
    if auto:
        return answer["ngl"], answer["ctx"] + 256
    if answer["ngl"] >= n:
        raise RuntimeError(f"fit answered every layer ({answer['command']}): no step beyond")
    return answer["ngl"] + 1, answer["ctx"]


def fit_configs(model: str, memories: list[str], answer: dict, auto: bool) -> list[dict]:
    """llama.cpp at fit's answer and one step beyond, with the -ts fit's line gives."""
    cmd = answer["command"].split()
    split = [int(float(v)) for v in cmd[cmd.index("-ts") + 1].split(",")] if "-ts" in cmd else []
    tag = "fit-" + "-".join(memories)
    out = []
    for ngl, ctx in ((answer["ngl"], answer["ctx"]), beyond(answer, auto)):
        ngl = "all" if ngl == HPARAMS["n_layer"] + 1 else ngl
        suffix = tag + (f"-ts{split[0]}-{split[1]}" if split else "")
        out.append(configure(model, suffix, {"ctx": ctx, "flash_attn": answer["flash_attn"],
                                             "ngl": ngl, "tensor_split": split}))
    return out


# ---------------------------------------------------------------- driver

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/realdims"))
    parser.add_argument("--only", default="")
    parser.add_argument("--fresh", action="store_true")
    args = parser.parse_args(argv)
    rec.CHILD_MEMORY = MEMORY
    args.work.mkdir(parents=True, exist_ok=True)
    data = json.loads(OUT.read_text()) if OUT.exists() and not args.fresh else {}
    recorded = {c["id"]: c for c in data.get("configs", [])}
    files = data.get("files", {})
    paths = {F16: args.work / f"{F16}.gguf", Q4_K_M: args.work / f"{Q4_K_M}.gguf"}
    types = {F16: f16_types()}
    files[F16] = {"sha256_header": write_sparse(paths[F16], F16, types[F16])}
    if "types" not in files.get(Q4_K_M, {}):
        files[Q4_K_M] = {"types": quantizer_types(paths[F16], args.work)}
    types[Q4_K_M] = files[Q4_K_M]["types"]
    files[Q4_K_M]["sha256_header"] = write_sparse(paths[Q4_K_M], Q4_K_M, types[Q4_K_M])
    data.update(rec.versions(), hparams=HPARAMS, files=files, n_threads=rec.N_THREADS,
                n_batch=rec.N_BATCH)
    fits = {f["question"]: f for f in data.get("fit", [])}
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        shim = rec.compile_shim(workdir)
        servers = [rec.start_rpc_server() for _ in range(2)]
        endpoints = [endpoint for _, endpoint in servers]

        def record(cfg: dict) -> dict:
            if cfg["id"] in recorded:
                return recorded[cfg["id"]]
            t0 = time.monotonic()
            run = dict(cfg, path=str(paths[cfg["model"]]), n_layer=HPARAMS["n_layer"])
            entry, _ = rec.record_one(run, endpoints, shim, workdir)
            entry.pop("logits")           # zeros in, a flat row out: nothing to compare
            if "use_mmap" in cfg:
                entry["options"]["use_mmap"] = cfg["use_mmap"]
            entry["n_copies"] = 4 if entry.get("pipeline_parallel") else 1
            recorded[cfg["id"]] = entry
            data["configs"] = list(recorded.values())
            data["fit"] = list(fits.values())
            rec.write_json_atomic(OUT, data)
            sizes = " ".join(f"{k}:w{v['weights_bytes']}/kv{v['kv_bytes']}/c{v['arena_bytes']}"
                             for k, v in entry["backends"].items())
            print(f"{cfg['id']:48s} nodes {entry['n_nodes']} splits {entry['n_splits']} "
                  f"copies {entry['n_copies']} {sizes} ({time.monotonic() - t0:.0f}s)", flush=True)
            return entry

        try:
            for model in (F16, Q4_K_M):
                for m, suffix, opts in grid(model):
                    cfg = configure(m, suffix, opts)
                    if args.only in cfg["id"]:
                        record(cfg)
            for model, memories, ctx, fa in FIT_QUESTIONS:
                question = f"{model} {','.join(memories)} ctx {ctx} fa {int(fa)}"
                if args.only not in question:
                    continue
                answer = ask_fit(paths[model], memories, ctx, fa, workdir)
                answer["flash_attn"] = fa
                at, past = (record(c) for c in fit_configs(model, memories, answer, ctx == "auto"))
                fits[question] = {"question": question, "model": model, "memories": memories,
                                  "ctx": ctx, "flash_attn": fa, "ngl": answer["ngl"],
                                  "answer_ctx": answer["ctx"], "command": answer["command"],
                                  "at": at["id"], "beyond": past["id"]}
                data["fit"] = list(fits.values())
                rec.write_json_atomic(OUT, data)
                print(f"fit {question}: {answer['command']}", flush=True)
        finally:
            for server, _ in servers:
                server.kill()
                server.wait()
    print(f"{len(recorded)} configurations in {time.monotonic() - started:.0f}s -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
