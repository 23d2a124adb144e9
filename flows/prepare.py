"""Stage ``prepare``: generated problems + HumanEval + user files → data/prepared/problems.jsonl (+ report)."""

from __future__ import annotations

from prefect import flow

from flows.paths import PREPARE_HEADLINE, PREPARE_REPORT, PREPARED_PROBLEMS
from tasks import tracking
from tasks.config import load_params
from tasks.io import headline, write_json, write_lines
from tasks.prepare import (
    general_exercises,
    generated_problems,
    humaneval_problems,
    prepare_report,
    serialise,
    user_problem_lines,
)

HEADLINE = {"problems": "n_problems"}  # the DVC metric (tasks.io.headline); splits and leakage: the report


@flow(name="prepare")
def run(params_path: str = "params.yaml") -> dict:
    """Write the normalised, split problem set and its report (counts, leakage check); returns the report."""
    params = load_params(params_path)
    cfg = params.prepare
    with tracking.stage_run("prepare", params.tracking, cfg, inputs=cfg.user_problems):
        problems = generated_problems(cfg)
        if cfg.include_exercises:
            problems = problems + general_exercises()
        if cfg.include_humaneval:
            problems = problems + humaneval_problems()
        user_lines = [line for path in cfg.user_problems for line in user_problem_lines(path, cfg)]
        write_lines([serialise(p) for p in problems] + user_lines, PREPARED_PROBLEMS)
        report = prepare_report(problems, len(user_lines), cfg)
        write_json(report, PREPARE_REPORT)
        write_json(headline(report, HEADLINE), PREPARE_HEADLINE)
        tracking.log_artifacts(PREPARE_REPORT)
        splits = {f"prepare/n_{split}": n for split, n in report["splits"].items()}
        tracking.mlflow_emit({"prepare/n_problems": report["n_problems"], **splits}, step=0)
    return report
