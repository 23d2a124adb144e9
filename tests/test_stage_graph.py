"""dvc.yaml and the code agree (issue 20, item 4): every stage path in flows/paths.py is an output of a dvc.yaml stage
and every dvc.yaml output is one of them (or under one); no stage's flow imports another stage's flow; a stage's flow
only wires (its project imports: the stage's task, the configuration, the tracking and the paths); and every stage's
project-module ``deps`` are exactly the modules its task (tasks/X.py, the stage's work) imports, followed through every
import (function-local ones included), so editing any of them makes ``dvc repro`` re-run the stage and editing the
flows, the CLI or the tracking does not (issue 46, item 1)."""

from pathlib import Path

import yaml

import flows.paths as paths
from flows import code_graph
from flows.code_graph import PACKAGES, WATCHING, import_closure, project_imports

ROOT = Path(__file__).resolve().parents[1]
PROJECT = PACKAGES


def _stages() -> dict[str, dict]:
    return yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


def _outputs(spec: dict) -> list[str]:
    """A stage's outs, metrics and plots as path strings (dvc.yaml writes each as a string or a one-key mapping)."""
    return [
        entry if isinstance(entry, str) else next(iter(entry))
        for key in ("outs", "metrics", "plots")
        for entry in spec.get(key, [])
    ]


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def project_modules() -> dict[str, Path]:
    return code_graph.project_modules(ROOT)


def _stage_paths() -> dict[str, str]:
    return {name: str(value) for name, value in vars(paths).items() if isinstance(value, Path)}


def test_every_stage_path_is_a_dvc_output_and_every_output_is_a_stage_path():
    outputs = [out for spec in _stages().values() for out in _outputs(spec)]
    constants = _stage_paths()
    orphans = {name: p for name, p in constants.items() if not any(_under(p, o) or _under(o, p) for o in outputs)}
    assert not orphans, f"flows/paths.py paths no dvc.yaml stage writes: {orphans}"
    unnamed = [o for o in outputs if not any(_under(o, p) for p in constants.values())]
    assert not unnamed, f"dvc.yaml outputs with no flows/paths.py constant: {unnamed}"
    assert [str(p) for p in paths.CHECKPOINTS.values()] == [
        "data/checkpoints/base",
        "data/checkpoints/sft/merged",
        "data/checkpoints/dpo/merged",
        "data/checkpoints/didpo/merged",
    ]


def test_checkpoint_names_are_the_configs():
    from tasks.config import CHECKPOINT_NAMES

    assert tuple(paths.CHECKPOINTS) == CHECKPOINT_NAMES
    assert set(paths.HISTORIES) == set(CHECKPOINT_NAMES) - {"base"}


def test_no_stage_flow_imports_another_stage_flow():
    modules = project_modules()
    stage_flows = {f"flows.{name}" for name in _stages()}
    for name in sorted(stage_flows):
        others = (project_imports(modules[name], modules) & stage_flows) - {name}
        assert not others, f"{name} imports {sorted(others)}: read another stage's paths from flows.paths"


def test_a_stage_flow_only_wires_its_task():
    """flows/X.py passes the configuration and the paths to tasks/X.py and logs what it returns; everything that
    decides an output (reading inputs, computing, writing) is in the task, so a flow is no stage's dependency."""
    modules = project_modules()
    for stage in _stages():
        allowed = {f"tasks.{stage}", "tasks.config", "tasks.tracking", "flows.paths", "flows.code_graph"}
        extra = project_imports(modules[f"flows.{stage}"], modules) - allowed
        assert not extra, f"flows/{stage}.py imports {sorted(extra)}: move that work into tasks/{stage}.py"


def test_every_stage_deps_are_the_modules_its_task_imports():
    modules = project_modules()
    wrong = {}
    for stage, spec in _stages().items():
        deps = [str(d) for d in spec.get("deps", [])]
        closure = import_closure(f"tasks.{stage}", modules, WATCHING)
        needed = sorted(str(modules[m].relative_to(ROOT)) for m in closure)
        lacking = [path for path in needed if not any(_under(path, d) for d in deps)]
        extra = [d for d in deps if d.endswith(".py") and d.split("/")[0] in PROJECT and d not in needed]
        if lacking or extra:
            wrong[stage] = {"lacking": lacking, "not imported": extra}
    assert not wrong, f"dvc.yaml deps differ from the modules each stage's task imports: {wrong}"


def test_the_closure_follows_function_localproject_imports(tmp_path, monkeypatch):
    """The checker itself: a module reached only through an import inside a function is in the closure."""
    (tmp_path / "a.py").write_text("def f():\n    from b import g\n")
    (tmp_path / "b.py").write_text("import c\n")
    (tmp_path / "c.py").write_text("x = 1\n")
    modules = {name: tmp_path / f"{name}.py" for name in ("a", "b", "c")}
    assert import_closure("a", modules) == {"a", "b", "c"}
    assert import_closure("c", modules) == {"c"}


