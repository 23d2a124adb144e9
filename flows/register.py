"""Stage ``register``: pick the candidate (the trained checkpoint of this run with the best primary metric), log it to
the MLflow registry as the ``challenger`` and promote it to ``champion`` only when the pre-registered paired test
against the incumbent (the champion measured in the same evaluate run, else the base model) says it is better
(tasks/register.py has the rule and the reasons).

The decision, its reasons and the test (p, effect, interval, n, MDE) go to data/register/decision.json (DVC metrics),
the MLflow run's tags and the model version's tags. ``didpo rollback`` moves ``champion`` back to the version it
replaced.
"""

from __future__ import annotations

import json

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
from tasks.io import headline, write_json
from tasks.register import Evidence, choose_candidate, flatten, register_and_decide

HEADLINE = {"checkpoint": "checkpoint", "promoted": "promoted", "version": "version"}  # the DVC metric


@flow(name="register")
def run(params_path: str = "params.yaml") -> dict:
    """Choose the candidate, register it, decide champion/challenger, record the decision."""
    params = load_params(params_path)
    cfg = params.register
    evaluated = json.loads(EVAL_METRICS.read_text())
    measured = json.loads(EVAL_PER_PROBLEM.read_text())
    families = json.loads(EVAL_PROTOCOL.read_text())["families"]
    evidence = {
        name: Evidence(name, measured["protocol"], scores, families, flatten(evaluated[name]))
        for name, scores in measured["checkpoints"].items()
    }
    candidate = choose_candidate(evidence, cfg)
    incumbent = "champion" if "champion" in evidence else "base"
    if incumbent not in evidence:
        raise FileNotFoundError(
            "no champion yet and the base model was not evaluated: add base to evaluate.checkpoints, so the first "
            "version can be tested against it"
        )
    path = present_checkpoints()[candidate]
    algo = params.didpo.algo if candidate == "didpo" else None  # the RL checkpoint: named by its algorithm
    with tracking.stage_run("register", params.tracking, cfg, inputs=(str(EVAL_METRICS), str(path)), algo=algo):
        result = register_and_decide(
            path,
            evidence[candidate],
            evidence[incumbent],
            cfg,
            params.base_model.dtype,
            params.base_model.name_or_path,
            algo=algo,
            measured_champion=measured.get("champion_version"),
        )
        decision = result.as_dict()
        write_json(decision, REGISTER_DECISION)
        write_json(headline(decision, HEADLINE), REGISTER_HEADLINE)
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
    return decision
