"""scripts/rl_ablation.py: arms are paired by task id, refused across protocols or DPO starts, and each arm's
difference from the default arm is the mean per-problem difference (hand-computed)."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
spec = importlib.util.spec_from_file_location("rl_ablation", ROOT / "scripts/rl_ablation.py")
rl_ablation = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rl_ablation)


def claim(delta, protocol="p1"):
    return {
        "protocol": protocol, "engine": "openvino/f32", "n_problems": 4, "samples_per_problem": 4, "seed": 0,
        "delta": delta, "interval": [-0.1, 0.1], "p_value": 0.5, "p_worse": 0.5, "mde": 0.2,
        "verdict": "no change detected",
    }  # fmt: skip


def scores(dpo, rl, protocol="p1"):
    ids = ["t/a", "t/b", "t/c", "t/d"]
    return {
        "protocol": protocol,
        "checkpoints": {
            "dpo": {"val": dict(zip(ids, dpo, strict=True))},
            "didpo": {"val": dict(zip(ids, rl, strict=True))},
        },
    }


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    dpo = [0.5, 0.25, 0.0, 1.0]
    (tmp_path / "claim.json").write_text(json.dumps(claim(-0.125)))
    (tmp_path / "scores.json").write_text(json.dumps(scores(dpo, [0.25, 0.25, 0.0, 0.75])))
    monkeypatch.setattr(
        rl_ablation, "DEFAULT_RUN", {"claim": tmp_path / "claim.json", "scores": tmp_path / "scores.json"}
    )
    monkeypatch.setattr(rl_ablation, "OUT", tmp_path / "arms")
    monkeypatch.setattr(rl_ablation, "REFERENCE", tmp_path / "arms" / "reference" / "didpo_start_policy.json")
    (tmp_path / "arms").mkdir()
    assert rl_ablation.main(["freeze-reference"]) == 0
    with pytest.raises(SystemExit, match="written once"):  # a later default run cannot replace the reference
        rl_ablation.main(["freeze-reference"])
    return tmp_path, dpo


def test_an_arm_is_compared_with_the_default_arm_problem_by_problem(recorded):
    tmp_path, dpo = recorded
    # the arm's ids come in another order: pairing is by task id, not by position
    arm = rl_ablation.arm_record(claim(0.0625), scores(dpo, [0.75, 0.25, 0.0, 1.0]))
    arm["val"] = {name: dict(reversed(list(v.items()))) for name, v in arm["val"].items()}
    (tmp_path / "arms/rft.json").write_text(json.dumps(arm))
    text = rl_ablation.table(rl_ablation.load_arms())
    row = next(line for line in text.splitlines() if line.startswith("| rft |"))
    # RL pass@1 0.5; against the default arm: (0.5 + 0 + 0 + 0.25) / 4 = +0.1875
    assert row.startswith("| rft | 0.500 | +0.062 ")
    assert "| +0.188 [" in row
    assert "DPO (the start of every arm): val pass@1 0.438." in text


def test_arms_of_another_protocol_or_another_dpo_start_are_refused(recorded):
    tmp_path, dpo = recorded
    with pytest.raises(ValueError, match="protocol"):
        rl_ablation.arm_record(claim(0.0, protocol="p2"), scores(dpo, dpo))
    (tmp_path / "arms/other.json").write_text(
        json.dumps(rl_ablation.arm_record(claim(0.0, "p2"), scores(dpo, dpo, "p2")))
    )
    with pytest.raises(ValueError, match="protocol p2"):
        rl_ablation.load_arms()
    (tmp_path / "arms/other.json").write_text(json.dumps(rl_ablation.arm_record(claim(0.0), scores([1.0] * 4, dpo))))
    with pytest.raises(ValueError, match="DPO figures differ"):
        rl_ablation.load_arms()
