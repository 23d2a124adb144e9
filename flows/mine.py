"""Stage ``mine``: preference pairs from validated feedback logs (denoised, PII-scrubbed) + human pairs. No pair kept
is a warning with the counts of why and the ``mine`` keys to turn (`datalib.mine.no_pairs_warning`)."""

from __future__ import annotations

from prefect import flow, get_run_logger

from flows.paths import MINE_HEADLINE, MINE_REPORT, MINED_PAIRS, VALID_LOGS, VALID_PAIRS
from tasks import tracking
from tasks.config import load_params
from tasks.feedback import read_frame, write_frame
from tasks.io import headline, write_json

HEADLINE = {"pairs": "pairs_kept"}  # the DVC metric (tasks.io.headline)


@flow(name="mine")
def run(params_path: str = "params.yaml") -> dict:
    """Mine, write pairs and the mining report (counts per rule, category, source); returns the report."""
    from datalib.mine import EVENT_COLUMNS, HUMAN_COLUMNS, mine_pairs, no_pairs_warning

    params = load_params(params_path)
    with tracking.stage_run("mine", params.tracking, params.mine, inputs=(str(VALID_LOGS), str(VALID_PAIRS))):
        events = read_frame(VALID_LOGS, EVENT_COLUMNS)
        human = read_frame(VALID_PAIRS, HUMAN_COLUMNS)
        pairs, report = mine_pairs(events, params.mine, human_pairs=human if len(human) else None)
        write_frame(pairs, MINED_PAIRS)
        write_json(report, MINE_REPORT)
        write_json(headline(report, HEADLINE), MINE_HEADLINE)
        tracking.log_artifacts(MINE_REPORT, artifact_path="mine")
        tracking.mlflow_emit({"mine/pairs": len(pairs), "mine/events": len(events)}, step=0)
        warning = no_pairs_warning(report)  # 0 pairs is not an error (self-play still makes pairs), but loud
        if warning:
            get_run_logger().warning(f"{warning} (counts: {MINE_REPORT})")
    return report
