"""Stage ``simulate_logs``: realistic feedback logs for the embedded default; ground truth kept apart for benchmarks.

The miner never reads data/simulated/ground_truth.jsonl; bench_mining.py uses it to measure precision and recall.
"""

from __future__ import annotations

from prefect import flow

from flows.paths import GROUND_TRUTH, PREPARED_PROBLEMS, SIMULATED_LOGS
from tasks import tracking
from tasks.config import load_params
from tasks.simulate_logs import simulate


@flow(name="simulate_logs")
def run(params_path: str = "params.yaml") -> dict:
    """Simulate, write logs + ground truth; returns counts."""
    params = load_params(params_path)
    cfg = params.simulate_logs
    with tracking.stage_run("simulate_logs", params.tracking, cfg, inputs=(str(PREPARED_PROBLEMS),)):
        events, truth = simulate(PREPARED_PROBLEMS, cfg, params.verifier, SIMULATED_LOGS, GROUND_TRUTH)
        counts = {
            "simulate_logs/events": len(events),
            "simulate_logs/users": events["user_id"].nunique(),
            "simulate_logs/prompts": events["prompt"].nunique(),
            "simulate_logs/up_rate": float((events["rating"] == "up").mean()),
        }
        tracking.mlflow_emit(counts, step=0)
    return counts
