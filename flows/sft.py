"""Stage ``sft``: supervised fine-tuning of the base checkpoint on the train split's reference answers.

Outputs the LoRA adapter and a merged checkpoint (DVC outs). The exact-resume checkpoints live beside them in
data/checkpoints/sft/checkpoints/ (not a DVC out, so DVC does not delete them before a re-run): a crash mid-training
followed by `dvc repro` or `didpo run` continues from the last checkpoint.
"""

from __future__ import annotations

from prefect import flow

from flows.paths import BASE_CHECKPOINT, SFT_CHECKPOINT, SFT_HEADLINE, SFT_HISTORY, SFT_METRICS, VALID_PROBLEMS
from tasks import tracking
from tasks.config import load_params
from tasks.sft import run_sft, sft, sft_data


@flow(name="sft")
def run(params_path: str = "params.yaml") -> dict:
    """Fine-tune, export adapter + merged checkpoint, write metrics and the loss curves (DVC plots)."""
    params = load_params(params_path)
    with tracking.stage_run(
        "sft",
        params.tracking,
        params.sft,
        inputs=(str(VALID_PROBLEMS), str(BASE_CHECKPOINT)),
        resume_dir=SFT_CHECKPOINT / "checkpoints",
    ):
        metrics = sft(params, VALID_PROBLEMS, BASE_CHECKPOINT, SFT_CHECKPOINT, SFT_METRICS, SFT_HEADLINE, SFT_HISTORY)
        tracking.log_artifacts(SFT_METRICS, SFT_HISTORY, artifact_path="sft")
    return metrics


def worker(params_path: str = "params.yaml") -> None:
    """A rank > 0 of the stage under ``accelerate launch`` (``launch.num_processes`` > 1): the training alone, on the
    inputs `run` gives it (rank 0 runs `run`: Prefect, MLflow and the DVC outputs)."""
    params = load_params(params_path)
    train, held_out = sft_data(params, VALID_PROBLEMS)
    run_sft.fn(BASE_CHECKPOINT, params.base_model.dtype, train, held_out, params.sft, SFT_CHECKPOINT)
