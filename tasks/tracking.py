"""MLflow tracking: one parent run per pipeline run, one child run per stage.

The parent run is created by ``didpo run`` and its id travels to the stage processes (``dvc repro`` →
``didpo stage NAME``) in the ``DIDPO_PARENT_RUN_ID`` environment variable; a stage run alone (``didpo stage``,
``dvc repro`` by hand) becomes a top-level run of its own. Each stage run logs its params section, the git commit,
its input data versions (DVC hashes) as MLflow dataset inputs, and its reports as artifacts; system metrics (CPU,
memory) are sampled while it runs. The experiment is marked as model training (`EXPERIMENT_KIND`).

Training loops never import this module: they take an ``emit(metrics, step)`` callback, and :func:`mlflow_emit`
is the MLflow implementation of it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from tasks.config import TrackingConfig, section_dict

PARENT_ENV = "DIDPO_PARENT_RUN_ID"


# The experiment tag the MLflow 3 UI reads to choose its view; "custom_model_development" is its "Machine learning"
# kind (runs, metrics, models), where an unset kind opens the GenAI view (traces, prompts).
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")


def configure(tracking: TrackingConfig) -> str:
    """Point MLflow at the tracking store and experiment (created as a model-training experiment,
    `EXPERIMENT_KIND`); returns the tracking URI in use.

    ``MLFLOW_TRACKING_URI`` in the environment wins over params.yaml (a team's server).
    """
    import mlflow

    uri = os.environ.get("MLFLOW_TRACKING_URI") or tracking.tracking_uri
    mlflow.set_tracking_uri(uri)
    client = mlflow.MlflowClient()
    experiment = client.get_experiment_by_name(tracking.experiment)
    if experiment is None:
        location = tracking.artifact_location
        if "://" not in location:
            location = Path(location).resolve().as_uri()
        client.create_experiment(tracking.experiment, artifact_location=location, tags=dict([EXPERIMENT_KIND]))
    elif EXPERIMENT_KIND[0] not in experiment.tags:
        client.set_experiment_tag(experiment.experiment_id, *EXPERIMENT_KIND)
    mlflow.set_experiment(tracking.experiment)
    return uri


def pipeline_outputs(dvc_yaml: str | Path = "dvc.yaml") -> list[str]:
    """Every path the DVC graph writes (``outs``, ``metrics``, ``plots`` of every stage), ``dvc.lock`` and
    ``docs/screenshots`` (`make screenshots` retakes them from a run's state): files the tools rewrite, so a change
    to them does not make the source tree dirty."""
    path = Path(dvc_yaml)
    stages = (yaml.safe_load(path.read_text()) or {}).get("stages", {}) if path.is_file() else {}
    out = ["dvc.lock", "docs/screenshots"]
    for stage in stages.values():
        for kind in ("outs", "metrics", "plots"):
            for entry in stage.get(kind, []):
                out.append(next(iter(entry)) if isinstance(entry, dict) else str(entry))
    return out


def git_commit() -> tuple[str, bool]:
    """The checked-out git commit and whether the source differs from it: a tracked file changed, other than the
    pipeline's own outputs (`pipeline_outputs`: a run rewrites dvc.lock and the cache-less metrics, which would
    otherwise mark every run's commit dirty). ``("unknown", False)`` outside a git work tree."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        excludes = [f":(exclude){p}" for p in pipeline_outputs()]
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", *excludes],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown", False
    return sha, bool(dirty)


def run_name(stage: str, algo: str | None = None, commit: tuple[str, bool] | None = None) -> str:
    """The MLflow run name that tells runs apart in the run list: ``<stage> · <algo> · <short commit>``, e.g.
    ``didpo · rft · 8fc972a`` (``-dirty`` after the commit when the source differs from it; no algorithm part for
    a stage without one; no commit part outside a git work tree).

    Args:
        stage: the stage (``pipeline`` for a whole run).
        algo: the RL algorithm (``didpo.algo``) of a stage that trains or measures the RL checkpoint.
        commit: `git_commit`'s ``(sha, dirty)``; None: asked now.
    """
    sha, dirty = git_commit() if commit is None else commit
    parts = [stage, algo or "", "" if sha == "unknown" else sha[:7] + ("-dirty" if dirty else "")]
    return " · ".join(part for part in parts if part)


def source_tags(name: str, commit: tuple[str, bool] | None = None) -> dict[str, str]:
    """MLflow's standard source tags (``mlflow.source.git.commit``, ``.name``, ``.type``; the UI links a run to its
    commit through them) and ``didpo.git_dirty``; ``commit``: `git_commit`'s answer (None: asked now)."""
    from mlflow.entities import SourceType
    from mlflow.utils.mlflow_tags import MLFLOW_GIT_COMMIT, MLFLOW_SOURCE_NAME, MLFLOW_SOURCE_TYPE

    sha, dirty = git_commit() if commit is None else commit
    return {
        MLFLOW_GIT_COMMIT: sha,
        MLFLOW_SOURCE_NAME: name,
        MLFLOW_SOURCE_TYPE: SourceType.to_string(SourceType.LOCAL),
        "didpo.git_dirty": str(dirty).lower(),
    }


def dvc_version(path: str | Path, lock_path: str | Path = "dvc.lock") -> str:
    """The DVC content hash of a tracked path: from dvc.lock outs, a ``.dvc`` file, else the file's md5.

    DVC 3 hashes a file by the md5 of its bytes, so the fallback gives the value DVC would record.
    Returns ``""`` for a path that does not exist.
    """
    path = Path(path)
    lock = Path(lock_path)
    if lock.exists():
        stages = (yaml.safe_load(lock.read_text()) or {}).get("stages", {})
        for stage in stages.values():
            for out in stage.get("outs", []):
                if Path(out["path"]) == path:
                    return out.get("md5", "")
    dvc_file = path.with_name(path.name + ".dvc")
    if dvc_file.exists():
        outs = (yaml.safe_load(dvc_file.read_text()) or {}).get("outs", [])
        if outs:
            return outs[0].get("md5", "")
    if path.is_file():
        digest = hashlib.md5()
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        return digest.hexdigest()
    return ""


RUN_ID_FILE = "mlflow_run_id"


def _resumable_run(resume_dir: Path | None) -> str | None:
    """The MLflow run id an interrupted attempt left in `resume_dir` when training will resume there (a checkpoint
    exists) and the run is in this tracking store; else None."""
    from models.checkpoint import latest_checkpoint  # torch: local, as every CLI command imports this module

    if resume_dir is None or latest_checkpoint(resume_dir) is None or not (resume_dir / RUN_ID_FILE).is_file():
        return None
    import mlflow

    run_id = (resume_dir / RUN_ID_FILE).read_text().strip()
    try:
        mlflow.MlflowClient().get_run(run_id)
    except mlflow.exceptions.MlflowException:
        return None
    return run_id


@contextmanager
def stage_run(
    stage: str,
    tracking: TrackingConfig,
    section: Any = None,
    inputs: tuple[str, ...] = (),
    resume_dir: Path | None = None,
    algo: str | None = None,
) -> Iterator[Any]:
    """Open the MLflow run of one stage (a child of the pipeline's parent run when there is one), named by
    `run_name` (stage, algorithm, short commit) and tagged ``didpo.stage`` (and ``didpo.algo`` with an algorithm).

    Logs the stage's params section (``section``), the git commit, and each input path as a dataset input whose
    digest is its DVC hash. Yields the active ``mlflow.ActiveRun``; a stage that raises ends its run FAILED.
    ``algo``: the RL algorithm the stage trains or measures (default: the section's ``algo``, the RL stage's).
    ``resume_dir``: a training stage's exact-resume checkpoint folder. The run's id is kept there until the stage
    finishes, so an interrupted attempt's run is continued (one loss curve, not two runs) when training resumes
    from a checkpoint in it.
    """
    import mlflow
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    configure(tracking)
    parent = os.environ.get(PARENT_ENV) or None
    algo = algo if algo is not None else getattr(section, "algo", None)
    commit = git_commit()
    tags = {
        "didpo.stage": stage,
        **({"didpo.algo": algo} if algo else {}),
        **source_tags(f"didpo stage {stage}", commit),
    }
    name = run_name(stage, algo, commit)
    resumed = _resumable_run(resume_dir)
    if resumed is not None:
        started = mlflow.start_run(run_id=resumed, tags={**tags, "didpo.resumed": "true"}, log_system_metrics=True)
    else:
        started = mlflow.start_run(run_name=name, parent_run_id=parent, tags=tags, log_system_metrics=True)
    with started as run:
        if resume_dir is not None:
            resume_dir.mkdir(parents=True, exist_ok=True)
            (resume_dir / RUN_ID_FILE).write_text(run.info.run_id + "\n")
        if section is not None and resumed is None:  # a continued run has them (MLflow refuses a changed value)
            mlflow.log_params({f"{stage}.{k}": _param(v) for k, v in section_dict(section).items()})
        for path in inputs:
            version = dvc_version(path)
            if not version:
                continue
            with warnings.catch_warnings():  # a local path matches two equivalent registered local sources
                warnings.simplefilter("ignore", UserWarning)
                source = resolve_dataset_source(str(Path(path).resolve()))
            mlflow.log_input(MetaDataset(source, name=str(path), digest=version[:36]), context=stage)
        yield run
        if resume_dir is not None:
            (resume_dir / RUN_ID_FILE).unlink(missing_ok=True)  # finished: the next attempt is a new run


def _param(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (list, tuple, dict)) else str(value)
    return text[:6000]


def metric_name(key: str) -> str:
    """An MLflow-legal metric name: MLflow refuses ``@``, so ``eval/pass@16`` is logged as ``eval/pass_at_16``."""
    return key.replace("@", "_at_")


def mlflow_emit(metrics: dict[str, float], step: int) -> None:
    """The MLflow implementation of a loop's ``emit(metrics, step)`` callback (names via :func:`metric_name`)."""
    import mlflow

    mlflow.log_metrics({metric_name(k): float(v) for k, v in metrics.items()}, step=step)


def log_run_summary(params: dict[str, str], metrics: dict[str, float]) -> None:
    """Log a whole run's parameters and result figures on the current (parent) run."""
    import mlflow

    mlflow.log_params({key: _param(value) for key, value in params.items()})
    mlflow.log_metrics(metrics)


def set_tags(tags: dict[str, str]) -> None:
    """Tag the current stage run (MLflow tag values are strings)."""
    import mlflow

    mlflow.set_tags({key: str(value) for key, value in tags.items()})


def log_table(data: dict[str, list], artifact_file: str) -> None:
    """Log a table (column → values) as a JSON artifact of the current stage run (MLflow's table view reads it)."""
    import mlflow

    mlflow.log_table(data, artifact_file=artifact_file)


def log_artifacts(*paths: str | Path, artifact_path: str | None = None) -> None:
    """Log report files (or folders) of the current stage run as artifacts; missing paths are skipped."""
    import mlflow

    for path in map(Path, paths):
        if path.is_dir():
            mlflow.log_artifacts(str(path), artifact_path=artifact_path)
        elif path.is_file():
            mlflow.log_artifact(str(path), artifact_path=artifact_path)


@contextmanager
def pipeline_run(tracking: TrackingConfig, name: str = "pipeline", algo: str | None = None) -> Iterator[str]:
    """Open the parent run of a whole pipeline run, named ``<name> · <algo> · <short commit>`` (`run_name`; ``algo``:
    the run's ``didpo.algo``), and export its id to stage processes; yields the run id."""
    import mlflow

    configure(tracking)
    previous = os.environ.get(PARENT_ENV)
    commit = git_commit()
    tags = {"didpo.stage": "pipeline", **({"didpo.algo": algo} if algo else {}), **source_tags("didpo run", commit)}
    with mlflow.start_run(run_name=run_name(name, algo, commit), tags=tags) as run:
        os.environ[PARENT_ENV] = run.info.run_id
        try:
            yield run.info.run_id
        finally:
            if previous is None:
                os.environ.pop(PARENT_ENV, None)
            else:
                os.environ[PARENT_ENV] = previous
