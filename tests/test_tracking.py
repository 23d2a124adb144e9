"""MLflow spine: a parent run per pipeline run, child runs per stage with params, git commit and DVC data versions."""

import hashlib
import os

import pytest

from tasks import tracking
from tasks.config import PrepareConfig, TrackingConfig


@pytest.fixture()
def tracking_cfg(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv(tracking.PARENT_ENV, raising=False)
    return TrackingConfig(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", experiment="t", artifact_location="art")


def test_dvc_version_prefers_lock_then_dvc_file_then_md5(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_bytes(b'{"a": 1}\n')
    assert tracking.dvc_version(data, tmp_path / "nolock") == hashlib.md5(b'{"a": 1}\n').hexdigest()
    (tmp_path / "data.jsonl.dvc").write_text("outs:\n- md5: abc123\n  path: data.jsonl\n")
    assert tracking.dvc_version(data, tmp_path / "nolock") == "abc123"
    lock = tmp_path / "dvc.lock"
    lock.write_text(f"schema: '2.0'\nstages:\n  s:\n    cmd: x\n    outs:\n    - path: {data}\n      md5: fromlock\n")
    assert tracking.dvc_version(data, lock) == "fromlock"
    assert tracking.dvc_version(tmp_path / "missing", lock) == ""


def test_parent_and_child_runs(tracking_cfg, tmp_path):
    import mlflow

    data = tmp_path / "problems.jsonl"
    data.write_text('{"task_id": "x"}\n')
    cfg = PrepareConfig(seed=3)
    with tracking.pipeline_run(tracking_cfg) as parent_id:
        assert os.environ[tracking.PARENT_ENV] == parent_id
        # what a stage process does (it inherits DIDPO_PARENT_RUN_ID); emulate it in-process
        active = mlflow.active_run()
        mlflow.end_run()  # a stage runs in its own process, where no run is active yet
        with tracking.stage_run("prepare", tracking_cfg, cfg, inputs=(str(data),)) as run:
            tracking.mlflow_emit({"prepare/n_problems": 42, "baseline/val/pass@16": 0.25}, step=0)
            child_id = run.info.run_id
        mlflow.start_run(run_id=active.info.run_id)
    assert tracking.PARENT_ENV not in os.environ

    client = mlflow.MlflowClient()
    child = client.get_run(child_id)
    assert child.data.tags["mlflow.parentRunId"] == parent_id
    assert child.data.tags["didpo.stage"] == "prepare"
    assert child.data.tags["mlflow.source.git.commit"] and child.data.tags["mlflow.source.type"] == "LOCAL"
    assert child.data.tags["mlflow.source.name"] == "didpo stage prepare"
    assert child.data.tags["didpo.git_dirty"] in ("true", "false")
    experiment = client.get_experiment(child.info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"  # the UI's "Machine learning" view
    assert child.data.params["prepare.seed"] == "3"
    assert child.data.metrics["prepare/n_problems"] == 42
    assert child.data.metrics["baseline/val/pass_at_16"] == 0.25  # MLflow refuses "@" in names
    inputs = child.inputs.dataset_inputs
    assert [i.dataset.digest for i in inputs] == [hashlib.md5(data.read_bytes()).hexdigest()]
    assert client.get_run(parent_id).info.status == "FINISHED"


def test_failing_stage_marks_run_failed(tracking_cfg):
    import mlflow

    with pytest.raises(RuntimeError), tracking.stage_run("gate", tracking_cfg) as run:
        raise RuntimeError("gate failed")
    assert mlflow.MlflowClient().get_run(run.info.run_id).info.status == "FAILED"


def test_env_tracking_uri_wins(tracking_cfg, tmp_path, monkeypatch):
    other = f"sqlite:///{tmp_path}/other.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", other)
    assert tracking.configure(tracking_cfg) == other


def test_a_run_rewriting_its_own_outputs_leaves_the_commit_clean(tmp_path, monkeypatch):
    """A run rewrites dvc.lock and cache-less metrics, `make screenshots` its PNGs (tracked in git): that must not
    mark the commit dirty, while an edited source file must."""
    import subprocess

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  s:\n    cmd: x\n    outs:\n      - data/out.json:\n          cache: false\n"
        "    metrics:\n      - data/m.json\n"
    )
    (tmp_path / "data").mkdir()
    (tmp_path / "docs/screenshots").mkdir(parents=True)
    for name in ("dvc.lock", "data/out.json", "data/m.json", "code.py", "docs/screenshots/mlflow_experiment.png"):
        (tmp_path / name).write_text("v1\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.email=a@b", "-c", "user.name=t", "commit", "-qm", "init")
    monkeypatch.chdir(tmp_path)
    assert tracking.pipeline_outputs() == ["dvc.lock", "docs/screenshots", "data/out.json", "data/m.json"]
    for name in ("dvc.lock", "data/out.json", "data/m.json", "docs/screenshots/mlflow_experiment.png"):
        (tmp_path / name).write_text("v2\n")
    sha, dirty = tracking.git_commit()
    assert len(sha) == 40 and dirty is False
    (tmp_path / "code.py").write_text("v2\n")
    assert tracking.git_commit() == (sha, True)


def test_a_resumed_training_stage_continues_its_mlflow_run(tracking_cfg, tmp_path):
    """Issue 19: a resumed SFT opened a second MLflow run, splitting its loss curve. The interrupted attempt's run
    is continued when training resumes from a checkpoint; a finished stage's next attempt is a new run."""
    import mlflow

    ckpts = tmp_path / "checkpoints"
    with pytest.raises(KeyboardInterrupt), tracking.stage_run("sft", tracking_cfg, resume_dir=ckpts) as run:
        first = run.info.run_id
        tracking.mlflow_emit({"sft/loss": 2.0}, step=10)
        (ckpts / "checkpoint-00000010").mkdir()  # what the loop saved before the Ctrl-C
        raise KeyboardInterrupt
    assert (ckpts / tracking.RUN_ID_FILE).read_text().strip() == first
    with tracking.stage_run("sft", tracking_cfg, resume_dir=ckpts) as run:
        assert run.info.run_id == first
        tracking.mlflow_emit({"sft/loss": 1.0}, step=20)
    client = mlflow.MlflowClient()
    history = client.get_metric_history(first, "sft/loss")
    assert [(m.step, m.value) for m in history] == [(10, 2.0), (20, 1.0)]  # one curve
    assert client.get_run(first).info.status == "FINISHED"
    assert client.get_run(first).data.tags["didpo.resumed"] == "true"
    assert not (ckpts / tracking.RUN_ID_FILE).exists()
    with tracking.stage_run("sft", tracking_cfg, resume_dir=ckpts) as run:  # finished before: a new run
        assert run.info.run_id != first
    # an interrupted attempt that saved no checkpoint starts over, so its run is not continued either
    empty = tmp_path / "empty"
    with pytest.raises(KeyboardInterrupt), tracking.stage_run("dpo", tracking_cfg, resume_dir=empty) as run:
        interrupted = run.info.run_id
        raise KeyboardInterrupt
    with tracking.stage_run("dpo", tracking_cfg, resume_dir=empty) as run:
        assert run.info.run_id != interrupted


def test_run_names_tell_runs_apart_by_stage_algorithm_and_commit(tracking_cfg, tmp_path):
    """Issue 44: four runs named "evaluate" and four "didpo" side by side could not be told apart. A run is named
    `<stage> · <algorithm> · <short commit>` (-dirty when the source differs from the commit) and tagged with its
    algorithm; the RL stage's algorithm comes from its params section."""
    import subprocess

    import mlflow

    from models.config import RLConfig

    sha = "8fc972a" + "0" * 33
    assert tracking.run_name("didpo", "rft", (sha, False)) == "didpo · rft · 8fc972a"
    assert tracking.run_name("evaluate", "grpo", (sha, True)) == "evaluate · grpo · 8fc972a-dirty"
    assert tracking.run_name("sft", None, (sha, False)) == "sft · 8fc972a"
    assert tracking.run_name("prepare", None, ("unknown", False)) == "prepare"  # outside a git work tree

    def git(*args):
        return subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True).stdout

    (tmp_path / "code.py").write_text("v1\n")
    git("init", "-q")
    git("add", "code.py")
    git("-c", "user.email=a@b", "-c", "user.name=t", "commit", "-qm", "init")
    short = git("rev-parse", "--short=7", "HEAD").strip()
    with tracking.pipeline_run(tracking_cfg, algo="dapo") as parent_id:
        pass
    client = mlflow.MlflowClient()  # of the store pipeline_run configured
    assert client.get_run(parent_id).info.run_name == f"pipeline · dapo · {short}"
    with tracking.stage_run("didpo", tracking_cfg, RLConfig(algo="grpo")) as run:
        rl = run.info.run_id
    with tracking.stage_run("evaluate", tracking_cfg, algo="grpo") as run:
        evaluate = run.info.run_id
    (tmp_path / "code.py").write_text("v2\n")  # an edited source file: the commit is not what ran
    with tracking.stage_run("sft", tracking_cfg) as run:
        sft = run.info.run_id
    names = {run_id: client.get_run(run_id).info.run_name for run_id in (rl, evaluate, sft)}
    assert names == {rl: f"didpo · grpo · {short}", evaluate: f"evaluate · grpo · {short}", sft: f"sft · {short}-dirty"}
    assert client.get_run(rl).data.tags["didpo.algo"] == "grpo" and "didpo.algo" not in client.get_run(sft).data.tags
