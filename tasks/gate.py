"""The ``gate`` stage's decision (RL only when the SFT model already "knows how": pass@k on val above a threshold)
and its external guard (the paired change of the SFT model against the base model on HumanEval)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tasks.config import GateConfig


def external_change(base: Sequence[float], trained: Sequence[float], seed: int = 0) -> dict:
    """The external guard's paired change of one trained checkpoint against the base model on the same problems.

    Args:
        base, trained: pass@1 of each problem (same order), e.g. 0/1 of a greedy answer.

    Returns:
        ``n_problems``, ``base_pass@1``, ``pass@1``, ``delta`` (mean of trained − base), ``low``/``high`` (its 95%
        interval, `models.significance.paired_test`), ``mde`` (None below 2 problems), ``n_discordant``,
        ``p_better`` and ``p_worse`` (one-sided paired sign-flip p of "trained is better" / "trained is worse").

    Raises:
        ValueError: no problems, or lists of different lengths.
    """
    from models.significance import paired_test

    if not base or len(base) != len(trained):
        raise ValueError(f"need the same non-empty problems on both sides, got {len(base)} and {len(trained)}")
    better, worse = paired_test(base, trained, seed=seed), paired_test(trained, base, seed=seed)
    return {
        "n_problems": len(base),
        "base_pass@1": sum(base) / len(base),
        "pass@1": sum(trained) / len(trained),
        "delta": better.effect,
        "low": better.low,
        "high": better.high,
        "mde": better.mde if better.mde == better.mde else None,  # NaN (below 2 problems) is not JSON
        "n_discordant": better.n_discordant,
        "p_better": better.p_value,
        "p_worse": worse.p_value,
    }


class GateFailed(RuntimeError):
    """The SFT model's pass@k on val is not above the gate's threshold; the message says what to do next."""


@dataclass(frozen=True)
class GateVerdict:
    """The gate's decision on measured ``metrics`` (see :func:`gate_verdict`)."""

    passed: bool
    message: str

    def raise_if_failed(self) -> None:
        if not self.passed:
            raise GateFailed(self.message)


def gate_verdict(metrics: dict, cfg: GateConfig) -> GateVerdict:
    """Pass when pass@k > threshold (strictly). The failure message names the figure, the threshold and next steps."""
    key = f"pass@{cfg.k}"
    if metrics.get("n_problems", 0) == 0 or key not in metrics:
        return GateVerdict(False, f"gate failed: no val problems were measured ({key} unavailable)")
    value = metrics[key]
    figure = f"{key} = {value:.3f} on {metrics['n_problems']} val problems ({cfg.n_samples} samples each)"
    if value > cfg.threshold:
        return GateVerdict(True, f"gate passed: {figure} > threshold {cfg.threshold:.2f}")
    return GateVerdict(
        False,
        f"gate failed: {figure} <= threshold {cfg.threshold:.2f}. RL amplifies what the model can already do, so "
        "it would have little to amplify. Next: more or better SFT data (prepare.n_problems), more steps "
        "(sft.max_steps / sft.epochs), a higher LoRA rank or full fine-tuning (sft.lora_r, sft.lora), or a bigger "
        "base model (base_model.name_or_path). Lowering gate.threshold only hides the problem.",
    )
