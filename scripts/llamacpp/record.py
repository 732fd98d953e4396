"""Records real llama.cpp's figures for the tiny models, the ground truth ggmlrun is tested on.

llama.cpp (llama-cpp-python 0.3.36 built with -DGGML_RPC=ON) runs every model x ctx x ubatch x
flash-attn x ngl configuration with one RPC server on 127.0.0.1 standing for a device; the
`-ts A,B` configurations register a second server on another loopback port too, as device RPC1
(graphs/backends/llamacpp_rpc2.yaml describes that pair; the others use llamacpp_rpc.yaml). Each
configuration runs in a child process with shim.c preloaded, which reports the exact bytes
llama.cpp only logs in MiB (model, KV and compute buffers per backend) and dumps every graph
the scheduler reserves or computes, with each node's backend. llama.cpp's own log gives
"graph nodes" and "graph splits"; llama_get_logits_ith gives the last token's logits.

    python3 scripts/llamacpp/record.py [--only SUBSTRING] [--fresh]

Resumable: configurations already in the figures file are skipped (--fresh redoes all).
Writes tests/data/llamacpp/figures.json, one graph dump per configuration (--graphs DIR,
default /work/oracle-out/graphs when it exists) and gzipped dumps of a few configurations
to tests/data/llamacpp/graphs/.
"""

from __future__ import annotations

import argparse
import ctypes
import gzip
import importlib.metadata
import importlib.util
import itertools
import json
import os
import re
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODELS_DIR = REPO / "examples" / "models"
FIGURES = REPO / "tests" / "data" / "llamacpp" / "figures.json"
COMMITTED_GRAPHS = REPO / "tests" / "data" / "llamacpp" / "graphs"
ORACLE_OUT = Path("/work/oracle-out")

MODELS = ["tiny-llama-f32", "tiny-llama-f16", "tiny-llama-q8_0", "tiny-llama-tied-f16",
          "tiny-qwen2-f16", "tiny-qwen2-q8_0", "tiny-qwen3-f16", "tiny-qwen3-q8_0",
          "tiny-mistral3-f16", "tiny-mistral3-q8_0", "tiny-phi3-f16", "tiny-phi3-q8_0",
          "tiny-gemma3-f16", "tiny-gemma3-q8_0", "tiny-gemma4-f16", "tiny-gemma4-q8_0",
          "tiny-qwen3moe-f16", "tiny-qwen3moe-q8_0", "tiny-glm4moe-f16", "tiny-glm4moe-q8_0",
          "tiny-qwen35-f16", "tiny-qwen35-q8_0", "tiny-gemma4moe-f16", "tiny-gemma4moe-q8_0",
          "tiny-qwen35moe-f16", "tiny-qwen35moe-q8_0",
          "tiny-deepseek2-f16", "tiny-deepseek2-q8_0", "tiny-deepseek2-lite-f16",
          "tiny-qwen3vl-f16", "tiny-qwen3vl-q8_0", "tiny-qwen3vlmoe-f16", "tiny-qwen3vlmoe-q8_0",
          "tiny-lfm2-f16", "tiny-lfm2-q8_0", "tiny-lfm2moe-f16", "tiny-lfm2moe-q8_0"]
GPT_OSS_MODELS = ["tiny-gpt-oss-f16", "tiny-gpt-oss-q8_0", "tiny-gpt-oss-mxfp4"]
MODELS += GPT_OSS_MODELS
# sliding-window models: the grid again with --swa-full (llama-cpp-python's default is a
# full-size SWA cache, llama.cpp's CLI's is not: every configuration passes it explicitly)
SWA_MODELS = ["tiny-gemma3-f16", "tiny-gemma3-q8_0", "tiny-gemma4-f16", "tiny-gemma4-q8_0",
              "tiny-gemma4moe-f16", "tiny-gemma4moe-q8_0"]
SWA_MODELS += GPT_OSS_MODELS
CTXS = [256, 1024]
UBATCHES = [32, 512]
FLASH_ATTN = [False, True]
NGLS: list[int | str] = [0, 2, "all"]
TOKENS = [1, 15, 100, 7, 42]
LONG_TOKENS = [1] + [(37 * i + 11) % 317 + 3 for i in range(159)]   # 160 tokens (extras)
N_THREADS = 2
N_BATCH = 2048          # llama.cpp's default -b; the graph depends on the ubatch only
CHILD_MEMORY = 4 << 30  # address-space cap for the server and each child
# The committed dumps: one per kind of placement, enough to read llama.cpp's graph offline.
COMMITTED_IDS = {"tiny-llama-f16/c256/ub32/fa0/nglall", "tiny-llama-f16/c256/ub32/fa1/ngl2",
                 "tiny-llama-q8_0/c1024/ub512/fa0/ngl0", "tiny-llama-tied-f16/c256/ub512/fa1/nglall",
                 # one per architecture beyond llama: pinned norms (ub32) and the tied output
                 "tiny-qwen2-f16/c256/ub32/fa0/ngl2", "tiny-qwen3-f16/c256/ub32/fa1/nglall",
                 "tiny-qwen3-q8_0/c1024/ub512/fa0/ngl2", "tiny-mistral3-f16/c256/ub32/fa0/nglall",
                 "tiny-phi3-f16/c1024/ub32/fa0/ngl2", "tiny-gemma3-f16/c1024/ub512/fa0/ngl2",
                 "tiny-gemma3-q8_0/c256/ub32/fa1/nglall", "tiny-gemma4-f16/c256/ub32/fa0/ngl2",
                 "tiny-gemma4-q8_0/c1024/ub512/fa1/nglall",
                 "tiny-qwen3moe-f16/c256/ub32/fa0/ngl2",
                 "tiny-qwen3moe-q8_0/c256/ub32/fa0/nglall/n-cpu-moe1",
                 "tiny-glm4moe-f16/c256/ub32/fa1/ngl0", "tiny-glm4moe-q8_0/c256/ub32/fa0/ngl2",
                 # qwen35: its recurrent state (zero-sized nodes, the delta-net ops) on both sides
                 "tiny-qwen35-f16/c256/ub32/fa0/ngl2", "tiny-qwen35-q8_0/c256/ub512/fa1/nglall",
                 "tiny-gemma4moe-f16/c256/ub32/fa0/ngl2",
                 # gpt-oss: sinks in soft_max (ngl 2) and flash attention, the MXFP4 experts
                 # on the CPU beside offloaded layers
                 "tiny-gpt-oss-f16/c256/ub32/fa0/ngl2",
                 "tiny-gpt-oss-mxfp4/c256/ub32/fa1/nglall/ot-exps-cpu",
                 # qwen35moe: the shared expert's gate beside the routed experts
                 "tiny-qwen35moe-f16/c256/ub32/fa0/ngl2",
                 "tiny-qwen35moe-q8_0/c256/ub32/fa0/nglall/ot-exps-cpu",
                 # deepseek2: MLA's K-only cache, v_cont / kqv_mla and fattn_mla
                 "tiny-deepseek2-f16/c256/ub32/fa0/nglall",
                 "tiny-deepseek2-q8_0/c256/ub32/fa1/ngl2",
                 # qwen3vl(moe): the padded token rows, deepstack views, IMROPE
                 "tiny-qwen3vl-f16/c256/ub32/fa0/ngl2", "tiny-qwen3vlmoe-f16/c256/ub32/fa1/nglall",
                 # lfm2: the short-conv state (concat, ssm_conv, the state's copy) beside KV
                 "tiny-lfm2-f16/c256/ub32/fa0/ngl2", "tiny-lfm2-q8_0/c256/ub32/fa1/nglall"}
