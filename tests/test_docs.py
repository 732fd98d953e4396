"""Docs that cannot drift: every repository path a doc names exists, the README's and
docs/models.md's example commands run (at a quick size), and every command's --help describes
every option and its default."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from clikit import invoke

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = ("ggmlrun/", "docs/", "tests/", "benchmarks/", "scripts/", "graphs/", "examples/")
# written by the examples themselves, or placeholders
NOT_PATHS = ("scratch/", "ggmlrun/.../")


def _named_paths(text: str) -> set[str]:
    """Repository paths a doc names: in backticks, in links, or bare, starting at a top-level
    folder of the repository (a placeholder such as FILE, N, <...> or * is not a path)."""
    found = set()
    for match in re.finditer(r"(?<![\w./-])((?:%s)[\w./-]*[\w/])" % "|".join(
            re.escape(t) for t in TOP), text):
        path = match.group(1).rstrip(".")
        if any(path.startswith(p) for p in NOT_PATHS) or re.search(r"[*<>]|\bN\b", path):
            continue
        found.add(path)
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_path_a_doc_names_exists(doc):
    text = doc.read_text()
    missing = []
    for path in sorted(_named_paths(text)):
        here = ROOT / path
        relative = doc.parent / path
        if not (here.exists() or relative.exists() or here.with_suffix("").exists()):
            missing.append(path)
    assert not missing, f"{doc.name} names paths that do not exist: {missing}"


def test_no_doc_cites_a_folder_outside_the_repository():
    for doc in DOCS:
        assert "../shared/" not in doc.read_text(), f"{doc.name} cites ../shared/"


# --- the examples run ----------------------------------------------------------------------
QUICK = {   # a 7B-shaped graph is minutes of NumPy; the same command at a toy size
    "--layers 32 --dim 4096 --heads 32 --ffn 11008 --context 512 --offload 8":
        "--layers 6 --dim 64 --heads 4 --ffn 160 --context 64 --offload 2",
}
SKIPPED = {   # why an example does not run here
    "pip install": "installs packages",
    "pytest": "runs the test suite",
    ".svg": "needs Graphviz",
    ".png": "needs Graphviz",
    "oracle": "needs llama-cpp-python (the oracle)",
    "hf://": "reaches the Hugging Face Hub (tests/test_hub.py runs these against a stand-in)",
    "https://": "reaches the network (tests/test_hub.py serves files on loopback)",
}


def _examples(doc: Path) -> list[str]:
    """The `ggmlrun ...` lines of the doc's bash blocks (comments dropped, `&&` split)."""
    text = doc.read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = re.split(r"\s#\s", line)[0].strip()
            for part in line.split("&&"):
                part = part.strip()
                synopsis = re.search(r"\bMODEL\b|\bFILE\b|\[", part)
                if re.match(r"^([A-Z_]+=\S+ )*(ggmlrun|python3 -m ggmlrun) ", part) \
                        and not synopsis:
                    commands.append(part)
    return commands


def _argv(command: str) -> tuple[dict, list[str]]:
    for slow, quick in QUICK.items():
        command = command.replace(slow, quick)
    words = shlex.split(command)
    env = {}
    while "=" in words[0] and words[0].split("=")[0].isupper():
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    if words[0] == "python3":
        words = words[2:]
    return env, words[1:]


EXAMPLES = [(doc.name, c) for doc in (ROOT / "README.md", ROOT / "docs/models.md")
            for c in _examples(doc)]


def test_examples_are_found():
    assert len([e for e in EXAMPLES if e[0] == "README.md"]) >= 15
    assert len([e for e in EXAMPLES if e[0] == "models.md"]) >= 5


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder that sees the repository's files and has its own scratch/ (and the backends
    files docs/models.md shows)."""
    work = tmp_path_factory.mktemp("examples")
    for name in ("graphs", "examples", "ggmlrun", "docs"):
        (work / name).symlink_to(ROOT / name)
    (work / "scratch").mkdir()
    text = (ROOT / "docs/models.md").read_text()
    for name, body in re.findall(r"```yaml\n# (\S+\.yaml)\n(.*?)```", text, re.S):
        (work / name).write_text(body)
    return work


def _writes(argv: list[str]) -> set[str]:
    """The scratch/ files an example writes (`-o`, `--out`, `--trace`)."""
    return {value for flag, value in zip(argv, argv[1:])
            if flag in ("-o", "--out", "--trace") and value.startswith("scratch/")}


# scratch file -> the example that writes it: an example reading one runs its writer first
# when the file is not there yet (the examples are split among the test workers, each with
# a working folder of its own, so the README's order is not the order they run in)
WRITERS = {path: command for _, command in EXAMPLES for path in _writes(_argv(command)[1])}


def _run_example(doc: str, command: str, workdir: Path, monkeypatch) -> None:
    env, argv = _argv(command)
    for path in [a for a in argv if a.startswith("scratch/") and a not in _writes(argv)]:
        if not (workdir / path).exists() and path in WRITERS:
            _run_example(doc, WRITERS[path], workdir, monkeypatch)
    monkeypatch.chdir(workdir)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    code, out, err = invoke(*argv)
    assert code == 0, f"{doc}: `{command}` exits {code}: {err}"


@pytest.mark.parametrize("doc, command", EXAMPLES, ids=[f"{d}:{c[:60]}" for d, c in EXAMPLES])
def test_example_runs(doc, command, workdir, monkeypatch):
    why = next((why for key, why in SKIPPED.items() if key in command), None)
    if why:
        pytest.skip(f"{command!r}: {why}")
    _run_example(doc, command, workdir, monkeypatch)


# --- --help -----------------------------------------------------------------------------------
def _commands(cmd, path=()):
    yield path, cmd
    if isinstance(cmd, click.Group):
        for name, sub in sorted(cmd.commands.items()):
            yield from _commands(sub, path + (name,))


def test_help_describes_every_option_and_its_default():
    from ggmlrun.cli import cli
    import ggmlrun.cli.main  # noqa: F401 - every command registered

    bad = []
    for path, cmd in _commands(cli):
        if not cmd.help:
            bad.append(f"{' '.join(path)}: no description")
        for p in cmd.params:
            if not isinstance(p, click.Option) or p.hidden:
                continue
            if not p.help:
                bad.append(f"{' '.join(path)} {p.opts[0]}: no help")
            elif not (p.is_flag or p.multiple or p.show_default or "default" in p.help.lower()):
                bad.append(f"{' '.join(path)} {p.opts[0]}: no default in its help")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", [(), ("gen",), ("gen", "llama"), ("fit",), ("run",)])
def test_help_runs(path):
    code, out, err = invoke(*path, "--help")
    assert code == 0 and "Usage: ggmlrun" in out
