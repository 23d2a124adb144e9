"""DPO: losses against TRL and by hand, sequence log-probs, the reference hash, cached reference log-probs, exact
resume, accumulation invariance, the CHES filter, the likelihood-displacement monitor and the best-checkpoint rule
(lowest held-out loss, the reference at step 0 included; issue 17).

Tiny random Llama models (`models.policy.build_tiny_causal_lm`), CPU, seconds; TRL is a test oracle only.
"""

from __future__ import annotations

import dataclasses
import math
import types
import warnings

import pytest
import torch

import models.dpo as dpo
from models.checkpoint import CheckpointMismatchError, latest_checkpoint, list_checkpoints, load_checkpoint
from models.dpo import (
    DPOConfig,
    LikelihoodDisplacementWarning,
    ReferenceMismatchError,
    build_pair_examples,
    checkpoint_hash,
    ches_scores,
    collate_pairs,
    ipo_loss,
    orpo_loss,
    robust_loss,
    sequence_logps,
    sigmoid_loss,
    simpo_loss,
    train_dpo,
    verify_reference,
)
from models.policy import build_tiny_causal_lm

BASE = dict(
    batch_size=2,
    max_steps=4,
    warmup_ratio=0.0,
    eval_every=0,
    checkpoint_every=0,
    seed=0,
    learning_rate=5e-3,
    lora_r=4,
    lora_alpha=8.0,
    max_seq_len=128,
    device="cpu",
    epochs=3.0,
)


def pair(i: int) -> dict:
    """A pair whose chosen answer follows the project's format and whose rejected one does not."""
    return {
        "pair_id": f"p{i}",
        "prompt": f"Write a function `add_{i}` that adds two numbers.",
        "chosen": f"The function adds a and b.\n\n```python\ndef add_{i}(a, b):\n    return a + b\n```",
        "rejected": f"def add_{i}(a, b):\n    import os\n    os.system('ls')\n    return a - b" + " # x" * (i % 3),
        "source": "mined",
    }


PAIRS = [pair(i) for i in range(8)]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def random_logps(b: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(-torch.rand(b, generator=g, dtype=torch.float64) * 30 for _ in range(4))


# --------------------------------------------------------------------------------------- losses vs TRL


@pytest.fixture(scope="module")
def trl_trainer(tmp_path_factory):
    """A minimal TRL DPOTrainer on the tiny model; its `_compute_loss` is called with a stub model that returns
    chosen log-probs we choose, so TRL's loss code runs on exactly our tensors."""
    from datasets import Dataset
    from trl import DPOConfig as TRLConfig
    from trl import DPOTrainer

    model, tok = build_tiny_causal_lm(0)
    ds = Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": "hi"}],
                "chosen": [{"role": "assistant", "content": "a"}],
                "rejected": [{"role": "assistant", "content": "b"}],
            }
        ]
    )
    args = TRLConfig(output_dir=str(tmp_path_factory.mktemp("trl")), report_to=[], use_cpu=True)
    trainer = DPOTrainer(
        model=model, ref_model=build_tiny_causal_lm(0)[0], args=args, train_dataset=ds, processing_class=tok
    )
    trainer.precompute_ref_logps = True  # take ref_*_logps from the inputs instead of a reference forward
    return trainer


def trl_loss(trainer, loss_type, beta, label_smoothing, pc, pr, rc, rr, n_chosen, n_rejected):
    """TRL's mean loss and its logged mean rewards on these (B,) log-probs and answer lengths."""
    b, width = len(pc), int(max(n_chosen.max(), n_rejected.max())) + 2
    mask = torch.zeros(2 * b, width, dtype=torch.long)
    for row, n in enumerate(torch.cat([n_chosen, n_rejected]).tolist()):
        mask[row, width - n :] = 1
    log_probs = torch.zeros(2 * b, width - 1, dtype=torch.float64)
    log_probs[:, -1] = torch.cat([pc, pr])  # TRL sums over the sequence: the sum is what we put here
    zeros = torch.zeros(2 * b, width - 1, dtype=torch.float64)

    def stub(**kwargs):
        return types.SimpleNamespace(log_probs=log_probs, entropy=zeros, mean_logits=zeros, is_top1=zeros.bool())

    inputs = {
        "input_ids": torch.ones(2 * b, width, dtype=torch.long),
        "attention_mask": torch.ones(2 * b, width, dtype=torch.long),
        "completion_mask": mask,
        "ref_chosen_logps": rc,
        "ref_rejected_logps": rr,
    }
    trainer.loss_types, trainer.loss_weights = [loss_type], [1.0]
    trainer.beta, trainer.label_smoothing = beta, label_smoothing
    loss = trainer._compute_loss(stub, inputs, False)
    mode = "train" if trainer.model.training else "eval"
    logged = trainer._metrics[mode]
    return loss, logged["rewards/chosen"][-1], logged["rewards/rejected"][-1]