GGML_LIBS = ["libggml-base.so.0", "libggml-cpu.so.0", "libggml-rpc.so.0", "libggml.so.0"]


# Beyond the grid: the other placement options of SPEC section 5 that one RPC device can show.
# (model, suffix of the id, options); the base is ctx 256, ubatch 32, flash-attn off. A q8_0 KV
# cache cannot be shown: llama.cpp needs head_dim (16 here) to be a multiple of q8_0's block of 32.
EXTRAS: list[tuple[str, str, dict]] = [
    ("tiny-llama-f16", "nkvo", {"ngl": "all", "no_kv_offload": True}),
    ("tiny-llama-f16", "nkvo", {"ngl": "all", "no_kv_offload": True, "flash_attn": True}),
    ("tiny-llama-f16", "nkvo", {"ngl": 2, "no_kv_offload": True}),
    ("tiny-llama-q8_0", "nkvo", {"ngl": "all", "no_kv_offload": True, "ubatch": 512}),
    ("tiny-llama-f16", "", {"ngl": 1}),
    ("tiny-llama-f16", "", {"ngl": 3}),
    ("tiny-llama-f16", "", {"ngl": 4}),
    ("tiny-llama-f16", "kvf32", {"ngl": "all", "kv_type": "f32"}),
    ("tiny-llama-f16", "kvf32", {"ngl": 2, "kv_type": "f32", "flash_attn": True}),
    ("tiny-llama-f16", "ot-ffn-cpu", {"ngl": "all", "overrides": [["ffn_.*", "CPU"]]}),
    ("tiny-llama-f16", "ot-ffn-cpu", {"ngl": "all", "overrides": [["ffn_.*", "CPU"]], "ubatch": 512}),
    ("tiny-llama-f16", "ot-blk1-rpc", {"ngl": 0, "overrides": [["blk\\.1\\.", "RPC0"]]}),
] + [
    # -ts A,B over two RPC devices (graphs/backends/llamacpp_rpc2.yaml); ngl all is the one where
    # llama.cpp turns on pipeline parallelism.
    (model, "ts" + "-".join(map(str, split)), {"ngl": ngl, "tensor_split": split})
    for model in ("tiny-llama-f16", "tiny-llama-q8_0") for split in ([1, 1], [3, 1]) for ngl in (3, 4)
] + [
    ("tiny-llama-f16", "ts1-1", {"ngl": "all", "tensor_split": [1, 1]}),
    # pipeline parallelism (issue 23): on for ngl all over two devices, in each of these but
    # the -nkvo and -ot ones, which turn it off
    ("tiny-llama-f16", "ts3-1", {"ngl": "all", "tensor_split": [3, 1]}),
    ("tiny-llama-q8_0", "ts1-1", {"ngl": "all", "tensor_split": [1, 1]}),
    ("tiny-llama-f16", "ts1-1", {"ngl": "all", "tensor_split": [1, 1], "flash_attn": True}),
    ("tiny-llama-f16", "ts1-1", {"ngl": "all", "tensor_split": [1, 1], "ubatch": 512}),
    ("tiny-llama-f32", "ts1-1", {"ngl": "all", "tensor_split": [1, 1], "ctx": 1024}),
    ("tiny-llama-f16", "ts1-1-nkvo", {"ngl": "all", "tensor_split": [1, 1], "no_kv_offload": True}),
    ("tiny-llama-f16", "ts1-1-ot-ffn-cpu", {"ngl": "all", "tensor_split": [1, 1],
                                             "overrides": [["ffn_.*", "CPU"]]}),
    ("tiny-qwen3-f16", "ts1-1", {"ngl": "all", "tensor_split": [1, 1], "flash_attn": True}),
    ("tiny-phi3-q8_0", "ts1-1", {"ngl": "all", "tensor_split": [1, 1], "ubatch": 512}),
] + [
    # the other architectures: their own tensors under the placement options (qwen3's heads of
    # 32 take a q8_0 cache; phi3's rope factors are duplicated per layer, -ot moves the copies)
    ("tiny-qwen3-f16", "nkvo", {"ngl": "all", "no_kv_offload": True}),
    ("tiny-qwen3-f16", "kvq8_0", {"ngl": "all", "kv_type": "q8_0", "flash_attn": True}),
    ("tiny-qwen3-f16", "kvq8_0", {"ngl": 2, "kv_type": "q8_0", "flash_attn": True, "ubatch": 512}),
    ("tiny-qwen2-f16", "ot-ffn-cpu", {"ngl": "all", "overrides": [["ffn_.*", "CPU"]]}),
    ("tiny-qwen2-q8_0", "", {"ngl": 3}),
    ("tiny-mistral3-f16", "ts1-1", {"ngl": 3, "tensor_split": [1, 1]}),
    ("tiny-mistral3-f16", "nkvo", {"ngl": 2, "no_kv_offload": True}),
    ("tiny-phi3-f16", "", {"ngl": 3}),
    ("tiny-phi3-f16", "ot-rope-cpu", {"ngl": "all", "overrides": [["rope_factors", "CPU"]]}),
    ("tiny-phi3-f16", "ot-blk1-rpc", {"ngl": 0, "overrides": [["blk\\.1\\.", "RPC0"]]}),
    # qwen35: the recurrent state follows -nkvo as the KV cache does; -ngl 3 splits delta-net
    # layers across the devices; -ot moves the delta-net weights, not their state
    ("tiny-qwen35-f16", "nkvo", {"ngl": "all", "no_kv_offload": True}),
    ("tiny-qwen35-q8_0", "nkvo", {"ngl": 2, "no_kv_offload": True, "flash_attn": True}),
    ("tiny-qwen35-f16", "", {"ngl": 3}),
    ("tiny-qwen35-q8_0", "", {"ngl": 4, "ubatch": 512}),
    ("tiny-qwen35-f16", "ot-ssm-cpu", {"ngl": "all", "overrides": [["ssm_", "CPU"]]}),
    ("tiny-qwen35-q8_0", "ot-blk1-rpc", {"ngl": 0, "overrides": [["blk\\.1\\.", "RPC0"]]}),
    # gemma3: the full and the SWA cache under the placement options (each layer's cache with
    # its layer, over two devices too; a q8_0 cache with its heads of 32)
    ("tiny-gemma3-f16", "nkvo", {"ngl": "all", "no_kv_offload": True}),
    ("tiny-gemma3-f16", "nkvo-swafull", {"ngl": 2, "no_kv_offload": True, "swa_full": True}),
    ("tiny-gemma3-f16", "", {"ngl": 4}),
    ("tiny-gemma3-f16", "ts1-1", {"ngl": 4, "tensor_split": [1, 1], "ctx": 1024}),
    ("tiny-gemma3-q8_0", "kvq8_0", {"ngl": "all", "kv_type": "q8_0", "flash_attn": True}),
    ("tiny-gemma3-q8_0", "ot-ffn-cpu", {"ngl": "all", "overrides": [["ffn_.*", "CPU"]],
                                        "ubatch": 512}),
] + [
    # a prompt longer than the window (160 tokens in one ubatch; windows of 64 and 128): the
    # SWA mask hides the tokens 64 (128) or more positions back, so the logits check it.
    # tiny-gemma4-f16 (window 64) takes 100 tokens and flash attention off only: its unscaled
    # attention (KQ scale 1) makes f16 rounding noise grow with the prompt (llama.cpp's own
    # logits move by 1.4e-3 of the largest between flash attention off and on at 100 tokens,
    # 2.3e-3 at 160, against SPEC's 2e-3)
    (model, "long" + ("-swafull" if full else ""),
     {"ngl": 2, "ubatch": 512, "flash_attn": fa, "swa_full": full,
      "tokens": LONG_TOKENS[:100] if model == "tiny-gemma4-f16" else LONG_TOKENS})
    for model in ("tiny-gemma3-f16", "tiny-gemma3-q8_0", "tiny-gemma4-f16", "tiny-gemma4-q8_0")
    for fa in (False, True) for full in (False, True)
    if not (model == "tiny-gemma4-f16" and fa)
] + [
    # gemma4: rope_freqs made with the first full layer and copied into the other full ones,
    # the KV-shared layers' caches (those of earlier layers) under the placement options
    ("tiny-gemma4-f16", "nkvo", {"ngl": "all", "no_kv_offload": True}),
    ("tiny-gemma4-f16", "", {"ngl": 3}),
    ("tiny-gemma4-f16", "", {"ngl": 5}),
    ("tiny-gemma4-f16", "ts1-1", {"ngl": 5, "tensor_split": [1, 1], "ctx": 1024}),
    ("tiny-gemma4-f16", "ot-rope-cpu", {"ngl": "all", "overrides": [["rope_freqs", "CPU"]]}),
    ("tiny-gemma4-q8_0", "ot-blk2-rpc", {"ngl": 0, "overrides": [["blk\\.2\\.", "RPC0"]]}),
    ("tiny-gemma4-q8_0", "nkvo-swafull", {"ngl": 4, "no_kv_offload": True, "swa_full": True,
                                          "flash_attn": True}),
] + [
    # mixtures of experts: every expert on the CPU with every layer offloaded (-ot exps=CPU, as
    # users write it, and --cpu-moe), and the experts of the first layers (--n-cpu-moe N)
    (model, suffix, dict({"ngl": "all"}, **opts))
    for model in ("tiny-qwen3moe-f16", "tiny-qwen3moe-q8_0")
    for suffix, opts in (("ot-exps-cpu", {"overrides": [["exps", "CPU"]]}),
                         ("ot-exps-cpu", {"overrides": [["exps", "CPU"]], "ubatch": 512}),
                         ("ot-exps-cpu", {"overrides": [["exps", "CPU"]], "flash_attn": True}),
                         ("cpu-moe", {"cpu_moe": True}),
                         ("n-cpu-moe1", {"n_cpu_moe": 1}),
                         ("n-cpu-moe1", {"n_cpu_moe": 1, "ubatch": 512, "ctx": 1024}),
                         ("n-cpu-moe3", {"n_cpu_moe": 3, "flash_attn": True}))
] + [
    ("tiny-qwen3moe-f16", "n-cpu-moe2", {"ngl": 2, "n_cpu_moe": 2}),
    ("tiny-qwen3moe-f16", "nkvo", {"ngl": "all", "no_kv_offload": True}),
] + [
    # glm4moe: the NextN block counts for -ngl (ngl 1 and 3 besides the grid's 0, 2, all)
    (model, suffix, dict({"ngl": "all"}, **opts))
    for model in ("tiny-glm4moe-f16", "tiny-glm4moe-q8_0")
    for suffix, opts in (("ot-exps-cpu", {"overrides": [["exps", "CPU"]]}),
                         ("ot-exps-cpu", {"overrides": [["exps", "CPU"]], "ubatch": 512}),
                         ("cpu-moe", {"cpu_moe": True}),
                         ("n-cpu-moe2", {"n_cpu_moe": 2}),
                         ("", {"ngl": 1}),
                         ("", {"ngl": 3}))
] + [
    # deepseek2 (MLA): the experts on the CPU with every layer offloaded, both attentions
    (model, suffix, dict({"ngl": "all"}, **opts))
    for model in ("tiny-deepseek2-f16", "tiny-deepseek2-q8_0")
    for suffix, opts in (("ot-exps-cpu", {"overrides": [["exps", "CPU"]]}),
                         ("ot-exps-cpu", {"overrides": [["exps", "CPU"]], "flash_attn": True}),
                         ("n-cpu-moe2", {"n_cpu_moe": 2}),
                         ("nkvo", {"no_kv_offload": True}))
]
EXTRAS += [
    # gemma4 with experts: the fused gate/up experts and their per-expert scale on the CPU
    # with every layer offloaded (-ot exps=CPU, --cpu-moe), the first layers' (--n-cpu-moe N:
    # the q8_0 file's layer 0 has no experts), and a prompt longer than the f16 file's window
    (model, suffix, dict({"ngl": "all"}, **opts))
    for model in ("tiny-gemma4moe-f16", "tiny-gemma4moe-q8_0")
    for suffix, opts in (("ot-exps-cpu", {"overrides": [["exps", "CPU"]]}),
                         ("ot-exps-cpu", {"overrides": [["exps", "CPU"]], "ubatch": 512}),
                         ("ot-exps-cpu", {"overrides": [["exps", "CPU"]], "flash_attn": True}),
                         ("ot-exps-cpu-swafull", {"overrides": [["exps", "CPU"]], "swa_full": True}),
                         ("cpu-moe", {"cpu_moe": True}),
                         ("n-cpu-moe2", {"n_cpu_moe": 2}),
                         ("n-cpu-moe1", {"n_cpu_moe": 1, "ubatch": 512, "ctx": 1024}),
                         ("", {"ngl": 4}),
                         ("long", {"ngl": 2, "ubatch": 512, "tokens": LONG_TOKENS[:100]}))
] + [
    # gpt-oss: every expert (and expert bias: "exps" matches them) on the CPU with every layer
    # offloaded; the mxfp4 file's experts then go to CPU_REPACK
    (model, suffix, dict({"ngl": "all"}, **opts))
    for model in GPT_OSS_MODELS
    for suffix, opts in (("ot-exps-cpu", {"overrides": [["exps", "CPU"]]}),
                         ("ot-exps-cpu", {"overrides": [["exps", "CPU"]], "ubatch": 512}),
                         ("ot-exps-cpu", {"overrides": [["exps", "CPU"]], "flash_attn": True}),
                         ("n-cpu-moe1", {"n_cpu_moe": 1}),
                         ("n-cpu-moe3", {"n_cpu_moe": 3, "flash_attn": True, "ctx": 1024}))
] + [
    # gpt-oss: a prompt longer than its window of 64 (160 tokens in one ubatch), so the logits
    # check the SWA mask on the sliding layers, with the sinks
    (model, "long" + ("-swafull" if full else ""),
     {"ngl": 2, "ubatch": 512, "flash_attn": fa, "swa_full": full, "tokens": LONG_TOKENS})
    for model in GPT_OSS_MODELS for fa in (False, True) for full in (False, True)
]
# Two ubatches: a prompt of 40 tokens at -ub 32 (and one ubatch of 40 at -ub 512 to compare),
# the KV cache and a hybrid model's recurrent state carried from the first ubatch to the second
TOKENS_2UB = [(i * 37 + 5) % 320 for i in range(40)]
EXTRAS += [(model, "t40", {"ngl": ngl, "tokens": TOKENS_2UB, "ubatch": ub})
           for model in ("tiny-qwen35-f16", "tiny-qwen35-q8_0", "tiny-llama-f16")
           for ngl, ub in ((2, 32), ("all", 32), (2, 512))]
