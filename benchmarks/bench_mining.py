"""Preference mining on simulated feedback logs: precision and recall against the ground truth, next to naive
pairing, and the time to mine 1,000,000 events.

    .venv/bin/python -m benchmarks.bench_mining [--events 20000] [--users 500] [--big-events 1000000]

Data: the ``train`` split of the bundled generated problems (``tasks.generate``, params.yaml defaults), the
embedded-default simulator (:func:`tasks.simulate_logs.simulate_logs`, default :class:`SimSettings`) with the
sandboxed verifier (:class:`models.verifier.Verifier`) deciding correctness, and
:func:`tasks.mine.mine_pairs` with the default :class:`MineConfig`.

Figures (on the ``--events`` log, seed 0):

- **precision**: the fraction of mined pairs whose chosen response is truly better than the rejected one
  (ground-truth quality strictly greater; equal quality counts as a miss).
- **recall**: the fraction of *opportunities* that end up mined. An opportunity is a distinct
  (prompt, better response, worse response) triple that some careful rater produced by rating the better response
  up and the worse one down on that same prompt (both ratings by one user, a true quality gap between the two
  responses). It is the set of truly ordered, high-confidence pairs a miner that knew who the careful raters are
  could output. A mined pair counts when its (prompt, chosen, rejected) texts as logged are an opportunity;
  opportunities the similarity filter drops on purpose (near-identical texts) count as misses.
- **naive_precision**: the same precision for naive pairing: every up-rated × down-rated event on the same prompt
  text, any users, responses not identical.
- **ratio** = precision / naive_precision.
- **mine_1M_seconds**: wall time of ``mine_pairs`` on a ``--big-events`` log (25,000 users, seed 1) simulated
  directly; the simulation is not timed.

Last lines: ``mine_1M_seconds=<s> ...`` then ``RESULT precision=<p> recall=<r> naive_precision=<q> ratio=<p/q>``.
Goal: precision ≥ 0.95 and mining 1M events in ≤ 120 s on 2 cores.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd


def precision(pairs: pd.DataFrame, truth: pd.DataFrame) -> float:
    """Fraction of mined log pairs with quality(chosen) > quality(rejected) (ground truth by event id)."""
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


def naive_precision(events: pd.DataFrame, truth: pd.DataFrame) -> tuple[float, int]:
    """(precision, number of pairs) of every up × down event pair on the same prompt text with different
    responses, counted without materialising the cross product."""
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--users", type=int, default=500)
    parser.add_argument("--big-events", type=int, default=1_000_000)
    parser.add_argument("--big-users", type=int, default=25_000)
    args = parser.parse_args()

    from models.verifier import Verifier
    from tasks.config import PrepareConfig
    from tasks.generate import assign_splits, generate_problems
    from tasks.mine import MineConfig, mine_pairs
    from tasks.simulate_logs import simulate_logs

    prep = PrepareConfig()
    problems = assign_splits(generate_problems(prep.n_problems, prep.seed), prep.seed, prep.val_frac, prep.test_frac)
    train = [p for p in problems if p["split"] == "train"]
    verdicts: dict[tuple[str, str, str], bool] = {}
    cfg = MineConfig()
    with Verifier() as verifier:

        def check(program: str, test: str, entry_point: str) -> bool:
            key = (program, test, entry_point)
            if key not in verdicts:
                verdicts[key] = verifier.check(program, test, entry_point).passed
            return verdicts[key]

        t0 = time.perf_counter()
        events, truth = simulate_logs(train, args.events, args.users, seed=0, check=check)
        print(
            f"simulated {len(events):,} events / {events['user_id'].nunique()} users / "
            f"{events['prompt'].nunique()} prompt texts in {time.perf_counter() - t0:.1f} s "
            f"({len(verdicts)} programs verified)"
        )
        big = None
        if args.big_events:
            t0 = time.perf_counter()
            big, big_truth = simulate_logs(train, args.big_events, args.big_users, seed=1, check=check)
            print(f"simulated {len(big):,} events in {time.perf_counter() - t0:.1f} s (not timed below)")

    t0 = time.perf_counter()
    pairs, report = mine_pairs(events, cfg)
    seconds = time.perf_counter() - t0
    p = precision(pairs, truth)
    r, n_opp = recall(pairs, events, truth)
    q, n_naive = naive_precision(events, truth)
    behaviours = truth.set_index("event_id").loc[pairs["chosen_event_id"], "behaviour"].value_counts().to_dict()
    print(f"mined {len(pairs):,} pairs in {seconds:.2f} s; users {report['users']}")
    print(f"pair rules {report['log_pairs']}")
    print(f"raters behind mined pairs: {behaviours}")
    print(
        f"precision={p:.4f} recall={r:.4f} (opportunities={n_opp:,}) naive_precision={q:.4f} (naive pairs={n_naive:,})"
    )

    extra = ""
    if big is not None:
        t0 = time.perf_counter()
        big_pairs, big_report = mine_pairs(big, cfg)
        big_seconds = time.perf_counter() - t0
        extra = f" precision_1M={precision(big_pairs, big_truth):.4f} pairs_1M={len(big_pairs)}"
        print(f"mine_1M_seconds={big_seconds:.1f} events={len(big):,}{extra}")
    print(f"RESULT precision={p:.4f} recall={r:.4f} naive_precision={q:.4f} ratio={p / q:.3f}")


if __name__ == "__main__":
    main()
