"""The ``sft`` stage's work: load the base checkpoint, train (models.sft), report; MLflow receives every step."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from models.checkpoint import checkpoint_hash
from models.config import SFTConfig
from models.distributed import is_main_process
from models.policy import load_policy
from models.sft import train_sft
from models.training import resume_or_start_over
from tasks.config import Params
from tasks.io import headline, read_problems, write_history, write_json
from tasks.tracking import mlflow_emit

HEADLINE = {"eval_loss": "best_eval_loss"}  # the DVC metric (tasks.io.headline)


@task(cache_policy=NO_CACHE)
def run_sft(base: Path, dtype: str, train: list[dict], held_out: list[dict], cfg: SFTConfig, out: Path):
    """Train and export; returns ``(metrics, history)`` where history holds every emitted record (for plots).

    A leftover resume checkpoint written with another config or other data is discarded (that is a new run,
    not a resumed one); a checkpoint of this very run is resumed.
    """

    def attempt(resume: bool):
        model, tokenizer = load_policy(base, dtype=dtype)
        return train_sft(model, tokenizer, train, held_out, cfg, out, emit=mlflow_emit, resume=resume)

    result = resume_or_start_over(attempt)
    if not is_main_process():  # a rank > 0 under `accelerate launch`: rank 0 writes the outputs
        return {}, result.history
    metrics = {
        "global_step": result.global_step,
        "best_eval_loss": result.best_eval_loss,
        "best_step": result.best_step,
        "stopped_early": result.stopped_early,
        "n_train_examples": result.n_train_examples,
        "n_truncated": result.n_truncated,
        "trainable_params": result.trainable_params,
        "merged_sha256": checkpoint_hash(result.merged_path),  # the DPO stage accepts only this reference
    }
    return metrics, result.history


def sft_data(params: Params, problems: Path) -> tuple[list[dict], list[dict]]:
    """The train split (required) and the held-out val problems (the gate's first ``gate.val_problems``)."""
    return read_problems(problems, "train", required=True), read_problems(problems, "val", params.gate.val_problems)


def sft(
    params: Params, problems: Path, base: Path, out: Path, metrics_out: Path, headline_out: Path, history_out: Path
):
    """The stage's work (rank 0): train on `problems`' train split from `base`, export to `out`, write the metrics to
    `metrics_out`, their headline to `headline_out` and the loss curves to `history_out`. Returns the metrics."""
    train, held_out = sft_data(params, problems)
    metrics, history = run_sft(base, params.base_model.dtype, train, held_out, params.sft, out)
    write_json(metrics, metrics_out)
    write_json(headline(metrics, HEADLINE), headline_out)
    write_history(history, history_out)
    return metrics