@pytest.mark.parametrize(("loss_type", "beta", "eps"), [("sigmoid", 0.1, 0.0), ("ipo", 0.3, 0.0), ("robust", 0.2, 0.2)])
def test_losses_equal_trl_dpo_trainer(trl_trainer, loss_type, beta, eps):
    pc, pr, rc, rr = random_logps(6, seed=1)
    n_chosen, n_rejected = torch.tensor([3, 7, 1, 12, 5, 9]), torch.tensor([4, 2, 8, 6, 11, 1])
    if loss_type == "sigmoid":
        ours = sigmoid_loss(pc, pr, rc, rr, beta)
    elif loss_type == "ipo":
        ours = ipo_loss(pc, pr, rc, rr, beta, n_chosen, n_rejected)
    else:
        ours = robust_loss(pc, pr, rc, rr, beta, eps)
    losses, chosen_rewards, rejected_rewards = ours
    assert losses.dtype == torch.float64 and losses.shape == (6,)
    trl_mean, trl_chosen, trl_rejected = trl_loss(
        trl_trainer, loss_type, beta, eps, pc, pr, rc, rr, n_chosen, n_rejected
    )
    assert abs(losses.mean().item() - trl_mean.item()) < 1e-6
    assert abs(chosen_rewards.mean().item() - trl_chosen) < 1e-6
    assert abs(rejected_rewards.mean().item() - trl_rejected) < 1e-6
    for k in range(6):  # per pair too, not only the mean
        one = [t[k : k + 1] for t in (pc, pr, rc, rr, n_chosen, n_rejected)]
        trl_one, _, _ = trl_loss(trl_trainer, loss_type, beta, eps, *one)
        assert abs(losses[k].item() - trl_one.item()) < 1e-6


def test_at_step_zero_dpo_loss_is_ln2_and_rewards_zero():
    logps = -torch.tensor([12.5, 3.0, 40.0], dtype=torch.float64)
    other = -torch.tensor([7.0, 9.0, 1.5], dtype=torch.float64)
    for losses, chosen, rejected in (
        sigmoid_loss(logps, other, logps, other, 0.1),
        robust_loss(logps, other, logps, other, 0.1, 0.3),
    ):
        torch.testing.assert_close(losses, torch.full((3,), math.log(2), dtype=torch.float64), atol=1e-12, rtol=0)
        assert torch.equal(chosen, torch.zeros(3, dtype=torch.float64)) and torch.equal(rejected, chosen)
    losses, _, _ = ipo_loss(logps, other, logps, other, 0.5, torch.tensor([3, 4, 5]), torch.tensor([1, 2, 3]))
    torch.testing.assert_close(losses, torch.full((3,), 1.0, dtype=torch.float64))  # (0 − 1/(2·0.5))² = 1


def test_dpo_sign_and_hand_value():
    # chosen log-ratio +2, rejected −1 → −log σ(0.5·3) = log(1 + e^−1.5) = 0.2014132779827524
    losses, chosen, rejected = sigmoid_loss(*[torch.tensor([x], dtype=torch.float64) for x in (-8, -12, -10, -11)], 0.5)
    assert abs(losses.item() - 0.2014132779827524) < 1e-12
    assert chosen.item() == 1.0 and rejected.item() == -0.5


