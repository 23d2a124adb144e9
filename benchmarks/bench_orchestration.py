"""Orchestration overhead: the ``evaluate`` stage run through ``didpo stage evaluate`` vs its work called directly.

    .venv/bin/python benchmarks/bench_orchestration.py [--problems 8] [--max-new-tokens 64] [--repeats 3]

Builds a scratch project (the real code, a tiny random model saved as the base and the SFT checkpoint, generated +
HumanEval problems as the validated problem file, a small ``evaluate`` section: one val problem per family, one per
held-out family, ``--problems`` test and HumanEval problems, the torch sampler) and times, each in a fresh process:

- stage: ``didpo stage evaluate`` (CLI, params validation, the Prefect flow and its task runs, the MLflow run with
  metrics, table and artifacts, the verifier, the plots);
- direct: a plain Python script doing the same work with the same functions (``evaluate_checkpoint.fn`` for each
  checkpoint, the protocol, the paired deltas, the same JSON/Markdown/PNG outputs) without the CLI, Prefect or
  MLflow (and without the champion download, a no-op here: the scratch registry is empty).

Both pay the interpreter and torch start-up. Stage processes talk to one Prefect API started here beforehand, as in
``didpo run`` (one API for a whole pipeline run); starting an ephemeral API per stage is not counted. Same work is
checked: every run of either side must write the same metrics (timings aside) and per-problem scores
(``CHECK same_work=ok``, else ``FAIL`` and exit 1). Runs alternate (A B, B A, ...); each side's median seconds is
reported with its range. Goal: overhead <= 10 %. Last line:
``RESULT overhead_pct=<x> stage_s=<a> direct_s=<b> ratio=<direct/stage>`` (medians).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from repeats import alternate, check_same_work, spread

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
COPY = ["flows", "tasks", "models", "sandbox", "datalib", "dvc.yaml", "params.yaml", "pyproject.toml"]

DIRECT = """
from pathlib import Path
from tasks.evaluate import evaluate_headline, selection_prefix
from flows.paths import (
    CHECKPOINTS, EVAL_DELTAS, EVAL_FIGURES, EVAL_HEADLINE, EVAL_METRICS, EVAL_PER_PROBLEM, EVAL_PROTOCOL, EVAL_REPORT,
    EVAL_SAMPLES, EVALUATE, HISTORIES, VALID_PROBLEMS, present_checkpoints,
)
from tasks.config import load_params
from tasks.evaluate import (
    SPLITS, comparison_markdown, deltas_markdown, evaluate_checkpoint, pass1_deltas, passk_rows, plot_history,
    plot_passk, protocol_record, read_history, resolve_engine, select_problems,
)
from tasks.io import write_json, write_lines
from tasks.sandbox import make_verifier

params = load_params("params.yaml")
cfg = params.evaluate
checkpoints = {name: path for name, path in present_checkpoints().items() if name in cfg.checkpoints}
problems = select_problems(VALID_PROBLEMS, cfg, selection_prefix(params))
engine = resolve_engine(cfg)
protocol = protocol_record(cfg, problems, engine)
metrics, per_problem = {}, {}
with make_verifier(params.verifier) as verifier:
    for name, path in checkpoints.items():
        metrics[name], per_problem[name] = evaluate_checkpoint.fn(
            path, params.base_model.dtype, problems, cfg, verifier, EVAL_SAMPLES / name, engine
        )
families = {split: [protocol["families"][p["task_id"]] for p in rows] for split, rows in problems.items()}
deltas = pass1_deltas(per_problem, families, seed=cfg.seed)
scores = {
    name: {split: dict(zip(protocol["splits"][split], values, strict=True)) for split, values in s.items()}
    for name, s in per_problem.items()
}
write_json.fn(metrics, EVAL_METRICS)
write_json.fn(deltas, EVAL_DELTAS)
write_json.fn(evaluate_headline(metrics, deltas), EVAL_HEADLINE)
write_json.fn(protocol, EVAL_PROTOCOL)
write_json.fn({"protocol": protocol["id"], "champion_version": None, "checkpoints": scores}, EVAL_PER_PROBLEM)
write_lines.fn([comparison_markdown(metrics) + "\\n" + deltas_markdown(deltas).rstrip("\\n")], EVAL_REPORT)
for split in SPLITS:
    write_json.fn({"passk": passk_rows(metrics, split, list(CHECKPOINTS))}, EVALUATE / f"passk_{split}.json")
plot_passk(metrics, EVAL_FIGURES / "passk.png")
for stage, path in HISTORIES.items():
    if path.is_file():
        plot_history(read_history(path), f"{stage} training", EVAL_FIGURES / f"training_{stage}.png")
