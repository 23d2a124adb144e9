"""Stage ``selfplay``: the SFT model answers training prompts K times; best vs worst answers become preference pairs,
merged with the mined (and human) pairs into data/selfplay/pairs.jsonl, each pair tagged with its source.

Runs after the gate (it depends on data/gate/metrics.json, so a failed gate blocks it).
"""

from __future__ import annotations

from prefect import flow, get_run_logger

from flows.paths import (
    MINED_PAIRS,
    SELFPLAY_HEADLINE,
    SELFPLAY_METRICS,
    SELFPLAY_PAIRS,
    SFT_CHECKPOINT,
    VALID_PAIRS,
    VALID_PROBLEMS,
)
from tasks import tracking
from tasks.config import load_params
from tasks.selfplay import selfplay


@flow(name="selfplay")
def run(params_path: str = "params.yaml") -> dict:
    """Sample, verify, pair, merge; writes the pairs and data/selfplay/metrics.json (counts per source)."""
    params = load_params(params_path)
    merged = SFT_CHECKPOINT / "merged"
    inputs = (str(VALID_PROBLEMS), str(merged), str(MINED_PAIRS))
    with tracking.stage_run("selfplay", params.tracking, params.selfplay, inputs=inputs):
        metrics, warning = selfplay(
            params,
            VALID_PROBLEMS,
            merged,
            MINED_PAIRS,
            VALID_PAIRS,
            SELFPLAY_PAIRS,
            SELFPLAY_METRICS,
            SELFPLAY_HEADLINE,
        )
        tracking.log_artifacts(SELFPLAY_METRICS, artifact_path="selfplay")
        tracking.mlflow_emit({f"selfplay/{k}": v for k, v in metrics.items()}, step=0)
        if warning:
            get_run_logger().warning(f"{warning} (counts: {SELFPLAY_METRICS})")
    return metrics