def test_simpo_and_orpo_equal_hand_computed_values():
    chosen, rejected = torch.tensor([-0.5], dtype=torch.float64), torch.tensor([-1.0], dtype=torch.float64)
    # SimPO: −log σ(2·(−0.5) − 2·(−1.0) − 0.5) = −log σ(0.5)
    losses, r_chosen, r_rejected = simpo_loss(chosen, rejected, beta=2.0, gamma=0.5)
    assert abs(losses.item() - 0.47407698418010663) < 1e-12
    assert r_chosen.item() == -1.0 and r_rejected.item() == -2.0
    # ORPO: 0.5 − 2·log σ(log odds(e^−0.5) − log odds(e^−1)), log odds(p) = log p − log(1 − p)
    losses, r_chosen, _ = orpo_loss(chosen, rejected, beta=2.0)
    assert abs(losses.item() - 1.1405995704750733) < 1e-12
    assert r_chosen.item() == -1.0


def test_simpo_and_orpo_terms_equal_trl_cpo_and_orpo_trainers():
    from trl.experimental.cpo.cpo_trainer import CPOTrainer
    from trl.experimental.orpo.orpo_trainer import ORPOTrainer

    chosen, rejected = -torch.rand(5, dtype=torch.float64) * 3, -torch.rand(5, dtype=torch.float64) * 3
    accel = types.SimpleNamespace(device="cpu")
    cpo = types.SimpleNamespace(alpha=0.0, loss_type="simpo", simpo_gamma=0.7, beta=2.5, label_smoothing=0.0)
    cpo.accelerator = accel
    trl_losses, trl_c, trl_r = CPOTrainer.cpo_loss(cpo, chosen, rejected)
    ours, c, r = simpo_loss(chosen, rejected, beta=2.5, gamma=0.7)
    torch.testing.assert_close(ours, trl_losses, atol=1e-6, rtol=0)
    torch.testing.assert_close(c, trl_c, atol=1e-6, rtol=0)
    # TRL's ORPO returns λ·log σ(log odds ratio) (float32) and subtracts it from its NLL; ours adds the NLL per pair
    trl_or, trl_c, _, _, _ = ORPOTrainer.odds_ratio_loss(
        types.SimpleNamespace(beta=0.3, accelerator=accel), chosen, rejected
    )
    ours, c, _ = orpo_loss(chosen, rejected, beta=0.3)
    torch.testing.assert_close(ours, (-chosen - trl_or.double()), atol=1e-6, rtol=0)
    torch.testing.assert_close(c, trl_c.double(), atol=1e-6, rtol=0)


def test_robust_rejects_eps_of_a_half_and_config_validates():
    x = torch.zeros(1)
    with pytest.raises(ValueError, match="label_smoothing"):
        robust_loss(x, x, x, x, 0.1, 0.5)
    with pytest.raises(ValueError, match="loss_type"):
        DPOConfig(loss_type="hinge")
    with pytest.raises(ValueError, match="epochs"):
        DPOConfig(epochs=4.0)
    with pytest.raises(ValueError, match="ches_filter_quantile"):
        DPOConfig(ches_filter_quantile=1.0)


# -------------------------------------------------------------------------------------- log-probs, CHES


