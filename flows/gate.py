"""Stage ``gate``: RL runs only if the SFT model already "knows how" — unbiased pass@k on val above a threshold.

A failed gate exits non-zero with a message that names the figure, the threshold and what to do next; the MLflow run
is tagged ``gate=failed``; `didpo run` stops and no later stage runs.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from flows.sft import OUT as SFT_OUT
from flows.validate import VALID_PROBLEMS
from tasks import tracking
from tasks.config import load_params
from tasks.io import write_json
from tasks.measure import gate_verdict, make_sampler, make_verifier, measure_split, read_problems, resolve_engine

OUT = Path("data/gate")
METRICS = OUT / "metrics.json"


@flow(name="gate")
def run(params_path: str = "params.yaml") -> dict:
    """Sample n answers per val problem with the SFT model, verify, decide; raises GateFailed below the threshold."""
    import mlflow

    from models.policy import load_policy

    params = load_params(params_path)
    cfg = params.gate
    merged = SFT_OUT / "merged"
    with tracking.stage_run("gate", params.tracking, cfg, inputs=(str(VALID_PROBLEMS), str(merged))):
        model, tokenizer = load_policy(merged, dtype=params.base_model.dtype)
        problems = read_problems(VALID_PROBLEMS, "val", cfg.val_problems)
        engine = resolve_engine(cfg.engine, cfg.precision, "gate")
        sampler = make_sampler(merged, tokenizer, engine)
        with make_verifier(params.verifier) as verifier:
            metrics = measure_split(
                model, tokenizer, problems, cfg, verifier, OUT, "val", greedy=False, sampler=sampler
            )
        verdict = gate_verdict(metrics, cfg)
        metrics = {**metrics, "threshold": cfg.threshold, "passed": verdict.passed, "engine": "/".join(engine)}
        write_json(metrics, METRICS)
        tracking.log_artifacts(OUT, artifact_path="gate")
        tracking.mlflow_emit({f"gate/{k}": v for k, v in metrics.items() if isinstance(v, int | float)}, step=0)
        mlflow.set_tag("gate", "passed" if verdict.passed else "failed")
        verdict.raise_if_failed()
    return metrics
