"""The evaluate stage's pieces: answer metrics on hand-made answers, the comparison table, plot data, and one split
measured end to end on a tiny model in the real sandbox."""

import json
from pathlib import Path

import pytest

from models.measure import ProblemResult
from tasks.config import KS, ConfigError, EvaluateConfig, parse_params
from tasks.evaluate import (
    MIN_PROBLEMS,
    answer_metrics,
    checkpoint_label,
    comparison_markdown,
    comparison_table,
    deltas_markdown,
    evaluate_split,
    flat_metrics,
    pass1_deltas,
    passk_rows,
    plot_history,
    plot_passk,
    protocol_problems,
    protocol_record,
    select_problems,
    split_sampling,
    too_small,
)
from tests.test_process_metrics import PROBLEM, REFERENCE


def result(answers, c=0):
    n = len(answers)
    return ProblemResult(PROBLEM["task_id"], "val", n, c, (0.0,) * n, ("assertion",) * n, tuple(answers))


def test_config_validation_names_the_key():
    assert EvaluateConfig().ks() == (1, 2) and EvaluateConfig(n_samples=16).ks() == (1, 2, 5)
    assert EvaluateConfig(n_samples=32).ks() == KS
    with pytest.raises(ConfigError, match="evaluate.n_samples must be >= 2"):
        parse_params({"evaluate": {"n_samples": 1}})
    with pytest.raises(ConfigError, match="evaluate.val_per_family must be >= 0"):
        parse_params({"evaluate": {"val_per_family": -1}})
    with pytest.raises(ConfigError, match="consistency_samples"):
        parse_params({"evaluate": {"consistency_samples": 1}})
    assert parse_params({"evaluate": {"checkpoints": ["dpo", "didpo"]}}).evaluate.checkpoints == ("dpo", "didpo")
    with pytest.raises(ConfigError, match=r"evaluate.checkpoints must be a non-empty subset .* got \['dpo', 'ppo'\]"):
        parse_params({"evaluate": {"checkpoints": ["dpo", "ppo"]}})
    with pytest.raises(ConfigError, match="evaluate.checkpoints"):
        parse_params({"evaluate": {"checkpoints": []}})


def test_answer_metrics_by_hand():
    full = f"The function `count_big` below counts values; each step is commented.\n\n```python\n{REFERENCE}```"
    body = "```python\n    return 0\n```"  # a bare body without explanation: judged after the prompt
    empty = "I cannot help with that."  # no code: counts for format, not for prefixes or complexity
    m = answer_metrics([PROBLEM], [result([full, body, empty])])
    assert m["format_compliance"] == pytest.approx(1 / 3)
    assert m["explanation_rate"] == pytest.approx(2 / 3)  # the refusal is one sentence of prose
    assert m["unsafe_rate"] == 0.0
    assert m["valid_prefix_rate"] == 1.0
    # reference: 6 code lines, complexity 3; the body-only program is `def` + `return 0`: 2 lines, complexity 1
    assert m["lines_ratio"] == pytest.approx((6 / 6 + 2 / 6) / 2)
    assert m["complexity_ratio"] == pytest.approx((3 / 3 + 1 / 3) / 2)


METRICS = {
    "base": {"val": {"n_problems": 8, "n_samples": 16, "pass@1": 0.0625, "pass@5": 0.25, "recovery": None}},
    "sft": {"val": {"n_problems": 8, "n_samples": 16, "pass@1": 0.5, "pass@5": 0.75}, "seconds": 12.0},
}
# the RL checkpoint too, and a test split of one problem (params.yaml's evaluate.test_problems: 1)
WITH_TEST = {
    "base": {**METRICS["base"], "test": {"n_problems": 1, "n_samples": 16, "pass@1": 0.0, "pass@2": 0.0}},
    "didpo": {
        "val": {"n_problems": 8, "n_samples": 16, "pass@1": 0.5, "pass@5": 0.75},
        "test": {"n_problems": 1, "n_samples": 16, "pass@1": 1.0, "pass@2": 1.0},
    },
}