def test_sequence_logps_equal_a_naive_masked_sum():
    model, tok = build_tiny_causal_lm(0)
    pairs = build_pair_examples(tok, PAIRS[:3], max_seq_len=128)
    batch = collate_pairs(pairs, tok.pad_token_id)
    with torch.no_grad():
        masked, n_masked = sequence_logps(model, batch, logits_mask=True)
        full, n_full = sequence_logps(model, batch, logits_mask=False)
        logp = torch.log_softmax(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits, -1)
    labels = batch["labels"][:, 1:]
    keep = labels != -100
    naive = (logp[:, :-1].gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1) * keep).sum(-1)
    torch.testing.assert_close(masked, naive, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(full, naive, atol=1e-4, rtol=1e-5)
    expected_n = [
        len(ex["input_ids"]) - ex["n_prompt_tokens"]
        for side in ("chosen", "rejected")
        for ex in [p[side] for p in pairs]
    ]
    assert n_masked.tolist() == n_full.tolist() == expected_n
    assert all(n > 5 for n in expected_n)


def test_pairs_are_validated():
    _, tok = build_tiny_causal_lm(0)
    with pytest.raises(ValueError, match="p0: chosen and rejected are identical"):
        build_pair_examples(tok, [dict(PAIRS[0], rejected=PAIRS[0]["chosen"])], 128)
    with pytest.raises(ValueError, match="'rejected' must be a non-empty string"):
        build_pair_examples(tok, [dict(PAIRS[0], rejected="  ")], 128)


def test_ches_equals_the_definition_on_hidden_states():
    model, tok = build_tiny_causal_lm(0)
    pairs = build_pair_examples(tok, PAIRS[:2], max_seq_len=128)
    scores = ches_scores(model, pairs, batch_size=2, pad_id=tok.pad_token_id)
    for k, p in enumerate(pairs):
        sums = []
        for side in ("chosen", "rejected"):
            ids = torch.tensor([p[side]["input_ids"]])
            with torch.no_grad():
                h = model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0]  # (T, H)
            n_prompt = p[side]["n_prompt_tokens"]
            sums.append(h[n_prompt - 1 : -1].sum(0))  # the positions predicting the answer tokens
        expected = torch.dot(sums[0], sums[1]) - torch.dot(sums[0], sums[0])
        assert abs(scores[k].item() - expected.item()) < 1e-3 * max(1.0, abs(expected.item()))


# ------------------------------------------------------------------------------------------ reference


def test_checkpoint_hash_and_reference_refusal(tmp_path):
    model, tok = build_tiny_causal_lm(0)
    model.save_pretrained(tmp_path / "a")
    model.save_pretrained(tmp_path / "b")
    build_tiny_causal_lm(1)[0].save_pretrained(tmp_path / "other")
    tok.save_pretrained(tmp_path / "b")  # tokenizer files are not hashed
    h = checkpoint_hash(tmp_path / "a")
    assert len(h) == 64 and h == checkpoint_hash(tmp_path / "b")
    other = checkpoint_hash(tmp_path / "other")
    assert other != h
    assert verify_reference(tmp_path / "a", h) == h
    with pytest.raises(ReferenceMismatchError) as err:
        verify_reference(tmp_path / "other", h)
    assert other in str(err.value) and h in str(err.value)
    with pytest.raises(ValueError):  # ReferenceMismatchError is a ValueError
        dpo.load_reference(tmp_path / "other", h)
    with pytest.raises(FileNotFoundError):
        checkpoint_hash(tmp_path)


# ------------------------------------------------------------------------------------------ the loop


class Crash(RuntimeError):
    pass


def counting_reference_logps(monkeypatch) -> list[int]:
    calls = []
    real = dpo.reference_logps

    def spy(model, pairs, *args, **kwargs):
        calls.append(len(pairs))
        return real(model, pairs, *args, **kwargs)

    monkeypatch.setattr(dpo, "reference_logps", spy)
    return calls


def test_first_step_loss_is_ln2_and_reference_logps_are_computed_once(tmp_path, monkeypatch):
    calls = counting_reference_logps(monkeypatch)
    cfg = DPOConfig(**dict(BASE, max_steps=2, eval_every=1, lora_dropout=0.1))
    model, tok = build_tiny_causal_lm(0)
    result = train_dpo(model, tok, PAIRS[:6], PAIRS[6:], cfg, tmp_path)
    assert calls == [6, 2]  # train pairs once, held-out pairs once, never again
    first = next(h for h in result.history if h["step"] == 1 and "dpo/loss" in h)
    # the cached reference log-probs are the policy's own before the first update
    assert abs(first["dpo/loss"] - math.log(2)) < 1e-6
    assert abs(first["dpo/rewards_margin"]) < 1e-6 and first["dpo/rewards_accuracy"] == 0.5  # every pair ties
    start = result.history[0]
    assert start["step"] == 0 and abs(start["dpo/eval_loss"] - math.log(2)) < 1e-6  # float32
    assert result.start_eval["dpo/eval_rewards_margin"] == 0.0
    later = [h for h in result.history if h["step"] == 2 and "dpo/loss" in h][0]
    assert later["dpo/rewards_margin"] > 0  # training moves the margin up
    assert (result.merged_path / "config.json").is_file() and (result.adapter_path / "adapter_config.json").is_file()


