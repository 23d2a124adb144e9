"""Stage ``validate``: Great Expectations data contracts (data/expectations/) over problems, feedback logs and pairs.

Valid rows go to data/validated/, every bad row to data/validated/quarantine/ with the failed expectation; valid +
quarantined = input, always. The console gets the quarantine's summary (rows, top reasons, where the rows and the
report are: `tasks.validate.quarantine_summary`). The stage fails with a readable summary when a critical expectation
or a bad-row-rate threshold fails (the report is written and logged first, so people can read why).
"""

from __future__ import annotations

import logging

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
from tasks.validate import ensure_passed, quarantine_summary, report_dict, validate


@flow(name="validate")
def run(params_path: str = "params.yaml") -> dict:
    """Validate every input dataset, write the JSON/Markdown report, fail loudly when a contract is broken."""
    params = load_params(params_path)
    cfg = params.validate
    inputs = (str(PREPARED_PROBLEMS), cfg.feedback_logs, cfg.human_pairs)
    with tracking.stage_run("validate", params.tracking, cfg, inputs=inputs):
        reports = validate(
            params,
            PREPARED_PROBLEMS,
            VALID_PROBLEMS,
            VALID_LOGS,
            VALID_PAIRS,
            QUARANTINE,
            VALIDATE_REPORT_JSON,
            VALIDATE_REPORT_MD,
            VALIDATE_HEADLINE,
        )
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