def test_comparison_table_and_plot_rows():
    md = comparison_markdown(METRICS)
    assert "## val (problems: 8, samples per problem: 16)" in md and "## test" not in md
    header = next(line for line in md.splitlines() if line.startswith("| checkpoint"))
    assert header.split(" | ")[1:4] == ["pass@1", "pass@2", "pass@5"]
    assert "| base | 0.062 | – | 0.250 | – |" in md and "| SFT | 0.500 | – | 0.750 | – |" in md
    table = comparison_table(METRICS)
    assert table["checkpoint"] == ["base", "SFT"] and table["pass@5"] == [0.25, 0.75]
    assert table["recovery"] == [None, None]
    rows = passk_rows(METRICS, "val", ["base", "sft", "dpo", "didpo"])
    assert [r["k"] for r in rows] == list(KS)
    assert rows[2] == {"k": 5, "base": 0.25, "sft": 0.75, "dpo": None, "didpo": None, "n_problems": 8}
    assert flat_metrics(METRICS) == {
        "eval/base/val/n_problems": 8.0,
        "eval/base/val/n_samples": 16.0,
        "eval/base/val/pass@1": 0.0625,
        "eval/base/val/pass@5": 0.25,
        "eval/sft/val/n_problems": 8.0,
        "eval/sft/val/n_samples": 16.0,
        "eval/sft/val/pass@1": 0.5,
        "eval/sft/val/pass@5": 0.75,
        "eval/sft/seconds": 12.0,
    }


def test_a_split_too_small_is_neither_drawn_nor_tabled_and_rl_is_named_by_its_algorithm():
    """Issue 44: a 1-problem test split was drawn and tabled as pass@k 1.0 for RL, under the name `didpo` while the
    algorithm was rft. Below MIN_PROBLEMS (8) a split is measured (metrics.json keeps it) but not shown, and the
    reason names the key that sizes it."""
    assert MIN_PROBLEMS == 8
    assert [checkpoint_label(n, "rft") for n in ("base", "sft", "dpo", "didpo", "champion")] == [
        "base", "SFT", "DPO", "RL (rft)", "champion"
    ]  # fmt: skip
    assert checkpoint_label("didpo") == "RL"
    assert too_small(WITH_TEST) == {
        "test": "test: 1 problem (fewer than 8): measured, not drawn or tabled; raise evaluate.test_problems"
    }
    rows = passk_rows(WITH_TEST, "test", ["base", "sft", "dpo", "didpo"])
    assert rows[0] == {"k": 1, "base": None, "sft": None, "dpo": None, "didpo": None, "n_problems": 1}  # not 1.0
    assert all(v is None for r in rows for k, v in r.items() if k not in ("k", "n_problems"))
    val = passk_rows(WITH_TEST, "val", ["base", "sft", "dpo", "didpo"])
    assert val[0] == {"k": 1, "base": 0.0625, "sft": None, "dpo": None, "didpo": 0.5, "n_problems": 8}
    md = comparison_markdown(WITH_TEST, "rft")
    assert "## test" not in md and "| RL (rft) | 0.500 | – | 0.750 |" in md and "| didpo |" not in md
    assert md.rstrip().endswith(
        "Not tabled: test: 1 problem (fewer than 8): measured, not drawn or tabled; raise evaluate.test_problems "
        "(its figures are in metrics.json)."
    )
    table = comparison_table(WITH_TEST, "rft")
    assert (table["checkpoint"], table["split"], table["pass@1"]) == (
        ["base", "RL (rft)"],
        ["val", "val"],
        [0.0625, 0.5],
    )
    flat = flat_metrics(WITH_TEST)
    assert flat["eval/didpo/test/n_problems"] == 1.0 and "eval/didpo/test/pass@1" not in flat  # MLflow charts it
    assert flat["eval/didpo/val/pass@1"] == 0.5


