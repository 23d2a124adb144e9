"""The baseline stage's work: the base model's greedy pass@1 and sampled pass@k on the val split and on HumanEval
(`tasks.measure.measure_split`, the sampler and engine the gate and evaluate use too), written with its headline."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.config import BaselineConfig, VerifierSection
from tasks.io import headline, read_problems, write_json
from tasks.measure import load_checkpoint, make_sampler, measure_split, resolve_engine
from tasks.sandbox import make_verifier

HEADLINE = {"val.pass@1": "val.pass@1", "val.pass@16": "val.pass@16"}  # the DVC metric (tasks.io.headline)


@task(cache_policy=NO_CACHE)
def measure_base(
    checkpoint: Path,
    problems_path: Path,
    cfg: BaselineConfig,
    dtype: str,
    verifier_cfg: VerifierSection,
    out: Path,
    metrics_path: Path,
    headline_path: Path,
) -> tuple[dict, tuple[str, str]]:
    """Measure `checkpoint` on ``cfg.val_problems`` val and ``cfg.humaneval_problems`` HumanEval problems (0 = all);
    per-problem results under `out`, the metrics ``{split: {...}}`` at `metrics_path`, their headline at
    `headline_path`. Returns ``(metrics, (engine, precision))``."""
    model, tokenizer = load_checkpoint(checkpoint, dtype)
    engine = resolve_engine(cfg.engine, cfg.precision, "baseline")
    sampler = make_sampler(checkpoint, tokenizer, engine)
    metrics = {}
    with make_verifier(verifier_cfg) as verifier:
        for split, limit in (("val", cfg.val_problems), ("humaneval", cfg.humaneval_problems)):
            problems = read_problems(problems_path, split, limit)
            metrics[split] = measure_split(model, tokenizer, problems, cfg, verifier, out, split, sampler=sampler)
    write_json(metrics, metrics_path)
    write_json(headline(metrics, HEADLINE), headline_path)
    return metrics, engine
