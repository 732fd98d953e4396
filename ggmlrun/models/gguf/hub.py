"""`hf://` names: a GGUF file, or a quant of a repository, on the Hugging Face Hub.

`hf://OWNER/REPO/PATH/IN/REPO.gguf[@REVISION]` names one file;
`hf://OWNER/REPO[:QUANT][@REVISION]` is llama.cpp's `-hf OWNER/REPO:QUANT`: the repository's
GGUF file or split set whose name carries the quant tag (case-insensitive, as a whole word of
the name; Q4_K_M when none is given, as llama.cpp defaults; projector files, `mmproj*`, never
match). `huggingface_hub` speaks to the Hub: the endpoint (HF_ENDPOINT), the token (HF_TOKEN or
the login cache), the repository listing (the tree API), and each file's HEAD (its commit, ETag,
size and the CDN address it redirects to). The header's bytes then come through gguf/remote.py's
range reader. Read at call time, so a test or a wrapper may set them after import: HF_ENDPOINT
and HF_HUB_OFFLINE.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.gguf.split import parse_shard

DEFAULT_QUANT = "Q4_K_M"
TIMEOUT = 20.0
MAX_PAGES = 100                   # of 1000 entries: a listing is bounded too
_QUANT_WORD = r"(?:^|[-._/]){}(?:[-.]|$)"
_QUANT_TAGS = re.compile(r"(?:^|[-._/])((?:UD-)?(?:I?Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32|"
                         r"MXFP4(?:_MOE)?|TQ\d_\d))(?=[-.]|$)", re.IGNORECASE)
DENIED = (": the model is gated or private: accept its licence on the model page "
          "and set HF_TOKEN (or run `hf auth login`)")


@dataclass(frozen=True)
class HfName:
    repo: str                      # OWNER/REPO
    path: str | None               # a file in it, or None: pick by quant
    quant: str | None
    revision: str | None

    @property
    def shown(self) -> str:
        text = f"hf://{self.repo}" + (f"/{self.path}" if self.path else "")
        text += f":{self.quant}" if self.quant and not self.path else ""
        return text + (f"@{self.revision}" if self.revision else "")

    def file(self, path: str) -> "HfName":
        return HfName(self.repo, path, None, self.revision)


def is_hf(name: str) -> bool:
    return name.startswith("hf://")


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def parse_hf(name: str) -> HfName:
    body = name[len("hf://"):]
    revision = None
    if "@" in body:
        body, _, revision = body.rpartition("@")
        if not revision:
            raise InputError("an empty revision after '@'", file=name)
    parts = body.split("/")
    if len(parts) < 2 or not all(parts[:2]):
        raise InputError("write hf://OWNER/REPO[:QUANT] or hf://OWNER/REPO/PATH.gguf", file=name)
    if len(parts) > 2:
        path = "/".join(parts[2:])
        if not path.lower().endswith(".gguf"):
            raise InputError("a file in a repository is a .gguf file (hf://OWNER/REPO/PATH.gguf);"
                             " for a quant write hf://OWNER/REPO:QUANT", file=name)
        return HfName(f"{parts[0]}/{parts[1]}", path, None, revision)
    repo, _, quant = parts[1].partition(":")
    return HfName(f"{parts[0]}/{repo}", None, quant or None, revision)


def file_url(ref: HfName) -> str:
    from huggingface_hub import hf_hub_url

    return hf_hub_url(ref.repo, ref.path, revision=ref.revision, endpoint=endpoint())


def file_metadata(ref: HfName):
    """(the address its bytes come from, the validator the cache keys it by, the headers the
    range requests send): one HEAD on the Hub."""
    from huggingface_hub import get_hf_file_metadata
    from huggingface_hub.utils import build_hf_headers

    meta = call(ref, lambda: get_hf_file_metadata(file_url(ref), timeout=TIMEOUT,
                                                   endpoint=endpoint()))
    headers = {}
    if meta.location.startswith(endpoint() + "/"):    # no redirect: the token goes along
        headers = {k: v for k, v in build_hf_headers().items() if k.lower() == "authorization"}
    return meta.location, f"{meta.commit_hash}:{meta.etag}", headers


def list_gguf(ref: HfName) -> list[str]:
    """The repository's .gguf files (every folder), by the tree API, page by page (its Link
    headers). Through huggingface_hub's session, headers and errors, but not HfApi: importing
    hf_api costs 0.3 s of CPU, and its pagination retries a refused connection for 23 s
    where one clear line at once is wanted."""
    from urllib.parse import quote

    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    revision = quote(ref.revision or "main", safe="")
    first = f"{endpoint()}/api/models/{ref.repo}/tree/{revision}?recursive=true&expand=false"

    def listing():
        session, headers, files, url = get_session(), build_hf_headers(), [], first
        for _ in range(MAX_PAGES):
            response = session.get(url, headers=headers, timeout=TIMEOUT)
            hf_raise_for_status(response)
            files += [e["path"] for e in response.json() if e.get("type") == "file"]
            url = response.links.get("next", {}).get("url")
            if not url:
                return files
        raise InputError(f"the listing of {ref.repo} runs past {MAX_PAGES} pages",
                         file=ref.shown)
    return sorted(path for path in call(ref, listing) if path.lower().endswith(".gguf"))


def pick_quant(ref: HfName, files: list[str]) -> str:
    """The file (a split set: its first shard) whose name carries the quant tag."""
    quant = ref.quant or DEFAULT_QUANT
    word = re.compile(_QUANT_WORD.format(re.escape(quant)), re.IGNORECASE)
    models = [f for f in files if "mmproj" not in f.rsplit("/", 1)[-1].lower()]
    choices = []
    for f in models:
        shard = parse_shard(f)
        if shard is not None and shard[1] != 1:
            continue                        # a split set counts once, by its first shard
        if word.search(f[:-len(".gguf")] if shard is None else shard[0]):
            choices.append(f)
    if len(choices) == 1:
        return choices[0]
    present = sorted({m.group(1).upper() for f in models for m in _QUANT_TAGS.finditer(
        f[:-len(".gguf")])})
    if not choices:
        listed = ", ".join(present) if present else "none recognised: " + (
            ", ".join(models[:8]) or "no .gguf file")
        raise InputError(f"no GGUF file carries the quant tag {quant}; quants here: {listed}",
                         file=ref.shown)
    raise InputError(f"{len(choices)} GGUF files carry the quant tag {quant}: "
                     f"{', '.join(choices)}; name one as hf://{ref.repo}/PATH.gguf",
                     file=ref.shown)


_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)


def _split_info(path: str) -> tuple[str, str]:
    """common/download.cpp's get_gguf_split_info: (prefix without -NNNNN-of-NNNNN, tag)."""
    prefix = path[:-len(".gguf")] if path.endswith(".gguf") else ""
    m = _SPLIT.match(prefix)
    if m:
        prefix = m.group(1)
    tag = _TAG.search(prefix)
    return prefix, tag.group(1).upper() if tag else ""