def test_exact_resume_uses_the_cached_reference_logps(tmp_path, monkeypatch):
    cfg = DPOConfig(**dict(BASE, max_steps=5, checkpoint_every=2, eval_every=2, lora_dropout=0.2))
    model, tok = build_tiny_causal_lm(0)
    straight = train_dpo(model, tok, PAIRS[:6], PAIRS[6:], cfg, tmp_path / "straight", reference_sha256="abc")
    straight_merged = {k: v.clone() for k, v in model.state_dict().items()}

    def crash_at_step_3(metrics, step):
        if step == 3:
            raise Crash

    model, tok = build_tiny_causal_lm(0)
    with pytest.raises(Crash):
        train_dpo(model, tok, PAIRS[:6], PAIRS[6:], cfg, tmp_path / "resumed", crash_at_step_3, reference_sha256="abc")
    assert [p.name for p in list_checkpoints(tmp_path / "resumed/checkpoints")] == ["checkpoint-00000002"]
    calls = counting_reference_logps(monkeypatch)
    torch.manual_seed(99)  # the crashed process's RNG must not matter
    model, tok = build_tiny_causal_lm(0)
    resumed = train_dpo(model, tok, PAIRS[:6], PAIRS[6:], cfg, tmp_path / "resumed", reference_sha256="abc")
    assert calls == []  # read back from the checkpoint, not recomputed
    assert resumed.history == straight.history and resumed.global_step == straight.global_step == 5
    assert resumed.best_step == straight.best_step and resumed.best_eval == straight.best_eval
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, straight_merged[key], atol=1e-6, rtol=0)
    with pytest.raises(CheckpointMismatchError, match="another reference"):
        train_dpo(
            build_tiny_causal_lm(0)[0], tok, PAIRS[:6], PAIRS[6:], cfg, tmp_path / "resumed", reference_sha256="zzz"
        )


# ------------------------------------------------------------------- the best checkpoint (issue 17, item 6)

SWAPPED = [dict(p, chosen=p["rejected"], rejected=p["chosen"]) for p in PAIRS[6:]]  # held out against the training


def eval_losses(result) -> dict[int, float]:
    return {h["step"]: h["dpo/eval_loss"] for h in result.history if "dpo/eval_loss" in h}


def assert_reference_weights(merged_path):
    """The exported merged weights are the reference's (`build_tiny_causal_lm(0)`), bit for bit."""
    from safetensors.torch import load_file

    reference = build_tiny_causal_lm(0)[0].state_dict()
    merged = load_file(merged_path / "model.safetensors")
    assert merged and all(torch.equal(value, reference[key]) for key, value in merged.items())


def test_tied_pairs_count_half_in_the_accuracy():
    cfg = DPOConfig(**BASE)
    ref = torch.tensor([-5.0, -5.0, -5.0]), torch.tensor([-6.0, -6.0, -6.0])
    n = torch.tensor([3, 3, 3])
    at_reference = dpo.pair_metrics(cfg, *ref, *ref, n, n)
    assert at_reference["dpo/rewards_accuracy"] == 0.5 and at_reference["dpo/rewards_margin"] == 0.0
    # pair 0 right, pair 1 tied, pair 2 wrong: (1 + 0.5 + 0) / 3
    moved = dpo.pair_metrics(cfg, torch.tensor([-4.0, -5.0, -6.0]), torch.tensor([-6.0, -6.0, -5.0]), *ref, n, n)
    assert abs(moved["dpo/rewards_accuracy"] - 0.5) < 1e-7
    moved = dpo.pair_metrics(cfg, torch.tensor([-4.0, -4.0, -5.0]), torch.tensor([-6.0, -6.0, -6.0]), *ref, n, n)
    assert abs(moved["dpo/rewards_accuracy"] - 2.5 / 3) < 1e-7


def test_updates_that_worsen_the_held_out_loss_export_the_reference(tmp_path):
    cfg = DPOConfig(**dict(BASE, max_steps=6, eval_every=1, early_stopping_patience=2))
    model, tok = build_tiny_causal_lm(0)
    result = train_dpo(model, tok, PAIRS[:6], SWAPPED, cfg, tmp_path)
    losses = eval_losses(result)
    assert abs(losses[0] - math.log(2)) < 1e-6 and all(losses[s] > losses[0] for s in (1, 2))
    assert result.best_step == 0 and result.kept_reference and result.best_eval == result.start_eval
    assert result.stopped_early and result.global_step == 2  # two evaluations in a row no better than step 0
    assert "no update beat the reference's held-out loss 0.6931" in result.selection
    assert_reference_weights(result.merged_path)