# qwen35moe: every expert on the CPU with every layer offloaded (-ot exps=CPU, --cpu-moe), the
# experts of the first layers (--n-cpu-moe), the state under -nkvo, and two ubatches (the
# recurrent state carried from the first to the second)
EXTRAS += [
    (model, suffix, dict({"ngl": "all"}, **opts))
    for model in ("tiny-qwen35moe-f16", "tiny-qwen35moe-q8_0")
    for suffix, opts in (("ot-exps-cpu", {"overrides": [["exps", "CPU"]]}),
                         ("ot-exps-cpu", {"overrides": [["exps", "CPU"]], "ubatch": 512}),
                         ("ot-exps-cpu", {"overrides": [["exps", "CPU"]], "flash_attn": True,
                                          "ctx": 1024}),
                         ("cpu-moe", {"cpu_moe": True}),
                         ("n-cpu-moe2", {"n_cpu_moe": 2}),
                         ("nkvo", {"no_kv_offload": True}),
                         ("t40", {"tokens": TOKENS_2UB}),
                         ("t40", {"ngl": 2, "tokens": TOKENS_2UB}),
                         ("t40", {"ngl": 2, "tokens": TOKENS_2UB, "ubatch": 512}))
]
# hybrid models serving several sequences (-np N, llama.cpp's n_seq_max): max(1, n_seq_max)
# rows of recurrent state per delta-net layer, reserves of N sequences of equal length (an odd
# N rounds the ubatch's tokens up), a KV stream per sequence unless -kvu
EXTRAS += [
    (model, suffix, opts)
    for model in ("tiny-qwen35-f16", "tiny-qwen35-q8_0", "tiny-qwen35moe-f16", "tiny-qwen35moe-q8_0")
    for suffix, opts in (("np2", {"ngl": 2, "parallel": 2}),
                         ("np2-kvu", {"ngl": "all", "parallel": 2, "kv_unified": True}),
                         ("np3", {"ngl": "all", "parallel": 3, "flash_attn": True, "ubatch": 512}),
                         ("np4", {"ngl": 0, "parallel": 4, "ctx": 1024}))
]
# qwen3vl / qwen3vlmoe: the deepstack slices (views into the padded token rows) under -np 2
# (two KV streams), two ubatches, -nkvo; the MoE one's experts on the CPU (-ot exps=CPU,
# --n-cpu-moe)
EXTRAS += [
    (model, "np2", {"ngl": 2, "parallel": 2})
    for model in ("tiny-qwen3vl-f16", "tiny-qwen3vl-q8_0", "tiny-qwen3vlmoe-f16",
                  "tiny-qwen3vlmoe-q8_0")
] + [
    (model, "t40", {"ngl": ngl, "tokens": TOKENS_2UB})
    for model in ("tiny-qwen3vl-f16", "tiny-qwen3vlmoe-q8_0") for ngl in (2, "all")
] + [
    ("tiny-qwen3vl-f16", "nkvo", {"ngl": "all", "no_kv_offload": True}),
    ("tiny-qwen3vl-q8_0", "", {"ngl": 3}),
] + [
    (model, suffix, dict({"ngl": "all"}, **opts))
    for model in ("tiny-qwen3vlmoe-f16", "tiny-qwen3vlmoe-q8_0")
    for suffix, opts in (("ot-exps-cpu", {"overrides": [["exps", "CPU"]]}),
                         ("ot-exps-cpu", {"overrides": [["exps", "CPU"]], "flash_attn": True,
                                          "ubatch": 512}),
                         ("cpu-moe", {"cpu_moe": True}),
                         ("n-cpu-moe2", {"n_cpu_moe": 2}))
]
# lfm2: the short-conv state under -np (a row per sequence, a KV stream per sequence unless
# -kvu) and -nkvo, carried across two ubatches (t40), -ngl splitting conv and attention layers,
# -ot moving the conv weights (not their state)
EXTRAS += [
    (model, suffix, opts)
    for model in ("tiny-lfm2-f16", "tiny-lfm2-q8_0")
    for suffix, opts in (("np2", {"ngl": 2, "parallel": 2}),
                         ("np2-kvu", {"ngl": "all", "parallel": 2, "kv_unified": True}),
                         ("np3", {"ngl": "all", "parallel": 3, "flash_attn": True, "ubatch": 512}),
                         ("t40", {"ngl": 2, "tokens": TOKENS_2UB}),
                         ("t40", {"ngl": "all", "tokens": TOKENS_2UB, "flash_attn": True}),
                         ("nkvo", {"ngl": "all", "no_kv_offload": True}),
                         ("", {"ngl": 3}),
                         ("ot-conv-cpu", {"ngl": "all", "overrides": [["shortconv", "CPU"]]}))
]
# lfm2moe: its experts on the CPU (-ot exps=CPU, --cpu-moe, --n-cpu-moe), -np 2, two ubatches
EXTRAS += [
    (model, suffix, opts)
    for model in ("tiny-lfm2moe-f16", "tiny-lfm2moe-q8_0")
    for suffix, opts in (("ot-exps-cpu", {"ngl": "all", "overrides": [["exps", "CPU"]]}),
                         ("ot-exps-cpu", {"ngl": "all", "overrides": [["exps", "CPU"]],
                                          "flash_attn": True, "ubatch": 512}),
                         ("cpu-moe", {"ngl": "all", "cpu_moe": True}),
                         ("n-cpu-moe3", {"ngl": "all", "n_cpu_moe": 3}),
                         ("np2", {"ngl": 2, "parallel": 2}),
                         ("t40", {"ngl": 2, "tokens": TOKENS_2UB}))
]
# --- the Mamba-2 hybrids (nemotron_h, nemotron_h_moe, granitehybrid): the grid, and the SSM
# and conv state under -np 2 (a row per sequence), across two ubatches (t40), -ngl splitting
# the layer kinds; the MoE ones' experts on the CPU
MAMBA2_MODELS = ["tiny-nemotronh-f16", "tiny-nemotronh-q8_0", "tiny-nemotronhmoe-f16",
                 "tiny-nemotronhmoe-q8_0", "tiny-granitehybrid-f16", "tiny-granitehybrid-q8_0"]
