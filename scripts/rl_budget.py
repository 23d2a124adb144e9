"""The RL budget curve (issue 43; rules in docs/results/rl_budget/preregistration.md): each arm is one RL run that
keeps its policy at steps 6, 31 and 94 (``didpo.keep_steps``); each kept point is evaluated against the DPO checkpoint
it started from, and the table applies the pre-registered decision.

    python scripts/rl_budget.py point ARM STEP   # in the workspace of ARM's run: evaluate its policy after STEP
    python scripts/rl_budget.py point ARM STEP --record-only   # record the evaluation already made (checked)
    python scripts/rl_budget.py table            # docs/results/rl_budget/ table.md, points.json, curve.json and
                                                 # curve.png from every recorded point
    python scripts/rl_budget.py drift            # docs/results/rl_budget/drift/drift.md from the drift runs
    python scripts/rl_budget.py precheck CONTROL # in the workspace of didpo's 31-step run with CONTROL: evaluate
                                                 # it at 4 answers, record it; with both recorded, the choice

``point`` rebuilds ``data/checkpoints/didpo/merged`` from the DPO checkpoint and the adapter the run kept after STEP
(``data/checkpoints/didpo/points/step_NNNN``), exactly as the stage exports its own (`scripts/restore_run.py`'s
`rebuild_merged`), runs the evaluate stage (`didpo stage evaluate`, params.yaml's protocol, which must measure
``[dpo, didpo]`` with 16 answers per problem), and records in docs/results/rl_budget/ARM/step_NNNN.json the claim,
the per-problem scores of both checkpoints (val, HumanEval, held-out) and the run's training figures up to STEP (KL to
start over the last 5 steps, entropy, groups with zero spread, rows left out, duplicates, RL step seconds).

``table`` tests each point with the promotion rule's one-sided paired sign-flip test on val pass@1
(`models.significance.paired_test`), the HumanEval guard as a non-inferiority test at margin -0.03 (the same test,
margin -0.03: p < 0.05 means not worse by 0.03), and the primary hypotheses (every arm at 1,504 rollouts) with Holm's
step-down procedure at family-wise alpha 0.05. The claim is made only when all three arms are recorded.

Errors (a message, exit status 2): no kept point for STEP, an evaluation protocol other than the pre-registered one,
``--record-only`` on an evaluation of another checkpoint or older than it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs/results/rl_budget"
ARMS = ("rft", "grpo", "didpo")
FINAL_STEP = 94  # 1,504 rollouts: the primary hypotheses
ROLLOUTS_PER_STEP = 16  # 2 prompts x 8 answers
SAMPLES = 16  # answers per val problem (the pre-registered protocol)
ALPHA = 0.05
GUARD_MARGIN = -0.03  # HumanEval non-inferiority margin
LAST_STEPS = 5  # KL to start and entropy: mean over the last steps before a point


def holm(p_values: dict[str, float], alpha: float = ALPHA) -> dict[str, bool]:
    """Holm's step-down procedure (Holm 1979, Scand. J. Statist. 6:65-70): with the m p-values sorted ascending,
    reject H_(i) while p_(i) <= alpha / (m - i + 1) (i from 1), and stop at the first that is not. Returns
    ``{name: rejected}``; family-wise error rate <= alpha under any dependence."""
    rejected, m = {name: False for name in p_values}, len(p_values)
    for i, (name, p) in enumerate(sorted(p_values.items(), key=lambda item: item[1])):
        if p > alpha / (m - i):
            break
        rejected[name] = True
    return rejected


def training_figures(history: list[dict], step: int) -> dict:
    """The run's figures up to and including `step` from its per-step history (``data/didpo/history.json``'s rows):
    KL to start and entropy, each as the mean over the last `LAST_STEPS` steps that measured it (a step with nothing
    to train on, e.g. rft's groups without a passing answer, measures neither; a grpo step whose groups all have zero
    reward spread measures KL to start but no entropy, as no row reaches the loss), the number of steps that ran an
    update (KL measured), the mean share of groups with zero reward spread, the rows left out of the update and
    duplicates merged (sums), and the RL steps' seconds (sum).

    Raises ValueError when the history stops before `step`."""
    rows = [row for row in history if row["step"] <= step]
    if not rows or rows[-1]["step"] != step:
        raise ValueError(f"the run's history stops at step {rows[-1]['step'] if rows else 0}, before {step}")
    updated = [row for row in rows if "didpo/kl_start" in row]

    def last_mean(key):
        of = [row[key] for row in rows if key in row][-LAST_STEPS:]
        return sum(of) / len(of) if of else float("nan")

    return {
        "kl_start_last5": last_mean("didpo/kl_start"),
        "entropy_last5": last_mean("didpo/entropy"),
        "steps_updated": len(updated),
        "frac_zero_std_groups": sum(row["didpo/frac_zero_std_groups"] for row in rows) / len(rows),
        "rows_zero_advantage": sum(row.get("didpo/rows_zero_advantage", 0) for row in rows),
        "duplicate_rows": sum(row.get("didpo/duplicate_rows", 0) for row in rows),
        "rl_step_seconds": sum(row["didpo/step_time_s"] for row in rows),
    }


def point_record(
    arm: str, step: int, claim: dict, per_problem: dict, history: list[dict], adapter_sha: str, samples: int = SAMPLES
) -> dict:
    """One kept point: its claim (val pass@1 against DPO), both checkpoints' per-problem scores and the training
    figures up to `step`. Raises ValueError for a protocol other than the pre-registered one (not `samples` answers, or
    dpo and didpo not both measured)."""
    if claim.get("samples_per_problem") != samples:
        raise ValueError(
            f"evaluated with {claim.get('samples_per_problem')} answers per problem, not {samples}: "
            f"set evaluate.n_samples: {samples} and evaluate.checkpoints: [dpo, didpo]"
        )
    scores = per_problem["checkpoints"]
    splits = ("val", "humaneval", "heldout")
    missing = [f"{name}/{split}" for name in ("dpo", "didpo") for split in splits if split not in scores.get(name, {})]
    if missing:
        raise ValueError(f"{missing} not measured: run evaluate with evaluate.checkpoints=[dpo, didpo]")
    return {
        "arm": arm,
        "step": step,
        "rollouts": step * ROLLOUTS_PER_STEP,
        "adapter_sha256": adapter_sha,
        "claim": claim,
        "scores": {name: {split: scores[name][split] for split in splits} for name in ("dpo", "didpo")},
        "training": training_figures(history, step),
    }


def load_points() -> list[dict]:
    """Every recorded point (arm order, then step). Raises ValueError when two points differ in protocol or in their
    DPO scores (another start checkpoint or seeds)."""
    points = [json.loads(p.read_text()) for arm in ARMS for p in sorted((OUT / arm).glob("step_*.json"))]
    for point in points[1:]:
        if point["claim"]["protocol"] != points[0]["claim"]["protocol"]:
            raise ValueError(f"{point['arm']} step {point['step']}: another evaluation protocol")
        if point["scores"]["dpo"] != points[0]["scores"]["dpo"]:
            raise ValueError(f"{point['arm']} step {point['step']}: its DPO scores differ (another start or seeds)")
    return points


def point_tests(point: dict) -> dict:
    """The point's val test (one-sided paired sign-flip, RL better than DPO) and HumanEval guard (non-inferiority at
    `GUARD_MARGIN`), each a `models.significance.PairedTest`, and its held-out pass@1 (both checkpoints)."""
    from models.significance import paired_test

    dpo, rl = point["scores"]["dpo"], point["scores"]["didpo"]
    paired = {split: sorted(dpo[split]) for split in ("val", "humaneval", "heldout")}
    seed = point["claim"]["seed"]
    val = paired_test([dpo["val"][p] for p in paired["val"]], [rl["val"][p] for p in paired["val"]], seed=seed)
    guard = paired_test(
        [dpo["humaneval"][p] for p in paired["humaneval"]],
        [rl["humaneval"][p] for p in paired["humaneval"]],
        margin=GUARD_MARGIN,
        seed=seed,
    )
    heldout = {name: sum(s["heldout"].values()) / len(s["heldout"]) for name, s in (("dpo", dpo), ("rl", rl))}
    return {"val": val, "guard": guard, "heldout": heldout}


def summary(point: dict) -> dict:
    """One point's figures as docs/results/rl_budget/points.json lists them: ``algo``, ``rollouts``, ``step``,
    ``val_pass1`` (RL), ``delta`` (RL - DPO, val pass@1), ``interval`` ([low, high], 95%), ``p_value`` (one-sided,
    RL better), ``mde``, ``n_problems``, ``humaneval_delta`` and ``guard_p_value`` (non-inferiority at
    `GUARD_MARGIN`), ``heldout_pass1`` (RL) and the training figures up to the point."""
    t = point_tests(point)
    val, guard = t["val"], t["guard"]
    rl_val = point["scores"]["didpo"]["val"]
    return {
        "algo": point["arm"],
        "rollouts": point["rollouts"],
        "step": point["step"],
        "val_pass1": sum(rl_val.values()) / len(rl_val),
        "delta": val.effect,
        "interval": [val.low, val.high],
        "p_value": val.p_value,
        "mde": val.mde,
        "n_problems": val.n,
        "humaneval_delta": guard.effect,
        "guard_p_value": guard.p_value,
        "heldout_pass1": t["heldout"]["rl"],
        **point["training"],
    }


def decision(summaries: list[dict]) -> dict[str, dict] | None:
    """The pre-registered decision at `FINAL_STEP`: Holm over the three arms' one-sided p-values, and a claim only
    where Holm rejects and the HumanEval guard passes. ``{arm: {"holm_rejects", "guard_passes", "claimed",
    "verdict"}}``, or None while an arm's final point is missing."""
    finals = {s["algo"]: s for s in summaries if s["step"] == FINAL_STEP}
    if set(finals) != set(ARMS):
        return None
    rejected = holm({arm: s["p_value"] for arm, s in finals.items()})
    out = {}
    for arm, s in finals.items():
        guard = s["guard_p_value"] < ALPHA
        if rejected[arm]:
            verdict = "beats DPO" if guard else "passes Holm, fails the HumanEval guard"
        elif s["interval"][1] < 0:
            verdict = "worse than DPO (interval below 0)"
        elif s["interval"][0] > 0:
            verdict = "interval above 0, kept by Holm: not claimed"
        else:
            verdict = "no change detected"
        out[arm] = {"holm_rejects": rejected[arm], "guard_passes": guard, "claimed": rejected[arm] and guard,
                    "verdict": verdict}  # fmt: skip
    return out


