"""Advantages: GAE against a naive double loop (ragged rows, per-row λ), VAPO's adaptive λ, GRPO group advantages,
masked whitening, running reward statistics with resume, reward clipping."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.advantages import (
    RunningMeanStd,
    adaptive_lambda,
    clip_rewards,
    didpo_group_advantages,
    gae,
    group_advantages,
    whiten,
)


def naive_gae(rewards, values, lengths, gamma, lams):
    """A plain double loop (cleanrl's reversed loop, one row at a time, bootstrap 0 after the row's last token)."""
    batch, width = rewards.shape
    advantages = np.zeros((batch, width))
    for b in range(batch):
        last = 0.0
        for t in reversed(range(lengths[b])):
            next_value = values[b, t + 1] if t + 1 < lengths[b] else 0.0
            delta = rewards[b, t] + gamma * next_value - values[b, t]
            last = delta + gamma * lams[b] * last
            advantages[b, t] = last
    returns = advantages.copy()
    for b in range(batch):
        returns[b, : lengths[b]] += values[b, : lengths[b]]
    return advantages, returns


@pytest.mark.parametrize("gamma", [1.0, 0.9])
@pytest.mark.parametrize("per_row_lambda", [False, True])
def test_gae_equals_a_naive_double_loop_on_ragged_rows(gamma, per_row_lambda):
    g = torch.Generator().manual_seed(int(gamma * 10) + per_row_lambda)
    lengths = [7, 1, 4, 0, 7]
    batch, width = len(lengths), max(lengths)
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths], dtype=torch.bool)
    rewards = torch.randn(batch, width, generator=g, dtype=torch.float64)
    values = torch.randn(batch, width, generator=g, dtype=torch.float64)  # garbage on padding on purpose
    lam = torch.rand(batch, generator=g, dtype=torch.float64) if per_row_lambda else 0.95
    advantages, returns = gae(rewards, values, mask, gamma, lam)
    lams = lam.tolist() if per_row_lambda else [lam] * batch
    # the naive loop only ever reads a row's own tokens, so padding rewards/values cannot leak in
    exp_adv, exp_ret = naive_gae(rewards.numpy(), values.numpy(), lengths, gamma, lams)
    np.testing.assert_allclose(advantages.numpy(), exp_adv, atol=1e-12)
    np.testing.assert_allclose(returns.numpy(), exp_ret, atol=1e-12)


def test_gae_with_lambda_one_is_reward_to_go_minus_value_and_lambda_zero_is_td():
    rewards = torch.tensor([[1.0, 0.0, 2.0, 0.0]])
    values = torch.tensor([[0.5, 0.5, 0.5, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    mc, returns = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    # reward-to-go 3, 2, 2 minus V 0.5
    torch.testing.assert_close(mc, torch.tensor([[2.5, 1.5, 1.5, 0.0]]))
    torch.testing.assert_close(returns, torch.tensor([[3.0, 2.0, 2.0, 0.0]]))
    td, _ = gae(rewards, values, mask, gamma=1.0, lam=0.0)
    # δ_t = r_t + V_{t+1} − V_t with V = 0 after the last valid token (the 9.0 is padding)
    torch.testing.assert_close(td, torch.tensor([[1.0, 0.0, 1.5, 0.0]]))


def test_gae_rejects_bad_input():
    ones = torch.ones(2, 3)
    with pytest.raises(ValueError, match="right-padded"):
        gae(ones, ones, torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]]), 1.0, 0.95)
    with pytest.raises(ValueError, match="one shape"):
        gae(ones, torch.ones(2, 4), ones, 1.0, 0.95)
    with pytest.raises(ValueError, match="lam"):
        gae(ones, ones, ones, 1.0, torch.ones(3))
    with pytest.raises(ValueError, match="lie in"):
        gae(ones, ones, ones, 1.0, 1.5)


def test_adaptive_lambda():
    lam = adaptive_lambda(torch.tensor([100, 200, 20, 10, 0]), alpha=0.05)
    # 1 − 1/(0.05·T): T = 100 → 0.8, 200 → 0.9, 20 → 0, 10 → −1 clamped to 0, 0 → −inf clamped to 0
    torch.testing.assert_close(lam, torch.tensor([0.8, 0.9, 0.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match="alpha"):
        adaptive_lambda(torch.tensor([10]), alpha=0.0)


def test_group_advantages_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0])
    adv = group_advantages(rewards, group_size=3)
    # group 1: mean 1/3, unbiased std sqrt(((2/3)² + 2·(1/3)²)/2) = sqrt(1/3); group 2: mean 5/3, same std
    std = (1 / 3) ** 0.5
    expected = torch.tensor([2 / 3, -1 / 3, -1 / 3, -2 / 3, 1 / 3, 1 / 3]) / (std + 1e-4)
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(group_advantages(rewards, 3, scale=False), torch.tensor([2, -1, -1, -2, 1, 1]) / 3)
    # equal rewards → 0; a group of one → 0 (TRL: std 0 for num_generations = 1)
    assert group_advantages(torch.tensor([0.5, 0.5]), 2).tolist() == [0.0, 0.0]
    assert group_advantages(torch.tensor([3.0, -1.0]), 1).tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="divide"):
        group_advantages(rewards, 4)


def test_whiten_by_hand():
    values = torch.tensor([[1.0, 2.0, 100.0], [3.0, -50.0, -50.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    # masked entries 1, 2, 3: mean 2, unbiased variance ((−1)² + 0 + 1²)/2 = 1
    out = whiten(values, mask)
    scale = 1 / (1 + 1e-8) ** 0.5
    torch.testing.assert_close(out[mask], torch.tensor([-1.0, 0.0, 1.0]) * scale)
    torch.testing.assert_close(whiten(values, mask, shift_mean=False)[mask], torch.tensor([-1.0, 0.0, 1.0]) * scale + 2)
    with pytest.raises(ValueError, match="at least 2"):
        whiten(values, torch.tensor([[1, 0, 0], [0, 0, 0]]))


def test_running_mean_std_matches_the_statistics_of_everything_seen_and_resumes():
    g = torch.Generator().manual_seed(0)
    chunks = [torch.randn(n, generator=g, dtype=torch.float64) * 3 + 1 for n in (5, 1, 17, 8)]
    stats = RunningMeanStd()
    assert stats.std == 1.0  # nothing seen: normalize is the identity up to eps
    for chunk in chunks[:2]:
        stats.update(chunk)
    resumed = RunningMeanStd()
    resumed.load_state_dict(stats.state_dict())
    for chunk in chunks[2:]:
        stats.update(chunk)
        resumed.update(chunk)
    everything = torch.cat(chunks).numpy()
    assert stats.count == everything.size
    assert stats.mean == pytest.approx(everything.mean(), abs=1e-12)
    assert stats.var == pytest.approx(everything.var(), abs=1e-12)
    assert resumed.state_dict() == stats.state_dict()
    x = torch.tensor([2.0, -4.0])
    torch.testing.assert_close(stats.normalize(x), x / (everything.var() + 1e-8) ** 0.5)


def test_clip_rewards():
    assert clip_rewards(torch.tensor([-12.0, 0.5, 30.0]), 10.0).tolist() == [-10.0, 0.5, 10.0]
    with pytest.raises(ValueError, match="bound"):
        clip_rewards(torch.tensor([1.0]), 0.0)


def naive_didpo_advantages(returns, gaps, lengths, group_size, w_did, eps):
    """DIDPO.md v2's formula written out per group and token, with Python floats."""
    out = np.zeros_like(gaps)
    for start in range(0, len(returns), group_size):
        group = returns[start : start + group_size]
        mean = sum(group) / group_size
        std = (sum((r - mean) ** 2 for r in group) / (group_size - 1)) ** 0.5
        for i in range(start, start + group_size):
            for t in range(lengths[i]):
                process = w_did * gaps[i, t] if max(group) > min(group) else 0.0
                out[i, t] = ((returns[i] - mean) - process) / (std + eps)
    return out