MAMBA2_MOE_MODELS = ["tiny-nemotronhmoe-f16", "tiny-nemotronhmoe-q8_0", "tiny-granitehybrid-q8_0"]
MODELS += MAMBA2_MODELS
# their committed dumps: the Mamba-2 block (ssm_conv, ssm_scan by ids, the state copies) split
# between devices, the MLP / expert layers, granite's multipliers with and without rope
COMMITTED_IDS |= {"tiny-nemotronh-f16/c256/ub32/fa0/ngl2",
                  "tiny-nemotronhmoe-q8_0/c256/ub32/fa1/nglall",
                  "tiny-granitehybrid-f16/c256/ub32/fa0/ngl2",
                  "tiny-granitehybrid-q8_0/c256/ub32/fa1/nglall"}
EXTRAS += [
    (model, suffix, opts)
    for model in MAMBA2_MODELS
    for suffix, opts in (("np2", {"ngl": 2, "parallel": 2}),
                         ("np2", {"ngl": "all", "parallel": 2, "flash_attn": True}),
                         ("t40", {"ngl": 2, "tokens": TOKENS_2UB}),
                         ("t40", {"ngl": "all", "tokens": TOKENS_2UB, "flash_attn": True}),
                         ("", {"ngl": 3}))
] + [
    # the state follows the KV cache to the CPU under -nkvo; -ot moves the SSM weights only
    (model, suffix, opts)
    for model in ("tiny-nemotronh-f16", "tiny-nemotronh-q8_0", "tiny-granitehybrid-f16")
    for suffix, opts in (("nkvo", {"ngl": "all", "no_kv_offload": True}),
                         ("ot-ssm-cpu", {"ngl": "all", "overrides": [["ssm_", "CPU"]]}))
] + [
    (model, suffix, dict({"ngl": "all"}, **opts))
    for model in MAMBA2_MOE_MODELS
    for suffix, opts in (("ot-exps-cpu", {"overrides": [["exps", "CPU"]]}),
                         ("ot-exps-cpu", {"overrides": [["exps", "CPU"]], "flash_attn": True,
                                          "ubatch": 512}),
                         ("cpu-moe", {"cpu_moe": True}),
                         ("n-cpu-moe2", {"n_cpu_moe": 2}))
]
KV_TYPES = {"f32": 0, "f16": 1, "q8_0": 8}   # ggml_type values
# --- wave 2b (issue 32): minimax-m2, llama4, ... -------------------------------------------
# each on the grid, then -np 2, two ubatches (t40) and, for the MoE ones, the experts on the
# CPU (-ot exps=CPU, --cpu-moe, --n-cpu-moe)
WAVE2B_MOE = ["tiny-minimaxm2-f16", "tiny-minimaxm2-q8_0", "tiny-llama4-f16", "tiny-llama4-q8_0"]
WAVE2B_DENSE = ["tiny-seedoss-f16", "tiny-seedoss-q8_0", "tiny-olmo2-f16", "tiny-olmo2-q8_0",
                "tiny-smollm3-f16", "tiny-smollm3-q8_0", "tiny-olmo3-f16"]
