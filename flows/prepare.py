"""Stage ``prepare``: generated problems + HumanEval + user files → data/prepared/problems.jsonl (+ report)."""

from __future__ import annotations

from pathlib import Path

from prefect import flow

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

PROBLEMS = Path("data/prepared/problems.jsonl")
REPORT = Path("data/prepared/prepare_report.json")
HEADLINE = Path("data/prepared/headline.json")  # the DVC metric (tasks.io.headline)
HEADLINE_KEYS = (
    "n_problems",
    *(f"splits.{split}" for split in ("train", "val", "test", "heldout", "humaneval")),
    "leakage.group_overlap",
    "leakage.prompt_hash_collisions",
    "exercise_decontamination.checked",
    "exercise_decontamination.n_entry_points",
    "exercise_decontamination.n_ngram_hits",
)


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
        write_lines([serialise(p) for p in problems] + user_lines, PROBLEMS)
        report = prepare_report(problems, len(user_lines), cfg)
        write_json(report, REPORT)
        write_json(headline(report, HEADLINE_KEYS), HEADLINE)
        tracking.log_artifacts(REPORT)
        splits = {f"prepare/n_{split}": n for split, n in report["splits"].items()}
        tracking.mlflow_emit({"prepare/n_problems": report["n_problems"], **splits}, step=0)
    return report
