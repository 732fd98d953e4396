"""What a MODEL name holds: the headers of a GGUF file or of a split set, local or remote.

(The remote machinery, HTTP, TLS and threads, is imported only for a remote name: a local
file's `validate` loads none of it.)

A name is a local path, an `http(s)://` URL, or an `hf://` name (gguf/hub.py). A name whose
file part is a shard's (`PREFIX-0000i-of-0000N.gguf`) is the whole set, read from its first
shard whichever was named; a file whose header says it is one of a split set but whose name
is not a shard's is refused (llama.cpp finds the other shards by name). Remote headers go
through the header cache (gguf/cache.py) and are read in parallel, one thread per shard: each
shard is a few round trips of its own, so a set costs about what its largest header costs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.gguf.header import GGUFHeader, read_header
from ggmlrun.models.gguf.split import check_set, parse_shard, shard_name, split_count

@dataclass
class Shard:
    name: str                       # as messages show it: a path, a URL, an hf:// name
    header: GGUFHeader
    path: Path | None = None        # a local file's
    address: object = None          # a remote file's: its URL, or its hub.HfName


@dataclass
class HeaderSet:
    name: str                       # the name given
    shards: list[Shard]
    note: str | None = None         # said on stderr: which shard is first, when another was named


def is_remote(name) -> bool:
    text = str(name) if not isinstance(name, Path) else ""
    return text.startswith(("http://", "https://", "hf://"))


def read_headers(name, *, refresh: bool = False, stats=None, cache=None) -> HeaderSet:
    """Every shard's header, in order, checked as llama.cpp's loader checks a set; `stats`
    (gguf/remote.py's Stats) counts what a remote name fetched, `cache` is the HeaderCache."""
    if not is_remote(name):
        return _local(Path(name))
    from urllib.parse import urlsplit, urlunsplit

    from ggmlrun.models.gguf import hub
    from ggmlrun.models.gguf.cache import HeaderCache
    from ggmlrun.models.gguf.stats import Stats

    reader = _Remote(refresh, stats or Stats(), cache or HeaderCache())
    text = str(name)
    if hub.is_hf(text):
        ref = hub.parse_hf(text)
        if ref.path is None:
            ref = ref.file(reader.pick(ref))
        names = _set_names(ref.path, lambda path: ref.file(path).shown)
        fetch = [lambda path=path: reader.hub_file(ref.file(path)) for path, _ in names[0]]
        addresses = [ref.file(path) for path, _ in names[0]]
    else:
        parts = urlsplit(text)
        folder, _, leaf = parts.path.rpartition("/")
        names = _set_names(leaf, lambda leaf: urlunsplit(parts._replace(path=f"{folder}/{leaf}")))
        fetch = [lambda url=shown: reader.url(url) for _, shown in names[0]]
        addresses = [shown for _, shown in names[0]]
    return _assemble(text, [_Result(shown, None, address) for (_, shown), address
                            in zip(names[0], addresses)], names[1], fetch, reader.parallel)


def _set_names(leaf: str, show) -> tuple[list[tuple[str, str]], str | None]:
    """[(file part, shown name)] of the set a file part names (one entry for a single file),
    and the note for a shard named other than the first."""
    shard = parse_shard(leaf)
    if shard is None or shard[2] == 1:
        return [(leaf, show(leaf))], None
    prefix, no, count = shard
    if no > count or no < 1:
        raise InputError(f"shard {no} of {count}? a split set's shards are 1 to {count}",
                         file=show(leaf))
    parts = [shard_name(prefix, i, count) for i in range(1, count + 1)]
    note = None
    if no != 1:
        note = (f"{show(leaf)} is shard {no} of {count}; the set is read from its first, "
                f"{show(parts[0])}")
    return [(p, show(p)) for p in parts], note


@dataclass
class _Result:
    name: str
    path: Path | None
    address: object = None


def _local(path: Path) -> HeaderSet:
    folder = path.parent
    names, note = _set_names(path.name, lambda leaf: str(folder / leaf) if leaf != path.name
                             else str(path))
    results = [_Result(shown, folder / leaf if leaf != path.name else path)
               for leaf, shown in names]
    fetch = [lambda p=r.path: read_header(p) for r in results]
    return _assemble(str(path), results, note, fetch, lambda jobs: [job() for job in jobs])


def _assemble(name: str, results: list[_Result], note, fetch, run) -> HeaderSet:
    """The shards read (all at once where `run` is parallel), then checked as a set. A file
    named like a first shard whose header is not one of a set is a single file, as llama.cpp
    loads it: the other names' failures then do not count."""
    outcomes = run([lambda job=job: _outcome(job) for job in fetch])
    first_ok = not isinstance(outcomes[0], Exception)
    if len(outcomes) > 1 and first_ok and split_count(outcomes[0]) == 1 and note is None:
        results, outcomes = results[:1], outcomes[:1]
    failed = next((o for o in outcomes if isinstance(o, Exception)), None)
    if failed is not None:
        raise failed
    shards = [Shard(r.name, h, r.path, r.address) for r, h in zip(results, outcomes)]
    if len(shards) == 1:
        if split_count(shards[0].header) > 1:
            raise InputError(f"one of {split_count(shards[0].header)} split GGUF files "
                             f"(split.count), but not named as a shard (PREFIX-00001-of-"
                             f"{split_count(shards[0].header):05d}.gguf): llama.cpp finds the "
                             f"other shards by that name; rename the set or merge it "
                             f"(llama-gguf-split --merge)", file=shards[0].name)
        return HeaderSet(name, shards, note)
    check_set([s.header for s in shards], [s.name for s in shards])
    return HeaderSet(name, shards, note)


def _outcome(job):
    """A shard's header, or the InputError that reading it raised (judged with the others)."""
    try:
        return job()
    except InputError as err:
        return err


def repo_mmproj(name: str, *, refresh: bool = False, stats=None, cache=None) -> str | None:
    """The projector `-hf` loads beside an hf:// model (common/download.cpp: the repo's
    `mmproj` file closest to the model, hub.pick_sibling), as an hf:// name; None for any
    other name or a repository without one."""
    from ggmlrun.models.gguf import hub

    if not hub.is_hf(str(name)):
        return None
    from ggmlrun.models.gguf.cache import HeaderCache
    from ggmlrun.models.gguf.stats import Stats

    reader = _Remote(refresh, stats or Stats(), cache or HeaderCache())
    ref = hub.parse_hf(str(name))
    files = reader.listing(ref)
    model = ref.path or hub.pick_quant(ref, files)
    found = hub.pick_sibling(files, model)
    return None if found is None else ref.file(found).shown


class _Remote:
    """Remote headers through the cache; a fetch's bytes stop at the tensor infos' end."""

    def __init__(self, refresh: bool, stats, cache):
        self.refresh, self.stats, self.cache = refresh, stats, cache

    def parallel(self, jobs):
        """Every job in a thread of its own (a shard: a few round trips each), results in
        order. Plain threads: concurrent.futures would import logging on every question."""
        import threading

        self.stats.add(files=len(jobs))
        results = [None] * len(jobs)

        def work(i):
            results[i] = jobs[i]()
        threads = [threading.Thread(target=work, args=(i,), daemon=True)
                   for i in range(1, len(jobs))]
        for thread in threads:
            thread.start()
        work(0)
        for thread in threads:
            thread.join()
        return results

    def pick(self, ref) -> str:
        from ggmlrun.models.gguf import hub

        return hub.pick_quant(ref, self.listing(ref))

    def listing(self, ref) -> list[str]:
        """The repository's .gguf files, through the cache."""
        from ggmlrun.models.gguf import hub

        identity = f"tree:{hub.endpoint()}/{ref.repo}@{ref.revision or 'main'}"
        files = None if self.refresh else self.cache.get_fresh_json(
            "tree", identity, fresh=not hub.offline())
        if files is None and hub.offline():
            raise InputError("offline (HF_HUB_OFFLINE is set) and the repository's listing "
                             "is not in the header cache", file=ref.shown)
        if files is None:
            files = hub.list_gguf(ref)
            self.stats.add(requests=1)
            self.cache.put_fresh_json("tree", identity, files)
        return files

    def hub_file(self, ref) -> GGUFHeader:
        from ggmlrun.models.gguf import hub

        identity = f"hf:{hub.endpoint()}/{ref.repo}/{ref.path}@{ref.revision or 'main'}"
        header = self._cached(identity, ref.shown, hub.offline())
        if header is not None:
            return header
        from ggmlrun.models.gguf.remote import HttpFile

        location, validator, headers = hub.file_metadata(ref)
        self.stats.add(requests=1)
        return self._fetch(identity, validator, ref.shown, HttpFile(
            location, name=ref.shown, headers=headers, stats=self.stats,
            denied_hint=hub.DENIED))

    def url(self, url: str) -> GGUFHeader:
        from ggmlrun.models.gguf import hub

        header = self._cached(url, url, hub.offline())
        if header is not None:
            return header
        from ggmlrun.models.gguf.remote import HttpFile

        handle = HttpFile(url, stats=self.stats)
        size, validator = handle.head()
        return self._fetch(url, validator, url, handle, size)

    def _cached(self, identity: str, shown: str, offline: bool) -> GGUFHeader | None:
        """The cached header if it is fresh (or offline: whatever its age); offline without
        one is an error, else None: ask the server."""
        if self.refresh and not offline:
            return None
        validator = self.cache.latest(identity, fresh=not offline)
        cached = self.cache.get(identity, validator) if validator else None
        if cached is not None:
            self.stats.add(done=1)
            return _from_cache(cached, shown)
        if offline:
            raise InputError("offline (HF_HUB_OFFLINE is set) and this header is not in the "
                             "header cache: ask once online first", file=shown)
        return None

    def _fetch(self, identity: str, validator, shown: str, handle,
               size: int | None = None) -> GGUFHeader:
        from ggmlrun.models.gguf.header import read_header_from
        from ggmlrun.models.gguf.remote import CHUNK

        if not self.refresh:
            cached = self.cache.get(identity, validator)
            if cached is not None and (size is None or cached[1] == size):
                handle.close()
                self.cache.checked(identity, validator)
                self.stats.add(done=1)
                return _from_cache(cached, shown)
        with handle:
            handle.open()
            header = read_header_from(handle, handle.size, shown, chunk=CHUNK)
            validator = validator if validator is not None else handle.validator
            self.cache.put(identity, validator, bytes(handle.prefix[:header.header_end]),
                           handle.size)
        self.stats.add(done=1)
        return header


def _from_cache(cached: tuple[bytes, int], shown: str) -> GGUFHeader:
    import io

    from ggmlrun.models.gguf.header import read_header_from

    blob, size = cached
    return read_header_from(io.BytesIO(blob), size, shown)