WAVE2B_MODELS = WAVE2B_MOE + WAVE2B_DENSE
MODELS += WAVE2B_MODELS
# OLMo 3's sliding layers (a window of 64): the grid again with --swa-full, and a prompt of
# 160 tokens, longer than the window, in one ubatch
SWA_MODELS += ["tiny-olmo3-f16"]
EXTRAS += [("tiny-olmo3-f16", "long" + ("-swafull" if full else ""),
            {"ngl": 2, "ubatch": 512, "flash_attn": fa, "swa_full": full, "tokens": LONG_TOKENS})
           for fa in (False, True) for full in (False, True)]
# llama4's chunked layers live in llama_kv_cache_iswa's second cache, which its chunk of 8192
# makes full-size at any context here: --swa-full on a few configurations (the whole grid
# again would repeat the same figures)
EXTRAS += [
    (model, "swafull", {"ngl": ngl, "swa_full": True, "flash_attn": fa, "ubatch": ub})
    for model in ("tiny-llama4-f16", "tiny-llama4-q8_0")
    for ngl, fa, ub in ((2, False, 32), ("all", True, 512))
]
EXTRAS += [
    (model, suffix, opts)
    for model in WAVE2B_MODELS
    for suffix, opts in (("np2", {"ngl": 2, "parallel": 2}),
                         ("t40", {"ngl": 2, "tokens": TOKENS_2UB}),
                         ("t40", {"ngl": 2, "tokens": TOKENS_2UB, "ubatch": 512}))
] + [
    (model, suffix, dict({"ngl": "all"}, **opts))
    for model in WAVE2B_MOE
    for suffix, opts in (("ot-exps-cpu", {"overrides": [["exps", "CPU"]]}),
                         ("ot-exps-cpu", {"overrides": [["exps", "CPU"]], "flash_attn": True,
                                          "ubatch": 512}),
                         ("cpu-moe", {"cpu_moe": True}),
                         ("n-cpu-moe2", {"n_cpu_moe": 2}))
]
# --- end of wave 2b ---------------------------------------------------------------------------
# qwen3next: the grid, then -np 2 (a state row per sequence), two ubatches (t40), its experts
# on the CPU (-ot exps=CPU, --n-cpu-moe 2)
QWEN3NEXT_MODELS = ["tiny-qwen3next-f16", "tiny-qwen3next-q8_0"]
MODELS += QWEN3NEXT_MODELS
EXTRAS += [
    (model, suffix, opts)
    for model in QWEN3NEXT_MODELS
    for suffix, opts in (("np2", {"ngl": 2, "parallel": 2}),
                         ("t40", {"ngl": 2, "tokens": TOKENS_2UB}),
                         ("ot-exps-cpu", {"ngl": "all", "overrides": [["exps", "CPU"]]}),
                         ("n-cpu-moe2", {"ngl": "all", "n_cpu_moe": 2}))
]
# mistral4 (deepseek2's graph under its own name, YaRN's mscale left at 1): the grid, then -np 2,
# two ubatches (t40), its experts on the CPU with every layer offloaded (-ot exps=CPU, both
# attentions; --n-cpu-moe 2)
MISTRAL4_MODELS = ["tiny-mistral4-f16", "tiny-mistral4-q8_0"]
MODELS += MISTRAL4_MODELS
EXTRAS += [
    (model, suffix, opts)
    for model in MISTRAL4_MODELS
    for suffix, opts in (("np2", {"ngl": 2, "parallel": 2}),
                         ("t40", {"ngl": 2, "tokens": TOKENS_2UB}),
                         ("ot-exps-cpu", {"ngl": "all", "overrides": [["exps", "CPU"]]}),
                         ("ot-exps-cpu", {"ngl": "all", "overrides": [["exps", "CPU"]],
                                          "flash_attn": True}),
                         ("n-cpu-moe2", {"ngl": "all", "n_cpu_moe": 2}))
]
# ggml_type values of common/arg.cpp's kv_cache_types (-ctk/-ctv)
KV_TYPES = {"f32": 0, "f16": 1, "bf16": 30, "q8_0": 8, "q4_0": 2, "q4_1": 3, "iq4_nl": 20,
            "q5_0": 6, "q5_1": 7}


