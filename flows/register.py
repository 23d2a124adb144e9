"""Stage ``register``: pick the candidate (the trained checkpoint of this run with the best primary metric), log it to
the MLflow registry as the ``challenger`` and promote it to ``champion`` only when the pre-registered paired test
against the incumbent (the champion measured in the same evaluate run, else the base model) says it is better
(tasks/register.py has the rule and the reasons).

The decision, its reasons and the test (p, effect, interval, n, MDE) go to data/register/decision.json (DVC metrics),
the MLflow run's tags and the model version's tags. ``didpo rollback`` moves ``champion`` back to the version it
replaced.
"""

from __future__ import annotations

from prefect import flow

from flows.paths import (
    EVAL_METRICS,
    EVAL_PER_PROBLEM,
    EVAL_PROTOCOL,
    REGISTER_DECISION,
    REGISTER_HEADLINE,
    present_checkpoints,
)
from tasks import tracking
from tasks.config import load_params
from tasks.register import gather_evidence, register


@flow(name="register")
def run(params_path: str = "params.yaml") -> dict:
    """Choose the candidate, register it, decide champion/challenger, record the decision."""
    params = load_params(params_path)
    evidence, candidate, incumbent = gather_evidence(params, EVAL_METRICS, EVAL_PER_PROBLEM, EVAL_PROTOCOL)
    path = present_checkpoints()[candidate]
    algo = params.didpo.algo if candidate == "didpo" else None  # the RL checkpoint: named by its algorithm
    inputs = (str(EVAL_METRICS), str(path))
    with tracking.stage_run("register", params.tracking, params.register, inputs=inputs, algo=algo):
        result = register(
            params, path, evidence, candidate, incumbent, EVAL_PER_PROBLEM, REGISTER_DECISION, REGISTER_HEADLINE
        )
        tracking.set_tags(
            {
                "didpo.decision": "promoted" if result.promoted else "rejected",
                "didpo.model_version": str(result.version),
                "didpo.candidate": result.checkpoint,
                "didpo.incumbent": result.incumbent,
                "didpo.protocol": result.protocol,
                "didpo.reasons": "\n".join(result.reasons)[:4900],
            }
        )
        test = result.test
        tracking.mlflow_emit(
            {
                "register/promoted": float(result.promoted),
                "register/version": result.version,
                "register/p_value": test["p_value"],
                "register/effect": test["effect"],
                "register/n_problems": test["n"],
            },
            0,
        )
        tracking.log_artifacts(REGISTER_DECISION, artifact_path="register")
    return result.as_dict()
