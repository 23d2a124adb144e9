"""The didpo CLI: readable errors and exit codes before any flow starts."""

import os

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
    for args in (["stage", "prepare", "--params", str(params)], ["run", "--params", str(params)]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2
        assert "prepare.n_problems must be >= 100, got 5" in result.output


def test_a_missing_params_file_is_refused_not_defaulted(tmp_path):
    missing = tmp_path / "parms.yaml"
    for args in (["stage", "prepare", "--params", str(missing)], ["run", "--params", str(missing)]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2
        assert f"{missing}: no such params file" in result.output


def test_run_refuses_what_the_dvc_stages_would_ignore(tmp_path):
    other = tmp_path / "other.yaml"
    other.write_text("")  # valid (all defaults), but the DVC stages read ./params.yaml, not this file
    result = runner.invoke(app, ["run", "--params", str(other)])
    assert result.exit_code == 2 and "which read ./params.yaml" in result.output
    result = runner.invoke(app, ["run", "--stages", "sfft,prepare"])
    assert result.exit_code == 2
    assert "unknown stage(s) sfft; stages: base_model, prepare" in result.output


def test_ui_prints_both_uis():
    result = runner.invoke(app, ["ui"])
    assert result.exit_code == 0
    assert "mlflow ui --backend-store-uri" in result.output and "prefect server start" in result.output
    assert "workflowType=machine_learning" in result.output  # MLflow's model-training view, not its GenAI one


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
    assert f'{PREFECT_UI} (the runs\' "View at" links point here)' in runner.invoke(app, ["ui"]).output
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
