"""MLflow tracking: one parent run per pipeline run, one child run per stage.

The parent run is created by ``didpo run`` and its id travels to the stage processes (``dvc repro`` →
``didpo stage NAME``) in the ``DIDPO_PARENT_RUN_ID`` environment variable; a stage run alone (``didpo stage``,
``dvc repro`` by hand) becomes a top-level run of its own. Each stage run logs its params section, the git commit,
its input data versions (DVC hashes) as MLflow dataset inputs, and its reports as artifacts.

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


def configure(tracking: TrackingConfig) -> str:
    """Point MLflow at the tracking store and experiment; returns the tracking URI in use.

    ``MLFLOW_TRACKING_URI`` in the environment wins over params.yaml (a team's server).
    """
    import mlflow

    uri = os.environ.get("MLFLOW_TRACKING_URI") or tracking.tracking_uri
    mlflow.set_tracking_uri(uri)
    client = mlflow.MlflowClient()
    if client.get_experiment_by_name(tracking.experiment) is None:
        location = tracking.artifact_location
        if "://" not in location:
            location = Path(location).resolve().as_uri()
        client.create_experiment(tracking.experiment, artifact_location=location)
    mlflow.set_experiment(tracking.experiment)
    return uri


def git_commit() -> str:
    """The checked-out git commit (with ``-dirty`` when the tree has uncommitted changes), or ``unknown``."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("-dirty" if dirty else "")


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


@contextmanager
def stage_run(stage: str, tracking: TrackingConfig, section: Any = None, inputs: tuple[str, ...] = ()) -> Iterator[Any]:
    """Open the MLflow run of one stage (a child of the pipeline's parent run when there is one).

    Logs the stage's params section (``section``), the git commit, and each input path as a dataset input whose
    digest is its DVC hash. Yields the active ``mlflow.ActiveRun``; a stage that raises ends its run FAILED.
    """
    import mlflow
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    configure(tracking)
    parent = os.environ.get(PARENT_ENV) or None
    tags = {"didpo.stage": stage, "git_commit": git_commit()}
    with mlflow.start_run(run_name=stage, parent_run_id=parent, tags=tags) as run:
        if section is not None:
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


def log_artifacts(*paths: str | Path, artifact_path: str | None = None) -> None:
    """Log report files (or folders) of the current stage run as artifacts; missing paths are skipped."""
    import mlflow

    for path in map(Path, paths):
        if path.is_dir():
            mlflow.log_artifacts(str(path), artifact_path=artifact_path)
        elif path.is_file():
            mlflow.log_artifact(str(path), artifact_path=artifact_path)


@contextmanager
def pipeline_run(tracking: TrackingConfig, name: str = "pipeline") -> Iterator[str]:
    """Open the parent run of a whole pipeline run and export its id to stage processes; yields the run id."""
    import mlflow

    configure(tracking)
    previous = os.environ.get(PARENT_ENV)
    with mlflow.start_run(run_name=name, tags={"didpo.stage": "pipeline", "git_commit": git_commit()}) as run:
        os.environ[PARENT_ENV] = run.info.run_id
        try:
            yield run.info.run_id
        finally:
            if previous is None:
                os.environ.pop(PARENT_ENV, None)
            else:
                os.environ[PARENT_ENV] = previous
