"""Start-up stays lazy (issue 19: `validate` of a 128k-vocabulary GGUF in <= 0.15 s, most of
which was the command line's imports). What a command imports is checked, never how long it
takes, so neither a slow nor a busy machine decides these. Each probe is a fresh interpreter
and counts only the modules it imported beyond what that interpreter had at start (site and
.pth files differ between machines). The rules are in docs/architecture.md ("Start-up: what a
command imports") and docs/models.md ("Adding an architecture")."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib

import ggmlrun
from tests.test_load_fast import ROOT

MODELS = sorted((ROOT / "examples" / "models").glob("*.gguf"))
CARDS = sorted((ROOT / "ggmlrun" / "models" / "cards").glob("*.yaml"))

# what reading and checking a model's header must not load (a module or package, with why)
NOT_FOR_A_HEADER = {
    "ggmlrun.core.ir.ops": "the op registry and every op module",
    "ggmlrun.core.ir.graph": "the graph IR",
    "ggmlrun.models.graph.decoder": "the graph builders",
    "ggmlrun.models.graph.builder": "the graph builders",
    "ggmlrun.models.graph.attention": "the graph builders",
    "ggmlrun.models.graph.moe_ffn": "the graph builders",
    "ggmlrun.models.graph.output": "the graph builders",
    "ggmlrun.models.reserve": "the reserve graphs",
    "ggmlrun.models.fit": "fit",
    "ggmlrun.core.engine": "the engine",
    "ggmlrun.core.sched": "the scheduler",
    "ggmlrun.core.memory": "the allocator",
    "ggmlrun.core.run": "the executor",
    "ggmlrun.core.frontend.loader": "the graph-file loader",
    "ggmlrun.core.frontend.leaves": "the graph-file loader",
    "ggmlrun.core.frontend.backends_file": "the backends-file reader",
    "ggmlrun.core.frontend.yamlfile": "the YAML reader",
    "ggmlrun.report.graph": "graph reports",
    "ggmlrun.report.run": "run reports",
    "ggmlrun.visual": "terminal pictures",
    "yaml": "PyYAML", "rich": "rich", "numpy": "NumPy", "gguf": "the gguf package",
}
# a card is YAML: its reader may load, nothing else of the above
NOT_FOR_A_CARD = {name: why for name, why in NOT_FOR_A_HEADER.items()
                  if name not in ("yaml", "ggmlrun.core.frontend.yamlfile")}
# `--version` answers from the package: no model code, no installed-metadata lookup
NOT_FOR_VERSION = {**NOT_FOR_A_HEADER, "ggmlrun.models.load": "the model loader",
                   "ggmlrun.core.ir.types": "the type table (gguf's constants)",
                   "importlib.metadata": "the installed package's metadata"}


def _loaded(code: str) -> dict:
    """Run `code` in a fresh interpreter (NumPy not imported) after noting the modules it
    started with; `code` may set `found` (a dict). Returns found and the modules added."""
    probe = ("import json, sys\nstart = set(sys.modules)\nfound = {}\n" + code +
             "\nprint(json.dumps({'found': found, 'added': sorted(set(sys.modules) - start)}))\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def _offending(added, banned: dict) -> list[str]:
    return sorted(f"{name} ({why})" for name, why in banned.items()
                  if any(m == name or m.startswith(name + ".") for m in added))


def _validate_all(paths) -> str:
    return ("from ggmlrun.cli import main\n"
            f"for path in {[str(p) for p in paths]!r}:\n"
            "    try:\n        main(['validate', path])\n"
            "    except SystemExit as done:\n        assert not done.code, (path, done.code)\n")


def test_validate_of_every_bundled_model_loads_no_graph_machinery():
    """Every tiny GGUF (one or more per architecture), in one process: the header, the
    hyperparameter rules and the tensor table only."""
    assert len(MODELS) >= 10
    added = _loaded(_validate_all(MODELS))["added"]
    assert "ggmlrun.models.modelfile" in added          # the probe did read models
    assert _offending(added, NOT_FOR_A_HEADER) == []


def test_validate_of_every_card_loads_no_graph_machinery():
    added = _loaded(_validate_all(CARDS))["added"]
    assert "ggmlrun.models.cards.reader" in added
    assert _offending(added, NOT_FOR_A_CARD) == []


def test_every_registered_architecture_keeps_its_tables_apart_from_its_graph():
    """The registry's every module, a new one included: importing it (what `validate` does to
    get the tensor table) must not import the graph builders. The first module that pulls one
    in is named, so the failure says which file breaks the rule."""
    found = _loaded("""
