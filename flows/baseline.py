"""Stage ``baseline``: the base model's greedy pass@1 and sampled pass@k on the val split and on HumanEval
(tasks/baseline.py)."""

from __future__ import annotations

from prefect import flow

from flows.paths import BASE_CHECKPOINT, BASELINE, BASELINE_HEADLINE, BASELINE_METRICS, VALID_PROBLEMS
from tasks import tracking
from tasks.baseline import measure_base
from tasks.config import load_params


@flow(name="baseline")
def run(params_path: str = "params.yaml") -> dict:
    """Measure the base checkpoint; writes data/baseline/metrics.json, its headline (the DVC metric) and per-problem
    results."""
    params = load_params(params_path)
    cfg = params.baseline
    with tracking.stage_run("baseline", params.tracking, cfg, inputs=(str(VALID_PROBLEMS),)):
        metrics, engine = measure_base(
            BASE_CHECKPOINT,
            VALID_PROBLEMS,
            cfg,
            params.base_model.dtype,
            params.verifier,
            BASELINE,
            BASELINE_METRICS,
            BASELINE_HEADLINE,
        )
        tracking.set_tags({"didpo.engine": "/".join(engine)})
        tracking.log_artifacts(BASELINE, artifact_path="baseline")
        flat = {f"baseline/{split}/{k}": v for split, m in metrics.items() for k, v in m.items()}
        tracking.mlflow_emit(flat, step=0)
    return metrics
