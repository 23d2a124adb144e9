"""Stage ``prepare``: generated problems + HumanEval + user files → data/prepared/problems.jsonl (+ report)
(tasks/prepare.py)."""

from __future__ import annotations

from prefect import flow

from flows.paths import PREPARE_HEADLINE, PREPARE_REPORT, PREPARED_PROBLEMS
from tasks import tracking
from tasks.config import load_params
from tasks.prepare import prepare


@flow(name="prepare")
def run(params_path: str = "params.yaml") -> dict:
    """Write the normalised, split problem set and its report (counts, leakage check); returns the report."""
    params = load_params(params_path)
    cfg = params.prepare
    with tracking.stage_run("prepare", params.tracking, cfg, inputs=cfg.user_problems):
        report = prepare(cfg, PREPARED_PROBLEMS, PREPARE_REPORT, PREPARE_HEADLINE)
        tracking.log_artifacts(PREPARE_REPORT)
        splits = {f"prepare/n_{split}": n for split, n in report["splits"].items()}
        tracking.mlflow_emit({"prepare/n_problems": report["n_problems"], **splits}, step=0)
    return report
