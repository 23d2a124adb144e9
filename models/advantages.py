"""Advantages and reward statistics for the RL stage: GAE, group-normalised advantages, whitening, running
reward scaling.

Tensors are (B, T) over completion tokens, right-padded: ``mask`` (float or bool) is 1 on a row's tokens, then 0.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def _check_prefix_mask(mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(dtype=torch_float(mask))
    if mask.dim() != 2:
        raise ValueError(f"mask must be (B, T), got shape {tuple(mask.shape)}")
    if ((mask != 0) & (mask != 1)).any():
        raise ValueError("mask must hold only 0 and 1")
    if (mask[:, 1:] > mask[:, :-1]).any():
        raise ValueError("mask must be right-padded: each row 1 on its tokens, then 0")
    return mask


def torch_float(t: torch.Tensor):
    """The float dtype to compute in: `t`'s own when it is floating point, else float32."""
    import torch

    return t.dtype if t.is_floating_point() else torch.float32


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016, eq. 16) over each row's tokens.

    δ_t = r_t + γ·V_{t+1} − V_t and A_t = δ_t + γλ·A_{t+1}, computed by a reversed loop (as cleanrl's PPO); a row
    ends after its last valid token, so V and A bootstrap from 0 there (the episode is over).

    Args:
        rewards: (B, T) per-token rewards.
        values: (B, T) value estimates V(s_t).
        mask: (B, T) 1 on completion tokens, right-padded.
        gamma: discount γ ∈ [0, 1].
        lam: λ ∈ [0, 1], a float or a (B,) tensor (one λ per row, e.g. `adaptive_lambda`).

    Returns:
        ``(advantages, returns)``, both (B, T) in the rewards' float dtype, 0 on padding;
        returns = advantages + values (the λ-return targets of the critic).

    Raises:
        ValueError: shapes differ, λ or γ outside [0, 1], or the mask is not right-padded 0/1.
    """
    import torch

    if rewards.shape != values.shape or rewards.shape != mask.shape:
        raise ValueError(
            f"rewards, values and mask must have one shape, got {tuple(rewards.shape)}, "
            f"{tuple(values.shape)}, {tuple(mask.shape)}"
        )
    mask = _check_prefix_mask(mask).to(rewards.dtype)
    batch, length = rewards.shape
    lam = torch.as_tensor(lam, dtype=rewards.dtype, device=rewards.device)
    if lam.dim() == 0:
        lam = lam.expand(batch)
    if lam.shape != (batch,):
        raise ValueError(f"lam must be a float or a (B,) = ({batch},) tensor, got shape {tuple(lam.shape)}")
    if not 0 <= gamma <= 1 or ((lam < 0) | (lam > 1)).any():
        raise ValueError(f"gamma and lam must lie in [0, 1], got gamma={gamma}, lam={lam.tolist()}")
    values = values.to(rewards.dtype) * mask
    advantages = torch.zeros_like(rewards)
    last = torch.zeros(batch, dtype=rewards.dtype, device=rewards.device)  # A_{t+1}
    for t in reversed(range(length)):
        next_mask = mask[:, t + 1] if t + 1 < length else torch.zeros_like(last)
        next_value = values[:, t + 1] * next_mask if t + 1 < length else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * next_value - values[:, t]  # (B,)
        last = (delta + gamma * lam * next_mask * last) * mask[:, t]
        advantages[:, t] = last
    returns = (advantages + values) * mask
    return advantages, returns


def adaptive_lambda(lengths: torch.Tensor, alpha: float) -> torch.Tensor:
    """Length-adaptive λ for the policy's GAE (VAPO, Yue et al. 2025, §3.2): λ = 1 − 1/(α·T), so that the sum of
    the GAE weights 1/(1 − λ) = α·T grows with the sequence length T; clamped to [0, 1].

    Args:
        lengths: (B,) completion lengths in tokens.
        alpha: α > 0 (VAPO uses 0.05).

    Returns:
        (B,) float32 λ per row (0 for T ≤ 1/α).

    Raises:
        ValueError: α ≤ 0.
    """
    import torch

    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    lengths = lengths.to(torch.float32)
    return (1.0 - 1.0 / (alpha * lengths)).nan_to_num(neginf=0.0).clamp(0.0, 1.0)


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4, scale: bool = True) -> torch.Tensor:
    """GRPO's group-relative advantage (Shao et al. 2024, DeepSeekMath §4.1.2), as TRL's GRPOTrainer computes it
    (``scale_rewards="group"``): (r − mean of its group) / (std of its group + eps), the std with Bessel's
    correction (unbiased, TRL's ``nanstd``); a group of one has std 0 (advantage 0).

    Args:
        rewards: (B,) one scalar reward per completion, the G = `group_size` completions of a prompt contiguous.
        group_size: G ≥ 1, dividing B.
        eps: added to the std (TRL: 1e-4).
        scale: divide by (std + eps); False keeps r − mean (Dr. GRPO, TRL ``scale_rewards="none"``).

    Returns:
        (B,) advantages in the rewards' float dtype.

    Raises:
        ValueError: B is not a multiple of group_size, or group_size < 1.
    """
    rewards = rewards.to(torch_float(rewards))
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be (B,), got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"group_size ({group_size}) must be >= 1 and divide the batch ({rewards.numel()})")
    grouped = rewards.view(-1, group_size)  # (B/G, G)
    centred = (grouped - grouped.mean(dim=1, keepdim=True)).view(-1)
    if not scale:
        return centred
    if group_size == 1:
        std = rewards.new_zeros(rewards.shape)
    else:
        std = grouped.std(dim=1, unbiased=True).repeat_interleave(group_size)
    return centred / (std + eps)


def didpo_group_advantages(
    returns: torch.Tensor,
    gaps: torch.Tensor,
    mask: torch.Tensor,
    group_size: int,
    w_did: float,
    eps: float = 1e-4,
) -> torch.Tensor:
    """DiDPO's critic-free advantage (DIDPO.md v2, "Advantage"): per token,
    A_{i,t} = [(R_i − mean_k R_k) − w_did·G_{i,j(t)−1}] / (std_k R_k + ε), GRPO's scaling (Shao et al. 2024, §4.1.2;
    std with Bessel's correction, as `group_advantages`). The process term is a state-dependent baseline, so a
    group whose returns are all equal gets advantage 0 whatever its gaps (it carries no signal). With w_did = 0
    the result is `group_advantages` on every token, bit for bit.

    Args:
        returns: (B,) R_i, the G = `group_size` rollouts of a prompt contiguous.
        gaps: (B, T) G_{i,j(t)−1} per token (`models.process_reward.token_gaps`; 0 where only the outcome counts).
        mask: (B, T) 1 on completion tokens.
        group_size: G ≥ 2 dividing B.
        w_did: weight of the process term (≥ 0).
        eps: ε added to the std (TRL's 1e-4).

    Returns:
        (B, T) advantages, 0 on padding.

    Raises:
        ValueError: shapes that do not match, or group_size < 2 or not dividing B.
    """
    returns = returns.to(torch_float(returns))
    if gaps.shape != mask.shape or gaps.shape[0] != returns.shape[0]:
        raise ValueError(
            f"gaps {tuple(gaps.shape)}, mask {tuple(mask.shape)} and returns {tuple(returns.shape)} differ"
        )
    if group_size < 2 or returns.numel() % group_size:
        raise ValueError(f"group_size ({group_size}) must be >= 2 and divide the batch ({returns.numel()})")
    outcome = group_advantages(returns, group_size, eps, True)  # (B,)
    grouped = returns.view(-1, group_size)
    std = grouped.std(dim=1, unbiased=True).repeat_interleave(group_size)  # (B,)
    varied = (grouped.amax(dim=1) > grouped.amin(dim=1)).repeat_interleave(group_size)  # (B,)
    process = (w_did * gaps.to(returns.dtype)) / (std + eps).unsqueeze(-1)  # (B, T)
    process = process * varied.unsqueeze(-1).to(returns.dtype)
    mask = mask.to(returns.dtype)
    return (outcome.unsqueeze(-1) - process) * mask


def whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Whiten `values` with the mean and unbiased variance of its masked entries, as TRL's ``masked_whiten``
    (``trl/core.py``, later ``trl/trainer/utils.py``, used by its PPO trainer for advantages; TRL 1.16 no longer
    ships it): (x − mean)·rsqrt(var + 1e-8), the mean added back when ``shift_mean`` is False. Entries outside
    the mask are transformed too (ignore them).

    Args:
        values: (B, T). mask: (B, T), 0/1 or bool.

    Raises:
        ValueError: fewer than 2 masked entries (the variance is undefined).
    """
    import torch

    mask = mask.to(values.dtype)
    count = mask.sum()
    if count < 2:
        raise ValueError(f"whiten needs at least 2 masked entries, got {int(count)}")
    mean = (values * mask).sum() / count
    var = (((values - mean) ** 2) * mask).sum() / count * (count / (count - 1))
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    return whitened if shift_mean else whitened + mean


def clip_rewards(rewards: torch.Tensor, bound: float) -> torch.Tensor:
    """Rewards clipped to [−bound, bound] (seed §4.3; PPO implementations clip normalised rewards at ±10).

    Raises:
        ValueError: bound ≤ 0.
    """
    if bound <= 0:
        raise ValueError(f"bound must be > 0, got {bound}")
    return rewards.clamp(-bound, bound)


class RunningMeanStd:
    """Running mean and variance of every value seen (Chan et al.'s parallel update of Welford's algorithm, as in
    OpenAI baselines' ``RunningMeanStd``), for reward normalisation across RL steps.

    Starts from count 0; `normalize` divides by the running standard deviation (the mean is not subtracted, so
    a reward's sign and a zero reward keep their meaning; as cleanrl's reward scaling). State is three floats,
    saved in checkpoints with `state_dict`/`load_state_dict` for an exact resume.
    """

    def __init__(self, eps: float = 1e-8):
        self.mean = 0.0
        self.var = 1.0
        self.count = 0
        self.eps = eps

    def update(self, x: torch.Tensor) -> None:
        """Fold in every element of `x` (any shape; pass only real tokens' rewards)."""
        x = x.detach().to("cpu").double().reshape(-1)
        n = x.numel()
        if n == 0:
            return
        batch_mean = float(x.mean())
        batch_var = float(x.var(unbiased=False))
        if self.count == 0:
            self.mean, self.var, self.count = batch_mean, batch_var, n
            return
        total = self.count + n
        delta = batch_mean - self.mean
        m2 = self.var * self.count + batch_var * n + delta * delta * self.count * n / total
        self.mean += delta * n / total
        self.var = m2 / total
        self.count = total

    @property
    def std(self) -> float:
        """The population standard deviation of the values seen (1 before any update)."""
        return math.sqrt(self.var)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """x / sqrt(var + eps)."""
        return x / math.sqrt(self.var + self.eps)

    def state_dict(self) -> dict:
        return {"mean": self.mean, "var": self.var, "count": self.count, "eps": self.eps}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var = float(state["mean"]), float(state["var"])
        self.count, self.eps = int(state["count"]), float(state["eps"])
