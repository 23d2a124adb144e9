"""Stage ``baseline``: the base model's greedy pass@1 and sampled pass@k on the val split and on HumanEval."""

from __future__ import annotations

from prefect import flow

from flows.paths import BASE_CHECKPOINT, BASELINE, BASELINE_HEADLINE, BASELINE_METRICS, VALID_PROBLEMS
from tasks import tracking
from tasks.config import load_params
from tasks.io import headline, read_problems, write_json
from tasks.measure import load_checkpoint, make_sampler, measure_split, resolve_engine
from tasks.sandbox import make_verifier

HEADLINE = {"val.pass@1": "val.pass@1", "val.pass@16": "val.pass@16"}  # the DVC metric (tasks.io.headline)


@flow(name="baseline")
def run(params_path: str = "params.yaml") -> dict:
    """Measure the base checkpoint; writes data/baseline/metrics.json, its headline (the DVC metric) and per-problem
    results."""
    params = load_params(params_path)
    cfg = params.baseline
    with tracking.stage_run("baseline", params.tracking, cfg, inputs=(str(VALID_PROBLEMS),)):
        model, tokenizer = load_checkpoint(BASE_CHECKPOINT, params.base_model.dtype)
        engine = resolve_engine(cfg.engine, cfg.precision, "baseline")
        sampler = make_sampler(BASE_CHECKPOINT, tokenizer, engine)
        tracking.set_tags({"didpo.engine": "/".join(engine)})
        metrics = {}
        with make_verifier(params.verifier) as verifier:
            for split, limit in (("val", cfg.val_problems), ("humaneval", cfg.humaneval_problems)):
                problems = read_problems(VALID_PROBLEMS, split, limit)
                metrics[split] = measure_split(
                    model, tokenizer, problems, cfg, verifier, BASELINE, split, sampler=sampler
                )
        write_json(metrics, BASELINE_METRICS)
        write_json(headline(metrics, HEADLINE), BASELINE_HEADLINE)
        tracking.log_artifacts(BASELINE, artifact_path="baseline")
        flat = {f"baseline/{split}/{k}": v for split, m in metrics.items() for k, v in m.items()}
        tracking.mlflow_emit(flat, step=0)
    return metrics
