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

import shutil
import tempfile
from functools import partial
from pathlib import Path

from prefect import flow, get_run_logger

from flows.code_graph import WATCHING, import_closure, project_imports, project_modules
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
from tasks.evaluate import (
    SPLITS,
    comparison_markdown,
    comparison_table,
    deltas_markdown,
    evaluate_checkpoint,
    evaluate_once,
    evaluation_key,
    flat_metrics,
    pass1_deltas,
    passk_rows,
    plot_history,
    plot_passk,
    protocol_record,
    read_history,
    resolve_engine,
    rl_claim,
    select_problems,
    too_small,
)
from tasks.io import write_json, write_lines
from tasks.register import download_champion
from tasks.sandbox import make_verifier

# one entry per checkpoint evaluation (tasks.evaluate.evaluation_key): a memo beside .cache/openvino, not a DVC out
EVAL_CACHE = Path(".cache/evaluate")


def evaluate_headline(metrics: dict) -> dict[str, dict]:
    """``{checkpoint: {"val.pass@1": value, "humaneval.pass@1": value}}``: the figures a person reads first, one DVC
    metric file per checkpoint (``data/evaluate/headline/<checkpoint>.json``), so ``dvc metrics show`` prints a row
    per checkpoint under the columns the baseline and the gate fill too. Test and held-out pass@1, pass@k, process
    metrics and the changes with their p-values stay in metrics.json and deltas.json, DVC outputs beside it."""
    return {
        name: {
            f"{split}.pass@1": m[split]["pass@1"]
            for split in ("val", "humaneval")
            if isinstance(m.get(split), dict) and "pass@1" in m[split]
        }
        for name, m in metrics.items()
    }


def rl_claim_record(per_problem: dict, families: dict, protocol: dict, params) -> dict:
    """`tasks.evaluate.rl_claim` of this run (RL against the DPO checkpoint it started from, on val), or
    ``{"verdict": "not measured", "reason": ...}`` when ``evaluate.checkpoints`` leaves one of them out."""
    if not all(per_problem.get(name, {}).get("val") for name in ("dpo", "didpo")):
        return {"verdict": "not measured", "reason": "evaluate.checkpoints does not measure both dpo and didpo on val"}
    commit, dirty = tracking.git_commit()
    rl = params.didpo
    return rl_claim(
        per_problem["dpo"]["val"],
        per_problem["didpo"]["val"],
        protocol,
        rl.algo,
        params.register.alpha,
        clusters=families.get("val"),
        start="dpo",
        commit=commit + ("-dirty" if dirty else ""),
        rl_config={
            "control": rl.reward.control,
            "shaping": rl.reward.shaping,
            "critic": rl.critic,
            "steps": rl.steps,
            "prompts_per_step": rl.prompts_per_step,
            "group_size": rl.group_size,
            "learning_rate": rl.learning_rate,
            "seed": rl.seed,
        },
    )


def selection_prefix(params) -> int:
    """How many val problems (from the first) other stages use to choose or smoke-check a checkpoint: the gate and
    SFT's held-out loss (``gate.val_problems``), DPO's smoke check, the baseline. Raises ValueError when one of them
    uses every val problem (0), since the protocol then has none left."""
    used = {
        "gate.val_problems": params.gate.val_problems,
        "dpo.val_problems": params.dpo.val_problems,
        "baseline.val_problems": params.baseline.val_problems,
    }
    every = [name for name, n in used.items() if n == 0]
    if every:
        raise ValueError(f"{every} = 0 uses every val problem: the evaluation protocol needs val problems of its own")
    return max(used.values())


# What the evaluate stage runs that cannot change a figure: how it is logged (`flows.code_graph.WATCHING`), where the
# champion comes from (tasks.register; its weights are in the key), the stage's wiring and paths (flows: the settings
# and the protocol they pass are in the key). Editing them keeps every cached evaluation valid.
EVAL_WATCHING = WATCHING | {"tasks.register"}


