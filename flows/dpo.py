"""Stage ``dpo``: DPO of a fresh LoRA on the SFT checkpoint against the SFT checkpoint itself (hash-verified).

Reads the merged pairs of the selfplay stage; holds out a fraction of the prompts; exports the weights with the
lowest held-out loss, the reference's when no update beats it. A smoke check (not a measurement: `dpo.val_problems`
problems cannot show a change below about 6/n) of format compliance, unsafe-code rate and greedy pass on val before
(SFT) and after (DPO), under ``smoke`` in the metrics. Outputs data/checkpoints/dpo/{adapter,merged},
data/dpo/metrics.json and data/dpo/history.json (DVC plots). Resume checkpoints live in
data/checkpoints/dpo/checkpoints/ (not a DVC out), as for sft.
"""

from __future__ import annotations

from prefect import flow

from flows.paths import (
    DPO_CHECKPOINT,
    DPO_HEADLINE,
    DPO_HISTORY,
    DPO_METRICS,
    SELFPLAY_PAIRS,
    SFT_CHECKPOINT,
    SFT_METRICS,
    VALID_PROBLEMS,
)
from tasks import tracking
from tasks.config import load_params
from tasks.dpo import dpo, expected_reference_hash, run_dpo, training_pairs


@flow(name="dpo")
def run(params_path: str = "params.yaml") -> dict:
    """Verify the reference, smoke-check SFT answers, train, smoke-check DPO answers; write metrics and history."""
    params = load_params(params_path)
    reference = SFT_CHECKPOINT / "merged"
    with tracking.stage_run(
        "dpo",
        params.tracking,
        params.dpo,
        inputs=(str(SELFPLAY_PAIRS), str(reference)),
        resume_dir=DPO_CHECKPOINT / "checkpoints",
    ):
        metrics, logged = dpo(
            params,
            SELFPLAY_PAIRS,
            SFT_METRICS,
            reference,
            VALID_PROBLEMS,
            DPO_CHECKPOINT,
            DPO_METRICS,
            DPO_HEADLINE,
            DPO_HISTORY,
        )
        tracking.log_artifacts(DPO_METRICS, DPO_HISTORY, artifact_path="dpo")
        tracking.mlflow_emit(logged, step=metrics["global_step"])
    return metrics


def worker(params_path: str = "params.yaml") -> None:
    """A rank > 0 of the stage under ``accelerate launch`` (``launch.num_processes`` > 1): the training alone, on the
    inputs `run` gives it (rank 0 runs `run`: the smoke checks, Prefect, MLflow and the DVC outputs)."""
    params = load_params(params_path)
    reference = SFT_CHECKPOINT / "merged"
    expected, _ = expected_reference_hash(SFT_METRICS, reference)
    train, held_out = training_pairs(SELFPLAY_PAIRS, params.dpo)
    run_dpo.fn(reference, expected, params.base_model.dtype, train, held_out, params.dpo, DPO_CHECKPOINT)
