"""The RL ablation's record and table (issue 18): each arm (an RL algorithm or control, same DPO start, pool, seeds
and rollout budget) against the DPO checkpoint it started from, and against the default arm, on the evaluation
protocol's val problems.

    python scripts/rl_ablation.py record ARM      # after `dvc exp run evaluate -S didpo.algo=...` (make ablation)
    python scripts/rl_ablation.py table           # docs/results/rl_ablation/table.md from every recorded arm
    python scripts/rl_ablation.py freeze-reference  # once: the default run (docs/results/) as the reference arm

``record`` copies the run's claim (data/evaluate/rl_claim.json) and the per-problem val pass@1 of its RL and DPO
checkpoints (data/evaluate/per_problem.json) to docs/results/rl_ablation/ARM.json. ``table`` adds the default arm (the
pre-registered default, didpo with the start-policy control: the claim and val scores of the default run of 2026-12-03
(3800d02), frozen in docs/results/rl_ablation/reference/ by ``freeze-reference`` before the default changed), refuses
arms measured under another protocol or from other DPO figures, and tests each arm against the default arm with the
promotion rule's one-sided paired sign-flip test (`models.significance.paired_test`), per the rule written before the
figures (docs/results/rl_ablation/preregistration.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs/results/rl_ablation"
DEFAULT_ARM = "didpo (start_policy)"
# The arm every other is tested against: the default when the ablation was pre-registered (kept when the default
# changes; docs/results/rl_claim.json then holds the new default's claim).
REFERENCE = OUT / "reference" / "didpo_start_policy.json"
DEFAULT_RUN = {
    "claim": ROOT / "docs/results/rl_claim.json",
    "scores": ROOT / "docs/results/default_run/per_problem.json",
}


def arm_record(claim: dict, per_problem: dict) -> dict:
    """One arm: its claim and the val pass@1 of every problem (``{task_id: pass@1}``) for its RL (``didpo``) and DPO
    checkpoints. Raises
    ValueError when the claim and the scores come from two protocols or a checkpoint was not measured on val."""
    if claim.get("protocol") != per_problem.get("protocol"):
        raise ValueError(f"claim protocol {claim.get('protocol')} != scores' protocol {per_problem.get('protocol')}")
    scores = per_problem["checkpoints"]
    missing = [name for name in ("dpo", "didpo") if "val" not in scores.get(name, {})]
    if missing:
        raise ValueError(f"{missing} not measured on val: run evaluate with evaluate.checkpoints=[dpo,didpo]")
    return {"claim": claim, "val": {name: scores[name]["val"] for name in ("dpo", "didpo")}}


def load_arms() -> dict[str, dict]:
    """The default arm, then every recorded arm (file name order). Raises ValueError for a mixed protocol or DPO
    figures that differ from the default's (another start checkpoint or seeds)."""
    arms = {DEFAULT_ARM: json.loads(REFERENCE.read_text())}
    for path in sorted(OUT.glob("*.json")):
        arms[path.stem] = json.loads(path.read_text())
    base = arms[DEFAULT_ARM]
    for name, arm in arms.items():
        if arm["claim"]["protocol"] != base["claim"]["protocol"]:
            raise ValueError(f"{name}: protocol {arm['claim']['protocol']} is not {base['claim']['protocol']}")
        if arm["val"]["dpo"] != base["val"]["dpo"]:
            raise ValueError(f"{name}: its DPO figures differ from the default run's (another start or seeds)")
    return arms


def table(arms: dict[str, dict]) -> str:
    """Markdown: per arm, Δ val pass@1 against DPO (interval, p better, p worse, verdict) and against the default arm
    (one-sided paired sign-flip test that the arm is better, its interval and MDE)."""
    from models.significance import paired_test

    base = arms[DEFAULT_ARM]
    first = base["claim"]
    lines = [
        f"Protocol {first['protocol']} ({first['engine']}): {first['n_problems']} val problems (in-family, unseen "
        f"variants) x {first['samples_per_problem']} answers, seed {first['seed']}; every arm starts from the same "
        "DPO checkpoint and has the same rollout budget. Tests: one-sided paired sign-flip on per-problem pass@1, "
        "95% intervals, MDE at alpha 0.05 and power 0.8.",
        "",
        "| arm | RL pass@1 | Δ vs DPO [95% CI] | p better | p worse | MDE | verdict | Δ vs default arm [95% CI] "
        "| p better than default |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    problems = sorted(base["val"]["dpo"])  # task ids; every arm's scores are paired by them
    default = [base["val"]["didpo"][p] for p in problems]
    for name, arm in arms.items():
        c = arm["claim"]
        rl = [arm["val"]["didpo"][p] for p in problems]
        if name == DEFAULT_ARM:
            versus = "–", "–"
        else:
            t = paired_test(default, rl, seed=c["seed"])
            versus = f"{t.effect:+.3f} [{t.low:+.3f}, {t.high:+.3f}]", f"{t.p_value:.3f}"
        low, high = c["interval"]
        lines.append(
            f"| {name} | {sum(rl) / len(rl):.3f} | {c['delta']:+.3f} [{low:+.3f}, {high:+.3f}] | {c['p_value']:.3f} "
            f"| {c['p_worse']:.3f} | {c['mde']:.3f} | {c['verdict']} | {versus[0]} | {versus[1]} |"
        )
    dpo = list(base["val"]["dpo"].values())
    lines += ["", f"DPO (the start of every arm): val pass@1 {sum(dpo) / len(dpo):.3f}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="copy this run's claim and val scores to docs/results/rl_ablation/ARM.json")
    rec.add_argument("arm")
    sub.add_parser("table", help="write and print docs/results/rl_ablation/table.md")
    sub.add_parser("freeze-reference", help="the default run (docs/results/) as the reference arm, once")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if args.command == "record":
        claim = json.loads((ROOT / "data/evaluate/rl_claim.json").read_text())
        record = arm_record(claim, json.loads((ROOT / "data/evaluate/per_problem.json").read_text()))
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"{args.arm}.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        print(f"{args.arm}: Δ {claim['delta']:+.3f}, p better {claim['p_value']:.3f}, verdict {claim['verdict']}")
    elif args.command == "freeze-reference":
        if REFERENCE.exists():
            raise SystemExit(f"{REFERENCE} exists: the reference arm is written once")
        claim = json.loads(DEFAULT_RUN["claim"].read_text())
        record = arm_record(claim, json.loads(DEFAULT_RUN["scores"].read_text()))
        REFERENCE.parent.mkdir(parents=True, exist_ok=True)
        REFERENCE.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        print(f"{REFERENCE}: Δ {claim['delta']:+.3f}, verdict {claim['verdict']}")
    else:
        text = table(load_arms())
        (OUT / "table.md").write_text(text)
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
