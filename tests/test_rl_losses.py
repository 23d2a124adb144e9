"""RL losses: hand-computed PPO clip-higher and value-loss values, k3 KL, entropy; GRPO/DAPO advantages and losses
equal TRL GRPOTrainer's own code path on identical inputs (TRL 1.16 as the oracle, a dev dependency only)."""

from __future__ import annotations

import math

import pytest
import torch

from models.advantages import group_advantages
from models.rl_losses import entropy_from_logits, grpo_loss, kl_k3, ppo_policy_loss, value_loss

# ------------------------------------------------------------------------------------------------ by hand


def test_ppo_policy_loss_by_hand():
    # row 0: ratios 1.5, 0.5, 1.0 with A = +1 (per sequence); row 1: ratios 0.5, 1.2 with A = −2, then padding
    old = torch.zeros(2, 3)
    new = torch.log(torch.tensor([[1.5, 0.5, 1.0], [0.5, 1.2, 1.0]])).requires_grad_()
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    loss, stats = ppo_policy_loss(new, old, torch.tensor([1.0, -2.0]), mask, eps_low=0.2, eps_high=0.28)
    # per token −min(ρA, clip(ρ, 0.8, 1.28)A):
    #   row 0 (A = 1): −min(1.5, 1.28) = −1.28; −min(0.5, 0.8) = −0.5; −1
    #   row 1 (A = −2): −min(−1, −1.6) = 1.6; −min(−2.4, −2.4) = 2.4
    # token mean over 5 tokens: (−1.28 − 0.5 − 1 + 1.6 + 2.4)/5 = 0.244
    assert loss.item() == pytest.approx(0.244, abs=1e-6)
    # high clip: ρ = 1.5 > 1.28 with A > 0 (1 of 5); low clip: ρ = 0.5 < 0.8 with A < 0 (1 of 5)
    assert stats["clip_frac/high"] == pytest.approx(0.2) and stats["clip_frac/low"] == pytest.approx(0.2)
    assert stats["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1 + 0.5 + 1.2) / 5, abs=1e-6)
    # k3 of old vs new: (ρ − 1) − log ρ
    k3 = [(r - 1) - math.log(r) for r in (1.5, 0.5, 1.0, 0.5, 1.2)]
    assert stats["approx_kl"] == pytest.approx(sum(k3) / 5, abs=1e-6)
    loss.backward()
    # gradient flows only through unclipped terms: d(−ρA)/dlogρ = −ρA/5; clipped tokens (1.5, row 1's 0.5) get 0
    expected = torch.tensor([[0.0, -0.5, -1.0], [0.0, 2 * 1.2, 0.0]]) / 5
    torch.testing.assert_close(new.grad, expected)


def test_ppo_policy_loss_accepts_per_token_advantages_and_checks_shapes():
    new = torch.tensor([[0.1, -0.2]])
    adv = torch.tensor([[1.0, -1.0]])
    loss, _ = ppo_policy_loss(new, new.clone(), adv, torch.ones(1, 2))
    assert loss.item() == pytest.approx(0.0)  # ratio 1: −(1·1) − (1·(−1)) = 0
    with pytest.raises(ValueError, match="one shape"):
        ppo_policy_loss(new, torch.zeros(1, 3), adv, torch.ones(1, 2))
    with pytest.raises(ValueError, match="advantages"):
        ppo_policy_loss(new, new, torch.ones(1, 3), torch.ones(1, 2))


def test_value_loss_by_hand():
    values = torch.tensor([[1.0, 0.0, 5.0]], requires_grad=True)
    old = torch.tensor([[0.5, 0.5, 0.0]])
    returns = torch.tensor([[2.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, stats = value_loss(values, old, returns, mask, clip_eps=0.2)
    # token 0: V 1 → clipped 0.7; (1 − 2)² = 1, (0.7 − 2)² = 1.69 → 1.69 (clipped term larger)
    # token 1: V 0 → clipped 0.3; (0 − 0)² = 0, 0.09 → 0.09 (clipped term larger); token 2 padding
    # ½ · (1.69 + 0.09)/2 = 0.445
    assert loss.item() == pytest.approx(0.445, abs=1e-6)
    assert stats["vf_clip_frac"] == pytest.approx(1.0)
    # explained variance over R = [2, 0], R − V = [1, 0]: 1 − Var[1, 0]/Var[2, 0] = 1 − 0.25/1
    assert stats["explained_variance"] == pytest.approx(0.75)
    unclipped, stats = value_loss(values, old, returns, mask, clip_eps=None)
    assert unclipped.item() == pytest.approx(0.5 * (1.0 + 0.0) / 2)
    assert stats["vf_clip_frac"] == 0.0
    _, flat = value_loss(values, old, torch.ones(1, 3), mask, clip_eps=None)
    assert math.isnan(flat["explained_variance"])  # Var[R] = 0
    with pytest.raises(ValueError, match="clip_eps"):
        value_loss(values, old, returns, mask, clip_eps=0.0)


def test_kl_k3_by_hand_and_unbiased():
    logp, ref = torch.tensor([[0.0, -1.0]]), torch.tensor([[-1.0, -1.0]])
    # exp(−1) − (−1) − 1 = e⁻¹; equal log-probs → 0
    torch.testing.assert_close(kl_k3(logp, ref), torch.tensor([[math.exp(-1.0), 0.0]]))
    # E_{a~p}[k3] = KL(p ‖ q) exactly, over a small categorical
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.2, 0.6])
    expectation = (p * kl_k3(p.log(), q.log())).sum()
    torch.testing.assert_close(expectation, (p * (p / q).log()).sum())


def test_entropy_from_logits():
    logits = torch.zeros(2, 3, 5)
    logits[1, 0] = torch.tensor([100.0, 0.0, 0.0, 0.0, 0.0])  # near one-hot: entropy ≈ 0
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # uniform over 5 → log 5 on tokens (0, 0), (0, 1); ≈ 0 on (1, 0): mean 2·log 5 / 3
    assert entropy_from_logits(logits, mask).item() == pytest.approx(2 * math.log(5) / 3, abs=1e-6)
    import trl.trainer.utils as trl_utils

    random_logits = torch.randn(3, 4, 11, generator=torch.Generator().manual_seed(0))
    full = torch.ones(3, 4)
    assert entropy_from_logits(random_logits, full).item() == pytest.approx(
        trl_utils.entropy_from_logits(random_logits).mean().item(), abs=1e-6
    )


# ------------------------------------------------------------------------------------------------ TRL as the oracle

GROUP = 4
BATCH = 8
REWARDS = [1.0, 0.0, 0.5, 0.5, 0.25, 0.25, 0.25, 0.25]  # the second group has equal rewards (std 0)


@pytest.fixture(scope="module")
def trl_trainer(tmp_path_factory):
    """A real GRPOTrainer (loss_type "dapo", epsilon_high 0.28, β = 0) on the tiny model, with a reward function
    returning `REWARDS` in order."""
    import trl
    from datasets import Dataset

    from models.policy import build_tiny_causal_lm

    model, tokenizer = build_tiny_causal_lm(0)

    def reward(completions, **kwargs):
        return list(REWARDS[: len(completions)])

    args = trl.GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("trl")),
        per_device_train_batch_size=BATCH,
        num_generations=GROUP,
        max_completion_length=4,
        loss_type="dapo",
        epsilon=0.2,
        epsilon_high=0.28,
        beta=0.0,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        seed=0,
    )
    dataset = Dataset.from_dict({"prompt": ["a", "b"]})
    return trl.GRPOTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=dataset, processing_class=tokenizer
    )


