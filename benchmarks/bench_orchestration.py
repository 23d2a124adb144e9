"""Orchestration overhead: the ``evaluate`` stage run through ``didpo stage evaluate`` vs its work called directly.

    .venv/bin/python benchmarks/bench_orchestration.py [--problems 8] [--max-new-tokens 64] [--repeats 2]

Builds a scratch project (the real code, a tiny random model saved as the base and the SFT checkpoint, generated +
HumanEval problems as the validated problem file, a small ``evaluate`` section) and times, each in a fresh process:

- stage: ``didpo stage evaluate`` (CLI, params validation, the Prefect flow and its task runs, the MLflow run with
  metrics, table and artifacts, the verifier, the plots);
- direct: a plain Python script doing the same work with the same functions (``evaluate_checkpoint.fn`` for each
  checkpoint, the same JSON/Markdown/PNG outputs) without the CLI, Prefect or MLflow.

Both pay the interpreter and torch start-up. Stage processes talk to one Prefect API started here beforehand, as in
``didpo run`` (one API for a whole pipeline run); starting an ephemeral API per stage is not counted. Runs alternate
and each side keeps its fastest (the box is shared). Goal: overhead <= 10 %. Last line:
``RESULT overhead_pct=<x> stage_s=<a> direct_s=<b> ratio=<direct/stage>``.
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

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
COPY = ["flows", "tasks", "models", "dvc.yaml", "params.yaml", "pyproject.toml"]

DIRECT = """
from pathlib import Path
from flows.evaluate import CHECKPOINTS, METRICS, OUT, REPORT, SAMPLES, FIGURES, present_checkpoints, selection_prefix
from flows.validate import VALID_PROBLEMS
from tasks.config import load_params
from tasks.evaluate import SPLITS, comparison_markdown, evaluate_checkpoint, passk_rows, plot_passk
from tasks.evaluate import resolve_engine, select_problems
from tasks.io import atomic_write_lines, write_json
from tasks.measure import make_verifier

params = load_params("params.yaml")
cfg = params.evaluate
problems = select_problems(VALID_PROBLEMS, cfg, selection_prefix(params))
metrics = {}
with make_verifier(params.verifier) as verifier:
    for name, path in present_checkpoints().items():
        metrics[name], _ = evaluate_checkpoint.fn(
            path, params.base_model.dtype, problems, cfg, verifier, SAMPLES / name, resolve_engine(cfg)
        )
write_json.fn(metrics, METRICS)
atomic_write_lines(REPORT, [comparison_markdown(metrics).rstrip("\\n")])
for split in SPLITS:
    write_json.fn({"passk": passk_rows(metrics, split, list(CHECKPOINTS))}, OUT / f"passk_{split}.json")
plot_passk(metrics, FIGURES / "passk.png")
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
    rows = generated_problems.fn(PrepareConfig(n_problems=120)) + humaneval_problems.fn()
    (root / "data/validated").mkdir(parents=True)
    (root / "data/validated/problems.jsonl").write_text("".join(serialise(p) + "\n" for p in rows))
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["evaluate"].update(
        val_problems=problems,
        test_problems=problems,
        humaneval_problems=problems,
        max_new_tokens=max_new_tokens,
        process_problems=1,
        process_prefixes=2,
        consistency_samples=4,
        recovery_samples=2,
    )
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
    parser.add_argument("--repeats", type=int, default=2)
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
        stage_times, direct_times = [], []
        try:
            for i in range(args.repeats):
                direct_times.append(timed([str(BIN / "python"), "-c", DIRECT], root, env))
                metrics = json.loads((root / "data/evaluate/metrics.json").read_text())
                stage_times.append(timed([str(BIN / "didpo"), "stage", "evaluate"], root, env))
                print(f"run {i + 1}: direct {direct_times[-1]:.1f} s, stage {stage_times[-1]:.1f} s", flush=True)
        finally:
            server.stop()
        same = {n: {s: m for s, m in v.items() if s != "seconds"} for n, v in metrics.items()}
        final = json.loads((root / "data/evaluate/metrics.json").read_text())
        if same != {n: {s: m for s, m in v.items() if s != "seconds"} for n, v in final.items()}:
            raise SystemExit("the stage and the direct call measured different metrics")
        print(f"checkpoints {sorted(final)}; val pass@16: {[final[n]['val'].get('pass@16') for n in sorted(final)]}")
    stage_s, direct_s = min(stage_times), min(direct_times)
    overhead = 100.0 * (stage_s - direct_s) / direct_s
    ratio = direct_s / stage_s
    print(f"RESULT overhead_pct={overhead:.1f} stage_s={stage_s:.1f} direct_s={direct_s:.1f} ratio={ratio:.3f}")


if __name__ == "__main__":
    main()
