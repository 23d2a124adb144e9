"""The didpo CLI: readable errors and exit codes before any flow starts."""

import os

import pytest
from typer.testing import CliRunner

from flows.cli import app

runner = CliRunner()


def test_unknown_stage_lists_the_stages():
    result = runner.invoke(app, ["stage", "nosuch"])
    assert result.exit_code == 2
    assert "unknown stage 'nosuch'; stages: base_model, prepare" in result.output


def test_bad_params_name_the_key(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("prepare:\n  n_problems: 5\n")
    result = runner.invoke(app, ["stage", "prepare", "--params", str(params)])
    assert result.exit_code == 2
    assert "prepare.n_problems must be >= 100, got 5" in result.output


def test_a_missing_params_file_is_refused_not_defaulted(tmp_path):
    missing = tmp_path / "parms.yaml"
    result = runner.invoke(app, ["stage", "prepare", "--params", str(missing)])
    assert result.exit_code == 2
    assert f"{missing}: no such params file" in result.output


def test_run_has_no_params_option_and_refuses_unknown_stages():
    """`didpo run` runs the DVC stages, which read ./params.yaml: an option for another file was only ever refused
    (issue 44), so there is none; unknown stage names are listed against the known ones."""
    result = runner.invoke(app, ["run", "--params", "other.yaml"])
    assert result.exit_code == 2 and "No such option: --params" in result.output
    assert "--params" not in runner.invoke(app, ["run", "--help"]).output
    result = runner.invoke(app, ["run", "--stages", "sfft,prepare"])
    assert result.exit_code == 2
    assert "unknown stage(s) sfft; stages: base_model, prepare" in result.output


def test_help_is_plain_text_lists_the_stages_and_shows_the_version():
    """Issue 44's CLI conventions: no RST markup or rich boxes, no type after a flag, the stage names in
    `stage --help` (and `run --help`), `--version`."""
    from importlib.metadata import version

    from flows.cli import stage_names

    names = stage_names()
    assert names[:3] == ["base_model", "prepare", "simulate_logs"] and names[-1] == "register" and len(names) == 13
    for args in ([], ["run"], ["stage"], ["serve"], ["deploy"], ["team"], ["rollback"], ["plots"], ["ui"]):
        result = runner.invoke(app, [*args, "--help"])
        assert result.exit_code == 0, args
        for markup in ("``", "<bool>", "╭", "│"):
            assert markup not in result.output, (args, markup)
    stage_help = " ".join(runner.invoke(app, ["stage", "--help"]).output.split())
    assert f"The stage to run: {', '.join(names)}." in stage_help
    assert ", ".join(names) in " ".join(runner.invoke(app, ["run", "--help"]).output.split())
    top = runner.invoke(app, ["--help"]).output
    assert "run       Run the whole pipeline, or --stages of it." in top
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output == f"didpo {version('didpo-pipeline')}\n"


def test_plots_refuses_an_unknown_revision_in_one_line():
    """`didpo plots <bad revision>` printed a 25-line traceback (issue 44): now one line naming it, exit 2."""
    from flows.plots import unknown_revisions

    assert unknown_revisions(["HEAD", "workspace", "no-such-rev", "--all"]) == ["no-such-rev", "--all"]
    result = runner.invoke(app, ["plots", "HEAD", "no-such-rev"])
    assert result.exit_code == 2
    assert result.output == (
        "not a git revision here: no-such-rev (a commit, branch or tag: git log --oneline; workspace: the files as "
        "they are)\n"
    )


def test_outside_a_dvc_project_or_with_a_params_yaml_dvc_yaml_cannot_resolve(tmp_path, monkeypatch):
    """DVC's own errors are one line: run from another folder, or a params.yaml without a key dvc.yaml names."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["stage", "prepare"])
    assert result.exit_code == 2
    assert result.output.startswith("dvc.yaml: you are not inside of a DVC repository")
    assert result.output.endswith("(run didpo from the project root)\n") and result.output.count("\n") == 1
    shutil.copy(Path(__file__).resolve().parents[1] / "dvc.yaml", tmp_path / "dvc.yaml")
    subprocess.run([sys.executable, "-m", "flows.dvc_cli", "init", "-q", "--no-scm"], cwd=tmp_path, check=True)
    (tmp_path / "params.yaml").write_text("prepare:\n  seed: 1\n")  # valid for didpo, not for dvc.yaml's ${...}
    result = runner.invoke(app, ["run"])
    assert result.exit_code == 2
    assert "Could not find 'validate.feedback_logs'" in result.output and result.output.count("\n") == 1


def test_ui_refuses_a_taken_port_and_names_a_team_server(monkeypatch, tmp_path):
    """`didpo ui` stops before starting anything when a port is taken (saying which option moves it), and prints a
    team's MLflow server instead of serving it again."""
    import socket

    monkeypatch.chdir(tmp_path)  # where a started server's log would go (.cache/ui/)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / ".prefect"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = runner.invoke(app, ["ui", "--mlflow-port", str(port)])
    assert result.exit_code == 1
    assert f"MLflow: port {port} is in use (another `didpo ui`?): --mlflow-port N" in result.output
    assert not (tmp_path / ".cache/ui").exists()  # nothing was started
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://mlflow.team.example")
    monkeypatch.setenv("PREFECT_API_URL", "https://prefect.team.example/api")
    result = runner.invoke(app, ["ui"])  # nothing local left to serve
    assert result.exit_code == 0
    assert "MLflow: https://mlflow.team.example (your tracking server)" in result.output
    assert "Prefect: https://prefect.team.example/api (your Prefect API" in result.output


def test_flow_run_links_point_at_the_ui_that_serves_the_runs_database(monkeypatch, tmp_path):
    """A run's own Prefect API is temporary; its "View at" links go to `didpo ui`'s server (same PREFECT_HOME), and a
    team's API (PREFECT_API_URL set) keeps Prefect's own links."""
    import uuid

    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.utilities.urls import url_for

    from flows.env import PREFECT_UI, setup_environment

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / ".prefect"))  # restored afterwards, as the two below
    monkeypatch.delenv("PREFECT_UI_URL", raising=False)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    setup_environment(tmp_path)
    assert PREFECT_UI == "http://127.0.0.1:4200"
    run_id = str(uuid.uuid4())
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:8230/api"}):  # the temporary server of a run
        assert url_for("flow-run", obj_id=run_id) == f"{PREFECT_UI}/runs/flow-run/{run_id}"
    monkeypatch.delenv("PREFECT_UI_URL")
    monkeypatch.setenv("PREFECT_API_URL", "https://prefect.team.example/api")
    setup_environment(tmp_path)
    assert "PREFECT_UI_URL" not in os.environ