def test_the_lowest_held_out_loss_is_exported_and_stops_early(tmp_path, monkeypatch):
    """Planted held-out losses (the real ones replaced after step 0): step 2 is the best; two worse evaluations after
    it stop the run at step 4, so steps 5 and 6 (lower still) are never reached; step 2's adapter is exported."""
    planted = iter([0.70, 0.60, 0.65, 0.62, 0.50, 0.40])
    real = dpo.pair_metrics
    seen = []

    def plant(*args, **kwargs):
        metrics = real(*args, **kwargs)
        if "dpo/eval_" in (kwargs.get("prefix"), *args[7:]):  # a held-out evaluation
            seen.append(metrics["dpo/eval_loss"])
            if len(seen) > 1:  # the reference's own evaluation at step 0 is kept
                metrics["dpo/eval_loss"] = next(planted)
        return metrics

    monkeypatch.setattr(dpo, "pair_metrics", plant)
    cfg = DPOConfig(**dict(BASE, max_steps=6, eval_every=1, early_stopping_patience=2))
    model, tok = build_tiny_causal_lm(0)
    adapters = {}

    def snapshot(metrics, step):  # the adapter as evaluated at `step`
        if "dpo/eval_loss" in metrics:
            adapters[step] = {
                "base_model.model." + n.replace(".default", ""): p.detach().clone()
                for n, p in model.named_parameters()
                if "lora_" in n
            }

    result = train_dpo(model, tok, PAIRS[:6], PAIRS[6:], cfg, tmp_path, snapshot)
    assert eval_losses(result) == {0: pytest.approx(math.log(2)), 1: 0.70, 2: 0.60, 3: 0.65, 4: 0.62}
    assert result.best_step == 2 and result.best_eval["dpo/eval_loss"] == 0.60 and not result.kept_reference
    assert result.stopped_early and result.global_step == 4
    assert result.selection == "step 2: held-out loss 0.6000 < the reference's 0.6931"
    from safetensors.torch import load_file

    exported = load_file(result.adapter_path / "adapter_model.safetensors")
    assert exported.keys() == adapters[2].keys()
    assert all(torch.equal(exported[k], adapters[2][k]) for k in exported)
    assert not all(torch.equal(exported[k], adapters[4][k]) for k in exported)


def test_resume_keeps_the_best_so_far(tmp_path):
    """A run that crashed after its step-2 checkpoint, with the reference best so far, still exports the reference."""
    cfg = DPOConfig(**dict(BASE, max_steps=4, eval_every=1, checkpoint_every=2, early_stopping_patience=0))
    straight = train_dpo(*build_tiny_causal_lm(0), PAIRS[:6], SWAPPED, cfg, tmp_path / "straight")

    def crash_at_step_3(metrics, step):
        if step == 3:
            raise Crash

    with pytest.raises(Crash):
        train_dpo(*build_tiny_causal_lm(0), PAIRS[:6], SWAPPED, cfg, tmp_path / "resumed", crash_at_step_3)
    saved = load_checkpoint(latest_checkpoint(tmp_path / "resumed/checkpoints"))
    assert saved.step == 2 and saved.state["early_stopping"]["best_step"] == 0
    assert abs(saved.state["early_stopping"]["best"] - math.log(2)) < 1e-6 and "best" in saved.tensors
    resumed = train_dpo(*build_tiny_causal_lm(0), PAIRS[:6], SWAPPED, cfg, tmp_path / "resumed")
    assert resumed.history == straight.history and resumed.global_step == 4
    assert resumed.best_step == straight.best_step == 0 and resumed.kept_reference and straight.kept_reference
    assert resumed.selection == straight.selection
    assert_reference_weights(resumed.merged_path)


