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


def test_ui_prints_both_uis():
    result = runner.invoke(app, ["ui"])
    assert result.exit_code == 0
    assert "mlflow ui --backend-store-uri" in result.output and "prefect server start" in result.output
