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
from tasks.dpo import answer_quality, expected_reference_hash, run_dpo, smoke_check, training_pairs
from tasks.io import headline, read_problems, write_history, write_json
from tasks.sandbox import make_verifier

# the DVC metric (tasks.io.headline): the held-out loss of the step it exported
HEADLINE = {"eval_loss": "best_eval.dpo/eval_loss"}


@flow(name="dpo")
def run(params_path: str = "params.yaml") -> dict:
    """Verify the reference, smoke-check SFT answers, train, smoke-check DPO answers; write metrics and history."""
    params = load_params(params_path)
    cfg, dtype = params.dpo, params.base_model.dtype
    reference = SFT_CHECKPOINT / "merged"
    with tracking.stage_run(
        "dpo",
        params.tracking,
        cfg,
        inputs=(str(SELFPLAY_PAIRS), str(reference)),
        resume_dir=DPO_CHECKPOINT / "checkpoints",
    ):
        expected, origin = expected_reference_hash(SFT_METRICS, reference)
        train, held_out = training_pairs(SELFPLAY_PAIRS, cfg)
        problems = read_problems(VALID_PROBLEMS, "val", cfg.val_problems)
        with make_verifier(params.verifier) as verifier:
            before = answer_quality(reference, dtype, problems, cfg.max_new_tokens, verifier)
            metrics, history = run_dpo(reference, expected, dtype, train, held_out, cfg, DPO_CHECKPOINT)
            after = answer_quality(DPO_CHECKPOINT / "merged", dtype, problems, cfg.max_new_tokens, verifier)
        smoke, logged = smoke_check(before, after)
        metrics = {**metrics, "reference_sha256": expected, "reference_hash_origin": origin, "smoke": smoke}
        write_json(metrics, DPO_METRICS)
        write_json(headline(metrics, HEADLINE), DPO_HEADLINE)
        write_history(history, DPO_HISTORY)
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