def config_id(model: str, ctx: int, ubatch: int, flash_attn: bool, ngl: int | str,
              suffix: str = "") -> str:
    return f"{model}/c{ctx}/ub{ubatch}/fa{int(flash_attn)}/ngl{ngl}" + (f"/{suffix}" if suffix else "")


def all_configs() -> list[dict]:
    """The grid the issue asks for, then the extras; options absent mean llama.cpp's defaults."""
    grid = [{"model": m, "ctx": c, "ubatch": u, "flash_attn": fa, "ngl": n}
            for m, c, u, fa, n in itertools.product(MODELS, CTXS, UBATCHES, FLASH_ATTN, NGLS)]
    grid += [{"model": m, "ctx": c, "ubatch": u, "flash_attn": fa, "ngl": n, "swa_full": True,
              "suffix": "swafull"}
             for m, c, u, fa, n in itertools.product(SWA_MODELS, CTXS, UBATCHES, FLASH_ATTN, NGLS)]
    extras = [dict({"model": m, "ctx": 256, "ubatch": 32, "flash_attn": False, "suffix": suffix},
                   **opts) for m, suffix, opts in EXTRAS]
    configs = []
    for cfg in grid + extras:
        cfg = {"no_kv_offload": False, "kv_type": "f16", "overrides": [], "suffix": "",
               "tensor_split": [], "swa_full": False, "cpu_moe": False, "n_cpu_moe": 0} | cfg
        cfg["id"] = config_id(cfg["model"], cfg["ctx"], cfg["ubatch"], cfg["flash_attn"], cfg["ngl"],
                              cfg["suffix"])
        configs.append(cfg)
    return configs


def llama_cpp_dir() -> Path:
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        sys.exit("record.py: llama_cpp is not installed (pip install llama-cpp-python==0.3.36 "
                 "with CMAKE_ARGS=-DGGML_RPC=ON)")
    return Path(spec.origin).parent


def cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))


def load_ggml(lib_dir: Path) -> dict[str, ctypes.CDLL]:
    """The `.so.0` names, globally: libllama links against those, so the RPC device registered
    here is the one llama.cpp sees (the plain `.so` copies would be a second registry)."""
    return {name: ctypes.CDLL(str(lib_dir / name), mode=ctypes.RTLD_GLOBAL) for name in GGML_LIBS}


# ---------------------------------------------------------------- RPC server (child process)

def serve_rpc(endpoint: str) -> None:
    """Serves this machine's CPU as an RPC device until killed."""
    libs = load_ggml(llama_cpp_dir() / "lib")
    ggml, rpc = libs["libggml.so.0"], libs["libggml-rpc.so.0"]
    ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    cpu = ggml.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
    rpc.ggml_backend_rpc_start_server.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                                                  ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
    devices = (ctypes.c_void_p * 1)(cpu)
    rpc.ggml_backend_rpc_start_server(endpoint.encode(), None, N_THREADS, 1, devices)


def start_rpc_server() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, __file__, "--serve-rpc", endpoint],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              preexec_fn=cap_memory)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server, endpoint
        except OSError:
            if server.poll() is not None:
                break
            time.sleep(0.2)
    server.kill()
    sys.exit("record.py: the RPC server did not start")


# ---------------------------------------------------------------- one configuration (child)

def run_config(cfg: dict, endpoints: list[str]) -> dict:
    """Loads the model with llama.cpp as `llama-cli -c CTX -ub UB -fa on|off -ngl N ...` would,
    decodes TOKENS as one batch and returns llama.cpp's log (for its node and split counts) and
    the last token's logits; the shim writes the bytes meanwhile."""
    libs = load_ggml(llama_cpp_dir() / "lib")
    ggml, rpc = libs["libggml.so.0"], libs["libggml-rpc.so.0"]
    rpc.ggml_backend_rpc_add_server.restype = ctypes.c_void_p
    rpc.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
    ggml.ggml_backend_register.argtypes = [ctypes.c_void_p]
    for endpoint in [e for e in endpoints if e][:max(1, len(cfg["tensor_split"]))]:  # RPC0, RPC1
        ggml.ggml_backend_register(rpc.ggml_backend_rpc_add_server(endpoint.encode()))
    shim = ctypes.CDLL(None)
    shim.shim_mark.argtypes = [ctypes.c_char_p]

    import llama_cpp  # after the registration, on the same ggml

    log: list[str] = []

    @llama_cpp.llama_log_callback
    def keep_log(level, text, user_data):
        log.append(text.decode("utf-8", "replace"))

    llama_cpp.llama_log_set(keep_log, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    n_layer = cfg["n_layer"]
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = n_layer + 1 if cfg["ngl"] == "all" else cfg["ngl"]
    split = (ctypes.c_float * llama_cpp.LLAMA_MAX_DEVICES)(*cfg["tensor_split"])
    if cfg["tensor_split"]:
        mparams.tensor_split = split
    rules = cfg["overrides"] + moe_overrides(cfg)
    overrides = buffer_overrides(ggml, rules)
    if rules:
        mparams.tensor_buft_overrides = ctypes.addressof(overrides)
    if not cfg.get("use_mmap", True):                      # --no-mmap: allocated, not mapped
        mparams.load_mode = 0                              # LLAMA_LOAD_MODE_NONE (0.3.36's field)
    shim.shim_mark(b"load")
    model = llama_cpp.llama_model_load_from_file(cfg["path"].encode(), mparams)
    if not model:
        raise RuntimeError("llama.cpp could not load " + cfg["path"] + "\n" + "".join(log[-20:]))
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = cfg["ctx"]
    cparams.n_batch = N_BATCH
    cparams.n_ubatch = cfg["ubatch"]
    cparams.n_threads = cparams.n_threads_batch = N_THREADS
    cparams.flash_attn_type = (-1 if cfg["flash_attn"] == "auto"     # LLAMA_FLASH_ATTN_TYPE_AUTO
                               else 1 if cfg["flash_attn"] else 0)
    cparams.offload_kqv = not cfg["no_kv_offload"]
    cparams.type_k = KV_TYPES[cfg.get("type_k", cfg["kv_type"])]   # -ctk (record_kv_types.py:
    cparams.type_v = KV_TYPES[cfg.get("type_v", cfg["kv_type"])]   # -ctv   K and V apart)
    cparams.swa_full = cfg["swa_full"]        # llama-cpp-python's default is true: always given
    cparams.n_seq_max = cfg.get("parallel", 1)             # -np
    cparams.kv_unified = cfg.get("kv_unified", False)      # -kvu (llama.cpp's CLI default: off)
    shim.shim_mark(b"context")
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    if not ctx:
        raise RuntimeError("llama.cpp could not make a context\n" + "".join(log[-20:]))
    shim.shim_mark(b"decode")
    prompt = cfg.get("tokens") or TOKENS
    tokens = (llama_cpp.llama_token * len(prompt))(*prompt)
    if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(tokens, len(prompt))) != 0:
        raise RuntimeError("llama_decode failed")
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    row = llama_cpp.llama_get_logits_ith(ctx, -1)
    logits = [float(f"{row[i]:.7g}") for i in range(n_vocab)]
    shim.shim_mark(b"done")
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return {"log": "".join(log), "logits": logits}


