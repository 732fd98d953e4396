"""Real models: GGUF headers and model cards, llama.cpp's graphs, their placement and buffers.

Built on ggmlrun.core (core never imports this package) and staged as llama.cpp's model code is,
each stage importing only the ones before it (tests/test_layers.py): `gguf` reads headers,
`hparams` holds the one hyperparameter record, `options` llama.cpp's context and loader
options, `memory` sizes the caches and places every weight before any graph (as
llama_model::create_memory), `graph` holds llm_graph_context's pieces, `arch` the registry and
one module per architecture, `modelfile`/`cards`/`load` the model an argument names, `reserve`
llama.cpp's buffers, `fit` the searches over them and `run` the logits.
"""