def test_group_advantages_equal_trl(trl_trainer):
    inputs = [{"prompt": "a"}] * GROUP + [{"prompt": "b"}] * GROUP
    out = trl_trainer._generate_and_score_completions(inputs)
    ours = group_advantages(torch.tensor(REWARDS), GROUP)
    torch.testing.assert_close(ours, out["advantages"].float())
    assert ours[GROUP:].abs().max() == 0.0


def trl_compute_loss(trl_trainer, monkeypatch, loss_type, new, mask, old, advantages, **extra):
    """TRL's own `_compute_loss` on prepared log-probs: the forward pass is replaced by `new` (the same tensor our
    side starts from), in eval mode (no gradient-accumulation rescaling). Returns ``(loss, logps)`` after backward,
    the log-probs holding TRL's gradient. `extra`: more inputs (e.g. ``importance_sampling_ratio``)."""
    batch, width = new.shape
    trl_logps = new.clone().requires_grad_()
    monkeypatch.setattr(
        trl_trainer,
        "_get_per_token_logps_and_entropies",
        lambda *a, **k: (trl_logps, torch.zeros(batch, width), None),
    )
    monkeypatch.setattr(trl_trainer, "loss_type", loss_type)
    trl_trainer.model.eval()
    inputs = {
        "prompt_ids": torch.ones(batch, 2, dtype=torch.long),
        "prompt_mask": torch.ones(batch, 2, dtype=torch.long),
        "completion_ids": torch.ones(batch, width, dtype=torch.long),
        "completion_mask": mask,
        "advantages": advantages,
        "old_per_token_logps": old,
        "num_items_in_batch": mask.sum(),
        **extra,
    }
    loss = trl_trainer._compute_loss(trl_trainer.model, inputs)
    loss.backward()
    return loss, trl_logps


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_grpo_losses_equal_trl_compute_loss(trl_trainer, loss_type, monkeypatch):
    g = torch.Generator().manual_seed(1)
    width = 6
    lengths = [6, 3, 1, 5, 6, 2, 4, 6]
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
    old = -torch.rand(BATCH, width, generator=g) * 3
    new = (old + torch.randn(BATCH, width, generator=g) * 0.4).detach()
    advantages = torch.randn(BATCH, generator=g)

    trl_trainer._metrics["eval"].clear()
    trl_loss, trl_logps = trl_compute_loss(trl_trainer, monkeypatch, loss_type, new, mask, old, advantages)

    ours_logps = new.clone().requires_grad_()
    loss, stats = grpo_loss(ours_logps, old, advantages, mask, eps_low=0.2, eps_high=0.28, loss_type=loss_type)
    loss.backward()
    torch.testing.assert_close(loss, trl_loss.detach())
    # equal gradients per token = equal per-token loss terms and weights
    torch.testing.assert_close(ours_logps.grad, trl_logps.grad)
    metrics = trl_trainer._metrics["eval"]
    assert stats["clip_frac/low"] == pytest.approx(metrics["clip_ratio/low_mean"][-1], abs=1e-7)
    assert stats["clip_frac/high"] == pytest.approx(metrics["clip_ratio/high_mean"][-1], abs=1e-7)
    assert stats["clip_frac/low"] > 0 and stats["clip_frac/high"] > 0  # the inputs exercise both clips


