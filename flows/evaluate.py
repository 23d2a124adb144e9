"""Stage ``evaluate``: every checkpoint present (base, SFT, DPO, RL; ``evaluate.checkpoints``) on val, test and
HumanEval, side by side.

pass@{1,5,10,16}, the process metrics, format compliance and unsafe-code rate per checkpoint and split
(tasks/evaluate.py lists the keys); the pass@1 change between consecutive checkpoints with a paired bootstrap
interval (data/evaluate/deltas.json); a Markdown comparison table, pass@k plots (DVC plot JSON per split + one PNG) and
the training curves of each training stage whose history file exists. Everything is logged to the stage's MLflow run.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from flows.base_model import CHECKPOINT as BASE
from flows.validate import VALID_PROBLEMS
from tasks import tracking
from tasks.config import load_params
from tasks.evaluate import (
    CHECKPOINT_NAMES,
    SPLITS,
    comparison_markdown,
    comparison_table,
    deltas_markdown,
    evaluate_checkpoint,
    flat_metrics,
    pass1_deltas,
    passk_rows,
    plot_history,
    plot_passk,
    read_history,
)
from tasks.io import write_json, write_lines
from tasks.measure import make_verifier, read_problems

# Checkpoints in pipeline order (the names `evaluate.checkpoints` accepts); a missing one (its stage not run) is
# skipped. The trained ones are merged exports; the base checkpoint is the base_model stage's folder.
CHECKPOINTS = {name: Path(f"data/checkpoints/{name}/merged") for name in CHECKPOINT_NAMES} | {"base": BASE}
HISTORIES = {
    "sft": Path("data/sft/history.json"),
    "dpo": Path("data/dpo/history.json"),
    "rl": Path("data/rl/history.json"),
}
OUT = Path("data/evaluate")
METRICS = OUT / "metrics.json"
DELTAS = OUT / "deltas.json"
REPORT = OUT / "report.md"
SAMPLES = OUT / "samples"
FIGURES = OUT / "figures"


def present_checkpoints() -> dict[str, Path]:
    """The checkpoints of `CHECKPOINTS` that exist (a folder with a config.json), in pipeline order."""
    return {name: path for name, path in CHECKPOINTS.items() if (path / "config.json").is_file()}


@flow(name="evaluate")
def run(params_path: str = "params.yaml") -> dict:
    """Measure every present checkpoint; writes data/evaluate/ (metrics.json, report.md, plots, samples)."""
    import mlflow

    params = load_params(params_path)
    cfg = params.evaluate
    checkpoints = {name: path for name, path in present_checkpoints().items() if name in cfg.checkpoints}
    if not checkpoints:
        wanted = [str(CHECKPOINTS[name]) for name in cfg.checkpoints]
        raise FileNotFoundError(f"no checkpoint to evaluate: none of {wanted} (evaluate.checkpoints) exists")
    inputs = (str(VALID_PROBLEMS), *map(str, checkpoints.values()))
    with tracking.stage_run("evaluate", params.tracking, cfg, inputs=inputs):
        problems = {split: read_problems(VALID_PROBLEMS, split, cfg.limit(split)) for split in SPLITS}
        metrics, per_problem = {}, {}
        with make_verifier(params.verifier) as verifier:
            for name, path in checkpoints.items():
                metrics[name], per_problem[name] = evaluate_checkpoint(
                    path, params.base_model.dtype, problems, cfg, verifier, SAMPLES / name
                )
        deltas = pass1_deltas(per_problem, seed=cfg.seed)
        write_json(metrics, METRICS)
        write_json(deltas, DELTAS)
        write_lines([comparison_markdown(metrics) + "\n" + deltas_markdown(deltas).rstrip("\n")], REPORT)
        for split in SPLITS:
            write_json({"passk": passk_rows(metrics, split, list(CHECKPOINTS))}, OUT / f"passk_{split}.json")
        plot_passk(metrics, FIGURES / "passk.png")
        for stage, path in HISTORIES.items():
            if path.is_file():
                plot_history(read_history(path), f"{stage} training", FIGURES / f"training_{stage}.png")
        tracking.mlflow_emit(flat_metrics(metrics), step=0)
        mlflow.log_table(comparison_table(metrics), artifact_file="evaluate/comparison.json")
        tracking.log_artifacts(
            METRICS, DELTAS, REPORT, *(OUT / f"passk_{s}.json" for s in SPLITS), artifact_path="evaluate"
        )
        tracking.log_artifacts(FIGURES, artifact_path="evaluate/figures")
    return metrics