def evaluation_code(root: Path = Path(".")) -> list[Path]:
    """The code that produces the evaluate stage's answers and verdicts (part of `evaluation_key`): every project
    module this stage's flow imports, followed through their imports, less the flows (wiring) and `EVAL_WATCHING`; paths
    relative to `root`, the project root and working directory."""
    modules = project_modules(root)
    watching = EVAL_WATCHING | {name for name in modules if name.startswith("flows.")}
    starts = project_imports(modules["flows.evaluate"], modules) - watching
    closure = set().union(*(import_closure(name, modules, watching) for name in starts))
    return sorted(modules[name].relative_to(root) for name in closure)


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
    with (
        tracking.stage_run("evaluate", params.tracking, cfg, inputs=inputs, algo=algo),
        tempfile.TemporaryDirectory() as tmp,
    ):
        problems = select_problems(VALID_PROBLEMS, cfg, selection_prefix(params))
        engine = resolve_engine(cfg)
        protocol = protocol_record(cfg, problems, engine)
        champion_version = download_champion(params.register.model_name, Path(tmp) / "champion")
        if champion_version is not None:
            checkpoints["champion"] = Path(tmp) / "champion"
        tracking.set_tags({"didpo.protocol": protocol["id"], "didpo.champion_version": str(champion_version)})
        metrics, per_problem = {}, {}
        code, dtype, reused = evaluation_code(), params.base_model.dtype, []
        log = get_run_logger()  # on the console and in the flow run's logs
        splits = ", ".join(f"{split} {len(rows)}" for split, rows in problems.items() if rows)
        with make_verifier(params.verifier) as verifier:
            for i, (name, path) in enumerate(checkpoints.items(), start=1):
                log.info("checkpoint %d/%d: %s (%s problems; %s)", i, len(checkpoints), name, splits, path)
                key = evaluation_key(path, dtype, cfg, protocol["id"], params.verifier, code)
                metrics[name], per_problem[name], hit = evaluate_once(
                    key,
                    EVAL_CACHE,
                    EVAL_SAMPLES / name,
                    partial(evaluate_checkpoint, path, dtype, problems, cfg, verifier, EVAL_SAMPLES / name, engine),
                )
                if hit:
                    reused.append(name)
                    log.info("%s: same weights, protocol, settings and code as %s: its figures reused", name, key)
        tracking.set_tags({"didpo.eval_reused": ",".join(reused) or "none"})
        families = {split: [protocol["families"][p["task_id"]] for p in rows] for split, rows in problems.items()}
        pipeline = {name: scores for name, scores in per_problem.items() if name != "champion"}
        deltas = pass1_deltas(pipeline, families, seed=cfg.seed)
        scores = {
            name: {split: dict(zip(protocol["splits"][split], values, strict=True)) for split, values in s.items()}
            for name, s in per_problem.items()
        }
        write_json(metrics, EVAL_METRICS)
        write_json(deltas, EVAL_DELTAS)
        write_json(rl_claim_record(pipeline, families, protocol, params), EVAL_RL_CLAIM)
        shutil.rmtree(EVAL_HEADLINE, ignore_errors=True)  # a checkpoint measured last time but not now leaves no row
        for name, figures in evaluate_headline(metrics).items():
            write_json(figures, EVAL_HEADLINE / f"{name}.json")
        write_json(protocol, EVAL_PROTOCOL)
        write_json(
            {"protocol": protocol["id"], "champion_version": champion_version, "checkpoints": scores}, EVAL_PER_PROBLEM
        )
        for reason in too_small(metrics).values():
            log.warning(reason)
        report = comparison_markdown(metrics, algo) + "\n" + deltas_markdown(deltas, algo).rstrip("\n")
        write_lines([report], EVAL_REPORT)
        for split in SPLITS:
            write_json({"passk": passk_rows(metrics, split, list(CHECKPOINTS))}, EVALUATE / f"passk_{split}.json")
        plot_passk(metrics, EVAL_FIGURES / "passk.png", algo)
        for stage, path in HISTORIES.items():
            if path.is_file():
                plot_history(read_history(path), f"{stage} training", EVAL_FIGURES / f"training_{stage}.png")
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