def test_the_pass_k_figure_leaves_a_small_split_empty(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    drawn, original = [], plt.Axes.plot

    def plot(ax, *args, **kwargs):
        drawn.append((ax, kwargs.get("label")))
        return original(ax, *args, **kwargs)

    monkeypatch.setattr(plt.Axes, "plot", plot)
    plot_passk(WITH_TEST, tmp_path / "passk.png", "rft")
    # one line per checkpoint on val's panel, none on test's (1 problem) or on the splits without problems
    assert [(ax.get_title(), label) for ax, label in drawn] == [
        ("val (8 problems)", "base"),
        ("val (8 problems)", "RL (rft)"),
    ]
    assert (tmp_path / "passk.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_pass1_deltas_between_consecutive_checkpoints():
    per_problem = {
        "sft": {"val": [0.0, 0.0, 0.0, 0.0], "test": [], "humaneval": [0.5]},
        "dpo": {"val": [1.0, 0.0, 0.0, 0.0], "test": [], "humaneval": [0.25]},
        "didpo": {"val": [1.0, 0.5, 0.0, 0.0], "test": [], "humaneval": [0.25]},
    }
    deltas = pass1_deltas(per_problem, {"val": ["a", "a", "b", "b"]})
    assert list(deltas) == ["sft_to_dpo", "dpo_to_didpo"]
    assert set(deltas["sft_to_dpo"]) == {"val", "humaneval"}  # no problems in test: no row
    d = deltas["sft_to_dpo"]["val"]
    # one problem of four gained 1.0: the sign-flip p is 1/2 (the flip of that one problem), mean +0.25
    assert (d["delta"], d["p_value"], d["n_problems"], d["n_discordant"]) == (0.25, 0.5, 4, 1)
    # t half-width 3.182 * 0.5 / 2 = 0.796 beats the floor 1 - 0.025**(1/4) = 0.602
    assert d["low"] == pytest.approx(0.25 - 3.182446 * 0.5 / 2) and d["high"] == pytest.approx(0.25 + 0.795612)
    assert d["n_clusters"] == 2 and d["cluster_p"] == 0.5  # family a +0.5, family b 0: one family changed
    one = deltas["sft_to_dpo"]["humaneval"]
    assert (one["delta"], one["mde"], one["n_problems"]) == (-0.25, None, 1)
    assert one["low"] == pytest.approx(-0.25 - 0.975) and one["high"] == pytest.approx(-0.25 + 0.975)
    assert deltas["dpo_to_didpo"]["val"]["delta"] == 0.125
    md = deltas_markdown(deltas)  # 4 and 1 problems: intervals past ±1 are not tabled
    assert "| sft" not in md and "| SFT" not in md
    assert md.rstrip().endswith(
        "Not tabled, fewer than 8 problems: val (4 problems); humaneval (1 problem) (their changes are in deltas.json)."
    )
    eight = pass1_deltas(
        {"sft": {"val": [0.0] * 8}, "dpo": {"val": [1.0, 1.0] + [0.0] * 6}, "didpo": {"val": [1.0] * 8}}
    )
    md = deltas_markdown(eight, "rft")
    # two of 8 problems gained 1.0: mean +0.25, exact one-sided sign-flip p = 1/2**2 (of 4 patterns, the observed
    # one is the largest)
    assert "| SFT → DPO | val | +0.250 | [" in md and "| 0.2500 |" in md and md.count("| 8 (2) |") == 1
    assert "| DPO → RL (rft) | val | +0.750 |" in md and "| 8 (6) |" in md and "Not tabled" not in md


def test_pass1_deltas_also_compare_every_later_checkpoint_with_base():
    per_problem = {
        "base": {"humaneval": [1.0, 1.0, 0.0, 0.0, 0.0]},
        "sft": {"humaneval": [1.0, 0.0, 0.0, 0.0, 0.0]},
        "dpo": {"humaneval": [0.0, 0.0, 0.0, 0.0, 0.0]},
        "didpo": {"humaneval": [0.0, 0.0, 1.0, 0.0, 0.0]},
    }
    deltas = pass1_deltas(per_problem)
    assert list(deltas) == ["base_to_sft", "sft_to_dpo", "dpo_to_didpo", "base_to_dpo", "base_to_didpo"]
    to_dpo = deltas["base_to_dpo"]["humaneval"]
    # two problems lost of five: Δ -0.4; "dpo is better" holds in 1 of the 4 sign patterns of the two losses
    assert (to_dpo["delta"], to_dpo["n_discordant"], to_dpo["p_value"]) == (-0.4, 2, 1.0)
    to_rl = deltas["base_to_didpo"]["humaneval"]  # two lost, one gained: Δ -0.2, 3 changed
    assert (to_rl["delta"], to_rl["n_discordant"]) == (pytest.approx(-0.2), 3)
    # the one-sided p of "didpo is better": sign patterns of the 3 changed problems with a sum >= -1 (the observed):
    # +3 (1 pattern), +1 (3), -1 (3) of 8
    assert to_rl["p_value"] == 0.875


def test_the_external_guard_is_greedy_and_reports_pass1_only():
    cfg = EvaluateConfig(n_samples=4, temperature=0.8)
    greedy, sampled = split_sampling(cfg, "humaneval"), split_sampling(cfg, "val")
    assert (greedy.n, greedy.temperature, greedy.max_new_tokens) == (1, 0.0, cfg.max_new_tokens)
    assert (sampled.n, sampled.temperature, sampled.top_p) == (4, 0.8, cfg.top_p)
    assert cfg.greedy("humaneval") and not cfg.greedy("val") and not cfg.greedy("test")
    assert not EvaluateConfig(humaneval_greedy=False).greedy("humaneval")
    record = protocol_record(cfg, {"val": [], "humaneval": []}, ("torch", "f32"))
    assert record["greedy_splits"] == ["humaneval"]
    assert (
        record["id"]
        != protocol_record(EvaluateConfig(humaneval_greedy=False), {"val": [], "humaneval": []}, ("torch", "f32"))["id"]
    )


def test_protocol_problems_are_stratified_and_disjoint_from_selection():
    rows = [{"task_id": f"{fam}/{i}", "family": fam} for i in range(6) for fam in ("b", "a")]
    chosen = protocol_problems(rows, skip=4, per_family=2)
    # the first 4 rows (a/0, b/0, a/1, b/1 by file order: b/0, a/0, b/1, a/1) are the selection prefix
    assert [p["task_id"] for p in chosen] == ["a/2", "a/3", "b/2", "b/3"]
    assert len(protocol_problems(rows, skip=4, per_family=0)) == 8
    cfg = EvaluateConfig()
    engine = ("openvino", "f32")
    record = protocol_record(cfg, {"val": chosen, "test": []}, engine)
    assert record["splits"] == {"val": ["a/2", "a/3", "b/2", "b/3"], "test": []}
    assert record["families"]["b/3"] == "b" and record["n_samples"] == 4 and len(record["id"]) == 16
    assert (record["engine"], record["precision"]) == engine
    assert protocol_record(cfg, {"val": chosen, "test": []}, engine)["id"] == record["id"]  # deterministic
    assert protocol_record(EvaluateConfig(seed=1), {"val": chosen, "test": []}, engine)["id"] != record["id"]
    assert protocol_record(cfg, {"val": chosen[:3], "test": []}, engine)["id"] != record["id"]
    assert protocol_record(cfg, {"val": chosen, "test": []}, ("torch", "f32"))["id"] != record["id"]


def test_the_protocol_measures_held_out_families_beside_val(tmp_path):
    rows = [
        {"task_id": f"{fam}/{i}", "family": fam, "split": split}
        for split, fams in (("val", ("a", "b")), ("heldout", ("h", "g")), ("train", ("a",)))
        for i in range(5)
        for fam in fams
    ]
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    chosen = select_problems(path, EvaluateConfig(val_per_family=1, heldout_per_family=3), skip=2)
    assert [p["task_id"] for p in chosen["val"]] == ["a/1", "b/1"]
    assert [p["task_id"] for p in chosen["heldout"]] == ["g/0", "g/1", "g/2", "h/0", "h/1", "h/2"]
    assert len(select_problems(path, EvaluateConfig(heldout_per_family=0), skip=0)["heldout"]) == 10
    assert chosen["humaneval"] == [] and not EvaluateConfig().greedy("heldout")  # sampled like val


def test_the_engine_falls_back_to_torch_and_says_why(monkeypatch, caplog):
    import models.openvino_engine as engine
    from tasks.evaluate import resolve_engine

    assert resolve_engine(EvaluateConfig(engine="torch")) == ("torch", "f32")
    monkeypatch.setattr(engine, "engine_available", lambda: "the export environment X is missing (make export-env)")
    with caplog.at_level("WARNING"):
        assert resolve_engine(EvaluateConfig(engine="openvino", precision="bf16")) == ("torch", "f32")
    assert "torch sampler is used: the export environment X is missing" in caplog.text
    monkeypatch.setattr(engine, "engine_available", lambda: None)
    assert resolve_engine(EvaluateConfig(engine="openvino", precision="bf16")) == ("openvino", "bf16")
    with pytest.raises(ConfigError, match="evaluate.engine must be"):
        parse_params({"evaluate": {"engine": "ct2"}})


def test_plots_are_written(tmp_path):
    plot_passk(METRICS, tmp_path / "passk.png")
    assert (tmp_path / "passk.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    history = [
        {"step": 1, "sft/loss": 2.0, "sft/learning_rate": 1e-4},
        {"step": 2, "sft/loss": 1.5, "sft/eval_loss": 1.7},
    ]
    assert plot_history(history, "sft", tmp_path / "sft.png") == ["sft/eval_loss", "sft/learning_rate", "sft/loss"]
    assert (tmp_path / "sft.png").stat().st_size > 0
    assert plot_history([{"step": 1}], "none", tmp_path / "none.png") == [] and not (tmp_path / "none.png").exists()


def test_evaluate_split_on_a_tiny_model_in_the_sandbox():
    from models.policy import build_tiny_causal_lm
    from sandbox.verifier import Verifier, VerifierConfig

    model, tokenizer = build_tiny_causal_lm(seed=0)
    small = {"process_problems": 1, "process_prefixes": 2, "consistency_samples": 3, "recovery_samples": 2}
    cfg = EvaluateConfig(n_samples=32, max_new_tokens=12, **small)
    with Verifier(VerifierConfig(workers=1, timeout_s=5.0, cpu_s=2)) as verifier:
        metrics, results = evaluate_split(model, tokenizer, [PROBLEM], cfg, verifier)
    (r,) = results
    assert r.n == 32 and len(r.answers) == 32
    assert metrics["n_problems"] == 1 and metrics["n_samples"] == 32
    for k in KS:  # one problem: pass@k is the unbiased estimate from its own n and c
        assert metrics[f"pass@{k}"] == pytest.approx(r.pass_at(k))
    assert 0.0 <= metrics["format_compliance"] <= 1.0 and 0.0 <= metrics["unsafe_rate"] <= 1.0
    assert metrics["process_problems"] == 1
    assert 1 / 3 <= metrics["consistency"] <= 1.0  # 3 next lines per prefix: agreement is 1/3, 2/3 or 1
    # prefixes at j = 1 (only a comment in it: no corruption, skipped) and j = 6 (corruptions that break the tests)
    assert metrics["recovery_prefixes"] == 1
    clean = metrics["recovery_clean_pass_rate"]
    assert (metrics["recovery"] is None) == (clean == 0.0)


def test_external_change_against_base_by_hand():
    from tasks.gate import external_change

    # greedy passes on five external problems: base solves 3, the trained model keeps 1 and loses 2
    change = external_change([1, 1, 1, 0, 0], [1, 0, 0, 0, 0])
    assert (change["n_problems"], change["base_pass@1"], change["pass@1"]) == (5, 0.6, 0.2)
    assert (change["delta"], change["n_discordant"]) == (pytest.approx(-0.4), 2)
    # diffs (0, -1, -1, 0, 0): sd sqrt(0.3); t(0.975, 4) = 2.776445 → half-width 2.776445 · sqrt(0.3) / sqrt(5)
    assert change["low"] == pytest.approx(-0.4 - 0.680087, abs=1e-6)
    assert change["high"] == pytest.approx(-0.4 + 0.680087, abs=1e-6)
    # "worse": both losses flipped to gains is 1 of 4 sign patterns as extreme; "better" holds in all 4
    assert (change["p_worse"], change["p_better"]) == (0.25, 1.0)
    with pytest.raises(ValueError, match="same non-empty problems"):
        external_change([1, 0], [1])


def test_the_rl_claim_compares_rl_with_its_start_on_val():
    from tasks.evaluate import rl_claim

    protocol = {"n_samples": 4, "seed": 0, "id": "abc", "engine": "torch", "precision": "f32"}
    dpo = [0.25, 0.25, 0.5, 0.75, 0.25, 0.5, 0.5, 0.25]

    def claim(didpo):
        return rl_claim(dpo, didpo, protocol, "didpo", 0.05, commit="c0ffee")

    # every one of the 8 problems gains 0.25: the exact sign-flip p is 1/2**8 (only the observed pattern is as large)
    better = claim([x + 0.25 for x in dpo])
    assert (better["verdict"], better["p_value"], better["n_problems"]) == ("better", 1 / 256, 8)
    assert better["delta"] == pytest.approx(0.25) and better["samples_per_problem"] == 4
    assert better["engine"] == "torch/f32" and better["commit"] == "c0ffee" and better["start_checkpoint"] == "dpo"
    # every problem loses 0.25: the mirrored test's p is 1/256, and "better" holds in every sign pattern
    worse = claim([x - 0.25 for x in dpo])
    assert (worse["verdict"], worse["p_worse"], worse["p_value"]) == ("worse", 1 / 256, 1.0)
    # one gain and one loss of the same size: no change detected either way
    mixed = claim([0.5, 0.0, *dpo[2:]])
    assert (mixed["verdict"], mixed["delta"], mixed["n_discordant"]) == ("no change detected", 0.0, 2)
    assert mixed["p_value"] == 0.75 and mixed["p_worse"] == 0.75  # patterns of the two changes with sum >= 0: 3 of 4
    with pytest.raises(ValueError):
        rl_claim(dpo, dpo[:3], protocol, "didpo", 0.05)


def test_an_evaluation_is_reused_only_for_the_same_weights_protocol_settings_and_code(tmp_path):
    """evaluation_key covers what determines the figures, and a recomputation gives the reused figures exactly
    (per-sample seeds), so `evaluate_once` may skip it."""
    from dataclasses import replace

    from models.policy import build_tiny_causal_lm
    from sandbox.verifier import Verifier, VerifierConfig
    from tasks.config import VerifierSection
    from tasks.evaluate import evaluate_checkpoint, evaluate_once, evaluation_key

    for seed in (0, 1):
        model, tokenizer = build_tiny_causal_lm(seed=seed)
        model.save_pretrained(tmp_path / f"model{seed}")
        tokenizer.save_pretrained(tmp_path / f"model{seed}")
    code = tmp_path / "code.py"
    code.write_text("x = 1\n")
    cfg = EvaluateConfig(n_samples=4, max_new_tokens=8, process_problems=0)
    key = evaluation_key(tmp_path / "model0", "float32", cfg, "p1", VerifierSection(), [code])
    assert key == evaluation_key(tmp_path / "model0", "float32", cfg, "p1", VerifierSection(), [code])
    # which other checkpoints the run measures does not decide this one's figures
    assert key == evaluation_key(
        tmp_path / "model0", "float32", replace(cfg, checkpoints=("dpo",)), "p1", VerifierSection(), [code]
    )
    changed = [
        evaluation_key(tmp_path / "model1", "float32", cfg, "p1", VerifierSection(), [code]),
        evaluation_key(tmp_path / "model0", "bfloat16", cfg, "p1", VerifierSection(), [code]),
        evaluation_key(tmp_path / "model0", "float32", replace(cfg, n_samples=8), "p1", VerifierSection(), [code]),
        evaluation_key(tmp_path / "model0", "float32", cfg, "p2", VerifierSection(), [code]),
        evaluation_key(tmp_path / "model0", "float32", cfg, "p1", VerifierSection(timeout_s=9.0), [code]),
    ]
    code.write_text("x = 2\n")
    changed.append(evaluation_key(tmp_path / "model0", "float32", cfg, "p1", VerifierSection(), [code]))
    assert len({key, *changed}) == 1 + len(changed)

    problems = {"val": [PROBLEM]}
    with Verifier(VerifierConfig(workers=1, timeout_s=5.0, cpu_s=2)) as verifier:

        def compute(samples):
            calls.append(samples)
            # the task's function: no Prefect API (a task called outside a flow starts a temporary server)
            return evaluate_checkpoint.fn(tmp_path / "model0", "float32", problems, cfg, verifier, samples)

        calls = []
        first = evaluate_once(key, tmp_path / "cache", tmp_path / "run1", lambda: compute(tmp_path / "run1"))
        again = evaluate_once(key, tmp_path / "cache", tmp_path / "run2", lambda: compute(tmp_path / "run2"))
        fresh = compute(tmp_path / "run3")
    assert calls == [tmp_path / "run1", tmp_path / "run3"]  # the second evaluation was reused
    assert first[2] is False and again[2] is True
    assert again[:2] == first[:2]
    assert fresh[1] == first[1]  # recomputed: the same per-problem pass@1 ...
    drop = ("seconds", "export_seconds")
    assert {k: v for k, v in fresh[0].items() if k not in drop} == {k: v for k, v in first[0].items() if k not in drop}
    # ... and the same answers, copied beside the reused figures
    assert (tmp_path / "run2/val.jsonl").read_text() == (tmp_path / "run1/val.jsonl").read_text()
    assert (tmp_path / "run3/val.jsonl").read_text() == (tmp_path / "run1/val.jsonl").read_text()
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [key]  # no temporary folder left


def test_the_evaluation_cache_ignores_watching_code_and_follows_computing_code(tmp_path, monkeypatch):
    """`flows.evaluate.evaluation_code` in a copy of the project: a log line added to tasks/tracking.py, the stage's
    flow or the registry leaves the code list's bytes (so every cached evaluation) as they were; an edit to the
    verifier, the sampler or the stage's task changes them."""
    import hashlib
    import shutil

    from flows.evaluate import evaluation_code

    root = Path(__file__).resolve().parents[1]
    for package in ("models", "sandbox", "datalib", "tasks", "flows"):
        shutil.copytree(root / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.chdir(tmp_path)

    def fingerprint():
        digest = hashlib.sha256()
        for path in evaluation_code():
            digest.update(str(path).encode() + path.read_bytes())
        return digest.hexdigest()

    code = {str(p) for p in evaluation_code()}
    assert {"tasks/evaluate.py", "models/measure.py", "sandbox/verifier.py", "sandbox/worker.py"} <= code
    assert not {"tasks/tracking.py", "tasks/register.py", "flows/evaluate.py"} & code
    before = fingerprint()
    for watching in ("tasks/tracking.py", "flows/evaluate.py", "tasks/register.py", "flows/paths.py"):
        with open(watching, "a") as f:
            f.write("\nprint('a new log line')\n")
    assert fingerprint() == before
    for computing in ("sandbox/verifier.py", "models/sampling.py", "tasks/evaluate.py"):
        with open(computing, "a") as f:
            f.write("\n# changed\n")
        assert fingerprint() != before, computing
        before = fingerprint()