"""


def build_project(root: Path, problems: int, max_new_tokens: int) -> None:
    """The scratch project: code, tiny base + SFT checkpoints, validated problems, a small evaluate section."""
    from models.policy import build_tiny_causal_lm
    from tasks.config import PrepareConfig
    from tasks.prepare import generated_problems, humaneval_problems, serialise

    for name in COPY:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, root / name)
    model, tokenizer = build_tiny_causal_lm(seed=0)
    for folder in ("data/checkpoints/base", "data/checkpoints/sft/merged"):
        model.save_pretrained(root / folder)
        tokenizer.save_pretrained(root / folder)
    params = yaml.safe_load((root / "params.yaml").read_text())
    heldout = tuple(params["prepare"]["heldout_families"])
    rows = generated_problems.fn(PrepareConfig(n_problems=120, heldout_families=heldout)) + humaneval_problems.fn()
    (root / "data/validated").mkdir(parents=True)
    (root / "data/validated/problems.jsonl").write_text("".join(serialise(p) + "\n" for p in rows))
    params["evaluate"].update(
        val_per_family=1,
        heldout_per_family=1,
        test_problems=problems,
        humaneval_problems=problems,
        max_new_tokens=max_new_tokens,
        process_problems=1,
        process_prefixes=2,
        consistency_samples=4,
        recovery_samples=2,
        engine="torch",
    )
    for section in ("gate", "dpo", "baseline"):  # their val problems are kept out of the protocol: leave it some
        params[section]["val_problems"] = 1
    params["verifier"]["workers"] = 2
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def timed(args: list[str], cwd: Path, env: dict) -> float:
    started = time.perf_counter()
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{args} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=8, help="problems per split")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs of each side; the median counts")
    args = parser.parse_args()

    from flows.env import TELEMETRY_OFF

    os.environ.update({k: os.environ.get(k, v) for k, v in TELEMETRY_OFF.items()})  # before Prefect is imported
    from prefect.server.api.server import SubprocessASGIServer

    with tempfile.TemporaryDirectory(prefix="bench-orch-") as tmp:
        root = Path(tmp)
        build_project(root, args.problems, args.max_new_tokens)
        env = {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": str(root),
            "PREFECT_HOME": str(root / ".prefect"),
            "MLFLOW_DISABLE_TELEMETRY": "true",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
        }
        for key in ("MLFLOW_TRACKING_URI", "DIDPO_PARENT_RUN_ID"):
            env.pop(key, None)
        server = SubprocessASGIServer()
        server.start(timeout=180)
        env["PREFECT_API_URL"] = server.api_url
        outputs: dict[str, list] = {"direct": [], "stage": []}

        def run(side: str, command: list[str]) -> float:
            seconds = timed(command, root, env)
            outputs[side].append(measured(root))
            return seconds

        try:
            seconds = alternate(
                {
                    "direct": lambda: run("direct", [str(BIN / "python"), "-c", DIRECT]),
                    "stage": lambda: run("stage", [str(BIN / "didpo"), "stage", "evaluate"]),
                },
                args.repeats,
            )
        finally:
            server.stop()
    first = outputs["direct"][0]
    same = all(out == first for side in outputs.values() for out in side)
    metrics = first[0]
    val_counts = [metrics[n]["val"].get("n_problems", 0) for n in sorted(metrics)]
    same = same and all(val_counts)  # a protocol without val problems would time less than the stage's work
    check_same_work(
        same,
        f"metrics.json (without timings) and per_problem.json equal in all {2 * args.repeats} runs; checkpoints "
        f"{sorted(metrics)}, val problems {val_counts}, "
        f"val pass@1 {[metrics[n]['val'].get('pass@1') for n in sorted(metrics)]}"
        if same
        else f"the stage and the direct call measured different metrics, or no val problems ({val_counts})",
    )
    stage_s = spread("stage", seconds["stage"], "s")
    direct_s = spread("direct", seconds["direct"], "s")
    overhead = 100.0 * (stage_s - direct_s) / direct_s
    ratio = direct_s / stage_s
    print(f"RESULT overhead_pct={overhead:.1f} stage_s={stage_s:.1f} direct_s={direct_s:.1f} ratio={ratio:.3f}")


def measured(root: Path) -> tuple[dict, dict]:
    """What a run measured: metrics.json without its wall-clock timings, and the per-problem scores."""
    metrics = json.loads((root / "data/evaluate/metrics.json").read_text())
    untimed = {n: {k: v for k, v in m.items() if k not in ("seconds", "export_seconds")} for n, m in metrics.items()}
    return untimed, json.loads((root / "data/evaluate/per_problem.json").read_text())["checkpoints"]


if __name__ == "__main__":
    main()
