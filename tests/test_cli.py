"""The didpo CLI: readable errors and exit codes before any flow starts."""

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
        assert "prepare.n_problems: Input should be greater than or equal to 100 (got 5)" in result.output


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