# common/common.h: LLM_FFN_EXPS_REGEX and llm_ffn_block_regex, as --cpu-moe / --n-cpu-moe add them
LLM_FFN_EXPS_REGEX = "\\.ffn_(up|down|gate|gate_up)_(ch|)exps"


def moe_overrides(cfg: dict) -> list[list[str]]:
    """--cpu-moe and --n-cpu-moe N as common/arg.cpp turns them into -ot rules (after -ot's)."""
    rules = [[LLM_FFN_EXPS_REGEX, "CPU"]] if cfg.get("cpu_moe") else []
    rules += [[f"blk\\.{i}{LLM_FFN_EXPS_REGEX}", "CPU"] for i in range(cfg.get("n_cpu_moe", 0))]
    return rules


class BuftOverride(ctypes.Structure):
    """llama_model_tensor_buft_override: -ot REGEX=BUFFER_TYPE, a NULL-terminated array."""
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def buffer_overrides(ggml: ctypes.CDLL, overrides: list[list[str]]) -> ctypes.Array:
    """ggmlrun's backend names mapped to the device buffer types llama.cpp's -ot takes."""
    ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    ggml.ggml_backend_dev_buffer_type.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_buffer_type.argtypes = [ctypes.c_void_p]
    device_types = {"CPU": 0, "RPC0": 1}   # GGML_BACKEND_DEVICE_TYPE_CPU, _GPU (the RPC device)
    array = (BuftOverride * (len(overrides) + 1))()
    for slot, (pattern, backend) in zip(array, overrides):
        slot.pattern = pattern.encode()
        slot.buft = ggml.ggml_backend_dev_buffer_type(ggml.ggml_backend_dev_by_type(device_types[backend]))
    return array


# ---------------------------------------------------------------- reading what the child left

def backend_key(llama_name: str) -> str:
    """ggmlrun's backend for a llama.cpp buffer or backend name (graphs/backends/llamacpp_rpc*.yaml);
    parse_shim has already named the RPC devices RPC0, RPC1 in their registration order."""
    if re.fullmatch(r"RPC\d+", llama_name):
        return llama_name
    if llama_name.startswith("CPU"):
        return "CPU"
    raise ValueError(f"unexpected llama.cpp backend {llama_name!r}")


def numpy_shape(ne: list[int]) -> list[int]:
    n_dims = max([i + 1 for i, n in enumerate(ne) if n != 1], default=1)
    return ne[:n_dims][::-1]


def ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")] if text else []


def names(field: str) -> list[str | None]:
    return [s or None for s in field.split("|")] if field else []


def device_names(text: str, endpoints: list[str]) -> str:
    """Each server's one device is `RPC0[endpoint]`; the ports change from run to run, so the n-th
    endpoint's device becomes RPCn."""
    return RPC_NAME.sub(lambda m: f"RPC{endpoints.index(m.group(1))}", text)


def parse_shim(text: str) -> tuple[list[tuple[str, str, str, int]], list[tuple[str, str, int]], list[dict]]:
    """(buffers [(phase, fn, name, bytes)], sched sizes [(phase, backend, bytes)], graphs)."""
    phase, buffers, sizes, graphs = "", [], [], []
    graph: dict | None = None
    for line in text.splitlines():
        f = line.split("\t")
        if f[0] == "M":
            phase = f[1]
        elif f[0] == "B":
            buffers.append((phase, f[1], f[2], int(f[3])))
        elif f[0] == "S":
            sizes.append((phase, f[1], int(f[2])))
        elif f[0] == "G" and f[1] == "begin":
            graph = {"kind": f[2], "phase": phase, "n_nodes": int(f[3]), "n_splits": int(f[4]),
                     "leaves": [], "nodes": []}
        elif f[0] == "G":
            graphs.append(graph)
            graph = None
        elif f[0] == "L":
            ne = ints(f[4])
            graph["leaves"].append({"name": f[1], "op": f[2], "type": f[3], "ne": ne,
                                    "shape": numpy_shape(ne), "nb": ints(f[5]), "backend": f[6],
                                    "flags": int(f[7]), "view_src": f[8], "buffer": f[9]})
        elif f[0] == "N":
            ne = ints(f[5])
            graph["nodes"].append({"i": int(f[1]), "name": f[2], "op": f[3], "type": f[4], "ne": ne,
                                   "shape": numpy_shape(ne), "nb": ints(f[6]), "backend": f[7],
                                   "flags": int(f[8]), "view_src": f[9], "view_offs": int(f[10]),
                                   "op_params": ints(f[11]), "src": names(f[12]),
                                   "sched_src": names(f[13])}
                                  | ({"alloc": int(f[14])} if len(f) > 14 and f[14] else {}))
    return buffers, sizes, graphs


RPC_NAME = re.compile(r"RPC0\[([0-9.:]+)\]")
GRAPH_LINE = re.compile(r"graph(?: \(pp bs=\d+, tg bs=\d+\))?: nodes = (\d+)(?: / (\d+))?, "
                        r"splits = (\d+)(?: / (\d+))?")


