"""A model named on the command line, local or remote: the progress line while remote headers
travel, the note on which shard of a split set is first, and `run`'s refusal to download
weights unless --download says so."""

from __future__ import annotations

import sys
import threading
import time

import click

from ggmlrun.core.util.errors import InputError

SHOW_AFTER = 0.5          # seconds: a quicker fetch draws nothing


class FetchProgress:
    """One line on stderr, redrawn in place, once a fetch has taken SHOW_AFTER seconds; only
    on a terminal and never with --json. Shards are read in threads: one lock, and at most
    ten redraws a second."""

    def __init__(self, enabled: bool, stream=None):
        self.enabled, self.stream = enabled, stream or sys.stderr
        self.start = time.monotonic()
        self.drawn = 0.0
        self.shown = False
        self.lock = threading.Lock()

    def __call__(self, stats) -> None:
        now = time.monotonic()
        if not self.enabled or now - self.start < SHOW_AFTER or now - self.drawn < 0.1:
            return
        with self.lock:
            self.drawn, self.shown = now, True
            self.stream.write(f"\r\033[Kggmlrun: {self.line(stats)}")
            self.stream.flush()

    @staticmethod
    def line(stats) -> str:
        from ggmlrun.models.gguf.stats import human

        shards = f", shard {min(stats.done + 1, stats.files)} of {stats.files}" \
            if stats.files > 1 else ""
        return f"fetching headers: {human(stats.bytes)} in {stats.requests} requests{shards}"

    def finish(self, stats) -> None:
        if self.shown:
            from ggmlrun.models.gguf.stats import human

            self.stream.write(f"\r\033[Kggmlrun: fetched headers: {human(stats.bytes)} in "
                              f"{stats.requests} requests, {time.monotonic() - self.start:.1f} s\n")
            self.stream.flush()


def load_named_model(path, model_kw: dict):
    """The model GRAPH names (None: a graph file), with --refresh; remote headers with a
    progress line; `run` (model_kw has "tokens") refuses a remote model without --download."""
    from ggmlrun.models.gguf.source import is_remote
    from ggmlrun.models.load import load_model

    refresh = bool(model_kw.get("refresh"))
    if not is_remote(path):
        model = load_model(path)
    else:
        if "tokens" in model_kw and not model_kw.get("download"):
            raise InputError("run reads the weights, and this model's would be downloaded "
                             "whole: give --download to fetch them (validate, measure, plan, "
                             "fit and card read only the header)", file=str(path))
        ctx = click.get_current_context(silent=True)
        as_json = bool(ctx and ctx.params.get("as_json"))
        from ggmlrun.core.util.fmt import is_terminal
        from ggmlrun.models.gguf.stats import Stats

        progress = FetchProgress(not as_json and is_terminal(sys.stderr))
        stats = Stats(progress)
        if model_kw.get("download"):
            from ggmlrun.models.gguf.download import download

            model = load_model(download(str(path), refresh=refresh, stats=stats))
        else:
            model = load_model(path, refresh=refresh, stats=stats)
        progress.finish(stats)
    if model is not None and model.note:
        click.echo(f"ggmlrun: note: {model.note}", err=True)
    return model