def test_didpo_group_advantages_equal_the_formula_written_out():
    rng = np.random.default_rng(0)
    returns = np.array([1.0, 0.0, 0.0, 1.4, 0.3, 0.3, 0.3, 0.3])  # the second group has equal returns
    lengths = [5, 3, 6, 2, 4, 6, 1, 3]
    gaps = rng.uniform(-1, 1, size=(8, 6)) * (np.arange(6)[None] < np.array(lengths)[:, None])
    mask = torch.tensor([[1.0] * n + [0.0] * (6 - n) for n in lengths], dtype=torch.float64)
    got = didpo_group_advantages(torch.tensor(returns), torch.tensor(gaps), mask, 4, 0.7, 1e-4)
    expected = naive_didpo_advantages(returns, gaps, lengths, 4, 0.7, 1e-4)
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-12)
    assert torch.all(got[4:].abs() < 1e-10)  # all-equal returns: no signal, whatever the gaps
    # w_did = 0: GRPO's advantage on every token, bit for bit
    zero = didpo_group_advantages(torch.tensor(returns), torch.tensor(gaps), mask, 4, 0.0, 1e-4)
    assert torch.equal(zero, group_advantages(torch.tensor(returns), 4, 1e-4).unsqueeze(-1) * mask)
    with pytest.raises(ValueError, match="group_size"):
        didpo_group_advantages(torch.tensor(returns), torch.tensor(gaps), mask, 3, 0.7)
