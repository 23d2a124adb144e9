"""The project's import graph, read from the source (ast): the project modules a module reaches through its imports,
function-local ones included. tests/test_stage_graph.py checks dvc.yaml's code deps with it, and the evaluate stage
keys its cache on the closure of the code that produces answers and verdicts (`flows.evaluate.evaluation_code`)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGES = ("models", "sandbox", "datalib", "tasks", "flows")
# Modules that watch a stage and cannot change what it writes: how it is logged (MLflow runs, metrics, tags). They are
# no stage's DVC dependency (tests/test_stage_graph.py), so editing them re-runs nothing.
WATCHING = frozenset({"tasks.tracking"})
# Modules started as scripts rather than imported (the verifier runs `python -I sandbox/worker.py`).
SCRIPTS = {"sandbox.verifier": {"sandbox.worker"}}


def project_modules(root: Path) -> dict[str, Path]:
    """Project module name → file under `root` (``models.sft`` → models/sft.py)."""
    return {
        ".".join(p.relative_to(root).with_suffix("").parts): p
        for d in PACKAGES
        for p in (Path(root) / d).glob("*.py")
        if p.name != "__init__.py"
    }


def project_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `path` imports anywhere in its body (``from a import b`` counts ``a.b`` when that is a
    module)."""
    names = set()
    for node in ast.walk(ast.parse(Path(path).read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
    return {name for name in names if name in modules}


def import_closure(start: str, modules: dict[str, Path], skip: frozenset[str] = frozenset()) -> set[str]:
    """`start` and every project module it reaches through imports (and `SCRIPTS`), not entering those in `skip`."""
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name not in seen and name not in skip:
            seen.add(name)
            todo += project_imports(modules[name], modules) | SCRIPTS.get(name, set())
    return seen
