"""The umbrella flow's view of dvc.yaml, which is DVC's own: dependency order, templating, cycles rejected."""

from pathlib import Path

import pytest

from flows.pipeline import stage_order

ROOT = Path(__file__).resolve().parents[1]


def write(tmp_path, text):
    """A DVC project (no git) at `tmp_path` with this dvc.yaml; returns its root. (What ``dvc init --no-scm`` writes,
    without DVC's logger, which holds on to the stream of the first test that configured it.)"""
    (tmp_path / ".dvc").mkdir()
    (tmp_path / ".dvc" / "config").write_text("[core]\n    no_scm = True\n")
    (tmp_path / "dvc.yaml").write_text(text)
    return tmp_path


def _after_its_upstream(order: list[str], upstream: dict[str, list[str]]) -> bool:
    return all(order.index(u) < order.index(stage) for stage, ups in upstream.items() for u in ups)


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
    order = stage_order(path)
    assert sorted(order) == ["base", "prepare", "report", "train"] and order[-2:] == ["train", "report"]
    assert _after_its_upstream(order, {"train": ["prepare", "base"], "report": ["train"]})


def test_cycle_is_rejected(tmp_path):
    path = write(
        tmp_path,
        """
stages:
  a: {cmd: x, deps: [b.txt], outs: [a.txt]}
  b: {cmd: x, deps: [a.txt], outs: [b.txt]}
""",
    )
    from dvc.exceptions import CyclicGraphError

    with pytest.raises(CyclicGraphError):
        stage_order(path)


def test_repo_graph_is_ordered_and_every_stage_has_a_flow():
    import yaml

    order = stage_order(ROOT)
    assert order == [
        "base_model",
        "prepare",
        "simulate_logs",
        "validate",
        "mine",
        "baseline",
        "sft",
        "gate",
        "selfplay",
        "dpo",
        "didpo",
        "evaluate",
        "register",
    ]

    for name, spec in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"].items():
        assert spec["cmd"] == f"didpo stage {name}"
        assert f"tasks/{name}.py" in spec["deps"]  # its work is a dependency; its flow (wiring) is not
        assert f"flows/{name}.py" not in spec["deps"]
        assert (ROOT / "flows" / f"{name}.py").read_text().count("\ndef run(") == 1


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
    assert stage_order(path) == ["simulate", "validate"]  # DVC resolved ${validate.feedback_logs}


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
    # DVC found only gate out of date (a restored clone): the ETA is gate's alone until gate, nothing after it
    assert (
        pipeline.progress_line(1, order, 0.0, timings, {"gate"})
        == "stage 1/3: prepare (elapsed 0 min 00 s, ETA 3 min 09 s)"
    )
    # sft out of date (`out_of_date` adds gate, which depends on it): not prepare before it
    assert pipeline.progress_line(1, order, 0.0, timings, {"sft", "gate"}).endswith("ETA 1 h 05 min)")
    # the quick path: sft and gate restored, prepare and a later stage out of date: 59 s + 189 s, not sft's hour
    assert pipeline.progress_line(1, order, 0.0, timings, {"prepare", "gate"}).endswith("ETA 4 min 08 s)")
    assert pipeline.progress_line(1, order, 0.0, timings, set()).endswith("ETA 0 min 00 s)")  # all up to date
    # a fresh clone: stages never run here take the committed run's figures, and the line says so
    reference = {"prepare": 16.6, "sft": 5148.9, "gate": 569.2}
    assert (
        pipeline.progress_line(1, order, 0.0, {}, None, reference)
        == "stage 1/3: prepare (elapsed 0 min 00 s, ETA 1 h 35 min, committed run's timings)"
    )  # 5734.7 s
    mixed = pipeline.progress_line(1, order, 0.0, {"prepare": 59.0, "sft": 3725.0}, None, reference)
    assert mixed.endswith("ETA 1 h 12 min, committed run's timings)")  # 59 + 3725 here + gate's 569.2 borrowed: 4353 s
    assert pipeline.progress_line(2, order, 59.4, timings, None, reference).endswith("ETA 1 h 05 min)")  # all here
    assert pipeline.progress_line(1, order, 0.0, {}, None, {"prepare": 1.0}).endswith("ETA ?)")  # sft has no figure
    assert set(pipeline.read_stage_seconds(ROOT / pipeline.REFERENCE_TIMINGS)) == set(stage_order(ROOT))
    pipeline.TIMINGS.write_text("not json")
    assert pipeline.read_stage_seconds() == {}  # an unreadable file means no ETA, not a crash