def figures_of(cfg: dict, child: dict, shim_text: str, endpoints: list[str],
               key=None) -> tuple[dict, dict]:
    """(the figures.json entry, the graph dump) of one configuration; `key` maps llama.cpp's
    buffer and backend names to ggmlrun's backends (backend_key unless given: record_cuda.py
    gives its own for CUDA0 / CUDA_Host)."""
    to_backend = key or backend_key
    buffers, sizes, graphs = parse_shim(device_names(shim_text, endpoints))
    backends: dict[str, dict[str, int]] = {}

    def add(name: str, key: str, nbytes: int) -> None:
        entry = backends.setdefault(to_backend(name), {"weights_bytes": 0, "kv_bytes": 0,
                                                        "arena_bytes": 0, **state})
        entry[key] += nbytes

    # state_bytes (the recurrent state: cache_r_l / cache_s_l) only where a model has one
    state = {"state_bytes": 0} if any(fn == "alloc_ctx_tensors_rs" for _, fn, _, _ in buffers) else {}
    output_bytes = 0
    for phase, fn, name, nbytes in buffers:
        if phase == "load":
            add(name, "weights_bytes", nbytes)
        elif phase == "context" and fn == "alloc_ctx_tensors":
            add(name, "kv_bytes", nbytes)
        elif phase == "context" and fn == "alloc_ctx_tensors_rs":
            add(name, "state_bytes", nbytes)
        elif phase == "context" and fn == "buft_alloc_buffer":
            output_bytes += nbytes   # the logits/embeddings output buffer, host memory
    arena = {to_backend(name): nbytes for phase, name, nbytes in sizes if phase == "context"}
    for name, nbytes in arena.items():
        backends.setdefault(name, {"weights_bytes": 0, "kv_bytes": 0, "arena_bytes": 0, **state})
        backends[name]["arena_bytes"] = nbytes
    child["log"] = device_names(child["log"], endpoints)
    match = GRAPH_LINE.search(child["log"])
    if not match:
        raise RuntimeError(f"{cfg['id']}: no 'graph nodes' line in llama.cpp's log")
    n_nodes_pp, n_nodes_tg, n_splits_pp, n_splits_tg = match.groups()
    entry = {
        "id": cfg["id"], "model": cfg["model"] + ".gguf",
        "options": {"ctx": cfg["ctx"], "ubatch": cfg["ubatch"], "flash_attn": cfg["flash_attn"],
                    "ngl": cfg["ngl"], "kv_type": cfg["kv_type"],
                    "no_kv_offload": cfg["no_kv_offload"], "overrides": cfg["overrides"]}
                   | ({"tensor_split": cfg["tensor_split"]} if cfg["tensor_split"] else {})
                   | ({"swa_full": True} if cfg["swa_full"] else {})
                   | ({"cpu_moe": True} if cfg.get("cpu_moe") else {})
                   | ({"n_cpu_moe": cfg["n_cpu_moe"]} if cfg.get("n_cpu_moe") else {})
                   | ({"parallel": cfg["parallel"]} if cfg.get("parallel", 1) > 1 else {})
                   | ({"kv_unified": True} if cfg.get("kv_unified") else {}),
        "n_nodes": int(n_nodes_pp), "n_splits": int(n_splits_pp),
        "n_nodes_tg": int(n_nodes_tg or n_nodes_pp), "n_splits_tg": int(n_splits_tg or n_splits_pp),
        "backends": {k: backends[k] for k in sorted(backends, key=lambda k: (k == "CPU", k))},
        "buffers": [[fn, name, nbytes] for phase, fn, name, nbytes in buffers
                    if phase in ("load", "context") and nbytes],   # the dummy 0-byte ones dropped
        "output_buffer_bytes": output_bytes,
        **({"pipeline_parallel": True} if "pipeline parallelism enabled" in child["log"] else {}),
        **({"tokens": cfg["tokens"]} if cfg.get("tokens") else {}),
        "logits": child["logits"],
    }
    reserves = [g for g in graphs if g["kind"] == "reserve" and g["phase"] == "context"]
    for label, g in zip(["pp", "tg", "pp_again"] if len(reserves) == 3 else [], reserves):
        g["label"] = label
    debug = [line for line in child["log"].splitlines()
             if line.startswith("## SPLIT") or line.startswith("node #")]
    dump = {"id": cfg["id"], "options": entry["options"], "graphs": graphs,
            "sched_debug": "\n".join(debug)}
    return entry, dump


# ---------------------------------------------------------------- driver

def compile_shim(workdir: Path) -> Path:
    include = llama_cpp_dir().parent / "include"
    out = workdir / "shim.so"
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", f"-I{include}", str(Path(__file__).parent / "shim.c"),
                    "-o", str(out), "-ldl"], check=True)
    return out


def model_layers(path: Path) -> int:
    from gguf import GGUFReader
    fields = GGUFReader(path).fields
    arch = fields["general.architecture"].contents()
    field = fields[f"{arch}.block_count"]
    return int(field.parts[field.data[0]][0])


def write_json_atomic(path: Path, data, compress: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    text = json.dumps(data, separators=(",", ":"))
    if compress:
        tmp.write_bytes(gzip.compress(text.encode(), mtime=0))
    else:
        tmp.write_text(text)
    tmp.replace(path)


def record_one(cfg: dict, endpoints: list[str], shim: Path, workdir: Path) -> tuple[dict, dict]:
    shim_log = workdir / "shim.log"
    shim_log.unlink(missing_ok=True)
    env = dict(os.environ, LD_PRELOAD=str(shim), SHIM_LOG=str(shim_log), GGML_SCHED_DEBUG="2",
               OMP_NUM_THREADS=str(N_THREADS))
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(cfg), "--endpoints", ",".join(endpoints)],
                          env=env, capture_output=True, text=True, timeout=300, preexec_fn=cap_memory)
    if proc.returncode != 0:
        raise RuntimeError(f"{cfg['id']}: llama.cpp child failed:\n{proc.stderr[-3000:]}")
    child = json.loads(proc.stdout.strip().splitlines()[-1])
    return figures_of(cfg, child, shim_log.read_text(), endpoints)


def versions() -> dict:
    return {"llama_cpp_python": importlib.metadata.version("llama-cpp-python"),
            "ggml": next(p.name.split(".so.")[1] for p in (llama_cpp_dir() / "lib").glob("libggml.so.*.*")),
            "gguf": importlib.metadata.version("gguf")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=FIGURES)
    parser.add_argument("--models", type=Path, default=MODELS_DIR)
    parser.add_argument("--graphs", type=Path,
                        default=ORACLE_OUT / "graphs" if ORACLE_OUT.is_dir() else None)
    parser.add_argument("--committed-graphs", type=Path, default=COMMITTED_GRAPHS,
                        help="where the gzipped dumps of the committed configurations go")
    parser.add_argument("--only", default="", help="record only configurations whose id contains this")
    parser.add_argument("--fresh", action="store_true", help="redo configurations already recorded")
    parser.add_argument("--serve-rpc", help=argparse.SUPPRESS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--endpoints", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_rpc:
        serve_rpc(args.serve_rpc)
        return 0
    if args.child:
        print(json.dumps(run_config(json.loads(args.child), args.endpoints.split(","))))
        return 0

    data = json.loads(args.out.read_text()) if args.out.exists() else {}
    recorded = {c["id"]: c for c in data.get("configs", [])}
    todo = [c for c in all_configs() if args.only in c["id"] and (args.fresh or c["id"] not in recorded)]
    data.update(versions(), tokens=TOKENS, n_threads=N_THREADS, n_batch=N_BATCH,
                backends_file="graphs/backends/llamacpp_rpc.yaml")
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        shim = compile_shim(workdir)
        servers = [start_rpc_server() for _ in range(2)]   # two devices for -ts; one otherwise
        endpoints = [endpoint for _, endpoint in servers]
        try:
            for cfg in todo:
                path = args.models / f"{cfg['model']}.gguf"
                cfg = dict(cfg, path=str(path), n_layer=model_layers(path))
                t0 = time.monotonic()
                entry, dump = record_one(cfg, endpoints, shim, workdir)
                recorded[cfg["id"]] = entry
                data["configs"] = [recorded[c["id"]] for c in all_configs() if c["id"] in recorded]
                write_json_atomic(args.out, data)
                stem = cfg["id"].replace("/", "_")
                if args.graphs:
                    write_json_atomic(args.graphs / f"{stem}.json", dump)
                if cfg["id"] in COMMITTED_IDS:
                    write_json_atomic(args.committed_graphs / f"{stem}.json.gz", dump, compress=True)
                sizes = " ".join(f"{k}:w{v['weights_bytes']}/kv{v['kv_bytes']}/c{v['arena_bytes']}"
                                 for k, v in entry["backends"].items())
                print(f"{cfg['id']:45s} nodes {entry['n_nodes']:4d} splits {entry['n_splits']:2d} "
                      f"{sizes}  ({time.monotonic() - t0:.1f}s)", flush=True)
        finally:
            for server, _ in servers:
                server.kill()
                server.wait()
    print(f"recorded {len(todo)} configurations in {time.monotonic() - started:.1f}s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
