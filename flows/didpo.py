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
from tasks.didpo import run_didpo
from tasks.io import headline, read_problems, write_history, write_json
from tasks.sandbox import make_verifier

# the DVC metric (tasks.io.headline): the last step's rollout pass rate and KL to the start policy
HEADLINE = {"algo": "algo", "step": "global_step", "pass_rate": "pass_rate/last", "kl_start": "kl_start/last"}


@flow(name="didpo")
def run(params_path: str = "params.yaml") -> dict:
    """Run RL, export adapter + merged checkpoint, write rollouts, metrics and the per-step curves."""
    params = load_params(params_path)
    cfg = params.didpo
    policy = CHECKPOINTS["dpo"]  # the DPO stage's export
    if not (policy / "config.json").is_file():
        raise FileNotFoundError(f"{policy} holds no checkpoint: run the dpo stage first (`didpo stage dpo`)")
    with tracking.stage_run(
        "didpo",
        params.tracking,
        cfg,
        inputs=(str(VALID_PROBLEMS), str(policy)),
        resume_dir=DIDPO_CHECKPOINT / "checkpoints",
    ):
        problems = read_problems(VALID_PROBLEMS, "train", required=True)
        with make_verifier(params.verifier) as verifier:
            metrics, history = run_didpo(
                policy, params.base_model.dtype, problems, cfg, verifier, DIDPO_CHECKPOINT, DIDPO_ROLLOUTS, DIDPO_POOL
            )
        write_json(metrics, DIDPO_METRICS)
        write_json(headline(metrics, HEADLINE), DIDPO_HEADLINE)
        write_history(history, DIDPO_HISTORY)
        tracking.log_artifacts(DIDPO_METRICS, DIDPO_HISTORY, DIDPO_ROLLOUTS, DIDPO_POOL, artifact_path="didpo")
    return metrics


def worker(params_path: str = "params.yaml") -> None:
    """A rank > 0 of the stage under ``accelerate launch`` (``launch.num_processes`` > 1): the training alone, on the
    inputs `run` gives it (rank 0 runs `run`: Prefect, MLflow and the DVC outputs); its verifier checks its share
    of every step's programs."""
    params = load_params(params_path)
    problems = read_problems(VALID_PROBLEMS, "train")
    with make_verifier(params.verifier) as verifier:
        run_didpo.fn(
            CHECKPOINTS["dpo"],
            params.base_model.dtype,
            problems,
            params.didpo,
            verifier,
            DIDPO_CHECKPOINT,
            DIDPO_ROLLOUTS,
            DIDPO_POOL,
        )