def test_out_of_date_is_what_dvc_status_finds_changed(tmp_path):
    """A real DVC project (no git): after `dvc repro` nothing is out of date; a changed dependency puts its stage
    back with every stage downstream of it in DVC's graph, and not a stage beside it; no DVC project means every
    stage."""
    import os
    import subprocess
    import sys

    from flows.pipeline import out_of_date

    dvc = str(Path(sys.executable).parent / "dvc")
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    assert out_of_date(["a", "b"], tmp_path) == {"a", "b"}  # not a DVC project: DVC cannot tell
    subprocess.run([dvc, "init", "-q", "--no-scm"], cwd=tmp_path, check=True, env=env)
    (tmp_path / "in.txt").write_text("1\n")
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  a:\n    cmd: cp in.txt a.txt\n    deps: [in.txt]\n    outs: [a.txt]\n"
        "  b:\n    cmd: cp a.txt b.txt\n    deps: [a.txt]\n    outs: [b.txt]\n"
        "  c:\n    cmd: cp in.txt c.txt\n    deps: [in.txt]\n    outs: [c.txt]\n"
        "  d:\n    cmd: cp b.txt d.txt\n    deps: [b.txt]\n    outs: [d.txt]\n"
    )
    assert out_of_date(["a", "b", "c", "d"], tmp_path) == {"a", "b", "c", "d"}  # never run
    subprocess.run([dvc, "repro", "-q"], cwd=tmp_path, check=True, env=env)
    assert out_of_date(["a", "b", "c", "d"], tmp_path) == set()
    (tmp_path / "a.txt").write_text("changed\n")  # a's output edited: a is changed, b and d run after it, c does not
    assert out_of_date(["a", "b", "c", "d"], tmp_path) == {"a", "b", "d"}
    assert out_of_date(["c"], tmp_path) == set()  # only the stages asked about


def test_dvc_git_and_push_hints_are_dropped_and_everything_else_kept(tmp_path):
    """The real ``dvc repro`` output of a git-tracked DVC project (DVC prints its hints there) through
    `without_dvc_hints`: the hints are gone; every other line, the stage's own tab-indented output included, is kept in
    order."""
    import os
    import subprocess
    import sys

    from flows.pipeline import DVC_HINT_HEADINGS, DVC_PUSH_HINT, DVC_UP_TO_DATE, without_dvc_hints

    dvc = str(Path(sys.executable).parent / "dvc")
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "DVC_NO_ANALYTICS": "1",
    }
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True, env=env)
    subprocess.run([dvc, "init", "-q"], cwd=tmp_path, check=True, env=env)
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  make:\n"
        "    cmd: printf 'made\\n\\tindented by the stage\\n' && echo 1 > out.txt\n"
        "    outs: [out.txt]\n"
    )
    raw = subprocess.run(
        [dvc, "repro", "--single-item", "make"], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    ).stdout
    assert all(h in raw for h in DVC_HINT_HEADINGS) and DVC_PUSH_HINT in raw  # what DVC prints today

    kept = "".join(without_dvc_hints(raw.splitlines(keepends=True)))
    assert "git add" not in kept and "autostage" not in kept and "dvc push" not in kept
    assert "Running stage 'make'" in kept and "made\n\tindented by the stage\n" in kept
    lines = raw.splitlines(keepends=True)
    dropped = [line for line in lines if line.strip()]
    kept_lines = [line for line in kept.splitlines(keepends=True) if line.strip()]
    assert kept_lines == [line for line in dropped if line in kept_lines]  # a subsequence: order kept
    assert len(dropped) - len(kept_lines) == 5  # 2 headings, `git add …`, `dvc config core.autostage true`, push
    assert "\n\n\n" not in kept  # the blank lines around a hint go with it

    again = subprocess.run(
        [dvc, "repro", "--single-item", "make"], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    ).stdout
    assert DVC_UP_TO_DATE in again  # DVC says it twice for a skipped stage
    kept = "".join(without_dvc_hints(again.splitlines(keepends=True)))
    assert "Stage 'make' didn't change, skipping" in kept and DVC_UP_TO_DATE not in kept