def test_library_info_lines_are_quiet_and_prefect_keeps_its_server_line():
    """`flows.env.quiet_library_logs`: MLflow's system-metrics and table-creation lines and GX's temporary-folder line
    are below the loggers' level (their warnings are not); Prefect's temporary-server line loses its docs link only.
    tests/test_integration.py checks a real `didpo run` prints none of them."""
    import logging

    from flows.env import QUIET_LOGGERS, WithoutServerDocs, quiet_library_logs

    quiet_library_logs()
    quiet_library_logs()
    for name in QUIET_LOGGERS:
        logger = logging.getLogger(name + ".child")
        assert not logger.isEnabledFor(logging.INFO) and logger.isEnabledFor(logging.WARNING), name
    assert sum(isinstance(f, WithoutServerDocs) for f in logging.getLogger("prefect").filters) == 1
    import great_expectations.data_context.types.base as gx_base  # sets its own logger to INFO when first imported

    info = gx_base.logger.makeRecord(
        gx_base.logger.name, logging.INFO, __file__, 1, "Created temporary directory", (), None
    )
    assert not gx_base.logger.filter(info)
    assert gx_base.logger.filter(logging.LogRecord(gx_base.logger.name, logging.WARNING, __file__, 1, "w", None, None))
    message = (
        "Starting temporary server on http://127.0.0.1:8077\nSee https://www.prefect.io/docs/v3/concepts/server"
        "#how-to-guides for more information on running a dedicated Prefect server."
    )
    record = logging.LogRecord("prefect", logging.INFO, __file__, 1, message, None, None)
    assert WithoutServerDocs().filter(record)
    assert record.getMessage() == "Starting temporary server on http://127.0.0.1:8077"


