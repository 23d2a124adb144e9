"""Champion/challenger promotion: the pre-registered paired test on hand-made per-problem scores (planted effects
both ways, protocol mismatch refused), then a real MLflow SQLite registry with a tiny model logged (versions,
aliases, reasons, the champion downloaded for re-measurement, rollback through `didpo rollback`)."""

import pytest
import yaml

from tasks.config import RegisterConfig
from tasks.register import (
    Evidence,
    ProtocolMismatch,
    choose_candidate,
    flatten,
    promotion_decision,
)

CFG = RegisterConfig(
    model_name="didpo-test",
    primary_metric="val/pass@1",
    alpha=0.05,
    margin=0.0,
    tolerance=0.02,
    secondary_metrics=("test/pass@1", "val/format_compliance", "val/unsafe_rate"),
    lower_is_better=("val/unsafe_rate",),
)
FAMILIES = {f"v{i}": f"fam{i % 4}" for i in range(20)} | {f"t{i}": "test" for i in range(10)}


def evidence(name, val, test=(0.5,) * 10, fmt=0.9, unsafe=0.0, protocol="p1"):
    """Per-problem pass@1 on 20 val and 10 test problems, and the means the share-of-answers checks use."""
    per_problem = {"val": {f"v{i}": v for i, v in enumerate(val)}, "test": {f"t{i}": v for i, v in enumerate(test)}}
    metrics = {"val/pass@1": sum(val) / len(val), "val/format_compliance": fmt, "val/unsafe_rate": unsafe}
    return Evidence(name, protocol, per_problem, FAMILIES, metrics)


BASE = [0.0] * 10 + [0.25] * 6 + [0.5] * 4  # mean 0.175
BETTER = [0.5] * 10 + [0.25] * 6 + [0.75] * 4  # every changed problem better: 14 of 20, p = 2**-14
WORSE = [0.0] * 20


def test_a_planted_gain_is_promoted_with_its_statistics():
    decision = promotion_decision(evidence("didpo", BETTER), evidence("base", BASE), CFG)
    assert decision.promote
    t = decision.test
    assert t["n"] == 20 and t["n_discordant"] == 14 and t["effect"] == pytest.approx(0.30)
    assert t["p_value"] == 2**-14 and t["method"] == "exact sign-flip (2^14 patterns)"
    assert t["n_clusters"] == 4 and t["cluster_p"] == 1 / 16
    assert t["low"] > 0 and t["mde"] > 0
    assert decision.reasons[0].startswith("val/pass@1: didpo 0.4750 vs base 0.1750, Δ +0.3000 (95% interval [")
    assert decision.reasons[0].endswith("significant at α 0.05 with margin 0")
    assert decision.reasons[1].startswith("test/pass@1: Δ +0.0000 over 10 problems; non-inferiority at margin 0.0200")
    assert len(decision.reasons) == 4


def test_no_gain_or_a_loss_is_not_promoted():
    same = promotion_decision(evidence("didpo", BASE), evidence("champion", BASE), CFG)
    assert not same.promote and same.test["p_value"] == 1.0 and "not significant" in same.reasons[0]
    worse = promotion_decision(evidence("didpo", WORSE), evidence("champion", BASE), CFG)
    assert not worse.promote and worse.test["effect"] == pytest.approx(-0.175)
    # a gain on one problem of twenty: p = 1/2
    one = promotion_decision(evidence("didpo", [1.0] + BASE[1:]), evidence("champion", BASE), CFG)
    assert not one.promote and one.test["p_value"] == 0.5
    # the margin: a real gain of +0.35 does not clear a margin of 0.4
    strict = RegisterConfig(**{**CFG.__dict__, "margin": 0.4})
    assert not promotion_decision(evidence("didpo", BETTER), evidence("base", BASE), strict).promote


