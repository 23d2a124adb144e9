"""Stage ``sft``: supervised fine-tuning of the base checkpoint on the train split's reference answers.

Outputs the LoRA adapter and a merged checkpoint (DVC outs). The exact-resume checkpoints live beside them in
data/checkpoints/sft/checkpoints/ (not a DVC out, so DVC does not delete them before a re-run): a crash mid-training
followed by `dvc repro` or `didpo run` continues from the last checkpoint.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from flows.base_model import CHECKPOINT as BASE
from flows.validate import VALID_PROBLEMS
from tasks import tracking
from tasks.config import load_params
from tasks.io import write_history, write_json
from tasks.measure import read_problems
from tasks.sft import run_sft

OUT = Path("data/checkpoints/sft")
METRICS = Path("data/sft/metrics.json")
HISTORY = Path("data/sft/history.json")


@flow(name="sft")
def run(params_path: str = "params.yaml") -> dict:
    """Fine-tune, export adapter + merged checkpoint, write metrics and the loss curves (DVC plots)."""
    params = load_params(params_path)
    with tracking.stage_run(
        "sft", params.tracking, params.sft, inputs=(str(VALID_PROBLEMS), str(BASE)), resume_dir=OUT / "checkpoints"
    ):
        train = read_problems(VALID_PROBLEMS, "train")
        held_out = read_problems(VALID_PROBLEMS, "val", params.gate.val_problems)
        metrics, history = run_sft(BASE, params.base_model.dtype, train, held_out, params.sft, OUT)
        write_json(metrics, METRICS)
        write_history(history, HISTORY)
        tracking.log_artifacts(METRICS, HISTORY, artifact_path="sft")
    return metrics
