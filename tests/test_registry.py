"""Champion/challenger promotion: the pure rule on hand-made metrics, then a real MLflow SQLite registry with a tiny
model logged (versions, aliases, reasons, rollback through `didpo rollback`)."""

import json

import pytest
import yaml

from tasks.registry import Decision, RegisterConfig, final_checkpoint, flatten, promotion_decision

CFG = RegisterConfig(
    model_name="didpo-test",
    primary_metric="val/pass@1",
    margin=0.01,
    tolerance=0.02,
    secondary_metrics=("val/pass@16", "val/format_compliance", "val/unsafe_rate"),
    lower_is_better=("val/unsafe_rate",),
)


def metrics(p1, p16=0.6, fmt=0.9, unsafe=0.0):
    return {"val/pass@1": p1, "val/pass@16": p16, "val/format_compliance": fmt, "val/unsafe_rate": unsafe}


def test_first_version_is_promoted():
    decision = promotion_decision(metrics(0.1), None, CFG)
    assert decision == Decision(True, ["no champion yet: the first version is promoted (val/pass@1 0.1000)"])


def test_a_better_champion_blocks_promotion():
    decision = promotion_decision(metrics(0.30), metrics(0.35), CFG)
    assert not decision.promote
    assert decision.reasons[0] == (
        "val/pass@1: 0.3000 vs champion 0.3500 (-0.0500): does not beat the champion by more than the margin 0.01"
    )
    assert len(decision.reasons) == 4  # the primary and each secondary metric are reported


def test_a_worse_champion_is_replaced():
    decision = promotion_decision(metrics(0.40, p16=0.59, fmt=0.89), metrics(0.35), CFG)
    assert decision.promote
    assert decision.reasons == [
        "val/pass@1: 0.4000 vs champion 0.3500 (+0.0500): beats the champion by more than the margin 0.01",
        "val/pass@16: 0.5900 vs champion 0.6000 (-0.0100): within the tolerance 0.02",
        "val/format_compliance: 0.8900 vs champion 0.9000 (-0.0100): within the tolerance 0.02",
        "val/unsafe_rate: 0.0000 vs champion 0.0000 (+0.0000): within the tolerance 0.02",
    ]


def test_a_secondary_regression_blocks_promotion():
    worse_format = promotion_decision(metrics(0.50, fmt=0.80), metrics(0.35, fmt=0.90), CFG)
    assert not worse_format.promote
    assert worse_format.reasons[2] == (
        "val/format_compliance: 0.8000 vs champion 0.9000 (-0.1000): regression beyond the tolerance 0.02"
    )
    # lower is better for the unsafe rate: a rise of 0.05 is a regression, a fall is not
    assert not promotion_decision(metrics(0.50, unsafe=0.05), metrics(0.35, unsafe=0.0), CFG).promote
    assert promotion_decision(metrics(0.50, unsafe=0.0), metrics(0.35, unsafe=0.05), CFG).promote


def test_margin_is_strict_and_missing_values():
    at_margin = promotion_decision(metrics(0.375), metrics(0.3625), CFG)  # gain 0.0125 > 0.01
    assert at_margin.promote
    assert not promotion_decision(metrics(0.35), metrics(0.35), CFG).promote  # a tie never promotes
    assert not promotion_decision(metrics(0.3125), metrics(0.3125 - 0.0078125), CFG).promote  # gain < margin
    # a champion without the primary metric cannot be beaten; one without a secondary metric skips that check
    assert not promotion_decision(metrics(0.9), {}, CFG).promote
    partial = promotion_decision(metrics(0.5), {"val/pass@1": 0.3}, CFG)
    assert partial.promote and partial.reasons[1] == "val/pass@16: the champion has no recorded value; not compared"
    with pytest.raises(ValueError, match="lack"):
        promotion_decision({"val/pass@1": 0.5}, None, CFG)


