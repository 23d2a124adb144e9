"""Stage ``didpo``: RL from the DPO checkpoint on the train split — DiDPO, or the GRPO/DAPO baselines (``didpo.algo``).

The policy starts from data/checkpoints/dpo/merged; the KL reference (when ``didpo.kl_coef`` > 0) is the same weights
with the LoRA adapters disabled. Outputs the adapter and a merged checkpoint, every rollout with its rewards
(data/rl/rollouts.jsonl, for people to read), the screened prompt pool with its pass rates and control curves
(data/rl/pool.json; train problems only), the run's metrics and the per-step history (DVC plots). The exact-resume
checkpoints live beside the exports in data/checkpoints/rl/checkpoints/ (not a DVC out): a crash followed by
`dvc repro` or `didpo run` continues from the last one.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from flows.validate import VALID_PROBLEMS
from tasks import tracking
from tasks.config import load_params
from tasks.io import headline, write_history, write_json
from tasks.measure import make_verifier, read_problems
from tasks.rl import run_rl

POLICY = Path("data/checkpoints/dpo/merged")  # the DPO stage's export
OUT = Path("data/checkpoints/rl")
ROLLOUTS = Path("data/rl/rollouts.jsonl")
POOL = Path("data/rl/pool.json")  # the screened prompt pool: pass rates and start-policy control curves
METRICS = Path("data/rl/metrics.json")
HEADLINE = Path("data/rl/headline.json")  # the DVC metric (tasks.io.headline)
HEADLINE_KEYS = (
    "algo",
    "global_step",
    *(f"{name}/{at}" for name in ("pass_rate", "reward/outcome", "kl_start") for at in ("first", "last")),
)
HISTORY = Path("data/rl/history.json")


@flow(name="didpo")
def run(params_path: str = "params.yaml") -> dict:
    """Run RL, export adapter + merged checkpoint, write rollouts, metrics and the per-step curves."""
    params = load_params(params_path)
    cfg = params.didpo
    if not (POLICY / "config.json").is_file():
        raise FileNotFoundError(f"{POLICY} holds no checkpoint: run the dpo stage first (`didpo stage dpo`)")
    with tracking.stage_run(
        "didpo", params.tracking, cfg, inputs=(str(VALID_PROBLEMS), str(POLICY)), resume_dir=OUT / "checkpoints"
    ):
        problems = read_problems(VALID_PROBLEMS, "train")
        with make_verifier(params.verifier) as verifier:
            metrics, history = run_rl(POLICY, params.base_model.dtype, problems, cfg, verifier, OUT, ROLLOUTS, POOL)
        write_json(metrics, METRICS)
        write_json(headline(metrics, HEADLINE_KEYS), HEADLINE)
        write_history(history, HISTORY)
        tracking.log_artifacts(METRICS, HISTORY, ROLLOUTS, POOL, artifact_path="didpo")
    return metrics
