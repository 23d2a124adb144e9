"""The external guard on a run's checkpoints: greedy pass@1 on HumanEval and the paired change against the base model.

    .venv/bin/python scripts/external_guard.py [--root .] [--params params.yaml] [--problems 0]
        [--out docs/results/external_guard.json]

What the gate (``external``) and the evaluate stage (the ``humaneval`` split, ``evaluate.humaneval_greedy``) measure,
for every checkpoint of a finished run at once: the base model and each present trained checkpoint
(data/checkpoints/{sft,dpo,rl}/merged under ``--root``) answer the first ``--problems`` HumanEval problems (0 = all
164) greedily with the evaluate stage's token budget, through its engine (OpenVINO GenAI where ``make export-env``
ran, else the torch sampler), in the sandbox. Prints one line per checkpoint and writes the figures
(`tasks.measure.external_change`: Δ, 95% interval, MDE, one-sided p of "better" and of "worse") and the seconds each
checkpoint took to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=".", help="the project whose data/ holds the checkpoints")
    parser.add_argument("--params", default="params.yaml", help="evaluate (token budget, engine) and verifier settings")
    parser.add_argument("--problems", type=int, default=0, help="first HumanEval problems (0 = all 164)")
    parser.add_argument("--out", default="docs/results/external_guard.json")
    args = parser.parse_args()

    from flows.env import setup_environment

    setup_environment(Path(args.root))  # telemetry off, offline hub, before prefect and mlflow are imported
    from models.policy import load_policy
    from tasks.config import load_params
    from tasks.measure import external_change, greedy_results, make_sampler, make_verifier, resolve_engine
    from tasks.prepare import humaneval_problems

    root = Path(args.root)
    params = load_params(args.params)
    cfg = params.evaluate
    problems = humaneval_problems.fn()[: args.problems or None]
    engine = resolve_engine(cfg.engine, cfg.precision, "external guard")
    checkpoints = {"base": root / "data/checkpoints/base"} | {
        name: root / f"data/checkpoints/{name}/merged" for name in ("sft", "dpo", "rl")
    }
    passes, seconds = {}, {}
    with make_verifier(params.verifier) as verifier:
        for name, path in checkpoints.items():
            if not (path / "config.json").is_file():
                continue
            started = time.perf_counter()
            model, tokenizer = load_policy(path, dtype=params.base_model.dtype)
            sampler = make_sampler(path, tokenizer, engine)
            out = Path(args.out).with_suffix("") / f"{name}.jsonl"
            results = greedy_results(model, tokenizer, problems, cfg.max_new_tokens, cfg.seed, verifier, out, sampler)
            passes[name] = [r.pass_at(1) for r in results]
            seconds[name] = time.perf_counter() - started
            print(f"{name}: greedy pass@1 {sum(passes[name]) / len(problems):.4f} ({seconds[name]:.0f} s)", flush=True)
    report = {
        "problems": len(problems),
        "engine": "/".join(engine),
        "max_new_tokens": cfg.max_new_tokens,
        "seconds": seconds,
        "pass@1": {name: sum(p) / len(p) for name, p in passes.items()},
        "against_base": {name: external_change(passes["base"], p) for name, p in passes.items() if name != "base"},
    }
    for name, change in report["against_base"].items():
        print(
            f"{name} vs base: Δ {change['delta']:+.4f} [{change['low']:+.4f}, {change['high']:+.4f}], "
            f"{change['n_discordant']} changed, p(worse) {change['p_worse']:.4f}, p(better) {change['p_better']:.4f}, "
            f"MDE {change['mde']:.3f}"
        )
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
