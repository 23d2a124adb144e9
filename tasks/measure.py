"""Stage-side helpers around the sandbox: choose problems, measure pass@k, decide the gate, run the data contracts."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.config import BaselineConfig, GateConfig, ValidateConfig, VerifierSection
from tasks.io import atomic_write_lines


def read_problems(path: str | Path, split: str, limit: int = 0) -> list[dict]:
    """The rows of one split of a validated problems file, in file order; ``limit`` > 0 keeps the first ones."""
    rows = []
    with Path(path).open(encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if row["split"] == split:
                rows.append(row)
                if limit and len(rows) == limit:
                    break
    return rows


def make_verifier(cfg: VerifierSection):
    """A :class:`models.verifier.Verifier` configured from params.yaml's ``verifier`` section (a context manager)."""
    import os

    from models.verifier import Verifier, VerifierConfig

    return Verifier(
        VerifierConfig(
            timeout_s=cfg.timeout_s,
            cpu_s=cfg.cpu_s,
            memory_mb=cfg.memory_mb,
            workers=cfg.workers or os.cpu_count() or 1,
        )
    )


@task(retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def write_results(results, path: Path) -> None:
    """Per-problem results (n, c, per-sample test fractions, reasons, answers) as JSONL, for people to read."""
    from dataclasses import asdict

    atomic_write_lines(path, (json.dumps(asdict(r), ensure_ascii=False) for r in results))


def resolve_engine(engine: str, precision: str, stage: str) -> tuple[str, str]:
    """The generation engine a stage uses, ``(name, precision)``: ``engine`` when it can run here, else ``("torch",
    "f32")`` with a warning naming ``stage`` and why."""
    import logging

    if engine == "torch":
        return "torch", "f32"
    from models.openvino_engine import engine_available

    reason = engine_available()
    if reason:
        logging.getLogger(__name__).warning("%s: the torch sampler is used: %s", stage, reason)
        return "torch", "f32"
    return engine, precision


def make_sampler(checkpoint: Path, tokenizer, engine: tuple[str, str]):
    """The engine's sampler for ``checkpoint`` (`resolve_engine`'s choice): an `models.openvino_engine.OpenVINOSampler`
    (the checkpoint exported once to .cache/openvino, by its weights' digest), or None for the torch sampler."""
    if engine[0] != "openvino":
        return None
    import torch

    from models.openvino_engine import OpenVINOSampler, export

    ir = export(Path(checkpoint), Path(".cache/openvino"))
    return OpenVINOSampler(ir, tokenizer, precision=engine[1], threads=torch.get_num_threads())


@task(cache_policy=NO_CACHE)
def measure_split(
    model,
    tokenizer,
    problems,
    cfg: BaselineConfig | GateConfig,
    verifier,
    out: Path,
    split: str,
    greedy: bool = True,
    sampler=None,
) -> dict:
    """pass@1/pass@k from ``cfg.n_samples`` answers per problem at the configured temperature, and (``greedy``) the
    greedy pass@1 of one answer at temperature 0. Writes per-problem results to ``out/{split}_*.jsonl``.
    ``sampler``: the engine (`make_sampler`), None for the torch sampler."""
    from models.evaluation import sample_and_verify, summarise
    from models.sampling import SamplingConfig

    sampled = SamplingConfig(
        n=cfg.n_samples, temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed
    )
    metrics: dict = {"n_problems": len(problems), "n_samples": cfg.n_samples}
    if greedy:
        one = SamplingConfig(n=1, temperature=0.0, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed)
        greedy_results = (
            sample_and_verify(model, tokenizer, problems, one, verifier, sampler=sampler) if problems else []
        )
        write_results(greedy_results, out / f"{split}_greedy.jsonl")
        if greedy_results:
            metrics["greedy_pass@1"] = summarise(greedy_results, ks=[1])["pass@1"]
    results = sample_and_verify(model, tokenizer, problems, sampled, verifier, sampler=sampler) if problems else []
    write_results(results, out / f"{split}_samples.jsonl")
    metrics.update(summarise(results, ks=sorted({1, 5, 10, cfg.k} & set(range(1, cfg.n_samples + 1)))))
    return metrics


def greedy_results(model, tokenizer, problems, max_new_tokens: int, seed: int, verifier, out: Path, sampler=None):
    """One greedy answer per problem (temperature 0, at most `max_new_tokens` tokens), verified; the per-problem
    `models.evaluation.ProblemResult` list, also written to `out` (JSONL)."""
    from models.evaluation import sample_and_verify
    from models.sampling import SamplingConfig

    one = SamplingConfig(n=1, temperature=0.0, max_new_tokens=max_new_tokens, seed=seed)
    results = sample_and_verify(model, tokenizer, problems, one, verifier, sampler=sampler) if problems else []
    write_results(results, out)
    return results


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


@task(cache_policy=NO_CACHE)
def validate_problems_task(params, source: Path, out_valid: Path, out_quarantine: Path):
    """Problems contract; reference solutions run against their own tests in the sandbox (when configured)."""
    from tasks.validate import validate_problems

    cfg = params.validate
    if not cfg.check_solutions:
        return validate_problems(source, out_valid, out_quarantine, max_bad_row_rate=cfg.max_bad_row_rate_problems)
    with make_verifier(params.verifier) as verifier:

        def check(rows):
            jobs = [(r["prompt"] + r["canonical_solution"], r["test"], r["entry_point"]) for r in rows]
            return verifier.check_many(jobs, progress=True)

        return validate_problems(
            source,
            out_valid,
            out_quarantine,
            max_bad_row_rate=cfg.max_bad_row_rate_problems,
            check_solutions=check,
        )


@task(cache_policy=NO_CACHE)
def validate_logs_task(cfg: ValidateConfig, source: Path, out_valid: Path, out_quarantine: Path):
    """Feedback-log contract; PII and secrets are scrubbed from everything written (valid rows and quarantine)."""
    from tasks.pii import scrub_text
    from tasks.validate import validate_feedback_logs

    return validate_feedback_logs(
        source,
        out_valid,
        out_quarantine,
        max_bad_row_rate=cfg.max_bad_row_rate_logs,
        max_text_chars=cfg.max_text_chars,
        redact=scrub_text,
    )


@task(cache_policy=NO_CACHE)
def validate_pairs_task(cfg: ValidateConfig, source: Path, out_valid: Path, out_quarantine: Path):
    """Human preference-pair contract (chosen ≠ rejected, non-empty); PII and secrets scrubbed as for the logs."""
    from tasks.pii import scrub_text
    from tasks.validate import validate_pairs

    return validate_pairs(
        source,
        out_valid,
        out_quarantine,
        max_bad_row_rate=cfg.max_bad_row_rate_pairs,
        max_text_chars=cfg.max_text_chars,
        redact=scrub_text,
    )
