"""The selfplay and dpo stage tasks on tiny inputs: fake verifier, tiny model, a temporary SFT checkpoint."""

from __future__ import annotations

import json

import pytest
import torch

from models.config import SelfplayConfig
from models.dpo import DPOConfig, ReferenceMismatchError, checkpoint_hash, split_pairs
from models.policy import build_tiny_causal_lm
from sandbox.verifier import Verdict
from tasks.dpo import expected_reference_hash, run_dpo, smoke_check
from tasks.io import read_pairs
from tasks.selfplay import generate_selfplay_pairs, write_pairs
from tests.test_dpo import BASE, PAIRS

PROBLEMS = [
    {
        "task_id": f"t/{i}",
        "instruction": f"Write a function `f{i}` that returns one.",
        "prompt": f"def f{i}():\n",
        "entry_point": f"f{i}",
        "test": "def check(candidate):\n    assert candidate() == 1\n",
        "split": "train",
        "source": "generated:v1",
    }
    for i in range(2)
]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class FakeVerifier:
    """Passes the i-th program with test fraction 1 when i is even, 0 otherwise (the answers' content is noise)."""

    def __init__(self):
        self.jobs = []

    def check_many(self, jobs, progress=False):
        self.jobs += list(jobs)
        return [
            Verdict(i % 2 == 0, 1, int(i % 2 == 0), (), "ok" if i % 2 == 0 else "assertion", 0.0)
            for i, _ in enumerate(jobs)
        ]


def test_generate_selfplay_pairs_samples_k_and_pairs_by_verdict():
    model, tok = build_tiny_causal_lm(0)
    verifier = FakeVerifier()
    cfg = SelfplayConfig(n_prompts=2, k=4, max_new_tokens=8)
    pairs, stats = generate_selfplay_pairs.fn(model, tok, PROBLEMS, cfg, verifier)
    assert len(verifier.jobs) == 8 and stats["n_answers"] == 8 and stats["n_prompts"] == 2
    assert stats["answer_test_pass_rate"] == 0.5
    # a random tiny model writes no parsable code, so nothing is eligible to be chosen: no pairs, by the pre-filter
    assert stats["n_selfplay_pairs"] == len(pairs)
    # every prompt without a pair is counted under its reason (the stage's warning when there is none)
    no_pair = {k: v for k, v in stats.items() if k.startswith("no_pair/")}
    assert len(no_pair) == 5 and sum(no_pair.values()) == 2 - len(pairs)
    for pair in pairs:
        assert pair["source"] == "selfplay" and pair["chosen_score"][0] == 1.0 and pair["rejected_score"][0] == 0.0


def test_pairs_round_trip_and_split_by_prompt(tmp_path):
    rows = [dict(p, prompt=f"prompt {i // 2}") for i, p in enumerate(PAIRS * 4)]  # 2 pairs per prompt
    write_pairs.fn(rows, tmp_path / "pairs.jsonl")
    assert read_pairs(tmp_path / "pairs.jsonl") == rows and read_pairs(tmp_path / "missing.jsonl") == []
    train, held_out = split_pairs(rows, 0.3)
    assert len(train) + len(held_out) == 32 and 0 < len(held_out) < 32
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held_out}  # no prompt on both sides
    assert split_pairs(rows[::-1], 0.3)[1] == held_out[::-1]  # order-independent membership
    assert split_pairs(rows, 0.0) == (rows, [])


def test_expected_hash_from_sft_metrics_or_computed(tmp_path):
    model, _ = build_tiny_causal_lm(0)
    model.save_pretrained(tmp_path / "merged")
    assert expected_reference_hash(tmp_path / "none.json", tmp_path / "merged") == (
        checkpoint_hash(tmp_path / "merged"),
        "computed",
    )
    (tmp_path / "metrics.json").write_text(json.dumps({"merged_sha256": "f" * 64}))
    assert expected_reference_hash(tmp_path / "metrics.json", tmp_path / "merged") == ("f" * 64, "sft_metrics")


def test_run_dpo_refuses_another_reference_and_trains_on_the_right_one(tmp_path, monkeypatch):
    emitted = []
    monkeypatch.setattr("tasks.dpo.mlflow_emit", lambda metrics, step: emitted.append((step, metrics)))
    model, tok = build_tiny_causal_lm(0)
    model.save_pretrained(tmp_path / "merged")
    tok.save_pretrained(tmp_path / "merged")
    cfg = DPOConfig(**dict(BASE, max_steps=2, eval_every=1))
    with pytest.raises(ReferenceMismatchError, match="0" * 64):
        run_dpo.fn(tmp_path / "merged", "0" * 64, "float32", PAIRS[:6], PAIRS[6:], cfg, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    expected = checkpoint_hash(tmp_path / "merged")
    metrics, history = run_dpo.fn(tmp_path / "merged", expected, "float32", PAIRS[:6], PAIRS[6:], cfg, tmp_path / "out")
    assert metrics["global_step"] == 2 and metrics["n_train_pairs"] == 6 and metrics["n_held_out_pairs"] == 2
    assert history[0]["step"] == 0 and (tmp_path / "out/merged/config.json").is_file()
    assert [step for step, _ in emitted] == [h["step"] for h in history]
    assert metrics["kept_reference"] == (metrics["best_step"] == 0) and metrics["selection"].startswith(
        f"step {metrics['best_step']}:" if metrics["best_step"] else "no update beat"
    )


def test_the_before_after_check_is_named_a_smoke_check():
    """Issue 17: greedy answers on n val problems cannot show a change below about 6/n; the keys say so."""
    before = {"n_problems": 10, "format_compliance": 1.0, "unsafe_rate": 0.0, "greedy_pass": 0.3}
    after = dict(before, greedy_pass=0.4)
    section, logged = smoke_check(before, after)
    assert section["before"] == before and section["after"] == after and section["n_problems"] == 10
    assert "smoke check, not a measurement" in section["note"] and "6/10" in section["note"]
    assert logged == {
        "dpo/smoke_n_problems": 10,
        "dpo/smoke_format_compliance_before": 1.0,
        "dpo/smoke_unsafe_rate_before": 0.0,
        "dpo/smoke_greedy_pass_before": 0.3,
        "dpo/smoke_format_compliance_after": 1.0,
        "dpo/smoke_unsafe_rate_after": 0.0,
        "dpo/smoke_greedy_pass_after": 0.4,
    }
    assert not any("pass@1" in key for key in logged)
    assert smoke_check({"n_problems": 0}, {"n_problems": 0})[1] == {"dpo/smoke_n_problems": 0}