def test_architecture_page_names_every_stage_and_only_modules_the_stageproject_imports():
    """docs/ARCHITECTURE.md's stage table: one row per dvc.yaml stage, and every module a row names for the stage's
    work or learning code is in that stage's import closure (the map cannot point at code the stage does not run)."""
    import re

    modules = project_modules()
    rows = {}
    for line in (ROOT / "docs" / "ARCHITECTURE.md").read_text().splitlines():
        m = re.match(r"\| `(\w+)`[^|]*\| flows/\w+\.py \| ([^|]*)\| ([^|]*)\|", line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3))
    assert set(rows) == set(_stages())
    for stage, (work, learning) in rows.items():
        closure = import_closure(f"flows.{stage}", modules)
        named = {f"{pkg or 'tasks'}.{n}" for pkg, n in re.findall(r"(?:(datalib)/)?(\w+)\.py", work)}
        named |= {f"{pkg or 'models'}.{n}" for pkg, n in re.findall(r"(?:(sandbox)/)?(\w+)\.py", learning)}
        assert named, stage
        assert named <= closure, f"{stage}: the page names {sorted(named - closure)}, which the stage does not import"


def test_dvc_lock_records_the_committed_code():
    """Every git-tracked file a stage depends on has, in the committed dvc.lock, the md5 and size it has now: a code
    change committed without re-hashing its stages (`dvc commit -f` where the outputs are unchanged, else a re-run)
    makes `dvc status` find every such stage changed, and a fresh clone's `didpo run` would retrain them (a re-trial
    found all 13 stages out of date over one new function in tasks/tracking.py)."""
    import hashlib
    import subprocess

    lock = yaml.safe_load((ROOT / "dvc.lock").read_text())["stages"]
    tracked = set(subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split())
    checked, stale = 0, []
    for stage, entry in lock.items():
        for dep in entry.get("deps", []):
            if dep["path"] in tracked and not dep.get("md5", "").endswith(".dir"):
                data = (ROOT / dep["path"]).read_bytes()
                checked += 1
                if (hashlib.md5(data).hexdigest(), len(data)) != (dep["md5"], dep["size"]):
                    stale.append(f"{stage}: {dep['path']}")
    assert checked > 150 and not stale, stale  # 199 code deps in 13 stages (2026-12-07)


def test_editing_a_watching_module_leaves_every_stage_up_to_date(tmp_path):
    """In a copy of the project (git-tracked files, docs aside): `dvc status` names no code dependency as changed;
    after a log line is added to tasks/tracking.py, to every stage's flow, to the paths and to the CLI it still names
    none, while the same edit to models/config.py (code every stage computes with) marks every stage changed."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    assert not any("tasks/tracking.py" in spec.get("deps", []) for spec in _stages().values())
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    for name in tracked:
        if not name.startswith("docs/") and (ROOT / name).is_file():
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, tmp_path / name)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)

    def changed_code() -> dict[str, list[str]]:
        out = subprocess.run(["dvc", "status", "--json"], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        changed = {}
        for stage, entries in json.loads(out.stdout or "{}").items():
            for entry in entries:
                deps = entry.get("changed deps", {}) if isinstance(entry, dict) else {}
                code = sorted(path for path in deps if path.endswith(".py"))
                if code:
                    changed[stage.rsplit(":", 1)[-1]] = code
        return changed

    assert changed_code() == {}
    for watching in ["tasks/tracking.py", "flows/paths.py", "flows/cli.py", *(f"flows/{s}.py" for s in _stages())]:
        with open(tmp_path / watching, "a") as f:
            f.write("\nprint('a new log line')\n")
    assert changed_code() == {}
    with open(tmp_path / "models/config.py", "a") as f:
        f.write("\nprint('a new log line')\n")
    assert set(changed_code()) == set(_stages())


def test_computing_code_imports_no_orchestration_or_tracking():
    """models/, sandbox/ and datalib/ (what decides a stage's outputs) import nothing of Prefect, MLflow, DVC or Great
    Expectations, anywhere in a module (function-local imports included): flows wire them."""
    import ast

    banned = {"prefect", "mlflow", "dvc", "great_expectations"}
    found = []
    for package in ("models", "sandbox", "datalib"):
        for path in sorted((ROOT / package).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                found += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in banned]
    assert not found, found


def test_every_stage_has_its_flow_and_its_task_file_named_after_it():
    """Stage names and files agree (issue 46, item 5): dvc.yaml stage `X` is flows/X.py and tasks/X.py, and each stage's
    flow imports its own task module."""
    modules = project_modules()
    for stage in _stages():
        assert f"flows.{stage}" in modules and f"tasks.{stage}" in modules, stage
        assert f"tasks.{stage}" in project_imports(modules[f"flows.{stage}"], modules), stage
