"""Real models: GGUF headers, llama.cpp's llama graph, its placement and its buffers.

Built on ggmlrun.core (core never imports this package). `modelfile` reads a GGUF header,
`llama` builds the graph llama.cpp builds, `placement` decides where every weight and KV buffer
lives as llama.cpp's loader does, `reserve` sizes the buffers as llama.cpp's context does and
`run` evaluates a real model file.
"""
