"""Stage ``didpo``: RL from the DPO checkpoint on the train split — DiDPO, or the GRPO/DAPO baselines (``didpo.algo``).

The policy starts from data/checkpoints/dpo/merged; the KL reference (when ``didpo.kl_coef`` > 0) is the same weights
with the LoRA adapters disabled. Outputs the adapter and a merged checkpoint, every rollout with its rewards
(data/didpo/rollouts.jsonl, for people to read), the screened prompt pool with its pass rates and control curves
(data/didpo/pool.json; train problems only), the run's metrics and the per-step history (DVC plots). The exact-resume
checkpoints live beside the exports in data/checkpoints/didpo/checkpoints/ (not a DVC out): a crash followed by
`dvc repro` or `didpo run` continues from the last one.
"""

from __future__ import annotations

from prefect import flow

from flows.paths import (
    CHECKPOINTS,
    DIDPO_CHECKPOINT,
    DIDPO_HEADLINE,
    DIDPO_HISTORY,
    DIDPO_METRICS,
    DIDPO_POOL,
    DIDPO_ROLLOUTS,
    VALID_PROBLEMS,
)
from tasks import tracking
from tasks.config import load_params
from tasks.didpo import rl, rl_worker


@flow(name="didpo")
def run(params_path: str = "params.yaml") -> dict:
    """Run RL, export adapter + merged checkpoint, write rollouts, metrics and the per-step curves."""
    params = load_params(params_path)
    policy = CHECKPOINTS["dpo"]  # the DPO stage's export
    with tracking.stage_run(
        "didpo",
        params.tracking,
        params.didpo,
        inputs=(str(VALID_PROBLEMS), str(policy)),
        resume_dir=DIDPO_CHECKPOINT / "checkpoints",
    ):
        metrics = rl(
            params,
            policy,
            VALID_PROBLEMS,
            DIDPO_CHECKPOINT,
            DIDPO_ROLLOUTS,
            DIDPO_POOL,
            DIDPO_METRICS,
            DIDPO_HEADLINE,
            DIDPO_HISTORY,
        )
        tracking.log_artifacts(DIDPO_METRICS, DIDPO_HISTORY, DIDPO_ROLLOUTS, DIDPO_POOL, artifact_path="didpo")
    return metrics


def worker(params_path: str = "params.yaml") -> None:
    """A rank > 0 of the stage under ``accelerate launch`` (``launch.num_processes`` > 1): the training alone, on the
    inputs `run` gives it (rank 0 runs `run`: Prefect, MLflow and the DVC outputs); its verifier checks its share
    of every step's programs."""
    params = load_params(params_path)
    rl_worker(params, CHECKPOINTS["dpo"], VALID_PROBLEMS, DIDPO_CHECKPOINT, DIDPO_ROLLOUTS, DIDPO_POOL)
