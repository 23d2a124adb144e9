"""The umbrella flow's view of dvc.yaml: dependency order, ties in file order, cycles rejected."""

import graphlib
from pathlib import Path

import pytest

from flows.pipeline import stage_order

ROOT = Path(__file__).resolve().parents[1]


def write(tmp_path, text):
    path = tmp_path / "dvc.yaml"
    path.write_text(text)
    return path


def test_order_follows_outs_to_deps_not_file_order(tmp_path):
    path = write(
        tmp_path,
        """
stages:
  train:
    cmd: x
    deps: [data/prepared/problems.jsonl, data/base]
    outs: [data/model]
  prepare:
    cmd: x
    outs: [data/prepared/problems.jsonl]
  base:
    cmd: x
    outs: [data/base]
  report:
    cmd: x
    deps: [data/model/metrics.json]
    metrics: [{data/report.json: {cache: false}}]
""",
    )
    assert stage_order(path) == ["prepare", "base", "train", "report"]


def test_cycle_is_rejected(tmp_path):
    path = write(
        tmp_path,
        """
stages:
  a: {cmd: x, deps: [b.txt], outs: [a.txt]}
  b: {cmd: x, deps: [a.txt], outs: [b.txt]}
""",
    )
    with pytest.raises(graphlib.CycleError):
        stage_order(path)


def test_repo_graph_is_ordered_and_every_stage_has_a_flow():
    from flows.cli import STAGES

    order = stage_order(ROOT / "dvc.yaml")
    assert order == [s for s in STAGES if s in order]  # the CLI lists the graph's stages in graph order
    import yaml

    for name, spec in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"].items():
        assert spec["cmd"] == f"didpo stage {name}"
        assert f"flows/{name}.py" in spec["deps"]  # its own source file is a dependency


def test_params_templating_in_deps_is_resolved(tmp_path):
    (tmp_path / "params.yaml").write_text("validate:\n  feedback_logs: data/sim/logs.jsonl\n")
    path = write(
        tmp_path,
        """
stages:
  validate:
    cmd: x
    deps:
      - ${validate.feedback_logs}
    outs: [data/valid]
  simulate:
    cmd: x
    outs: [data/sim/logs.jsonl]
""",
    )
    assert stage_order(path) == ["simulate", "validate"]


def test_progress_line_and_the_eta_from_the_last_timings(tmp_path, monkeypatch):
    from flows import pipeline

    monkeypatch.chdir(tmp_path)
    assert pipeline.read_stage_seconds() == {}
    order = ["prepare", "sft", "gate"]
    assert pipeline.progress_line(1, order, 0.0, {}) == "stage 1/3: prepare (elapsed 0 min 00 s, ETA ?)"
    pipeline.record_stage_seconds("prepare", 61.04)
    pipeline.record_stage_seconds("sft", 3725.0)
    pipeline.record_stage_seconds("gate", 189.0)
    pipeline.record_stage_seconds("prepare", 59.0)  # the latest run of a stage replaces its figure
    timings = pipeline.read_stage_seconds()
    assert timings == {"prepare": 59.0, "sft": 3725.0, "gate": 189.0}
    # before sft: sft + gate remain = 3914 s
    assert pipeline.progress_line(2, order, 59.4, timings) == "stage 2/3: sft (elapsed 0 min 59 s, ETA 1 h 05 min)"
    assert pipeline.progress_line(3, order, 3800, timings) == "stage 3/3: gate (elapsed 1 h 03 min, ETA 3 min 09 s)"
    pipeline.TIMINGS.write_text("not json")
    assert pipeline.read_stage_seconds() == {}  # an unreadable file means no ETA, not a crash
