"""Stage ``evaluate``: every checkpoint present (base, SFT, DPO, RL; ``evaluate.checkpoints``) and the registry's
champion on val, test, the held-out families and HumanEval, side by side, under one evaluation protocol
(tasks/evaluate.py). val and test are in-family (unseen variants of trained tasks), ``heldout`` holds whole families
never trained on (``prepare.heldout_families``), HumanEval is external.

The val problems are the protocol's (``evaluate.val_per_family`` per family, after the val problems the gate, SFT,
DPO and the baseline use); every checkpoint answers the same problems with the same seeds. HumanEval is the external
guard (problems not generated here): one greedy answer per problem (``evaluate.humaneval_greedy``), and every trained
checkpoint's paired change against the base model is in deltas.json. The champion is
downloaded from the MLflow registry into a temporary folder and measured like the others, so the register stage
compares figures of one run. data/evaluate/protocol.json is the protocol; per_problem.json holds every checkpoint's
per-problem pass@1 for the paired tests.

pass@k (k ≤ n/2), the process metrics, format compliance and unsafe-code rate per checkpoint and split
(tasks/evaluate.py lists the keys); the pass@1 change between consecutive checkpoints with its one-sided paired
sign-flip p, interval and MDE (data/evaluate/deltas.json); the RL checkpoint's claim against the DPO checkpoint it
started from (data/evaluate/rl_claim.json: n, test, p, interval, MDE, verdict); a Markdown comparison table, pass@k
plots (DVC plot JSON per split + one PNG) and the training curves of each training stage whose history file exists.
Everything is logged to the stage's MLflow run.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from prefect import flow, get_run_logger

from flows.code_graph import WATCHING, import_closure, project_modules
from flows.paths import (
    CHECKPOINTS,
    EVAL_DELTAS,
    EVAL_FIGURES,
    EVAL_HEADLINE,
    EVAL_METRICS,
    EVAL_PER_PROBLEM,
    EVAL_PROTOCOL,
    EVAL_REPORT,
    EVAL_RL_CLAIM,
    EVAL_SAMPLES,
    EVALUATE,
    HISTORIES,
    VALID_PROBLEMS,
    present_checkpoints,
)
from tasks import tracking
from tasks.config import load_params
from tasks.evaluate import SPLITS, comparison_table, evaluate, flat_metrics

# one entry per checkpoint evaluation (tasks.evaluate.evaluation_key): a memo beside .cache/openvino, not a DVC out
EVAL_CACHE = Path(".cache/evaluate")
OUTPUTS = {
    "samples": EVAL_SAMPLES,
    "metrics": EVAL_METRICS,
    "deltas": EVAL_DELTAS,
    "rl_claim": EVAL_RL_CLAIM,
    "headline": EVAL_HEADLINE,
    "protocol": EVAL_PROTOCOL,
    "per_problem": EVAL_PER_PROBLEM,
    "report": EVAL_REPORT,
    "passk": EVALUATE,
    "figures": EVAL_FIGURES,
}

# What the evaluate stage runs that cannot change a figure: how it is logged (`flows.code_graph.WATCHING`), where the
# champion comes from (tasks.register; its weights are in the key), the stage's wiring and paths (flows: the settings
# and the protocol they pass are in the key). Editing them keeps every cached evaluation valid.
EVAL_WATCHING = WATCHING | {"tasks.register"}


def evaluation_code(root: Path = Path(".")) -> list[Path]:
    """The code that produces the evaluate stage's answers and verdicts (part of `evaluation_key`): the stage's work
    (tasks.evaluate) followed through its imports, less the flows (wiring) and `EVAL_WATCHING`; paths relative to
    `root`, the project root and working directory."""
    modules = project_modules(root)
    watching = EVAL_WATCHING | {name for name in modules if name.startswith("flows.")}
    return sorted(modules[name].relative_to(root) for name in import_closure("tasks.evaluate", modules, watching))


@flow(name="evaluate")
def run(params_path: str = "params.yaml") -> dict:
    """Measure every present checkpoint and the champion; writes data/evaluate/ (metrics, protocol, per-problem
    scores, report, plots, samples)."""
    params = load_params(params_path)
    cfg = params.evaluate
    checkpoints = {name: path for name, path in present_checkpoints().items() if name in cfg.checkpoints}
    if not checkpoints:
        wanted = [str(CHECKPOINTS[name]) for name in cfg.checkpoints]
        raise FileNotFoundError(f"no checkpoint to evaluate: none of {wanted} (evaluate.checkpoints) exists")
    inputs = (str(VALID_PROBLEMS), *map(str, checkpoints.values()))
    algo = params.didpo.algo if "didpo" in checkpoints else None  # the RL checkpoint's algorithm, in names
    commit, dirty = tracking.git_commit()
    with (
        tracking.stage_run("evaluate", params.tracking, cfg, inputs=inputs, algo=algo),
        tempfile.TemporaryDirectory() as tmp,
    ):
        metrics, protocol, champion_version, reused = evaluate(
            params,
            checkpoints,
            VALID_PROBLEMS,
            Path(tmp) / "champion",
            evaluation_code(),
            EVAL_CACHE,
            commit + ("-dirty" if dirty else ""),
            HISTORIES,
            OUTPUTS,
            get_run_logger(),  # on the console and in the flow run's logs
        )
        tracking.set_tags(
            {
                "didpo.protocol": protocol["id"],
                "didpo.champion_version": str(champion_version),
                "didpo.eval_reused": ",".join(reused) or "none",
            }
        )
        tracking.mlflow_emit(flat_metrics(metrics), step=0)
        tracking.log_table(comparison_table(metrics, algo), artifact_file="evaluate/comparison.json")
        tracking.log_artifacts(
            EVAL_METRICS,
            EVAL_DELTAS,
            EVAL_PROTOCOL,
            EVAL_PER_PROBLEM,
            EVAL_REPORT,
            EVAL_RL_CLAIM,
            *(EVALUATE / f"passk_{s}.json" for s in SPLITS),
            artifact_path="evaluate",
        )
        tracking.log_artifacts(EVAL_FIGURES, artifact_path="evaluate/figures")
    return metrics
