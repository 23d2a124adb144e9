"""Stage ``register``: log the final model (RL, else DPO, else SFT) to the MLflow registry as the ``challenger`` and
promote it to ``champion`` only when it beats the current champion (tasks/registry.py has the rule and the reasons).

The decision and its reasons go to data/register/decision.json (DVC metrics), the MLflow run's tags and the model
version's tags. ``didpo rollback`` moves ``champion`` back to the version it replaced.
"""

from __future__ import annotations

import json
from pathlib import Path

from prefect import flow

from flows.evaluate import METRICS as EVAL_METRICS
from flows.evaluate import present_checkpoints
from tasks import tracking
from tasks.config import load_params
from tasks.io import write_json
from tasks.registry import final_checkpoint, flatten, register_and_decide

DECISION = Path("data/register/decision.json")


@flow(name="register")
def run(params_path: str = "params.yaml") -> dict:
    """Register the final checkpoint, decide champion/challenger, record the decision."""
    import mlflow

    params = load_params(params_path)
    cfg = params.register
    checkpoint, path = final_checkpoint(present_checkpoints())
    evaluated = json.loads(EVAL_METRICS.read_text())
    if checkpoint not in evaluated:
        raise FileNotFoundError(f"{EVAL_METRICS} has no '{checkpoint}' metrics: run the evaluate stage first")
    with tracking.stage_run("register", params.tracking, cfg, inputs=(str(EVAL_METRICS), str(path))):
        result = register_and_decide(path, checkpoint, flatten(evaluated[checkpoint]), cfg, params.base_model.dtype)
        decision = result.as_dict()
        write_json(decision, DECISION)
        mlflow.set_tags(
            {
                "didpo.decision": "promoted" if result.promoted else "rejected",
                "didpo.model_version": str(result.version),
                "didpo.reasons": "\n".join(result.reasons)[:4900],
            }
        )
        tracking.mlflow_emit({"register/promoted": float(result.promoted), "register/version": result.version}, 0)
        tracking.log_artifacts(DECISION, artifact_path="register")
    return decision