def test_config_and_helpers():
    with pytest.raises(ValueError, match="<split>/<key>"):
        RegisterConfig(primary_metric="pass@1")
    with pytest.raises(ValueError, match="also a secondary"):
        RegisterConfig(primary_metric="val/pass@1", secondary_metrics=("val/pass@1",))
    assert final_checkpoint({"sft": "s", "rl": "r", "dpo": "d"}) == ("rl", "r")
    assert final_checkpoint({"sft": "s", "base": "b"}) == ("sft", "s")
    with pytest.raises(FileNotFoundError, match="no trained checkpoint"):
        final_checkpoint({"base": "b"})
    assert flatten({"val": {"pass@1": 0.5, "recovery": None}, "seconds": 3.0}) == {
        "val/pass@1": 0.5,
        "val/recovery": None,
    }


@pytest.fixture()
def registry(tmp_path, monkeypatch):
    """A real MLflow SQLite store in tmp_path, and a tiny model saved as a Hugging Face folder."""
    from models.policy import build_tiny_causal_lm
    from tasks import tracking
    from tasks.config import TrackingConfig

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv(tracking.PARENT_ENV, raising=False)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("DO_NOT_TRACK", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = TrackingConfig(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", experiment="t", artifact_location="art")
    tracking.configure(cfg)
    model, tokenizer = build_tiny_causal_lm(seed=0)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    params = {
        "register": {"model_name": CFG.model_name},
        "tracking": {"tracking_uri": cfg.tracking_uri, "experiment": "t"},
    }
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    return tmp_path, model


def test_registry_promotion_and_rollback(registry):
    import mlflow
    import torch
    from typer.testing import CliRunner

    from flows.cli import app
    from tasks.registry import pip_requirements, register_and_decide

    root, model = registry
    client = mlflow.MlflowClient()

    def register(values):
        with mlflow.start_run():
            return register_and_decide.fn(root / "model", "rl", values, CFG)

    def aliases():
        names = ("champion", "challenger")
        return {a: int(client.get_model_version_by_alias(CFG.model_name, a).version) for a in names}

    first = register(metrics(0.30))
    assert (first.version, first.promoted, first.champion_before, first.champion_after) == (1, True, None, 1)
    assert aliases() == {"champion": 1, "challenger": 1}

    worse = register(metrics(0.25))  # the champion is better: v2 stays a challenger
    assert (worse.promoted, worse.champion_after) == (False, 1) and aliases() == {"champion": 1, "challenger": 2}
    assert "does not beat the champion" in worse.reasons[0]

    regressed = register(metrics(0.45, fmt=0.5))  # better primary, format regression: blocked
    assert not regressed.promoted and aliases() == {"champion": 1, "challenger": 3}

    better = register(metrics(0.45))  # beats the champion, no regression: replaces it
    assert (better.version, better.promoted, better.champion_before) == (4, True, 1)
    assert aliases() == {"champion": 4, "challenger": 4}
    v4 = client.get_model_version(CFG.model_name, "4")
    assert v4.tags["didpo.previous_champion"] == "1" and v4.tags["didpo.decision"] == "promoted"
    assert json.loads(v4.tags["didpo.metrics"]) == metrics(0.45)
    assert client.get_model_version(CFG.model_name, "2").tags["didpo.decision"] == "rejected"
    assert client.get_model_version(CFG.model_name, "3").tags["didpo.reasons"].count("regression beyond") == 1

    # the logged model is the tiny model, with explicit pinned requirements
    components = mlflow.transformers.load_model(f"models:/{CFG.model_name}@champion", return_type="components")
    loaded = components["model"].state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in model.state_dict().items())
    local = mlflow.artifacts.download_artifacts(f"models:/{CFG.model_name}@champion")
    requirements = (root / local / "requirements.txt").read_text().split()
    assert set(pip_requirements()) <= set(requirements)

    runner = CliRunner()
    result = runner.invoke(app, ["rollback", "--params", str(root / "params.yaml")])
    assert result.exit_code == 0, result.output
    assert "champion moved from version 4 back to version 1" in result.output
    assert aliases()["champion"] == 1
    assert client.get_model_version(CFG.model_name, "4").tags["didpo.rolled_back"] == "champion moved back to 1"
    again = runner.invoke(app, ["rollback", "--params", str(root / "params.yaml")])
    assert again.exit_code == 1 and "version 1 is the first champion" in again.output
