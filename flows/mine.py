"""Stage ``mine``: preference pairs from validated feedback logs (denoised, PII-scrubbed) + human pairs. No pair kept
is a warning with the counts of why and the ``mine`` keys to turn (`datalib.mine.no_pairs_warning`,
through tasks/mine.py)."""

from __future__ import annotations

from prefect import flow, get_run_logger

from flows.paths import MINE_HEADLINE, MINE_REPORT, MINED_PAIRS, VALID_LOGS, VALID_PAIRS
from tasks import tracking
from tasks.config import load_params
from tasks.mine import mine


@flow(name="mine")
def run(params_path: str = "params.yaml") -> dict:
    """Mine, write pairs and the mining report (counts per rule, category, source); returns the report."""
    params = load_params(params_path)
    with tracking.stage_run("mine", params.tracking, params.mine, inputs=(str(VALID_LOGS), str(VALID_PAIRS))):
        report, n_pairs, n_events, warning = mine(
            VALID_LOGS, VALID_PAIRS, params.mine, MINED_PAIRS, MINE_REPORT, MINE_HEADLINE
        )
        tracking.log_artifacts(MINE_REPORT, artifact_path="mine")
        tracking.mlflow_emit({"mine/pairs": n_pairs, "mine/events": n_events}, step=0)
        if warning:  # 0 pairs is not an error (self-play still makes pairs), but loud
            get_run_logger().warning(f"{warning} (counts: {MINE_REPORT})")
    return report
