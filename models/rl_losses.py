"""RL losses: clipped policy gradient (PPO/GRPO/DAPO), clipped value loss, entropy, k3 KL.

Pure functions of (B, T) tensors over completion tokens; `completion_mask` (float or bool) is 1 on real tokens.
Each returns ``(loss, stats)`` where ``stats`` holds python floats (detached), keys without the stage prefix.
Aggregation is token-level (DAPO, Yu et al. 2025, §3.3): sum over every valid token of the batch divided by the
number of valid tokens, so long and short completions weigh per token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

_LOSS_TYPES = ("dapo", "grpo")


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ x·mask / max(Σ mask, 1): the mean over valid tokens (0 when there are none)."""
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def kl_k3(per_token_logps: torch.Tensor, ref_per_token_logps: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(π_θ ‖ π_ref) per token (J. Schulman, "Approximating KL divergence", 2020),
    as TRL's GRPOTrainer: exp(ref − logp) − (ref − logp) − 1 ≥ 0, unbiased for samples drawn from π_θ.

    Args:
        per_token_logps, ref_per_token_logps: (B, T) log-probs of the sampled tokens (nats).

    Returns:
        (B, T) per-token KL estimates (padding positions hold whatever the inputs give; mask them).
    """
    diff = ref_per_token_logps - per_token_logps
    return diff.exp() - diff - 1.0


def _clipped_surrogate(per_token_logps, old_per_token_logps, advantages, eps_low, eps_high):
    """Per-token −min(ratio·A, clip(ratio, 1 − ε_low, 1 + ε_high)·A) (B, T), with ratio and log ratio (B, T)."""
    import torch

    log_ratio = per_token_logps - old_per_token_logps
    ratio = torch.exp(log_ratio)  # (B, T)
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    return -torch.min(ratio * advantages, clipped * advantages), ratio, log_ratio


def ppo_policy_loss(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate policy loss with clip-higher (PPO, Schulman et al. 2017, eq. 7; DAPO §3.1 decoupled
    ε_low/ε_high), token-level mean (DAPO §3.3).

    ratio = exp(logπ_θ − logπ_old); per token −min(ratio·A, clip(ratio, 1 − ε_low, 1 + ε_high)·A).

    Args:
        per_token_logps: (B, T) log π_θ of the sampled tokens (with gradient).
        old_per_token_logps: (B, T) log π_old recorded at sampling time.
        advantages: (B, T) per token, or (B,) per sequence (broadcast over its tokens).
        completion_mask: (B, T) 1 on completion tokens.
        eps_low, eps_high: clip range below / above 1.
        is_weights: (B, T) truncated importance weights min(exp(logπ_old − logπ_sampler), C) for rollouts sampled
            by another engine than the trainer (TRL's ``vllm_importance_sampling_correction``: the per-token loss
            is multiplied by them before aggregation; no gradient flows through them), or None.

    Returns:
        ``(pg_loss, stats)``; stats: ``clip_frac/low`` (tokens with ratio < 1 − ε_low and A < 0, where the clip
        stops the gradient), ``clip_frac/high`` (ratio > 1 + ε_high and A > 0), ``approx_kl`` (k3 of π_old vs
        π_θ: (ratio − 1) − log ratio, as cleanrl/TRL), ``ratio_mean``; all token means.

    Raises:
        ValueError: mismatched shapes or negative clip ranges.
    """
    import torch

    if per_token_logps.shape != old_per_token_logps.shape or per_token_logps.shape != completion_mask.shape:
        raise ValueError(
            f"per_token_logps, old_per_token_logps and completion_mask must have one shape, got "
            f"{tuple(per_token_logps.shape)}, {tuple(old_per_token_logps.shape)}, {tuple(completion_mask.shape)}"
        )
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"eps_low and eps_high must be >= 0, got {eps_low}, {eps_high}")
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)  # (B, 1)
    if advantages.shape[0] != per_token_logps.shape[0] or advantages.shape[1] not in (1, per_token_logps.shape[1]):
        raise ValueError(f"advantages must be (B,) or (B, T), got {tuple(advantages.shape)}")
    mask = completion_mask.to(per_token_logps.dtype)
    per_token_loss, ratio, log_ratio = _clipped_surrogate(
        per_token_logps, old_per_token_logps, advantages, eps_low, eps_high
    )
    if is_weights is not None:
        per_token_loss = per_token_loss * is_weights.detach()
    loss = masked_mean(per_token_loss, mask)
    with torch.no_grad():
        low = (ratio < 1.0 - eps_low) & (advantages < 0)
        high = (ratio > 1.0 + eps_high) & (advantages > 0)
        stats = {
            "clip_frac/low": masked_mean(low.to(mask.dtype), mask).item(),
            "clip_frac/high": masked_mean(high.to(mask.dtype), mask).item(),
            "approx_kl": masked_mean((ratio - 1.0) - log_ratio, mask).item(),
            "ratio_mean": masked_mean(ratio, mask).item(),
        }
    return loss, stats