def test_secondary_regressions_block_promotion():
    worse_test = promotion_decision(evidence("didpo", BETTER, test=(0.0,) * 10), evidence("base", BASE), CFG)
    assert not worse_test.promote and "not shown to be not worse" in worse_test.reasons[1]
    worse_format = promotion_decision(evidence("didpo", BETTER, fmt=0.8), evidence("base", BASE, fmt=0.9), CFG)
    assert not worse_format.promote
    assert worse_format.reasons[2] == (
        "val/format_compliance: 0.8000 vs base 0.9000 (-0.1000): regression beyond the tolerance 0.02"
    )
    # lower is better for the unsafe rate: a rise of 0.05 is a regression, a fall is not
    assert not promotion_decision(evidence("didpo", BETTER, unsafe=0.05), evidence("base", BASE), CFG).promote
    assert promotion_decision(evidence("didpo", BETTER), evidence("base", BASE, unsafe=0.05), CFG).promote
    # fewer than 8 test problems: reported, not tested
    few = Evidence("didpo", "p1", {"val": evidence("x", BETTER).per_problem["val"], "test": {"t0": 0.0}}, FAMILIES,
                   evidence("x", BETTER).metrics)  # fmt: skip
    base = Evidence("base", "p1", {"val": evidence("x", BASE).per_problem["val"], "test": {"t0": 1.0}}, FAMILIES,
                    evidence("x", BASE).metrics)  # fmt: skip
    decision = promotion_decision(few, base, CFG)
    assert decision.promote and decision.reasons[1] == "test/pass@1: 1 problems (< 8): reported, not tested"


def test_figures_of_two_protocols_are_not_compared():
    with pytest.raises(ProtocolMismatch, match="protocol p2 and base under p1"):
        promotion_decision(evidence("didpo", BETTER, protocol="p2"), evidence("base", BASE), CFG)
    other = Evidence("didpo", "p1", {"val": {"x": 1.0}}, FAMILIES, {})
    with pytest.raises(ProtocolMismatch, match="different problems"):
        promotion_decision(other, evidence("base", BASE), CFG)


def test_the_candidate_is_the_best_trained_checkpoint():
    ev = {"base": evidence("base", BETTER), "sft": evidence("sft", BASE), "dpo": evidence("dpo", BETTER),
          "didpo": evidence("didpo", BETTER)}  # fmt: skip
    assert choose_candidate(ev, CFG) == "dpo"  # dpo and didpo tie: the earlier stage; base is not a candidate
    ev["didpo"] = evidence("didpo", [0.75] * 20)
    assert choose_candidate(ev, CFG) == "didpo"
    with pytest.raises(FileNotFoundError, match="no trained checkpoint"):
        choose_candidate({"base": ev["base"]}, CFG)


def test_version_tags_are_short_plain_text():
    """Issue 44: the registry's version list showed `didpo.metrics: {"heldout/complexity_...` and `didpo.test:
    {"alpha": 0.05, "cluster_p...`, JSON cut at the column's width. Each tag is now one short value a person reads:
    the paired test in one line, one tag per metric of the decision with its problems, the RL algorithm."""
    from tasks.register import paired_summary, version_tags

    decision = promotion_decision(evidence("didpo", BETTER), evidence("base", BASE), CFG)
    # Δ 0.30 over 20 problems, 14 changed, all gains: exact p = 2**-14 = 6.1e-05; the per-problem changes have
    # sd 0.2236 (10 × 0.5, 6 × 0, 4 × 0.25 around 0.30), so the t half-width 2.093 · 0.2236 / √20 = 0.105 is under
    # the Clopper–Pearson floor 1 − 0.025^(1/20) = 0.1684: [0.1316, 0.4684]; MDE (1.729 + 0.861) · 0.05 = 0.1295
    assert paired_summary(decision.test) == "Δ +0.3000 [+0.1316, +0.4684], p 6.1e-05, n 20 (14 changed), MDE 0.1295"
    small = Evidence(
        "didpo", "p1", {"val": evidence("didpo", BETTER).per_problem["val"], "test": {"t0": 1.0}}, FAMILIES,
        {"val/pass@1": 0.475, "test/pass@1": 1.0, "val/format_compliance": 0.9, "val/unsafe_rate": None},
    )  # fmt: skip
    tags = version_tags(small, decision, CFG, algo="rft")
    assert tags == {
        "didpo.checkpoint": "didpo",
        "didpo.algo": "rft",
        "didpo.decision": "promoted",
        "didpo.test": "val/pass@1: Δ +0.3000 [+0.1316, +0.4684], p 6.1e-05, n 20 (14 changed), MDE 0.1295",
        "didpo.val/pass_at_1": "0.4750 (20 problems)",
        "didpo.test/pass_at_1": "not reported: 1 problem (fewer than 8)",  # not "1.0000"
        "didpo.val/format_compliance": "0.9000 (20 problems)",
        "didpo.val/unsafe_rate": "–",
        "didpo.protocol": "p1",
        "didpo.reasons": "\n".join(decision.reasons),
    }
    assert max(len(v) for k, v in tags.items() if k != "didpo.reasons") < 90 and "{" not in "".join(tags.values())
    assert "didpo.algo" not in version_tags(evidence("dpo", BETTER), decision, CFG, algo="rft")  # not the RL one