def _quant_bits(path: str) -> int:
    """extract_quant_bits: the first number of the tag (Q4_K_M 4, F16 16, none 0)."""
    m = re.search(r"\d+", _split_info(path)[1])
    return int(m.group(0)) if m else 0


def pick_sibling(files: list[str], model: str, keyword: str = "mmproj") -> str | None:
    """common/download.cpp's find_best_sibling, as `-hf` picks the model's projector: a .gguf
    whose path holds `keyword` in the model's folder or above, the deepest shared folder
    first, then the quant bits closest to the model's; the first in listing order on a tie."""
    model_dir = model.split("/")[:-1]
    model_bits = _quant_bits(model)
    best, best_key = None, None
    for f in files:
        if not f.endswith(".gguf") or keyword not in f:
            continue
        sib_dir = f.split("/")[:-1]
        depth = 0
        while depth < min(len(model_dir), len(sib_dir)) and model_dir[depth] == sib_dir[depth]:
            depth += 1
        if depth != len(sib_dir):
            continue
        key = (depth, -abs(_quant_bits(f) - model_bits))
        if best is None or key > best_key:
            best, best_key = f, key
    return best


def call(ref: HfName, action):
    """`action()` against the Hub; its failures as one line each (exit 2)."""
    from huggingface_hub import errors

    try:
        return action()
    except errors.OfflineModeIsEnabled:
        raise InputError("offline (HF_HUB_OFFLINE is set) and not in the header cache",
                         file=ref.shown) from None
    except errors.GatedRepoError:
        raise InputError(f"access denied{DENIED}", file=ref.shown) from None
    except errors.RevisionNotFoundError:
        raise InputError(f"no revision '{ref.revision}' in {ref.repo}", file=ref.shown) from None
    except errors.RemoteEntryNotFoundError:
        raise InputError(f"{ref.repo} has no file '{ref.path}'"
                         + (f" at revision {ref.revision}" if ref.revision else ""),
                         file=ref.shown) from None
    except errors.RepositoryNotFoundError as err:
        status = _status(err)
        raise InputError(f"no repository {ref.repo} on {endpoint()} (HTTP {status}), or it is "
                         f"private: check the name, or set HF_TOKEN", file=ref.shown) from None
    except errors.HfHubHTTPError as err:
        status = _status(err)
        if status in (401, 403):
            raise InputError(f"access denied (HTTP {status}){DENIED}", file=ref.shown) from None
        if status == 404:
            raise InputError(f"not found on {endpoint()} (HTTP 404): {ref.repo}"
                             + (f", file {ref.path}" if ref.path else ""), file=ref.shown) from None
        raise InputError(f"the Hub answered HTTP {status}", file=ref.shown) from None
    except Exception as err:  # noqa: BLE001 - the HTTP client's own errors: no network
        client = type(err).__module__.split(".")[0].startswith(("httpx", "httpcore", "ssl"))
        if not client and not isinstance(err, OSError):
            raise
        raise InputError(f"cannot reach {endpoint()}: {type(err).__name__}: {err} (no network? "
                         f"HF_HUB_OFFLINE=1 answers from the header cache)",
                         file=ref.shown) from None


def _status(err) -> int | None:
    response = getattr(err, "response", None)
    return getattr(response, "status_code", None)