def test_a_new_run_deletes_the_previous_checkpoint_only_after_saving_its_own(tmp_path):
    """Issue 15: starting over (resume=False) keeps the previous run's checkpoint until this run has saved."""
    ckpts = tmp_path / "checkpoints"
    old_cfg = DPOConfig(**dict(BASE, max_steps=3, checkpoint_every=3))
    model, tok = build_tiny_causal_lm(0)
    train_dpo(model, tok, PAIRS, [], old_cfg, tmp_path, reference_sha256="abc")
    (old,) = list_checkpoints(ckpts)
    old_state = load_checkpoint(old).state
    new_cfg = dataclasses.replace(old_cfg, learning_rate=1e-3, checkpoint_every=2)  # saves at steps 2 and 3

    def crash_at_step_1(metrics, step):
        raise Crash

    with pytest.raises(Crash):
        train_dpo(build_tiny_causal_lm(0)[0], tok, PAIRS, [], new_cfg, tmp_path, crash_at_step_1, resume=False)
    assert list_checkpoints(ckpts) == [old] and load_checkpoint(old).state == old_state

    listings = {}

    def watch(metrics, step):  # emitted before the step's checkpoint
        listings[step] = [p.name for p in list_checkpoints(ckpts)]

    train_dpo(build_tiny_causal_lm(0)[0], tok, PAIRS, [], new_cfg, tmp_path, watch, resume=False)
    assert listings == {1: [old.name], 2: [old.name], 3: ["checkpoint-00000002"]}
    (new,) = list_checkpoints(ckpts)
    assert new.name == "checkpoint-00000003" and load_checkpoint(new).state["fingerprint"] != old_state["fingerprint"]


def test_max_seq_len_below_the_longest_prompt_names_dpo_max_seq_len(tmp_path):
    _, tok = build_tiny_causal_lm(0)
    rows = [dict(p) for p in PAIRS[:4]]
    rows[2]["prompt"] += " Use integer arithmetic only and document both parameters."
    n_prompt = [e["chosen"]["n_prompt_tokens"] for e in build_pair_examples(tok, rows, max_seq_len=512)]
    longest = max(n_prompt)
    assert n_prompt.index(longest) == 2
    with pytest.raises(ValueError) as info:
        train_dpo(build_tiny_causal_lm(0)[0], tok, rows, [], DPOConfig(**dict(BASE, max_seq_len=longest)), tmp_path)
    assert (
        f"dpo.max_seq_len={longest} leaves no room for the answer of 1 of 4 rows: the longest prompt (p2) has "
        f"{longest} tokens; set dpo.max_seq_len > {longest}"
    ) in str(info.value)
    assert not (tmp_path / "checkpoints").exists()


def test_grad_accumulation_2x2_equals_batch_4(tmp_path):
    results = {}
    for name, batch, accum in (("big", 4, 1), ("accum", 2, 2)):
        cfg = DPOConfig(**dict(BASE, batch_size=batch, grad_accum_steps=accum, max_steps=2, lora_dropout=0.0))
        model, tok = build_tiny_causal_lm(0)
        result = train_dpo(model, tok, PAIRS, [], cfg, tmp_path / name)
        results[name] = (result, {k: v.clone() for k, v in model.state_dict().items()})
    for key, value in results["big"][1].items():
        torch.testing.assert_close(results["accum"][1][key], value, atol=1e-5, rtol=1e-4)
    for a, b in zip(results["big"][0].history, results["accum"][0].history, strict=True):
        assert abs(a["dpo/loss"] - b["dpo/loss"]) < 1e-5


def test_ches_filter_drops_the_top_quantile(tmp_path):
    cfg = DPOConfig(**dict(BASE, max_steps=1, checkpoint_every=1, ches_filter_quantile=0.25))
    model, tok = build_tiny_causal_lm(0)
    scores = ches_scores(model, build_pair_examples(tok, PAIRS, 128), 4, tok.pad_token_id)  # the reference's
    result = train_dpo(model, tok, PAIRS, [], cfg, tmp_path)
    assert result.n_ches_filtered == 2 and result.n_train_pairs == 6
    kept = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints")).state["kept_pairs"]
    top_two = set(scores.argsort(descending=True)[:2].tolist())
    assert sorted(set(range(8)) - set(kept)) == sorted(top_two)
    assert scores[list(top_two)].min() > scores[kept].max()
    no_filter = DPOConfig(**dict(BASE, max_steps=1))
    assert train_dpo(build_tiny_causal_lm(0)[0], tok, PAIRS, [], no_filter, tmp_path / "all").n_ches_filtered == 0