def curve_record(points: list[dict]) -> dict:
    """What points.json holds: the protocol, the DPO start's val pass@1, every point's `summary` and the `decision`
    (None while an arm's final point is missing)."""
    summaries = [summary(point) for point in points]
    dpo_val = points[0]["scores"]["dpo"]["val"]
    return {
        "protocol": points[0]["claim"]["protocol"],
        "engine": points[0]["claim"]["engine"],
        "dpo_val_pass1": sum(dpo_val.values()) / len(dpo_val),
        "points": summaries,
        "decision": decision(summaries),
    }


def table(record: dict) -> str:
    """Markdown of a `curve_record`: one row per point, then the decision at 1,504 rollouts (Holm over the arms)."""
    summaries = record["points"]
    lines = [
        f"Val: {summaries[0]['n_problems']} problems x {SAMPLES} answers (protocol {record['protocol']}, "
        f"{record['engine']}); Δ = RL - DPO, one-sided paired sign-flip p (RL better), 95% interval, "
        f"MDE at alpha 0.05 and power 0.8. HumanEval guard: non-inferiority at margin {GUARD_MARGIN}, greedy, 164 "
        "problems. KL and entropy: mean of the last 5 steps before the point.",
        "",
        "| arm | rollouts | val pass@1 | Δ vs DPO [95% CI] | p | MDE | HumanEval Δ | guard p | held-out pass@1 "
        "| KL to start | entropy | RL seconds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summaries:
        lines.append(
            f"| {s['algo']} | {s['rollouts']} | {s['val_pass1']:.3f} | {s['delta']:+.3f} [{s['interval'][0]:+.3f}, "
            f"{s['interval'][1]:+.3f}] | {s['p_value']:.3f} | {s['mde']:.3f} | {s['humaneval_delta']:+.3f} "
            f"| {s['guard_p_value']:.3f} | {s['heldout_pass1']:.3f} | {s['kl_start_last5']:.4f} "
            f"| {s['entropy_last5']:.3f} | {s['rl_step_seconds']:.0f} |"
        )
    lines += ["", f"DPO (every arm's start): val pass@1 {record['dpo_val_pass1']:.3f}.", ""]
    finals = {s["algo"]: s for s in summaries if s["step"] == FINAL_STEP}
    if record["decision"] is None:
        lines.append(
            f"Decision: waiting for {sorted(set(ARMS) - set(finals))} at {FINAL_STEP * ROLLOUTS_PER_STEP} "
            "rollouts (Holm runs over all three arms)."
        )
        return "\n".join(lines) + "\n"
    for arm, d in record["decision"].items():
        lines.append(
            f"- {arm} at {FINAL_STEP * ROLLOUTS_PER_STEP} rollouts: p {finals[arm]['p_value']:.4f}, Holm "
            f"{'rejects' if d['holm_rejects'] else 'keeps'} H0: {d['verdict']}."
        )
    return "\n".join(lines) + "\n"


def curve_rows(summaries: list[dict]) -> list[dict]:
    """DVC plot rows (dvc.yaml, "RL budget curve"): one per budget, ``{"rollouts": r, <arm>: Δ or None}``."""
    budgets = sorted({s["rollouts"] for s in summaries})
    delta = {(s["algo"], s["rollouts"]): s["delta"] for s in summaries}
    return [{"rollouts": r, **{arm: delta.get((arm, r)) for arm in ARMS}} for r in budgets]


def plot_curve(summaries: list[dict], path: Path) -> None:
    """PNG: Δ val pass@1 against rollouts (log scale), one line per arm with its 95% intervals as error bars, and
    the zero line (DPO)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.axhline(0.0, color="black", linewidth=0.8, label="DPO (the start)")
    for arm in ARMS:
        rows = sorted((s for s in summaries if s["algo"] == arm), key=lambda s: s["rollouts"])
        if rows:
            xs, ys = [s["rollouts"] for s in rows], [s["delta"] for s in rows]
            err = [[s["delta"] - s["interval"][0] for s in rows], [s["interval"][1] - s["delta"] for s in rows]]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=arm)
    budgets = sorted({s["rollouts"] for s in summaries})
    ax.set(xscale="log", xlabel="rollouts (answers trained on)", ylabel="Δ val pass@1 vs DPO (95% CI)")
    ax.set_xticks(budgets)
    ax.set_xticklabels([str(b) for b in budgets])
    ax.minorticks_off()
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_curve(points: list[dict], folder: Path) -> str:
    """table.md, points.json (the `curve_record`), curve.json (DVC plot rows) and curve.png in `folder`; returns the
    table."""
    record = curve_record(points)
    text = table(record)
    (folder / "table.md").write_text(text)
    (folder / "points.json").write_text(json.dumps(record, indent=1) + "\n")
    (folder / "curve.json").write_text(json.dumps(curve_rows(record["points"]), indent=1) + "\n")
    plot_curve(record["points"], folder / "curve.png")
    return text


PRECHECK_STEP = 31  # 496 rollouts
PRECHECK_SAMPLES = 4  # answers per val problem in the pre-check
CONTROLS = ("start_policy", "group")
TIE = 0.01  # |difference of the two Δ| below this is a tie, and a tie runs `group`


def precheck_choice(deltas: dict[str, float]) -> str:
    """The pre-registered choice of didpo's control (preregistration.md, "didpo's control, pre-check"): the control
    whose 31-step run has the larger Δ val pass@1 against DPO (4 answers per problem); on a tie (|difference| <
    `TIE`) `group`, which drifted less in the 2026-12-03 ablation. `deltas`: ``{control: Δ}`` for both `CONTROLS`."""
    if abs(deltas["start_policy"] - deltas["group"]) < TIE:
        return "group"
    return max(CONTROLS, key=lambda control: deltas[control])


def precheck_table(folder: Path) -> str:
    """Markdown: each recorded control's Δ val pass@1 against DPO (interval, p, MDE) and KL, then the choice once both
    are recorded."""
    lines = [
        f"{PRECHECK_STEP} didpo steps ({PRECHECK_STEP * ROLLOUTS_PER_STEP} rollouts), seed 0; val {PRECHECK_SAMPLES} "
        "answers per problem; Δ = RL - DPO, one-sided paired sign-flip p (RL better), 95% interval, MDE at alpha 0.05 "
        "and power 0.8.",
        "",
        "| control | val pass@1 | Δ vs DPO [95% CI] | p | MDE | HumanEval Δ | KL to start (last 5) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    deltas = {}
    for control in CONTROLS:
        path = folder / f"{control}.json"
        if not path.is_file():
            lines.append(f"| {control} | not yet | | | | | |")
            continue
        point = json.loads(path.read_text())
        t = point_tests(point)
        rl_val = sum(point["scores"]["didpo"]["val"].values()) / len(point["scores"]["didpo"]["val"])
        deltas[control] = t["val"].effect
        lines.append(
            f"| {control} | {rl_val:.3f} | {t['val'].effect:+.3f} [{t['val'].low:+.3f}, {t['val'].high:+.3f}] "
            f"| {t['val'].p_value:.3f} | {t['val'].mde:.3f} | {t['guard'].effect:+.3f} "
            f"| {point['training']['kl_start_last5']:.4f} |"
        )
    lines.append("")
    if len(deltas) < len(CONTROLS):
        lines.append(f"Choice: waiting for {sorted(set(CONTROLS) - set(deltas))}.")
    else:
        lines.append(
            f"Choice: `{precheck_choice(deltas)}` runs the curve (larger Δ; a tie below {TIE} would run `group`)."
        )
    return "\n".join(lines) + "\n"


DRIFT_RUNS = {  # docs/results/rl_budget/drift/<run>/history.json: 31 didpo steps, control start_policy (the rules)
    "sp_s0": "seed 0",
    "sp_s1": "seed 1",
    "wdid0_s0": "w_did = 0, seed 0",
}
DRIFT_STEPS = (6, 31)


def drift_figures(history: list[dict]) -> dict:
    """One drift run's KL to the start policy (``didpo/kl_start``) at steps 6 and 31, its mean over the last
    `LAST_STEPS` steps that updated the policy, the optimizer updates made (sum of ``didpo/updates``) and the mean
    rollout pass rate. Raises ValueError when the history stops before step 31."""
    by_step = {row["step"]: row for row in history}
    if DRIFT_STEPS[-1] not in by_step:
        raise ValueError(f"the run's history stops at step {max(by_step, default=0)}, before {DRIFT_STEPS[-1]}")
    fig = training_figures(history, DRIFT_STEPS[-1])
    return {
        **{f"kl_step{s}": by_step[s].get("didpo/kl_start", float("nan")) for s in DRIFT_STEPS},
        "kl_last5": fig["kl_start_last5"],
        "updates": sum(row.get("didpo/updates", 0) for row in history if row["step"] <= DRIFT_STEPS[-1]),
        "pass_rate": sum(row["didpo/pass_rate"] for row in history) / len(history),
    }


def drift_verdict(figures: dict[str, dict]) -> str:
    """The pre-registered rule (preregistration.md, "DiDPO's drift"), on the mean KL over the last 5 steps before step
    31 (``kl_last5``; the rules name the three figures, and this one decides: fixed in code before the first drift run
    finished): the drift is the process term's only if the w_did = 0 run's KL lies below both seeds' KL by more than
    the two seeds differ; otherwise it is read as a property of step counts and seed."""
    kl = {run: f["kl_last5"] for run, f in figures.items()}
    spread = abs(kl["sp_s0"] - kl["sp_s1"])
    margin = min(kl["sp_s0"], kl["sp_s1"]) - kl["wdid0_s0"]
    if margin > spread:
        return (
            f"attributed to the process term: w_did = 0 drifts {margin:.4f} less than the lower seed, more than the "
            f"seeds differ ({spread:.4f})"
        )
    return (
        f"not attributed to the process term: w_did = 0 is {margin:+.4f} below the lower seed, within the seeds' own "
        f"difference ({spread:.4f}); a property of step counts and seed"
    )


def drift_table(folder: Path) -> str:
    """Markdown: each drift run's KL figures, updates and pass rate, then the verdict."""
    figures = {}
    for run in DRIFT_RUNS:
        history = json.loads((folder / run / "history.json").read_text())["history"]
        figures[run] = drift_figures(history)
    lines = [
        "| run | KL at step 6 | KL at step 31 | KL, mean of last 5 | optimizer updates | rollout pass rate |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for run, label in DRIFT_RUNS.items():
        f = figures[run]
        lines.append(
            f"| {label} | {f['kl_step6']:.4f} | {f['kl_step31']:.4f} | {f['kl_last5']:.4f} | {int(f['updates'])} "
            f"| {f['pass_rate']:.3f} |"
        )
    return "\n".join(lines + ["", f"Verdict: {drift_verdict(figures)}."]) + "\n"


def evaluated_elsewhere(start: Path, adapter: Path, merged: Path, evaluate: Path) -> str | None:
    """Why ``evaluate``'s figures are not this point's, or None when they are: ``merged`` (the RL checkpoint the
    evaluation measured) must hold the same weights as `start` merged with `adapter` (rebuilt into a scratch folder and
    compared by sha256), and ``evaluate/rl_claim.json`` must be newer than ``merged``."""
    import tempfile

    from restore_run import rebuild_merged

    def digest(path: Path) -> str:
        return hashlib.sha256(path.read_bytes()).hexdigest()

    claim, weights = evaluate / "rl_claim.json", merged / "model.safetensors"
    if not claim.is_file() or not weights.is_file():
        return f"no evaluation ({claim}) or no RL checkpoint ({weights})"
    if claim.stat().st_mtime < weights.stat().st_mtime:
        return f"{claim} is older than {weights}"
    with tempfile.TemporaryDirectory(dir=merged.parent) as tmp:
        rebuilt = rebuild_merged(start, adapter, Path(tmp) / "merged")
        if digest(rebuilt / "model.safetensors") != digest(weights):
            return f"{merged} is not {start} merged with {adapter}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    point = sub.add_parser("point", help="evaluate the policy ARM's run kept after STEP and record it")
    point.add_argument("arm", choices=ARMS)
    point.add_argument("step", type=int)
    point.add_argument(
        "--record-only",
        action="store_true",
        help="record the evaluation already in data/evaluate (after a failed record step); refused unless the RL "
        "checkpoint it measured is this adapter's merge and the evaluation is newer than it",
    )
    sub.add_parser("table", help="write docs/results/rl_budget/{table.md,points.json,curve.json,curve.png}")
    sub.add_parser("drift", help="write and print docs/results/rl_budget/drift/drift.md")
    precheck = sub.add_parser("precheck", help="evaluate didpo's 31-step run with CONTROL at 4 answers and record it")
    precheck.add_argument("control", choices=CONTROLS)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if args.command == "drift":
        text = drift_table(OUT / "drift")
        (OUT / "drift" / "drift.md").write_text(text)
        print(text, end="")
        return 0
    if args.command == "table":
        print(write_curve(load_points(), OUT), end="")
        return 0
    from restore_run import rebuild_merged

    from flows.paths import DIDPO_CHECKPOINT, DPO_CHECKPOINT

    step, samples = (PRECHECK_STEP, PRECHECK_SAMPLES) if args.command == "precheck" else (args.step, SAMPLES)
    adapter = DIDPO_CHECKPOINT / "points" / f"step_{step:04d}"
    if not (adapter / "adapter_model.safetensors").is_file():
        print(
            f"error: {adapter} holds no kept policy: run the RL stage with didpo.keep_steps including {step}",
            file=sys.stderr,
        )
        return 2
    sha = hashlib.sha256((adapter / "adapter_model.safetensors").read_bytes()).hexdigest()
    evaluate = Path("data/evaluate")
    if getattr(args, "record_only", False):
        stale = evaluated_elsewhere(DPO_CHECKPOINT / "merged", adapter, DIDPO_CHECKPOINT / "merged", evaluate)
        if stale:
            print(f"error: --record-only: {stale}; run `point {args.arm} {step}` without it", file=sys.stderr)
            return 2
    else:
        rebuild_merged(DPO_CHECKPOINT / "merged", adapter, DIDPO_CHECKPOINT / "merged")
        subprocess.run([sys.executable, "-m", "flows.cli", "stage", "evaluate"], check=True)
    history = json.loads(Path("data/didpo/history.json").read_text())["history"]
    try:
        record = point_record(
            "didpo" if args.command == "precheck" else args.arm,
            step,
            json.loads((evaluate / "rl_claim.json").read_text()),
            json.loads((evaluate / "per_problem.json").read_text()),
            history,
            sha,
            samples,
        )
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.command == "precheck":
        target = OUT / "precheck" / f"{args.control}.json"
    else:
        target = OUT / args.arm / f"step_{step:04d}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    claim = record["claim"]
    print(f"{record['arm']} step {step}: Δ {claim['delta']:+.3f}, p {claim['p_value']:.3f} -> {target}")
    if args.command == "precheck":
        text = precheck_table(target.parent)
        (target.parent / "precheck.md").write_text(text)
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