def test_config_and_helpers():
    with pytest.raises(ValueError, match="<split>/pass@1"):
        RegisterConfig(primary_metric="val/pass@16")
    with pytest.raises(ValueError, match="also a secondary"):
        RegisterConfig(primary_metric="val/pass@1", secondary_metrics=("val/pass@1",))
    with pytest.raises(ValueError, match="register.alpha"):
        RegisterConfig(alpha=0.0)
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
    from tasks.register import download_champion, pip_requirements, register_and_decide

    root, model = registry
    client = mlflow.MlflowClient()

    def register(candidate, incumbent, measured=None):  # measured: the champion version evaluate compared with
        with mlflow.start_run():
            return register_and_decide.fn(root / "model", candidate, incumbent, CFG, measured_champion=measured)

    def aliases():
        names = ("champion", "challenger")
        return {a: int(client.get_model_version_by_alias(CFG.model_name, a).version) for a in names}

    assert download_champion(CFG.model_name, root / "champion") is None  # no registered model yet
    flat = register(evidence("sft", BASE), evidence("base", BASE))  # no better than the base model: no champion
    assert (flat.version, flat.promoted, flat.champion_after, flat.incumbent) == (1, False, None, "base")
    assert client.get_model_version(CFG.model_name, "1").tags["didpo.decision"] == "rejected"

    first = register(evidence("didpo", BETTER), evidence("base", BASE))  # beats the base model: first champion
    assert (first.version, first.promoted, first.champion_before, first.champion_after) == (2, True, None, 2)
    assert aliases() == {"champion": 2, "challenger": 2}
    assert first.test["p_value"] == 2**-14 and first.protocol == "p1"

    worse = register(evidence("dpo", BASE), evidence("champion", BETTER), 2)  # the champion is better
    assert (worse.promoted, worse.champion_after) == (False, 2) and aliases() == {"champion": 2, "challenger": 3}
    assert "not significant" in worse.reasons[0]

    regressed = register(evidence("didpo", [1.0] * 20, fmt=0.5), evidence("champion", BETTER), 2)  # format
    assert not regressed.promoted and aliases() == {"champion": 2, "challenger": 4}

    better = register(evidence("didpo", [1.0] * 20), evidence("champion", BETTER), 2)  # beats it, no regression
    assert (better.version, better.promoted, better.champion_before) == (5, True, 2)
    assert better.reasons[-1] == "champion: version 5 (was 2)"
    assert aliases() == {"champion": 5, "challenger": 5}
    v5 = client.get_model_version(CFG.model_name, "5")
    assert v5.tags["didpo.previous_champion"] == "2" and v5.tags["didpo.decision"] == "promoted"
    assert v5.tags["didpo.protocol"] == "p1" and v5.tags["didpo.test"].startswith("val/pass@1: Δ +0.5250 [")
    assert v5.tags["didpo.val/pass_at_1"] == "1.0000 (20 problems)" and v5.tags["didpo.checkpoint"] == "didpo"
    assert client.get_model_version(CFG.model_name, "4").tags["didpo.reasons"].count("regression beyond") == 1

    # a run that measured version 2 while another run promoted 5: it wins its test but keeps only its challenger
    stale = register(evidence("didpo", [1.0] * 20), evidence("champion", BETTER), 2)
    assert (stale.version, stale.promoted, stale.champion_before, stale.champion_after) == (6, False, 5, 5)
    assert stale.reasons[-1].startswith("champion: version 5 since the evaluation, which measured version 2")
    assert aliases() == {"champion": 5, "challenger": 6}
    assert client.get_model_version(CFG.model_name, "6").tags["didpo.decision"] == "rejected: champion changed"
    assert CFG.model_name + ".promotion-lock" not in [m.name for m in client.search_registered_models()]

    # the logged model is the tiny model, with explicit pinned requirements; the champion can be re-measured
    assert download_champion(CFG.model_name, root / "champion") == 5
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(root / "champion").state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in model.state_dict().items())
    local = mlflow.artifacts.download_artifacts(f"models:/{CFG.model_name}@champion")
    requirements = (root / local / "requirements.txt").read_text().split()
    assert set(pip_requirements()) <= set(requirements)
    assert not [r for r in requirements if "+" in r]  # no local version label (torch 2.13.0+cpu): portable
    # served as a chat model: an OpenAI chat request, its max_tokens honoured (the README's serving example)
    served = mlflow.pyfunc.load_model(f"models:/{CFG.model_name}@champion")
    request = {"messages": [{"role": "user", "content": "Write a function that adds two numbers."}], "max_tokens": 4}
    (reply,) = served.predict(request)
    assert reply["object"] == "chat.completion" and reply["choices"][0]["message"]["role"] == "assistant"
    assert reply["usage"]["completion_tokens"] <= 4
    # its model card says what it was trained from and that model's license (no hub lookup: no warning at logging)
    card = (root / local / "model_card_data.yaml").read_text()
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in card and "license: apache-2.0" in card
    assert "apache-2.0" in (root / local / "LICENSE.txt").read_text()

    runner = CliRunner()
    result = runner.invoke(app, ["rollback", "--params", str(root / "params.yaml")])
    assert result.exit_code == 0, result.output
    assert "champion moved from version 5 back to version 2" in result.output
    assert aliases()["champion"] == 2
    assert client.get_model_version(CFG.model_name, "5").tags["didpo.rolled_back"] == "champion moved back to 2"
    again = runner.invoke(app, ["rollback", "--params", str(root / "params.yaml")])
    assert again.exit_code == 1 and "version 2 is the first champion" in again.output


def test_the_promotion_lock_waits_for_its_holder_and_takes_over_a_stale_one(registry):
    """`promotion_lock`: a held lock makes another run wait and then fail naming it; a lock older than ``stale_s``
    (its holder died) is taken over; the block's end releases it."""
    import mlflow

    from tasks.register import promotion_lock

    client = mlflow.MlflowClient()
    lock = CFG.model_name + ".promotion-lock"
    with promotion_lock(client, CFG.model_name):
        assert client.get_registered_model(lock).name == lock
        with pytest.raises(TimeoutError, match=f"registered model '{lock}' still exists after 1 s"):
            with promotion_lock(client, CFG.model_name, wait_s=1.0):
                pass
    assert lock not in [m.name for m in client.search_registered_models()]

    client.create_registered_model(lock)  # left behind by a run that died holding it
    with promotion_lock(client, CFG.model_name, wait_s=5.0, stale_s=0.0):
        assert client.get_registered_model(lock).name == lock
    assert lock not in [m.name for m in client.search_registered_models()]