def test_grpo_loss_rejects_unknown_type():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="loss_type"):
        grpo_loss(x, x, torch.zeros(1), torch.ones(1, 2), loss_type="bnpo")


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_truncated_importance_weights_equal_trl_compute_loss(trl_trainer, loss_type, monkeypatch):
    """TRL's vLLM importance-sampling correction in ``token_truncate`` mode (w = min(exp(old − sampling), C) per
    token, multiplied into the per-token loss before aggregation) against ours: `truncated_is_weights` + grpo_loss's
    ``is_weights``, same tensors on both sides."""
    from models.rl import truncated_is_weights

    g = torch.Generator().manual_seed(2)
    width, cap = 6, 2.0
    lengths = [6, 3, 1, 5, 6, 2, 4, 6]
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
    old = -torch.rand(BATCH, width, generator=g) * 3
    sampling = old + torch.randn(BATCH, width, generator=g) * 0.8  # the engine's log-probs: some weights > cap
    new = (old + torch.randn(BATCH, width, generator=g) * 0.4).detach()
    advantages = torch.randn(BATCH, generator=g)
    weights, capped = truncated_is_weights(old, sampling, cap)
    assert 0 < float((capped * mask).sum()) < float(mask.sum())  # the cap binds on some tokens, not all

    monkeypatch.setattr(trl_trainer, "use_vllm", True)
    monkeypatch.setattr(trl_trainer, "vllm_importance_sampling_correction", True)
    # TRL's ratio (its `_generate_and_score_completions`, mode token_truncate, clip_max = cap), masked as TRL does
    trl_ratio = torch.clamp(torch.exp((old - sampling) * mask), max=cap)
    trl_loss, trl_logps = trl_compute_loss(
        trl_trainer, monkeypatch, loss_type, new, mask, old, advantages, importance_sampling_ratio=trl_ratio
    )

    ours_logps = new.clone().requires_grad_()
    loss, _ = grpo_loss(ours_logps, old, advantages, mask, 0.2, 0.28, loss_type, is_weights=weights * mask)
    loss.backward()
    torch.testing.assert_close(loss, trl_loss.detach())
    torch.testing.assert_close(ours_logps.grad, trl_logps.grad)
