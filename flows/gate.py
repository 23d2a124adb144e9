"""Stage ``gate``: RL runs only if the SFT model already "knows how" — unbiased pass@k on val above a threshold.

It also reports the external guard (never deciding): the base and SFT models each answer ``gate.external_problems``
HumanEval problems greedily; the paired change, its interval and one-sided p of "SFT is worse" are ``external`` in
data/gate/metrics.json — the in-family gate can pass while general ability falls (issue 23).

A failed gate exits non-zero with a message that names the figure, the threshold and what to do next; the MLflow run
is tagged ``gate=failed``; `didpo run` stops and no later stage runs.
"""

from __future__ import annotations

from prefect import flow

from flows.paths import BASE_CHECKPOINT, GATE, GATE_HEADLINE, GATE_METRICS, SFT_CHECKPOINT, VALID_PROBLEMS
from tasks import tracking
from tasks.config import load_params
from tasks.gate import gate


@flow(name="gate")
def run(params_path: str = "params.yaml") -> dict:
    """Sample n answers per val problem with the SFT model, verify, decide; raises GateFailed below the threshold."""
    params = load_params(params_path)
    merged = SFT_CHECKPOINT / "merged"
    inputs = (str(VALID_PROBLEMS), str(merged), str(BASE_CHECKPOINT))
    with tracking.stage_run("gate", params.tracking, params.gate, inputs=inputs):
        metrics, verdict = gate(params, VALID_PROBLEMS, BASE_CHECKPOINT, merged, GATE, GATE_METRICS, GATE_HEADLINE)
        tracking.log_artifacts(GATE, artifact_path="gate")
        flat = {f"gate/{k}": v for k, v in metrics.items() if isinstance(v, int | float)}
        flat |= {f"gate/external/{k}": v for k, v in metrics.get("external", {}).items() if isinstance(v, int | float)}
        tracking.mlflow_emit(flat, step=0)
        tracking.set_tags({"gate": "passed" if verdict.passed else "failed"})
        verdict.raise_if_failed()
    return metrics