def near_duplicates(n: int) -> list[dict]:
    """Pairs whose rejected answer is the chosen one plus a trailing sentence: near-duplicates (high CHES)."""
    body = "The sum.\n```python\n" + "def add(a, b):\n    return a + b\n" * 3 + "```"
    return [
        {"prompt": f"Add two numbers, variant {i}.", "chosen": body, "rejected": body + "\nAnd more text after it."}
        for i in range(n)
    ]


def test_near_duplicate_pairs_trigger_the_displacement_monitor(tmp_path):
    cfg = DPOConfig(
        **dict(
            BASE,
            max_steps=20,
            eval_every=1,
            learning_rate=1e-2,
            beta=0.1,
            displacement_threshold=2.0,
            early_stopping_patience=0,
            lora_r=8,
        )
    )
    rows = near_duplicates(8)
    model, tok = build_tiny_causal_lm(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = train_dpo(model, tok, rows[:6], rows[6:], cfg, tmp_path / "dup")
    assert result.displacement and result.stopped_early
    assert result.displacement_step is not None and result.global_step == result.displacement_step < 9
    assert any(issubclass(w.category, LikelihoodDisplacementWarning) for w in caught)
    fired = [h for h in result.history if h.get("dpo/eval_displaced") == 1.0]
    assert len(fired) == 1 and fired[0]["step"] == result.displacement_step
    assert fired[0]["dpo/eval_chosen_logp_drop"] > 2.0 and fired[0]["dpo/eval_rewards_margin"] > 0
    # the exported weights are the best evaluation before displacement, never the displaced ones
    assert result.best_step is not None and result.best_step < result.displacement_step
    # the same run on distinct pairs goes to the end (3 epochs of 6 pairs / batch 2 = 9 steps) without displacement
    model, tok = build_tiny_causal_lm(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        distinct = train_dpo(model, tok, PAIRS[:6], PAIRS[6:], cfg, tmp_path / "distinct")
    assert not distinct.displacement and distinct.global_step == 9
    assert not any(issubclass(w.category, LikelihoodDisplacementWarning) for w in caught)


def test_displacement_condition():
    start = {"dpo/eval_logps_chosen": -10.0, "dpo/eval_rewards_margin": 0.0}
    assert dpo.displaced(start, {"dpo/eval_logps_chosen": -12.0, "dpo/eval_rewards_margin": 0.5}, 1.0)
    assert not dpo.displaced(start, {"dpo/eval_logps_chosen": -10.5, "dpo/eval_rewards_margin": 0.5}, 1.0)
    assert not dpo.displaced(start, {"dpo/eval_logps_chosen": -12.0, "dpo/eval_rewards_margin": -0.1}, 1.0)
    assert not dpo.displaced(start, {"dpo/eval_logps_chosen": -99.0, "dpo/eval_rewards_margin": 9.0}, 0.0)


def test_select_pairs_prefers_on_policy_and_human_pairs_then_samples_the_rest():
    from models.dpo import select_pairs

    pairs = [{"prompt": str(i), "source": "mined"} for i in range(10)]
    pairs[3]["source"], pairs[7]["source"], pairs[8]["source"] = "selfplay", "human", "selfplay"
    assert select_pairs(pairs, 0, seed=0) == pairs and select_pairs(pairs, 10, seed=0) == pairs
    two = select_pairs(pairs, 2, seed=0)
    assert [p["prompt"] for p in two] == ["3", "7"]  # the first two non-mined, input order kept
    five = select_pairs(pairs, 5, seed=1)
    assert len(five) == 5 and {"3", "7", "8"} <= {p["prompt"] for p in five}
    assert five == sorted(five, key=lambda p: int(p["prompt"]))
    assert select_pairs(pairs, 5, seed=1) == five  # seeded
    assert any(select_pairs(pairs, 5, seed=s) != five for s in range(2, 8))  # the mined fill depends on the seed
