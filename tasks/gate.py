"""The ``gate`` stage's decision (RL only when the SFT model already "knows how": pass@k on val above a threshold)
and its external guard (the paired change of the SFT model against the base model on HumanEval)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from models.significance import paired_test
from tasks.config import GateConfig, Params
from tasks.io import headline, read_problems, write_json
from tasks.measure import greedy_results, load_checkpoint, make_sampler, measure_split, resolve_engine
from tasks.sandbox import make_verifier

# the DVC metric (tasks.io.headline): the SFT model's sampled pass@k on the gate's val problems, and the verdict
HEADLINE = {"val.pass@1": "pass@1", "val.pass@16": "pass@16", "gate": "passed"}


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


def gate(
    params: Params, problems_path: Path, base: Path, sft_merged: Path, out: Path, metrics_out: Path, headline_out: Path
):
    """The stage's work: the SFT model (`sft_merged`) samples ``gate.n_samples`` answers per val problem; the verdict
    against ``gate.threshold``; the external guard (base and SFT greedy on ``gate.external_problems`` HumanEval
    problems, answers under `out`). Writes the metrics to `metrics_out` and their headline to `headline_out`.
    Returns ``(metrics, verdict)``; the caller raises the failed verdict (`GateVerdict.raise_if_failed`) once it has
    logged it."""
    cfg, dtype = params.gate, params.base_model.dtype
    problems = read_problems(problems_path, "val", cfg.val_problems, required=True)
    external = read_problems(problems_path, "humaneval", cfg.external_problems)
    engine = resolve_engine(cfg.engine, cfg.precision, "gate")
    with make_verifier(params.verifier) as verifier:

        def external_passes(name, model, tokenizer, sampler):
            results = greedy_results(
                model,
                tokenizer,
                external,
                cfg.max_new_tokens,
                cfg.seed,
                verifier,
                out / f"external_{name}.jsonl",
                sampler,
            )
            return [r.pass_at(1) for r in results]

        base_model, base_tokenizer = load_checkpoint(base, dtype)
        base_passes = external_passes("base", base_model, base_tokenizer, make_sampler(base, base_tokenizer, engine))
        del base_model
        model, tokenizer = load_checkpoint(sft_merged, dtype)
        sampler = make_sampler(sft_merged, tokenizer, engine)
        sft_passes = external_passes("sft", model, tokenizer, sampler)
        metrics = measure_split(model, tokenizer, problems, cfg, verifier, out, "val", greedy=False, sampler=sampler)
    verdict = gate_verdict(metrics, cfg)
    metrics = {**metrics, "threshold": cfg.threshold, "passed": verdict.passed, "engine": "/".join(engine)}
    if external:
        metrics["external"] = external_change(base_passes, sft_passes, seed=cfg.seed)
    write_json(metrics, metrics_out)
    write_json(headline(metrics, HEADLINE), headline_out)
    return metrics, verdict
