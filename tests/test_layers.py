"""The house rules, checked on the source: each stage imports only the stages before it.

docs/architecture.md draws the same order. A lazy import inside a function counts too: a
cycle hidden in a function body is still a cycle. models/ is staged inside as llama.cpp's
model code is: the GGUF reader, the hyperparameter record, the options, memory sized from
those two, the graph pieces, the projectors (--mmproj), the architectures (the registry and one module each), the model a
header or card holds, the reserve, fit and run.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent / "ggmlrun"

# Stages in pipeline order; a module may import its own stage and any earlier one.
STAGES = ["version", "core.util", "core.ir", "core.backends", "core.frontend", "core.sched", "core.memory",
          "core.run", "core.observe", "core.engine",
          "models.gguf", "models.hparams", "models.options", "models.memory", "models.graph",
          "models.projector", "models.arch", "models.modelfile", "models.cards", "models.load",
          "models.reserve", "models.draft", "models.fit", "models.run",
          "report", "visual", "cli", "api"]
NEVER_IN_CORE = {"click", "rich", "gguf", "yaml"}
GGUF_ONLY_IN = {"core.ir.types"}      # ggml's type table, as the gguf package publishes it
YAML_ONLY_IN = {"core.frontend.yamlfile"}


def stage_of(module: str) -> int:
    """Index of the longest stage prefix of a dotted name below `ggmlrun.`."""
    best = -1
    for i, stage in enumerate(STAGES):
        if module == stage or module.startswith(stage + "."):
            best = i
    return best


def modules():
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        name = ".".join(parts)
        if parts and parts != ["__main__"] and not (path.name == "__init__.py" and stage_of(name) < 0):
            yield name, path


def imports_of(path: pathlib.Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return names


MODULES = dict(modules())


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_only_earlier_stages(module):
    own = stage_of(module)
    assert own >= 0, f"{module} belongs to no stage: add it to STAGES and docs/architecture.md"
    for name in imports_of(MODULES[module]):
        if name.startswith("ggmlrun."):
            target = name[len("ggmlrun."):]
            if stage_of(target) < 0:
                continue            # `from ggmlrun.core import x` names a package, checked via x
            assert stage_of(target) <= own, f"{module} imports the later stage {target}"
        top = name.split(".")[0]
        if module.startswith("core."):
            allowed = (top == "yaml" and module in YAML_ONLY_IN) or (top == "gguf" and module in GGUF_ONLY_IN)
            assert top not in NEVER_IN_CORE or allowed, f"{module} imports {top}"


def test_no_import_cycles_between_modules():
    graph = {m: set() for m in MODULES}
    for module, path in MODULES.items():
        for name in imports_of(path):
            target = name[len("ggmlrun."):] if name.startswith("ggmlrun.") else None
            if target in MODULES and target != module and not MODULES[target].name == "__init__.py":
                graph[module].add(target)
    state: dict[str, int] = {}

    def visit(m, trail):
        state[m] = 1
        for t in graph[m]:
            assert state.get(t) != 1, "import cycle: " + " -> ".join(trail + [m, t])
            if t not in state:
                visit(t, trail + [m])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [])


def test_the_registry_loads_only_its_own_stage():
    """The registry imports each architecture by name (import_module), which no import
    statement shows: every name it holds must be a module of the arch stage, so the stage
    order above covers what it loads (a registry entry below it would hide a loop)."""
    from ggmlrun.models.arch import _MODULES

    for arch, module in _MODULES.items():
        name = module[len("ggmlrun."):]
        assert stage_of(name) == STAGES.index("models.arch") and name in MODULES, (arch, module)


def test_the_checker_sees_a_backward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from ggmlrun.core.engine import run\n")
    assert stage_of("core.engine") > stage_of("core.sched")
    assert "ggmlrun.core.engine" in imports_of(bad)
    assert stage_of("models.arch.llama") > stage_of("models.graph.decoder")
    assert stage_of("models.graph") > stage_of("models.memory.caches")