def test_dvc_cli_drops_the_empty_warning_of_the_optional_human_pairs_only(tmp_path):
    """`flows.dvc_cli` (what `repro_stage` runs) is dvc itself: a real ``repro`` of a stage whose inputs are the empty
    ``validate.human_pairs`` and another empty file, and whose output is empty: dvc warns for the other two, not for
    the human pairs (issue 19: seven such lines a run)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    subprocess.run([sys.executable, "-m", "flows.dvc_cli", "init", "-q", "--no-scm"], cwd=tmp_path, check=True, env=env)
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw/pairs.jsonl").write_text("")
    (tmp_path / "notes.txt").write_text("")
    (tmp_path / "params.yaml").write_text("validate:\n  human_pairs: raw/pairs.jsonl\n")
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  copy:\n    cmd: cp raw/pairs.jsonl out.txt\n"
        "    deps: [raw/pairs.jsonl, notes.txt]\n    outs: [out.txt]\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "flows.dvc_cli", "repro", "--single-item", "copy"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "Running stage 'copy'" in done.stdout and (tmp_path / "dvc.lock").is_file()
    assert "'notes.txt' is empty." in done.stderr and "'out.txt' is empty." in done.stderr, done.stderr
    assert "raw/pairs.jsonl' is empty" not in done.stderr, done.stderr


def test_headline_metrics_are_the_stages_dvc_metrics(tmp_path):
    """The pipeline run's result metrics: each stage's headline figures as ``<stage>/<key>``, evaluate's folder as
    ``evaluate/<checkpoint>/<key>``, booleans 0/1, text left out, ``@`` made MLflow-legal; a stage not asked for or
    never run gives none."""
    import json

    from flows.pipeline import headline_metrics

    (tmp_path / "dvc.yaml").write_text(
        "stages:\n"
        "  sft:\n    cmd: x\n    metrics:\n      - data/sft/headline.json:\n          cache: false\n"
        "  evaluate:\n    cmd: x\n    metrics:\n      - data/evaluate/headline:\n          cache: false\n"
        "  register:\n    cmd: x\n    metrics:\n      - data/register/headline.json:\n          cache: false\n"
        "  dpo:\n    cmd: x\n    metrics:\n      - data/dpo/headline.json\n"
    )
    for path, figures in {
        "data/sft/headline.json": {"eval_loss": 0.0166, "step": 240},
        "data/evaluate/headline/base.json": {"val.pass@1": 0.0},
        "data/evaluate/headline/dpo.json": {"val.pass@1": 0.412, "humaneval.pass@1": 0.037},
        "data/register/headline.json": {"checkpoint": "dpo", "promoted": False, "version": 2},
    }.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(json.dumps(figures))
    assert headline_metrics(["sft", "evaluate", "register", "dpo"], tmp_path) == {
        "sft/eval_loss": 0.0166,
        "sft/step": 240.0,
        "evaluate/base/val.pass_at_1": 0.0,
        "evaluate/dpo/val.pass_at_1": 0.412,
        "evaluate/dpo/humaneval.pass_at_1": 0.037,
        "register/promoted": 0.0,
        "register/version": 2.0,
    }  # dpo never ran: no headline file
    assert headline_metrics(["sft"], tmp_path) == {"sft/eval_loss": 0.0166, "sft/step": 240.0}
