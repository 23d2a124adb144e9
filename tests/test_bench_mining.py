"""benchmarks/bench_mining.py: the first-rule baseline on a hand-made log, and the same-work check that guards its
RESULT line (both sides mined from one frame)."""

from __future__ import annotations

import pandas as pd
import pytest

from benchmarks.bench_mining import fingerprint, first_rule_pairs, precision, run_both, same_work_problems
from datalib.simulate_logs import simulate_logs
from tasks.config import MineConfig
from tests.test_simulate_logs import PROBLEMS, exec_check


def _log(rows: list[tuple[str, str, str, str]]) -> pd.DataFrame:
    """Events from (user, prompt, response, rating), one minute apart."""
    return pd.DataFrame(
        [
            {
                "event_id": f"e{i:03d}",
                "ts": f"2025-01-06T00:{i:02d}:00.000Z",
                "user_id": user,
                "session_id": f"s{i}",
                "prompt": prompt,
                "response": response,
                "rating": rating,
                "category": "c",
                "model_version": "v1",
            }
            for i, (user, prompt, response, rating) in enumerate(rows)
        ]
    )


def test_first_rule_pairs_same_user_same_prompt_up_against_down():
    events = _log(
        [
            ("a", "P", "R1", "up"),
            ("a", "P", "R2", "down"),
            ("a", "P", "R3", "down"),
            ("a", "P", "R1", "up"),  # a repeat: the (R1, R2) and (R1, R3) pairs are not doubled
            ("a", "P", "R3", "up"),  # R3 rated both ways: (R3, R2) is a pair, (R3, R3) is not
            ("b", "P", "R4", "up"),  # another user: never paired with a's down-votes
            ("a", "Q", "R5", "up"),  # another prompt: never paired with a's down-votes on P
            ("b", "Q", "R6", "down"),
        ]
    )
    pairs = first_rule_pairs(events)
    got = sorted(zip(pairs["user_id"], pairs["prompt"], pairs["chosen"], pairs["rejected"], strict=True))
    assert got == [("a", "P", "R1", "R2"), ("a", "P", "R1", "R3"), ("a", "P", "R3", "R2")]
    # The earliest events of each distinct pair; ids point back into the log.
    ids = pairs.set_index(["chosen", "rejected"]).loc[("R1", "R2"), ["chosen_event_id", "rejected_event_id"]]
    assert tuple(ids) == ("e000", "e001")
    assert (pairs["source"] == "logs").all()


@pytest.fixture(scope="module")
def small():
    events, truth = simulate_logs(PROBLEMS, n_events=3000, n_users=80, seed=0, check=exec_check)
    return events, truth, run_both(events, MineConfig())


def test_same_work_passes_when_both_sides_mine_the_log(small):
    events, truth, run = small
    assert same_work_problems(events, run) == []
    assert run["fed"]["ours"] == run["fed"]["baseline"] == fingerprint(events)
    assert run["report"]["events_in"] == len(events)
    # Our miner's pairs are a filtered subset of the first rule's idea, and more precise on the default simulator.
    assert precision(run["ours"], truth) > precision(run["baseline"], truth)


def test_same_work_fails_on_another_frame(small):
    events, _, run = small
    assert same_work_problems(events.iloc[:-1], run)  # the log checked is not the one mined
    other = events.assign(rating=events["rating"].iloc[::-1].to_numpy())  # same rows and prompts, other ratings
    tampered = run | {"fed": run["fed"] | {"baseline": fingerprint(other)}}
    problems = same_work_problems(events, tampered)
    assert len(problems) == 1 and problems[0].startswith("baseline saw")
    foreign = run | {"baseline": run["baseline"].assign(chosen_event_id="not-an-event")}
    assert any("event ids" in p for p in same_work_problems(events, foreign))
