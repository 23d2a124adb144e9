"""The generalisation guards on a run's checkpoints: HumanEval (external) and the held-out families, each checkpoint's
pass@1 and its paired change against the base model.

    .venv/bin/python scripts/external_guard.py [--root .] [--params params.yaml] [--problems 0]
        [--splits humaneval,heldout] [--out docs/results/external_guard.json]

What the gate (``external``) and the evaluate stage (the ``humaneval`` and ``heldout`` splits) measure, for every
checkpoint of a finished run at once: the base model and each present trained checkpoint
(data/checkpoints/{sft,dpo,didpo}/merged under ``--root``) answer the first ``--problems`` HumanEval problems (0 = all
164) greedily with the evaluate stage's token budget, and the protocol's held-out-family problems
(``evaluate.heldout_per_family`` of each family in ``prepare.heldout_families``, from the run's
data/validated/problems.jsonl), sampled as the protocol samples val (``evaluate.n_samples`` at its temperature and
seed); ``--splits`` chooses which (both by default). Generation goes through the evaluate stage's engine (OpenVINO
GenAI where ``make export-env`` ran, else the torch sampler), verdicts through the sandbox. Prints one line per
checkpoint and split and writes the figures (`tasks.gate.external_change`: Δ, 95% interval, MDE, one-sided p of
"better" and of "worse"), the seconds each checkpoint took and the per-problem answers (next to ``--out``).
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
    parser.add_argument("--splits", default="humaneval,heldout", help="humaneval and/or heldout (comma-separated)")
    parser.add_argument("--out", default="docs/results/external_guard.json")
    args = parser.parse_args()

    from flows.env import setup_environment

    setup_environment(Path(args.root))  # telemetry off, offline hub, before prefect and mlflow are imported
    from models.measure import sample_and_verify
    from models.policy import load_policy
    from tasks.config import load_params
    from tasks.evaluate import protocol_problems, split_sampling
    from tasks.gate import external_change
    from tasks.io import read_problems
    from tasks.measure import make_sampler, resolve_engine, write_results
    from tasks.prepare import humaneval_problems
    from tasks.sandbox import make_verifier

    root = Path(args.root)
    params = load_params(args.params)
    cfg = params.evaluate
    wanted = [name.strip() for name in args.splits.split(",") if name.strip()]
    if not wanted or set(wanted) - {"humaneval", "heldout"}:
        raise SystemExit(f"--splits: humaneval and/or heldout, got {args.splits!r}")
    splits = {"humaneval": humaneval_problems.fn()[: args.problems or None]} if "humaneval" in wanted else {}
    if "heldout" in wanted:
        rows = read_problems(root / "data/validated/problems.jsonl", "heldout")
        if not rows:
            raise SystemExit(f"{root}/data/validated/problems.jsonl has no heldout split (prepare.heldout_families)")
        splits["heldout"] = protocol_problems(rows, 0, cfg.heldout_per_family)
    engine = resolve_engine(cfg.engine, cfg.precision, "external guard")
    checkpoints = {"base": root / "data/checkpoints/base"} | {
        name: root / f"data/checkpoints/{name}/merged" for name in ("sft", "dpo", "didpo")
    }
    passes: dict[str, dict[str, list[float]]] = {split: {} for split in splits}
    seconds = {}
    with make_verifier(params.verifier) as verifier:
        for name, path in checkpoints.items():
            if not (path / "config.json").is_file():
                continue
            started = time.perf_counter()
            model, tokenizer = load_policy(path, dtype=params.base_model.dtype)
            sampler = make_sampler(path, tokenizer, engine)
            for split, problems in splits.items():
                results = sample_and_verify(
                    model, tokenizer, problems, split_sampling(cfg, split), verifier, sampler=sampler
                )
                write_results(
                    results,
                    Path(args.out).with_suffix("") / f"{name}{'' if split == 'humaneval' else '_' + split}.jsonl",
                )
                passes[split][name] = [r.pass_at(1) for r in results]
                print(f"{name} {split}: pass@1 {sum(passes[split][name]) / len(problems):.4f}", flush=True)
            seconds[name] = time.perf_counter() - started
            print(f"{name}: {seconds[name]:.0f} s", flush=True)
    report = {
        "problems": {split: len(problems) for split, problems in splits.items()},
        "sampling": {
            split: {"n": split_sampling(cfg, split).n, "temperature": split_sampling(cfg, split).temperature}
            for split in splits
        },
        "engine": "/".join(engine),
        "max_new_tokens": cfg.max_new_tokens,
        "seconds": seconds,
        "pass@1": {split: {name: sum(p) / len(p) for name, p in by.items()} for split, by in passes.items()},
        "against_base": {
            split: {name: external_change(by["base"], p) for name, p in by.items() if name != "base"}
            for split, by in passes.items()
        },
    }
    for split, changes in report["against_base"].items():
        for name, change in changes.items():
            print(
                f"{name} vs base on {split}: Δ {change['delta']:+.4f} [{change['low']:+.4f}, {change['high']:+.4f}], "
                f"{change['n_discordant']} changed, p(worse) {change['p_worse']:.4f}, "
                f"p(better) {change['p_better']:.4f}, MDE {change['mde']:.3f}"
            )
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
