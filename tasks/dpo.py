"""The ``dpo`` stage's work: check the reference, split the pairs, train (models.dpo), smoke-check answers."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from models.answer_format import check_format
from models.config import DPOConfig
from models.distributed import is_main_process
from models.dpo import checkpoint_hash, load_reference, select_pairs, split_pairs, train_dpo
from models.measure import sample_and_verify
from models.policy import load_policy
from models.sampling import SamplingConfig
from models.training import resume_or_start_over
from tasks.config import InputError, Params
from tasks.io import headline, read_pairs, read_problems, write_history, write_json
from tasks.sandbox import make_verifier
from tasks.tracking import mlflow_emit

# the DVC metric (tasks.io.headline): the held-out loss of the step it exported
HEADLINE = {"eval_loss": "best_eval.dpo/eval_loss"}


def training_pairs(pairs_path: Path, cfg: DPOConfig) -> tuple[list[dict], list[dict]]:
    """``(train, held_out)``: at most ``cfg.max_pairs`` pairs of the selfplay stage's file (`models.dpo.select_pairs`,
    seeded by ``cfg.seed``), ``cfg.held_out_frac`` of them held out for the held-out loss (`models.dpo.split_pairs`).

    Raises:
        tasks.config.InputError: no pair is left to train on (the message names the sources and their keys).
    """
    pairs = read_pairs(pairs_path)
    train, held_out = split_pairs(select_pairs(pairs, cfg.max_pairs, cfg.seed), cfg.held_out_frac)
    if not train:
        raise InputError(
            f"{pairs_path} leaves no pair to train DPO on ({len(pairs)} pairs, {len(held_out)} held out by "
            "dpo.held_out_frac): the mine and selfplay stages' warnings say why each made none (mine.* keys; "
            "selfplay.n_prompts, selfplay.k)"
        )
    return train, held_out


def expected_reference_hash(sft_metrics: Path, merged: Path) -> tuple[str, str]:
    """The hash the reference must have: ``merged_sha256`` from the sft stage's metrics, or, when the sft stage did not
    record one, the hash of `merged` computed now.

    Returns:
        ``(sha256, origin)`` with origin "sft_metrics" or "computed" (recorded in the dpo metrics).
    """
    metrics = json.loads(Path(sft_metrics).read_text()) if Path(sft_metrics).is_file() else {}
    if metrics.get("merged_sha256"):
        return metrics["merged_sha256"], "sft_metrics"
    return checkpoint_hash(merged), "computed"


SMOKE_NOTE = (
    "smoke check, not a measurement: one greedy answer on each of {n} val problems, before (SFT) and after (DPO); a "
    "change below about 6/{n} (six problems flipped, all one way: the fewest a two-sided sign test at 5% can tell "
    "from noise) cannot show here. Measured in the evaluate stage."
)


def smoke_check(before: dict, after: dict) -> tuple[dict, dict[str, float]]:
    """The before/after `answer_quality` of the dpo stage as ``(metrics.json section, MLflow metrics)``.

    Issue 17: the recorded run reported these as "pass@1" before/after on 10 problems, which cannot register fewer
    than 6 flips; the keys say what they are: ``smoke.{before,after}.greedy_pass`` in metrics.json, with the note,
    and ``dpo/smoke_<metric>_{before,after}`` (plus ``dpo/smoke_n_problems``) in MLflow.
    """
    n = before.get("n_problems", 0)
    note = SMOKE_NOTE.format(n=n) if n else "no val problems: no smoke check"
    section = {"note": note, "n_problems": n, "before": before, "after": after}
    logged = {"dpo/smoke_n_problems": n}
    for when, quality in (("before", before), ("after", after)):
        logged |= {f"dpo/smoke_{k}_{when}": v for k, v in quality.items() if k != "n_problems"}
    return section, logged


@task(cache_policy=NO_CACHE)
def answer_quality(checkpoint: Path, dtype: str, problems: list[dict], max_new_tokens: int, verifier) -> dict:
    """The smoke check's half on one checkpoint (`smoke_check`, `SMOKE_NOTE`): one greedy answer per problem;
    ``format_compliance`` and ``unsafe_rate`` (fractions of answers, `models.answer_format.check_format`),
    ``greedy_pass`` (fraction whose code passes every test), ``n_problems``."""
    if not problems:
        return {"n_problems": 0}
    model, tokenizer = load_policy(checkpoint, dtype=dtype)
    greedy = SamplingConfig(n=1, temperature=0.0, max_new_tokens=max_new_tokens)
    results = sample_and_verify(model, tokenizer, problems, greedy, verifier)
    reports = [check_format(r.answers[0]) for r in results]
    return {
        "n_problems": len(results),
        "format_compliance": sum(r.compliant for r in reports) / len(reports),
        "unsafe_rate": sum(bool(r.unsafe) for r in reports) / len(reports),
        "greedy_pass": sum(r.c for r in results) / len(results),
    }


@task(cache_policy=NO_CACHE)
def run_dpo(
    reference: Path,
    expected_sha256: str,
    dtype: str,
    train: list[dict],
    held_out: list[dict],
    cfg: DPOConfig,
    out: Path,
) -> tuple[dict, list[dict]]:
    """Verify the reference's hash, train and export; returns ``(metrics, history)``.

    A leftover resume checkpoint of another config, other pairs or another reference is discarded (a new run); a
    checkpoint of this very run is resumed.

    Raises:
        models.dpo.ReferenceMismatchError: `reference` is not the checkpoint with `expected_sha256`.
    """

    def attempt(resume: bool):
        model, tokenizer = load_reference(reference, expected_sha256, dtype=dtype)
        return train_dpo(
            model,
            tokenizer,
            train,
            held_out,
            cfg,
            out,
            emit=mlflow_emit,
            resume=resume,
            reference_sha256=expected_sha256,
        )

    result = resume_or_start_over(attempt)
    if not is_main_process():  # a rank > 0 under `accelerate launch`: rank 0 writes the outputs
        return {}, result.history
    metrics = {
        "global_step": result.global_step,
        "best_step": result.best_step,
        "kept_reference": result.kept_reference,
        "selection": result.selection,
        "stopped_early": result.stopped_early,
        "displacement": result.displacement,
        "displacement_step": result.displacement_step,
        "n_train_pairs": result.n_train_pairs,
        "n_held_out_pairs": len(held_out),
        "n_ches_filtered": result.n_ches_filtered,
        "n_truncated": result.n_truncated,
        "trainable_params": result.trainable_params,
        "start_eval": result.start_eval,
        "best_eval": result.best_eval,
    }
    return metrics, result.history


def dpo(
    params: Params,
    pairs: Path,
    sft_metrics: Path,
    reference: Path,
    problems_path: Path,
    out: Path,
    metrics_out: Path,
    headline_out: Path,
    history_out: Path,
) -> tuple[dict, dict]:
    """The stage's work (rank 0): verify the `reference` (SFT merged) against the hash in `sft_metrics`, smoke-check
    its answers on ``dpo.val_problems`` val problems of `problems_path`, train on `pairs` to `out`, smoke-check the
    DPO answers; write the metrics to `metrics_out`, their headline to `headline_out`, the curves to `history_out`.
    Returns ``(metrics, logged)``: ``logged`` the smoke check's figures for the tracker."""
    cfg, dtype = params.dpo, params.base_model.dtype
    expected, origin = expected_reference_hash(sft_metrics, reference)
    train, held_out = training_pairs(pairs, cfg)
    problems = read_problems(problems_path, "val", cfg.val_problems)
    with make_verifier(params.verifier) as verifier:
        before = answer_quality(reference, dtype, problems, cfg.max_new_tokens, verifier)
        metrics, history = run_dpo(reference, expected, dtype, train, held_out, cfg, out)
        after = answer_quality(out / "merged", dtype, problems, cfg.max_new_tokens, verifier)
    smoke, logged = smoke_check(before, after)
    metrics = {**metrics, "reference_sha256": expected, "reference_hash_origin": origin, "smoke": smoke}
    write_json(metrics, metrics_out)
    write_json(headline(metrics, HEADLINE), headline_out)
    write_history(history, history_out)
    return metrics, logged
