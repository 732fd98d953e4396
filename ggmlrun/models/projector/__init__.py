"""Multimodal projectors (llama-server's `--mmproj`): libmtmd's clip models, read from their
GGUF (clip.py), their encoder graph built as tools/mtmd/clip.cpp builds it at warm-up (vit.py:
the shared ViT pieces; one module per projector family: gemma3.py, qwen3vl.py), placed and
measured with core's scheduler and allocator (measure.py). Only sized, never computed: `run`
evaluates the text model alone."""
