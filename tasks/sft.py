"""The ``sft`` stage's work: load the base checkpoint, train (models.sft), report; MLflow receives every step."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from models.checkpoint import checkpoint_hash
from models.config import SFTConfig
from models.distributed import is_main_process
from models.training import resume_or_start_over
from tasks.tracking import mlflow_emit


@task(cache_policy=NO_CACHE)
def run_sft(base: Path, dtype: str, train: list[dict], held_out: list[dict], cfg: SFTConfig, out: Path):
    """Train and export; returns ``(metrics, history)`` where history holds every emitted record (for plots).

    A leftover resume checkpoint written with another config or other data is discarded (that is a new run,
    not a resumed one); a checkpoint of this very run is resumed.
    """
    from models.policy import load_policy
    from models.sft import train_sft

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