from ggmlrun.models.arch import ARCHITECTURES, _MODULES, get_arch
heavy = ("ggmlrun.models.graph.decoder", "ggmlrun.models.graph.builder", "ggmlrun.models.graph.attention",
         "ggmlrun.models.graph.moe_ffn", "ggmlrun.models.graph.output", "ggmlrun.core.ir.ops",
         "ggmlrun.core.ir.graph", "numpy", "yaml", "rich")
for name in ARCHITECTURES:
    arch = get_arch(name)
    assert arch.name == name and callable(arch.tensors) and callable(arch.build)
    now = [m for m in heavy if m in sys.modules]
    if now:
        found[_MODULES[name]] = now
        break
found["checked"] = list(ARCHITECTURES)
""")["found"]
    checked = found.pop("checked")
    assert "llama" in checked and len(checked) >= 10
    assert found == {}, ("an architecture module imports graph code at its top; import it "
                         "in the function that builds (docs/models.md, 'Adding an "
                         f"architecture'): {found}")


def _importtime(*args: str) -> set[str]:
    """The modules `python -X importtime ARGS` imports (its stderr lists each as it loads,
    which also covers a command that leaves through os._exit)."""
    done = subprocess.run([sys.executable, "-X", "importtime", *args], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
            if line.startswith("import time:") and "|" in line}


def test_the_ggmlrun_command_itself():
    """`python -m ggmlrun` as a user runs it (ggmlrun/__init__.py and __main__.py, the exit
    without teardown): validate of a GGUF, then --version."""
    bare = _importtime("-c", "pass")
    added = _importtime("-m", "ggmlrun", "validate", str(ROOT / "examples" / "models" /
                                                           "tiny-llama-q8_0.gguf")) - bare
    assert "ggmlrun.models.gguf.header" in added
    assert _offending(added, NOT_FOR_A_HEADER) == []
    added = _importtime("-m", "ggmlrun", "--version") - bare
    assert "ggmlrun.cli" in added
    assert _offending(added, NOT_FOR_VERSION) == []


def test_version_is_the_package_version():
    """--version prints ggmlrun.__version__ (not the installed metadata): it must be
    pyproject's."""
    with open(ROOT / "pyproject.toml", "rb") as handle:
        assert tomllib.load(handle)["project"]["version"] == ggmlrun.__version__
    done = subprocess.run([sys.executable, "-m", "ggmlrun", "--version"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.split()[-1] == ggmlrun.__version__


def test_a_model_graph_is_built_after_a_lazy_start():
    """The op registry and the builders load with the first graph: validate, then measure,
    in one fresh process (nothing imported them beforehand)."""
    model = str(ROOT / "examples" / "models" / "tiny-qwen35-q8_0.gguf")
    found = _loaded(f"""
from ggmlrun.cli import main
for command in (['validate', {model!r}], ['measure', {model!r}, '--json']):
    found[command[0]] = 'ggmlrun.core.ir.ops' in sys.modules
    try:
        main(command)
    except SystemExit as done:
        assert not done.code, done.code
""")["found"]
    assert found == {"validate": False, "measure": False}


def test_import_ggmlrun_for_its_api_loads_no_machinery():
    """A tool that embeds ggmlrun (docs/models.md, "ggmlrun as a library") pays for `import
    ggmlrun` only the API's own small module: the command line, the models and the engine
    load when `measure` or `fit` is called."""
    result = _loaded("import ggmlrun\n"
                     "found['api'] = [callable(ggmlrun.measure), callable(ggmlrun.fit)]")
    assert result["found"] == {"api": [True, True]}
    banned = {**NOT_FOR_VERSION, "click": "click", "ggmlrun.cli": "the command line",
              "ggmlrun.models": "model code"}
    assert _offending(result["added"], banned) == []
