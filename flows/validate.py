"""Stage ``validate``: Great Expectations data contracts (data/expectations/) over problems, feedback logs and pairs.

Valid rows go to data/validated/, every bad row to data/validated/quarantine/ with the failed expectation; valid +
quarantined = input, always. The console gets the quarantine's summary (rows, top reasons, where the rows and the
report are: `tasks.validate.quarantine_summary`). The stage fails with a readable summary when a critical expectation
or a bad-row-rate threshold fails (the report is written and logged first, so people can read why).
"""

from __future__ import annotations

import logging
from pathlib import Path

from prefect import flow, get_run_logger

from flows.paths import (
    PREPARED_PROBLEMS,
    QUARANTINE,
    VALID_LOGS,
    VALID_PAIRS,
    VALID_PROBLEMS,
    VALIDATE_HEADLINE,
    VALIDATE_REPORT_JSON,
    VALIDATE_REPORT_MD,
)
from tasks import tracking
from tasks.config import load_params
from tasks.io import write_json
from tasks.validate import validate_logs_task, validate_pairs_task, validate_problems_task


@flow(name="validate")
def run(params_path: str = "params.yaml") -> dict:
    """Validate every input dataset, write the JSON/Markdown report, fail loudly when a contract is broken."""
    from tasks.validate import ensure_passed, quarantine_summary, report_dict, write_report

    params = load_params(params_path)
    cfg = params.validate
    inputs = (str(PREPARED_PROBLEMS), cfg.feedback_logs, cfg.human_pairs)
    with tracking.stage_run("validate", params.tracking, cfg, inputs=inputs):
        reports = [
            validate_problems_task(params, PREPARED_PROBLEMS, VALID_PROBLEMS, QUARANTINE / "problems.jsonl"),
            validate_logs_task(cfg, Path(cfg.feedback_logs), VALID_LOGS, QUARANTINE / "feedback_logs.jsonl"),
            validate_pairs_task(cfg, Path(cfg.human_pairs), VALID_PAIRS, QUARANTINE / "human_pairs.jsonl"),
        ]
        write_report(reports, VALIDATE_REPORT_JSON, VALIDATE_REPORT_MD)
        # the DVC metric: rows quarantined across the datasets (per dataset and rule: the report)
        write_json({"quarantined": sum(r.rows_quarantined for r in reports)}, VALIDATE_HEADLINE)
        tracking.log_artifacts(VALIDATE_REPORT_JSON, VALIDATE_REPORT_MD, QUARANTINE, artifact_path="validation")
        tracking.mlflow_emit(
            {
                f"validate/{r.name}/{key}": getattr(r, key)
                for r in reports
                for key in ("rows_in", "rows_valid", "rows_quarantined", "bad_row_rate")
            },
            step=0,
        )
        level = logging.WARNING if any(r.rows_quarantined for r in reports) else logging.INFO
        for line in quarantine_summary(reports, VALIDATE_REPORT_MD):  # the console's account of the quarantine
            get_run_logger().log(level, line)
        ensure_passed(reports)
    return report_dict(reports)