@pytest.mark.slow
def test_ui_serves_both_uis_until_ctrl_c(tmp_path):
    """`didpo ui` as a person runs it: both servers answer at the addresses it prints, and Ctrl-C stops them (exit 0,
    both ports closed, no process of either server left, a second Ctrl-C during the stop included)."""
    import signal
    import subprocess
    import sys
    import time
    import urllib.request
    from pathlib import Path

    from flows.ui import free_port, port_in_use

    mlflow_port = prefect_port = free_port()
    while prefect_port == mlflow_port:  # each call may hand out the port the last one closed
        prefect_port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_UI_URL")}
    env |= {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", "PREFECT_HOME": str(tmp_path / ".prefect")}
    didpo = Path(sys.executable).parent / "didpo"
    command = [str(didpo), "ui", "--mlflow-port", str(mlflow_port), "--prefect-port", str(prefect_port)]
    log = tmp_path / "ui.log"
    with log.open("w") as out:
        proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while "Ctrl-C stops the UIs." not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(1)
        text = log.read_text()
        assert f"MLflow: http://127.0.0.1:{mlflow_port}/#/experiments?workflowType=machine_learning" in text
        assert f"Prefect: http://127.0.0.1:{prefect_port}  (flow runs" in text
        assert 'the runs\' "View at" links say http://127.0.0.1:4200' in text  # not the default port here
        for url in (f"http://127.0.0.1:{mlflow_port}/health", f"http://127.0.0.1:{prefect_port}/api/health"):
            with urllib.request.urlopen(url, timeout=10) as response:
                assert response.status == 200
        leaders = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert len(leaders) == 2, leaders  # each server leads its own session (a terminal's Ctrl-C reaches didpo only)
        groups = ",".join(leaders)
        servers = subprocess.run(["pgrep", "-g", groups], capture_output=True, text=True).stdout.split()
        assert len(servers) > 2, servers  # MLflow's UI runs worker processes of its own
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)  # an impatient second Ctrl-C while the servers stop: the stop still finishes
        assert proc.wait(timeout=60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert log.read_text().rstrip().endswith("UIs stopped.")
    assert not port_in_use(mlflow_port) and not port_in_use(prefect_port)
    left = subprocess.run(["pgrep", "-g", groups], capture_output=True, text=True).stdout.split()
    assert not left, f"server processes left: {left}"


def test_deploy_needs_a_prefect_server_and_team_a_free_port(monkeypatch):
    """`didpo deploy` without PREFECT_API_URL says what to set (exit 2); `didpo team` on a taken port names the option
    (exit 1) before starting anything."""
    import socket

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    result = runner.invoke(app, ["deploy", "--pool", "gpu"])
    assert result.exit_code == 2 and "PREFECT_API_URL is not set" in result.output
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        from flows.ui import free_port

        result = runner.invoke(app, ["team", "--mlflow-port", str(free_port()), "--prefect-port", str(port)])
    assert result.exit_code == 1 and f"prefect: port {port} is in use: --prefect-port N" in result.output


def test_run_set_writes_params_as_dvc_exp_run_and_refuses_bad_settings_untouched(tmp_path, capsys):
    """`didpo run --set`: the values land in params.yaml with its comments and other keys as they were (DVC's own
    writer, as `dvc exp run -S`); an unknown key, a value out of range or a missing file named by a setting is one
    line naming the key, exit status 2, and the file is byte for byte what it was."""
    import shutil
    from pathlib import Path

    import typer
    import yaml

    from flows.cli import _apply_settings

    params = tmp_path / "params.yaml"
    shutil.copyfile(Path("params.yaml"), params)
    before = params.read_text()
    _apply_settings(params, ["dpo.max_steps=3", "evaluate.checkpoints=[dpo,didpo]"], ["dpo", "evaluate"])
    after = params.read_text()
    loaded, original = yaml.safe_load(after), yaml.safe_load(before)
    assert loaded["dpo"]["max_steps"] == 3 and loaded["evaluate"]["checkpoints"] == ["dpo", "didpo"]
    loaded["dpo"]["max_steps"], loaded["evaluate"]["checkpoints"] = (
        original["dpo"]["max_steps"],
        original["evaluate"]["checkpoints"],
    )
    assert loaded == original  # nothing else changed
    assert "max_steps: 3              # the embedded CPU budget" in after  # comments kept (lists go block style)

    shutil.copyfile(Path("params.yaml"), params)
    for setting, says in (
        ("dpo.max_stepz=3", "Could not override 'dpo.max_stepz'"),
        ("dpo.max_steps=-3", "dpo.max_steps must be >= 0, got -3"),
        ("dpo.max_steps", "Error parsing override 'dpo.max_steps'"),
        ("validate.feedback_logs=nope.jsonl", "validate.feedback_logs: nope.jsonl does not exist"),
    ):
        with pytest.raises(typer.Exit) as stop:
            _apply_settings(params, [setting], ["validate", "dpo"])
        assert stop.value.exit_code == 2 and says in capsys.readouterr().err
        assert params.read_text() == before, setting
    result = runner.invoke(app, ["run", "--set", "dpo.max_stepz=3"])
    assert result.exit_code == 2
    assert "params.yaml with --set dpo.max_stepz=3: Could not override 'dpo.max_stepz'" in result.output


def test_the_quick_paths_settings_are_valid_params(tmp_path):
    """The Makefile's `QUICK` overrides, applied to a copy of params.yaml as `didpo run --set` applies them, give
    settings the configuration accepts (a typo or an out-of-range value would stop `make quick` after its set-up and
    data stages), with the budgets the README names: one self-play prompt, one DPO update without warm-up, one RL step,
    2 answers per evaluation problem on the base model and the RL policy, and the full token budgets but DPO's smoke
    check's."""
    import re
    import shutil
    from pathlib import Path

    import yaml
    from dvc.utils.hydra import apply_overrides

    from tasks.config import parse_params

    root = Path(__file__).resolve().parents[1]
    text = (root / "Makefile").read_text()
    quick = re.search(r"^QUICK := (.*?)(?<!\\)\n", text, re.S | re.M).group(1)
    overrides = re.findall(r"--set '?([^\s']+)'?", quick)
    assert len(overrides) == len(re.findall(r"--set", quick)) >= 10
    trial = tmp_path / "params.yaml"
    shutil.copyfile(root / "params.yaml", trial)
    apply_overrides(trial, overrides)
    params = parse_params(yaml.safe_load(trial.read_text()), "QUICK")
    default = parse_params(yaml.safe_load((root / "params.yaml").read_text()), "params.yaml")
    budgets = (params.selfplay.n_prompts, params.dpo.max_steps, params.dpo.warmup_ratio, params.didpo.steps)
    assert budgets == (1, 1, 0, 1)
    assert params.evaluate.n_samples == 2 and params.sft == default.sft and params.gate == default.gate
    assert params.evaluate.checkpoints == ("base", "didpo")  # the decision's incumbent and candidate
    assert params.evaluate.max_new_tokens == default.evaluate.max_new_tokens
    assert params.dpo.max_new_tokens == 128  # DPO's smoke check only; the measured answers keep their budgets


def test_run_large_is_the_budget_curves_arm(tmp_path):
    """`make run-large`'s `LARGE` overrides are settings the configuration accepts and the pre-registered arm of the RL
    budget curve (docs/results/rl_budget/preregistration.md; scripts/rl_budget.py's constants): 94 steps of 16
    rollouts, the policy kept after 6, 31 and 94, 96 problems screened, DPO and RL evaluated at 16 answers."""
    import importlib.util
    import re
    import shutil
    from pathlib import Path

    import yaml
    from dvc.utils.hydra import apply_overrides

    from tasks.config import parse_params

    root = Path(__file__).resolve().parents[1]
    large = re.search(r"^LARGE := (.*?)(?<!\\)\n", (root / "Makefile").read_text(), re.S | re.M).group(1)
    fixed = [o for o in re.findall(r"-S '?([^\s']+)'?", large) if "$(" not in o]  # not the ALGO= one
    overrides = fixed + ["didpo.algo=grpo"]  # what ALGO=grpo adds
    assert len(overrides) == 6
    trial = tmp_path / "params.yaml"
    shutil.copyfile(root / "params.yaml", trial)
    apply_overrides(trial, overrides)
    params = parse_params(yaml.safe_load(trial.read_text()), "LARGE")
    spec = importlib.util.spec_from_file_location("rl_budget", root / "scripts/rl_budget.py")
    rl_budget = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rl_budget)
    rollouts = params.didpo.prompts_per_step * params.didpo.group_size
    assert (params.didpo.steps, rollouts) == (rl_budget.FINAL_STEP, rl_budget.ROLLOUTS_PER_STEP) == (94, 16)
    assert tuple(params.didpo.keep_steps) == (6, 31, 94) and params.didpo.screen_problems == 96
    assert params.evaluate.n_samples == rl_budget.SAMPLES and params.evaluate.checkpoints == ("dpo", "didpo")
    assert params.didpo.algo == "grpo"
