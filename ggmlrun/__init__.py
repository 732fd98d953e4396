"""ggmlrun: ggml's scheduler, graph allocator and executor, rebuilt to be read and run."""

__version__ = "0.1.0"
