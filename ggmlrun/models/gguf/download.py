"""`run --download`: a remote model's files fetched whole, so that run maps them as local files.

Only `run` needs the weights. An hf:// model goes into the Hugging Face cache
(`hf_hub_download`: its layout, its locks, shared with every other tool that uses it); a URL
into ggmlrun's own cache dir (downloads/, beside headers/), one folder per URL folder, so the
shards of a set keep their names side by side. The headers are read (and the set checked)
first, so a bad model is refused before a byte of weights travels. A download is written to a
temporary file and renamed: an interrupted one leaves nothing that looks whole.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from urllib.parse import urlsplit

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.gguf import hub
from ggmlrun.models.gguf.cache import cache_dir
from ggmlrun.models.gguf.remote import HttpFile
from ggmlrun.models.gguf.source import read_headers

_BLOCK = 1 << 20


def download(name: str, *, refresh: bool = False, stats=None) -> Path:
    """The local path of the first shard (or only file) of the model `name` names."""
    headers = read_headers(name, refresh=refresh, stats=stats)
    paths = [_one(shard.address, shard.header.size) for shard in headers.shards]
    return paths[0]


def _one(address, size: int) -> Path:
    if isinstance(address, hub.HfName):
        from huggingface_hub import hf_hub_download

        return Path(hub.call(address, lambda: hf_hub_download(
            address.repo, address.path, revision=address.revision, endpoint=hub.endpoint(),
            cache_dir=os.environ.get("HF_HUB_CACHE") or None)))    # read now, not at import
    folder = hashlib.sha256(address.rsplit("/", 1)[0].encode()).hexdigest()[:24]
    target = cache_dir().parent / "downloads" / folder / urlsplit(address).path.rsplit("/", 1)[-1]
    if target.is_file() and target.stat().st_size == size:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    from ggmlrun.core.util.atomic import write_atomic

    with HttpFile(address) as remote:
        response = remote.request("GET", {})
        if response.status != 200:
            response.read()
            raise remote.status_error(response.status)

        def write(handle):
            while True:
                block = response.read(_BLOCK)
                if not block:
                    break
                handle.write(block)
        write_atomic(target, write)
    if target.stat().st_size != size:
        raise InputError(f"the download ended at {target.stat().st_size} of {size} bytes",
                         file=address)
    return target
