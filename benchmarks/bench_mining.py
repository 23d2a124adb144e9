"""Preference mining on simulated feedback logs: precision and recall against the ground truth, next to the miner's
own first rule alone, on the default simulator and on raters the miner does not model; and the time to mine
1,000,000 events.

    .venv/bin/python -m benchmarks.bench_mining [--events 20000] [--users 500] [--big-events 1000000]

Data: the ``train`` split of the bundled generated problems (``datalib.generate``, params.yaml defaults), the
simulator (:func:`datalib.simulate_logs.simulate_logs`) with the sandboxed verifier
(:class:`sandbox.verifier.Verifier`) deciding correctness, and :func:`datalib.mine.mine_pairs` with the default
:class:`MineConfig`.

**What this does and does not show.** The default simulator's raters behave as the miner assumes (a rater either
tracks quality or ignores it), so the default figures grade the miner on its own model. The baseline is therefore
not naive cross-user pairing but the miner's *first rule alone*: the same user rated one response up and another
down on the same prompt → a pair (:func:`first_rule_pairs`; the miner's later rules, the per-user Fisher test
against the others' consensus, the consensus check, the similarity filter, dedupe and cap, are what is being
measured, and ``MineConfig`` has no switch that turns the Fisher test off, so the rule is written out here). Both
sides get the same event frame (checked: ``CHECK same_work``). Then the same comparison runs on logs where a share
of users behaves in ways the miner does not model (:data:`SCENARIOS`, opt-in :class:`SimSettings` fields,
documented in :mod:`datalib.simulate_logs`): length-biased raters, a colluding group up-voting designated wrong
answers, and raters whose accuracy decays or flips over time. A scenario where the miner is less precise than the
first rule alone is reported as such.

Figures (each scenario's log has ``--events`` events of ``--users`` users, seed 0, so the answer catalogue and
the base users are the same in every scenario):

- **precision**: the fraction of pairs whose chosen response is truly better than the rejected one (ground-truth
  quality strictly greater; equal quality counts as a miss).
- **recall**: the fraction of *opportunities* that end up mined. An opportunity is a distinct
  (prompt, better response, worse response) triple that some careful rater produced by rating the better response
  up and the worse one down on that same prompt (both ratings by one user, a true quality gap between the two
  responses). A pair counts when its (prompt, chosen, rejected) texts as logged are an opportunity; opportunities
  the similarity filter drops on purpose (near-identical texts) count as misses. The first rule contains every
  opportunity by construction, so its recall is 1.0 up to identical texts; it is printed to show that.
- **baseline_precision**: precision of the first rule's pairs (distinct (user, prompt, chosen text, rejected
  text), responses not identical).
- **naive_precision** (second reference, not in the ratio): every up-rated × down-rated event on the same prompt
  text, any users, responses not identical.
- **ratio** = precision / baseline_precision on the default simulator.
- **mine_1M_seconds**: wall time of ``mine_pairs`` on a ``--big-events`` log (``--big-users`` users, default
  simulator, seed 1) simulated directly; the simulation is not timed.

Output: one line per scenario (followed by a ``WORSE:`` line where our precision is below the first rule's), the
default log's denoising and pair-rule counts, a one-line verdict over the scenarios, the timing line,
``CHECK same_work=ok ...`` (or ``CHECK same_work=FAIL ...`` and exit status 1), and last
``RESULT precision=<p> recall=<r> baseline_precision=<b> ratio=<p/b>`` (default simulator). Goal: precision ≥ 0.95
and mining 1M events in ≤ 120 s on 2 cores.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from typing import Any

import numpy as np
import pandas as pd

SCENARIOS: tuple[tuple[str, str | None, dict[str, Any]], ...] = (
    ("default", None, {}),
    ("length_biased", "length_biased", {"length_biased_share": 0.3}),
    ("colluders", "colluder", {"colluder_share": 0.1, "collusion_targets": 30}),
    ("drift_decay", "drifting", {"drifting_share": 0.3}),
    (
        "drift_flip",
        "drifting",
        {"drifting_share": 0.3, "drift_mode": "step", "drift_accuracy": (0.97, 0.03), "drift_step_at": 0.5},
    ),
)
"""(name, the behaviour it adds as labelled in the ground truth, the SimSettings fields it sets). length_biased: 30%
of users up-vote by length alone (threshold ratio 0.9–1.1 of the prompt's median answer length). colluders: 10% of
users up-vote 30 designated wrong answers (always) and rate everything else carefully; half their sessions are
steered to a target. drift_decay: 30% of users rate by correctness with an accuracy falling linearly from 0.97 to
0.5 over the period. drift_flip: the same 30% at 0.97 for the first half of the period, then 0.03 (the standard
flips)."""


def precision(pairs: pd.DataFrame, truth: pd.DataFrame) -> float:
    """Fraction of log pairs with quality(chosen) > quality(rejected) (ground truth by event id)."""
    q = truth.set_index("event_id")["quality"]
    logs = pairs[pairs["source"] == "logs"]
    better = q.loc[logs["chosen_event_id"]].to_numpy() > q.loc[logs["rejected_event_id"]].to_numpy()
    return float(better.mean()) if len(better) else float("nan")


def opportunities(events: pd.DataFrame, truth: pd.DataFrame) -> set[tuple[str, str, str]]:
    """Distinct (prompt, better response, worse response) texts rated up/down by one careful rater on one prompt."""
    e = events[["user_id", "prompt", "response", "rating"]].assign(
        q=truth["quality"].to_numpy(), careful=truth["behaviour"].eq("careful").to_numpy()
    )
    e = e[e["careful"]]
    cross = e[e["rating"] == "up"].merge(e[e["rating"] == "down"], on=["user_id", "prompt"], suffixes=("_c", "_r"))
    cross = cross[cross["q_c"] > cross["q_r"]]
    return set(zip(cross["prompt"], cross["response_c"], cross["response_r"], strict=True))


def recall(pairs: pd.DataFrame, events: pd.DataFrame, truth: pd.DataFrame) -> tuple[float, int]:
    """(recall as defined in the module docstring, number of opportunities)."""
    wanted = opportunities(events, truth)
    raw = events.set_index("event_id")
    logs = pairs[pairs["source"] == "logs"]
    c, r = raw.loc[logs["chosen_event_id"]], raw.loc[logs["rejected_event_id"]]
    mined = set(zip(c["prompt"], c["response"], r["response"], strict=True))
    return len(mined & wanted) / max(len(wanted), 1), len(wanted)


def first_rule_pairs(events: pd.DataFrame) -> pd.DataFrame:
    """The miner's first rule alone: within one user and one prompt text, every response rated up × every other
    response rated down is a pair (chosen = up). One pair per distinct (user, prompt, chosen text, rejected text),
    the earliest; no rater denoising, consensus check, similarity filter, dedupe or cap. Columns as the miner's
    pairs where the metrics need them (``prompt, chosen, rejected, source, user_id, chosen_event_id,
    rejected_event_id``; raw texts and ids)."""
    e = events[["event_id", "ts", "user_id", "prompt", "response", "rating"]]
    up, down = e[e["rating"].eq("up")], e[e["rating"].eq("down")]
    x = up.merge(down, on=["user_id", "prompt"], suffixes=("_c", "_r"))
    x = x[x["response_c"].to_numpy() != x["response_r"].to_numpy()]
    ts_c, ts_r = x["ts_c"].to_numpy(dtype=object), x["ts_r"].to_numpy(dtype=object)
    x = x.assign(t=np.where(ts_c > ts_r, ts_c, ts_r))  # ISO 8601 strings of one format sort by time
    x = x.sort_values(["t", "event_id_c", "event_id_r"], kind="stable")
    x = x.drop_duplicates(["user_id", "prompt", "response_c", "response_r"], keep="first")
    return pd.DataFrame(
        {
            "prompt": x["prompt"].to_numpy(),
            "chosen": x["response_c"].to_numpy(),
            "rejected": x["response_r"].to_numpy(),
            "source": "logs",
            "user_id": x["user_id"].to_numpy(),
            "chosen_event_id": x["event_id_c"].to_numpy(),
            "rejected_event_id": x["event_id_r"].to_numpy(),
        }
    )


def naive_precision(events: pd.DataFrame, truth: pd.DataFrame) -> tuple[float, int]:
    """(precision, number of pairs) of every up × down event pair on the same prompt text with different
    responses, any users, counted without materialising the cross product."""
    prompt = pd.factorize(events["prompt"])[0].astype(np.float64)
    response = pd.factorize(events["response"])[0]
    up = events["rating"].eq("up").to_numpy()
    q = truth["quality"].to_numpy()
    # Pairs with q_up > q_down: per up event, the downs of its prompt with a lower quality (q ∈ [0, 1]).
    downs = np.sort(prompt[~up] * 10.0 + q[~up])
    lo = np.searchsorted(downs, prompt[up] * 10.0, side="left")
    better = int((np.searchsorted(downs, prompt[up] * 10.0 + q[up], side="left") - lo).sum())
    # All pairs minus those whose two responses are identical (identical texts have equal quality).
    n_up = np.bincount(prompt[up].astype(np.int64), minlength=int(prompt.max()) + 1)
    n_down = np.bincount(prompt[~up].astype(np.int64), minlength=int(prompt.max()) + 1)
    keys = pd.DataFrame({"p": prompt.astype(np.int64), "r": response, "up": up})
    per = keys.groupby(["p", "r"])["up"].agg(["sum", "count"])
    identical = int((per["sum"] * (per["count"] - per["sum"])).sum())
    total = int((n_up * n_down).sum()) - identical
    return better / max(total, 1), total


def fingerprint(events: pd.DataFrame) -> tuple[int, int, str]:
    """(rows, distinct prompt texts, sha256 of the frame's row hashes): what a side was fed."""
    digest = hashlib.sha256(pd.util.hash_pandas_object(events, index=True).to_numpy().tobytes()).hexdigest()
    return len(events), int(events["prompt"].nunique()), digest


def run_both(events: pd.DataFrame, cfg) -> dict[str, Any]:
    """Our miner and the first-rule baseline on the same event frame, with what each side was fed recorded."""
    from datalib.mine import mine_pairs

    fed: dict[str, Any] = {"ours": fingerprint(events)}
    t0 = time.perf_counter()
    ours, report = mine_pairs(events, cfg)
    seconds = time.perf_counter() - t0
    fed["baseline"] = fingerprint(events)
    base = first_rule_pairs(events)
    fed["after"] = fingerprint(events)
    return {"ours": ours, "report": report, "seconds": seconds, "baseline": base, "fed": fed}


def same_work_problems(events: pd.DataFrame, run: dict[str, Any]) -> list[str]:
    """Why the two sides did not both mine ``events``, the log the metrics are computed on (empty: they did):
    what each side was fed (and the frame after both) must fingerprint as ``events``, our miner must have read
    all of its rows, and every pair of either side must point at events in it."""
    fed, problems, log = run["fed"], [], fingerprint(events)
    for side in ("ours", "baseline", "after"):
        if fed[side] != log:
            problems.append(f"{side} saw {fed[side][:2]} / {fed[side][2][:12]}, the log is {log[:2]} / {log[2][:12]}")
    if run["report"]["events_in"] != len(events):
        problems.append(f"ours read {run['report']['events_in']} events of {len(events)}")
    ids = set(events["event_id"])
    for side in ("ours", "baseline"):
        pairs = run[side]
        logs = pairs[pairs["source"] == "logs"]
        if not (logs["chosen_event_id"].isin(ids).all() and logs["rejected_event_id"].isin(ids).all()):
            problems.append(f"{side} has pairs whose event ids are not in the log")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--users", type=int, default=500)
    parser.add_argument("--big-events", type=int, default=1_000_000)
    parser.add_argument("--big-users", type=int, default=25_000)
    parser.add_argument("--verifier-workers", type=int, default=0, help="sandbox workers (0: one per CPU core)")
    args = parser.parse_args()

    from datalib.generate import assign_splits, generate_problems
    from datalib.mine import mine_pairs
    from datalib.simulate_logs import SimSettings, simulate_logs
    from sandbox.verifier import Verifier, VerifierConfig
    from tasks.config import MineConfig, PrepareConfig

    prep = PrepareConfig()
    problems = assign_splits(generate_problems(prep.n_problems, prep.seed), prep.seed, prep.val_frac, prep.test_frac)
    train = [p for p in problems if p["split"] == "train"]
    verdicts: dict[tuple[str, str, str], bool] = {}
    cfg = MineConfig()
    logs: dict[str, tuple[pd.DataFrame, pd.DataFrame]] = {}
    vcfg = VerifierConfig(workers=args.verifier_workers) if args.verifier_workers else VerifierConfig()
    with Verifier(vcfg) as verifier:

        def check(program: str, test: str, entry_point: str) -> bool:
            key = (program, test, entry_point)
            if key not in verdicts:
                verdicts[key] = verifier.check(program, test, entry_point).passed
            return verdicts[key]

        t0 = time.perf_counter()
        for name, _, fields in SCENARIOS:
            logs[name] = simulate_logs(
                train, args.events, args.users, seed=0, check=check, settings=SimSettings(**fields)
            )
        events = logs["default"][0]
        print(
            f"simulated {len(SCENARIOS)} logs of {len(events):,} events / {events['user_id'].nunique()} users / "
            f"{events['prompt'].nunique()} prompt texts in {time.perf_counter() - t0:.1f} s "
            f"({len(verdicts)} programs verified)"
        )
        big = None
        if args.big_events:
            t0 = time.perf_counter()
            big, big_truth = simulate_logs(train, args.big_events, args.big_users, seed=1, check=check)
            print(f"simulated {len(big):,} events in {time.perf_counter() - t0:.1f} s (not timed below)")

    results: dict[str, dict[str, Any]] = {}
    failures: list[str] = []
    worse: list[str] = []
    for name, behaviour, fields in SCENARIOS:
        events, truth = logs[name]
        run = run_both(events, cfg)
        failures += [f"{name}: {p}" for p in same_work_problems(events, run)]
        ours, base = run["ours"], run["baseline"]
        p, (r, n_opp) = precision(ours, truth), recall(ours, events, truth)
        bp, (br, _) = precision(base, truth), recall(base, events, truth)
        q, n_naive = naive_precision(events, truth)
        results[name] = {"p": p, "r": r, "bp": bp, "run": run}
        line = (
            f"sim={name:<13} ours precision={p:.4f} recall={r:.4f} pairs={len(ours):,} | "
            f"first_rule precision={bp:.4f} recall={br:.4f} pairs={len(base):,} | ratio={p / bp:.3f} | "
            f"naive_precision={q:.4f} (pairs={n_naive:,}) | opportunities={n_opp:,}"
        )
        if behaviour is not None:
            who = truth.set_index("event_id")["behaviour"]
            ours_from = int(who.loc[ours["chosen_event_id"]].eq(behaviour).sum())
            base_from = int(who.loc[base["chosen_event_id"]].eq(behaviour).sum())
            line += f" | pairs from {behaviour} raters: ours {ours_from:,}, first_rule {base_from:,} | {fields}"
        print(line)
        if behaviour is not None and p < bp:
            worse.append(name)
            print(
                f"  WORSE: on {name} (raters the miner does not model) our precision {p:.4f} is below the "
                f"first rule alone, {bp:.4f}"
            )
    default = results["default"]
    rep = default["run"]["report"]
    print(
        f"default sim: mined in {default['run']['seconds']:.2f} s; users {rep['users']}; pair rules {rep['log_pairs']}"
    )
    if worse:
        print(f"our miner is less precise than the first rule alone on: {', '.join(worse)}")
    else:
        print("our miner is at least as precise as the first rule alone on every scenario")

    if big is not None:
        t0 = time.perf_counter()
        big_pairs, _ = mine_pairs(big, cfg)
        big_seconds = time.perf_counter() - t0
        print(
            f"mine_1M_seconds={big_seconds:.1f} events={len(big):,} "
            f"precision_1M={precision(big_pairs, big_truth):.4f} pairs_1M={len(big_pairs)}"
        )

    n, n_prompts, digest = fingerprint(logs["default"][0])
    if failures:
        print("CHECK same_work=FAIL " + "; ".join(failures))
        sys.exit(1)
    print(
        f"CHECK same_work=ok both sides mined from the same log: {n:,} events, the same {n_prompts} prompt texts "
        f"(frame sha256 {digest[:12]}, identical at both entries and unchanged after; every pair's event ids in it; "
        f"same on all {len(SCENARIOS)} scenario logs)"
    )
    p, r, bp = default["p"], default["r"], default["bp"]
    print(f"RESULT precision={p:.4f} recall={r:.4f} baseline_precision={bp:.4f} ratio={p / bp:.3f}")


if __name__ == "__main__":
    main()