def grpo_loss(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    loss_type: str = "dapo",
    is_weights: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The GRPO/DAPO policy loss as TRL's ``GRPOTrainer._compute_loss`` (β = 0, one process, no gradient
    accumulation): the clipped per-token loss of `ppo_policy_loss`, aggregated by `loss_type`:

    - "dapo": token-level, Σ over all valid tokens / number of valid tokens (DAPO §3.3);
    - "grpo": each sequence's token mean, then the mean over sequences (DeepSeekMath eq. 3).

    Args: as `ppo_policy_loss` (``is_weights`` included); advantages (B,) (or (B, T)); weights: (B,) each
        row's multiplicity (identical rows merged into one), or None (1 each): the loss and stats equal those of
        the batch with each row repeated `weights` times.

    Returns:
        ``(loss, stats)`` with the stats of `ppo_policy_loss`.

    Raises:
        ValueError: unknown loss_type (and as `ppo_policy_loss`).
    """
    if loss_type not in _LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {_LOSS_TYPES}, got {loss_type!r}")
    mask = completion_mask.to(per_token_logps.dtype)
    weighted = mask if weights is None else mask * weights.to(mask.dtype).unsqueeze(1)
    loss, stats = ppo_policy_loss(
        per_token_logps, old_per_token_logps, advantages, weighted, eps_low, eps_high, is_weights
    )
    if loss_type == "dapo":
        return loss, stats
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    per_token_loss, _, _ = _clipped_surrogate(per_token_logps, old_per_token_logps, adv, eps_low, eps_high)
    if is_weights is not None:
        per_token_loss = per_token_loss * is_weights.detach()
    per_sequence = (per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)  # (B,)
    if weights is None:
        return per_sequence.mean(), stats
    w = weights.to(per_sequence.dtype)
    return (per_sequence * w).sum() / w.sum(), stats


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    completion_mask: torch.Tensor,
    clip_eps: float | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss (PPO as in OpenAI baselines / cleanrl / TRL's PPO): token-level mean of
    ½·max((V − R)², (clip(V, V_old − ε, V_old + ε) − R)²).

    Args:
        values: (B, T) current value predictions (with gradient).
        old_values: (B, T) the values recorded at rollout time.
        returns: (B, T) targets (GAE returns).
        completion_mask: (B, T).
        clip_eps: ε > 0, or None for the unclipped ½·(V − R)².

    Returns:
        ``(vf_loss, stats)``; stats: ``vf_clip_frac`` (tokens where the clipped term is the larger),
        ``explained_variance`` = 1 − Var[R − V]/Var[R] over valid tokens (population variances, as cleanrl;
        NaN when Var[R] = 0).

    Raises:
        ValueError: mismatched shapes or clip_eps ≤ 0.
    """
    import torch

    if not values.shape == old_values.shape == returns.shape == completion_mask.shape:
        raise ValueError(
            f"values, old_values, returns and completion_mask must have one shape, got {tuple(values.shape)}, "
            f"{tuple(old_values.shape)}, {tuple(returns.shape)}, {tuple(completion_mask.shape)}"
        )
    if clip_eps is not None and clip_eps <= 0:
        raise ValueError(f"clip_eps must be > 0 or None, got {clip_eps}")
    mask = completion_mask.to(values.dtype)
    unclipped = (values - returns) ** 2
    if clip_eps is None:
        worst = unclipped
        clip_hit = torch.zeros_like(unclipped)
    else:
        clipped_values = old_values + torch.clamp(values - old_values, -clip_eps, clip_eps)
        clipped = (clipped_values - returns) ** 2
        worst = torch.max(unclipped, clipped)
        clip_hit = (clipped > unclipped).to(values.dtype)
    loss = 0.5 * masked_mean(worst, mask)
    with torch.no_grad():
        valid = mask.bool()
        target, residual = returns[valid].double(), (returns - values)[valid].double()
        var_returns = target.var(unbiased=False) if target.numel() else target.new_tensor(0.0)
        explained = 1.0 - residual.var(unbiased=False) / var_returns if var_returns > 0 else float("nan")
        stats = {
            "vf_clip_frac": masked_mean(clip_hit, mask).item(),
            "explained_variance": float(explained),
        }
    return loss, stats


def entropy_from_logits(logits: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """Token-level mean entropy H(π_θ(·|s_t)) = −Σ_v p_v log p_v of the next-token distributions, in nats.

    Args:
        logits: (B, T, V) unscaled logits at the completion positions (computed in float32).
        completion_mask: (B, T).

    Returns:
        a scalar tensor (differentiable: the entropy bonus).
    """
    import torch

    logp = torch.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    entropy = -(logp.exp() * logp).sum(-1)  # (B, T)
    return masked_mean(entropy, completion_mask)
