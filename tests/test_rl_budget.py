"""scripts/rl_budget.py: Holm's step-down procedure and a point's training figures (hand-computed), the protocol a
point must be measured under, and the table's decision waiting for all three arms."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
spec = importlib.util.spec_from_file_location("rl_budget", ROOT / "scripts/rl_budget.py")
rl_budget = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rl_budget)


def test_holm_steps_down_and_stops_at_the_first_kept_hypothesis():
    # sorted: a 0.01 <= 0.05/3 rejects; c 0.03 > 0.05/2 stops, so b (0.04 <= 0.05) is kept too
    assert rl_budget.holm({"a": 0.01, "b": 0.04, "c": 0.03}) == {"a": True, "b": False, "c": False}
    # 0.01 <= 0.0167, 0.02 <= 0.025, 0.04 <= 0.05: all three
    assert rl_budget.holm({"a": 0.01, "b": 0.02, "c": 0.04}) == {"a": True, "b": True, "c": True}
    assert rl_budget.holm({"a": 0.2}) == {"a": False}


def history(n):
    return [
        {"step": s, "didpo/kl_start": 0.01 * s, "didpo/entropy": 1.0 - 0.1 * s, "didpo/frac_zero_std_groups": 0.5,
         "didpo/rows_zero_advantage": 2, "didpo/duplicate_rows": s % 2, "didpo/step_time_s": 10.0}
        for s in range(1, n + 1)
    ]  # fmt: skip


def test_training_figures_average_the_last_five_updating_steps_before_the_point():
    fig = rl_budget.training_figures(history(8), 6)
    assert fig["kl_start_last5"] == pytest.approx(0.04)  # steps 2..6: (0.02 + ... + 0.06) / 5
    assert fig["entropy_last5"] == pytest.approx(0.6)  # 1 - 0.1 x 4
    assert fig["rows_zero_advantage"] == 12 and fig["duplicate_rows"] == 3 and fig["rl_step_seconds"] == 60.0
    # steps 5 and 6 trained nothing (rft without a passing answer): no KL, no entropy, no update figures
    rows = history(8)
    for row in rows[4:6]:
        for key in ("didpo/kl_start", "didpo/entropy", "didpo/rows_zero_advantage", "didpo/duplicate_rows"):
            del row[key]
    fig = rl_budget.training_figures(rows, 6)
    assert fig["steps_updated"] == 4 and fig["kl_start_last5"] == pytest.approx(0.025)  # steps 1..4
    assert fig["rows_zero_advantage"] == 8 and fig["rl_step_seconds"] == 60.0
    # step 6 of grpo with every group at zero spread: KL to start measured, no row reached the loss (no entropy)
    rows = history(8)
    del rows[5]["didpo/entropy"]
    fig = rl_budget.training_figures(rows, 6)
    assert fig["kl_start_last5"] == pytest.approx(0.04) and fig["steps_updated"] == 6  # steps 2..6, as above
    assert fig["entropy_last5"] == pytest.approx(0.7)  # steps 1..5: 1 - 0.1 x 3
    with pytest.raises(ValueError, match="stops at step 8, before 9"):
        rl_budget.training_figures(history(8), 9)


IDS = [f"t/{i}" for i in range(8)]


def point(arm, step, rl_val, samples=16, expected=16):
    dpo_val = [0.5] * 8
    scores = {
        name: {
            "val": dict(zip(IDS, vals, strict=True)),
            "humaneval": {"HumanEval/0": 0.0, "HumanEval/1": 1.0},
            "heldout": {"h/0": 0.0},
        }
        for name, vals in (("dpo", dpo_val), ("didpo", rl_val))
    }
    claim = {"samples_per_problem": samples, "protocol": "p1", "engine": "openvino/f32", "n_problems": 8, "seed": 0}
    return rl_budget.point_record(arm, step, claim, {"checkpoints": scores}, history(step), "sha", expected)


def test_a_point_measured_under_another_protocol_is_refused():
    with pytest.raises(ValueError, match="4 answers per problem, not 16"):
        point("rft", 6, [0.5] * 8, samples=4)
    record = point("rft", 6, [0.75] * 8)
    assert record["rollouts"] == 96 and record["training"]["rl_step_seconds"] == 60.0


def test_the_decision_waits_for_all_arms_then_applies_holm(tmp_path, monkeypatch):
    monkeypatch.setattr(rl_budget, "OUT", tmp_path)
    gains = {"rft": [0.75] * 8, "grpo": [0.5] * 8, "didpo": [0.5] * 7 + [0.25]}
    for arm in ("rft", "grpo"):
        (tmp_path / arm).mkdir()
        (tmp_path / arm / "step_0094.json").write_text(json.dumps(point(arm, 94, gains[arm])))
    text = rl_budget.table(rl_budget.curve_record(rl_budget.load_points()))
    assert "| rft | 1504 | 0.750 | +0.250" in text and "waiting for ['didpo']" in text
    (tmp_path / "didpo").mkdir()
    (tmp_path / "didpo" / "step_0094.json").write_text(json.dumps(point("didpo", 94, gains["didpo"])))
    text = rl_budget.table(rl_budget.curve_record(rl_budget.load_points()))
    # rft: all 8 problems +0.25, exact sign-flip p = 1/256 <= 0.05/3; grpo: no change (p = 1); didpo one worse
    # ... but its HumanEval guard cannot pass on 2 unchanged problems: every change +0.03 over the margin, exact
    # sign-flip p = 1/4
    assert "rft at 1504 rollouts: p 0.0039, Holm rejects H0: passes Holm, fails the HumanEval guard" in text
    assert "grpo at 1504 rollouts: p 1.0000, Holm keeps H0: no change detected" in text
    assert "didpo at 1504 rollouts" in text and "Holm keeps H0" in text.split("didpo at")[1]


def drift_history(kl_scale, updates=2):
    rows = history(31)
    for row in rows:
        row["didpo/kl_start"] *= kl_scale
        row["didpo/updates"], row["didpo/pass_rate"] = updates, 0.5
    return rows


def test_drift_figures_and_the_preregistered_verdict(tmp_path):
    fig = rl_budget.drift_figures(drift_history(1.0))
    assert fig["kl_step6"] == pytest.approx(0.06) and fig["kl_step31"] == pytest.approx(0.31)
    assert fig["kl_last5"] == pytest.approx(0.29)  # steps 27..31
    assert fig["updates"] == 62 and fig["pass_rate"] == 0.5
    with pytest.raises(ValueError, match="before 31"):
        rl_budget.drift_figures(history(20))
    # seeds 0.29 and 0.29 x 1.1 = 0.319 differ by 0.029; w_did = 0 at 0.29 x 0.5 = 0.145 is 0.145 below: attributed
    runs = {"sp_s0": 1.0, "sp_s1": 1.1, "wdid0_s0": 0.5}
    for run, scale in runs.items():
        (tmp_path / run).mkdir()
        (tmp_path / run / "history.json").write_text(json.dumps({"history": drift_history(scale)}))
    text = rl_budget.drift_table(tmp_path)
    assert "| w_did = 0, seed 0 | 0.0300 | 0.1550 | 0.1450 | 62 | 0.500 |" in text
    assert "Verdict: attributed to the process term: w_did = 0 drifts 0.1450 less" in text
    # seeds 0.29 and 0.58 differ by 0.29; w_did = 0 at 0.145 lies 0.145 below the lower: within the spread
    figures = {run: {"kl_last5": 0.29 * s} for run, s in {"sp_s0": 1.0, "sp_s1": 2.0, "wdid0_s0": 0.5}.items()}
    assert rl_budget.drift_verdict(figures).startswith("not attributed to the process term: w_did = 0 is +0.1450")


def test_the_precheck_picks_the_larger_gain_and_group_on_a_tie(tmp_path):
    assert rl_budget.precheck_choice({"start_policy": 0.05, "group": 0.02}) == "start_policy"
    assert rl_budget.precheck_choice({"start_policy": -0.05, "group": -0.02}) == "group"
    assert rl_budget.precheck_choice({"start_policy": 0.025, "group": 0.02}) == "group"  # |0.005| < 0.01: a tie
    with pytest.raises(ValueError, match="16 answers per problem, not 4"):
        point("didpo", 31, [0.5] * 8, samples=16, expected=4)
    # start_policy: 8 problems +0.25 each against DPO's 0.5; group: unchanged
    (tmp_path / "start_policy.json").write_text(json.dumps(point("didpo", 31, [0.75] * 8, samples=4, expected=4)))
    text = rl_budget.precheck_table(tmp_path)
    # interval: 0.25 +/- the Clopper-Pearson floor 1 - 0.025^(1/8) = 0.369 (no spread); p = 1/256
    assert "| start_policy | 0.750 | +0.250 [-0.119, +0.619] | 0.004 |" in text
    assert "| group | not yet |" in text and "waiting for ['group']" in text
    (tmp_path / "group.json").write_text(json.dumps(point("didpo", 31, [0.5] * 8, samples=4, expected=4)))
    text = rl_budget.precheck_table(tmp_path)
    assert "| group | 0.500 | +0.000" in text and "Choice: `start_policy` runs the curve" in text


def test_the_curve_files_list_every_point_with_its_test_and_the_decision(tmp_path, monkeypatch):
    monkeypatch.setattr(rl_budget, "OUT", tmp_path)
    for arm, step, vals in (("rft", 6, [0.75] * 8), ("rft", 94, [0.0] * 8), ("grpo", 94, [0.5] * 8)):
        (tmp_path / arm).mkdir(exist_ok=True)
        (tmp_path / arm / f"step_{step:04d}.json").write_text(json.dumps(point(arm, step, vals)))
    rl_budget.write_curve(rl_budget.load_points(), tmp_path)
    record = json.loads((tmp_path / "points.json").read_text())
    rft6, rft94, grpo94 = record["points"]
    # every problem +0.25 (or -0.5): sd 0, so the interval is the Clopper-Pearson floor 1 - 0.025^(1/8) = 0.3694
    # either side; exact sign-flip p 1/256 (or 1 for RL better)
    assert (rft6["algo"], rft6["rollouts"], rft6["delta"]) == ("rft", 96, 0.25)
    assert rft6["interval"] == pytest.approx([0.25 - 0.3694, 0.25 + 0.3694], abs=1e-4)
    assert rft6["p_value"] == pytest.approx(1 / 256) and rft6["humaneval_delta"] == 0.0
    assert rft94["delta"] == -0.5 and rft94["interval"][1] == pytest.approx(-0.5 + 0.3694, abs=1e-4)
    assert rft94["p_value"] == 1.0 and grpo94["delta"] == 0.0
    assert record["dpo_val_pass1"] == 0.5 and record["decision"] is None  # didpo's final point is missing
    assert json.loads((tmp_path / "curve.json").read_text()) == [
        {"rollouts": 96, "rft": 0.25, "grpo": None, "didpo": None},
        {"rollouts": 1504, "rft": -0.5, "grpo": 0.0, "didpo": None},
    ]
    from PIL import Image

    with Image.open(tmp_path / "curve.png") as image:
        assert image.size == (640, 400) and len(image.getcolors(1 << 16)) > 10  # drawn, not blank
    (tmp_path / "didpo").mkdir()
    (tmp_path / "didpo" / "step_0094.json").write_text(json.dumps(point("didpo", 94, [0.5] * 8)))
    decided = rl_budget.curve_record(rl_budget.load_points())["decision"]
    assert decided["rft"] == {"holm_rejects": False, "guard_passes": False, "claimed": False,
                              "verdict": "worse than DPO (interval below 0)"}  # fmt: skip
    assert decided["grpo"]["verdict"] == "no change detected"
