"""Preference mining: the denoising test on hand-made users, the pairing rule, filters, dedupe, caps, human
pairs, determinism and zero PII leaks, plus an end-to-end check on simulated logs against the ground truth."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from scipy.stats import fisher_exact

from datalib.mine import PAIR_COLUMNS, mine_pairs, no_pairs_warning, rate_users, similarity
from datalib.simulate_logs import PII_KINDS, SimSettings, make_pii, simulate_logs
from tasks.config import MineConfig
from tests.test_simulate_logs import PROBLEMS, exec_check

N_RESPONSES = 20  # per side: GOOD[k] is the good answer to prompt k, BAD[k] the bad one


def _good(k: int) -> str:
    return (
        f"Here is `clean_{k}`: it strips every item and drops the empty ones.\n\n```python\n"
        f"def clean_{k}(items):\n    # Step 1: strip\n    out = [x.strip() for x in items if x is not None]\n"
        f"    # Step 2: drop empty\n    return [x for x in out if x]\n```"
    )


def _bad(k: int) -> str:
    return f"def clean_{k}(items): return items  # ok {k}"


GOOD = [_good(k) for k in range(N_RESPONSES)]
BAD = [_bad(k) for k in range(N_RESPONSES)]


def _prompt(k: int) -> str:
    return f"Write clean_{k}(items) that strips items and drops empty ones."


class Log:
    """Builds events in the feedback-log schema, one call per rating."""

    def __init__(self):
        self.rows: list[dict] = []

    def rate(self, user, prompt, response, rating, t=None, category="strip", session=None, event_id=None):
        i = len(self.rows)
        t = 60.0 * i if t is None else t
        ts = (pd.Timestamp("2025-01-06", tz="UTC") + pd.Timedelta(seconds=t)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        self.rows.append(
            {
                "event_id": event_id or f"e{i:06d}",
                "ts": ts,
                "user_id": user,
                "session_id": session or f"s-{user}-{i}",
                "prompt": prompt,
                "response": response,
                "rating": rating,
                "category": category,
                "model_version": "v1",
            }
        )

    def background(self, n_users: int = 10):
        """Careful raters who rate every answer by its quality, each on a prompt of its own (no pairs)."""
        for j in range(n_users):
            for k in range(N_RESPONSES):
                self.rate(f"bg{j}", f"background {k} good", GOOD[k], "up")
                self.rate(f"bg{j}", f"background {k} bad", BAD[k], "down")
        return self

    def calibrate(self, user: str):
        """``user`` rates answers 10..19 by quality, each on a prompt of its own: evidence for the denoising
        test that adds no pair (the pair tests use prompts 0..9)."""
        for k in range(N_RESPONSES // 2, N_RESPONSES):
            self.rate(user, f"calibration {user} {k} good", GOOD[k], "up")
            self.rate(user, f"calibration {user} {k} bad", BAD[k], "down")
        return self

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)


# ------------------------------------------------------------------------------------------------ denoising


def _denoising_log() -> Log:
    log = Log().background()
    for k in range(N_RESPONSES):  # always up, on everything
        log.rate("always_up", _prompt(k), GOOD[k], "up")
        log.rate("always_up", _prompt(k), BAD[k], "up")
    for k in range(N_RESPONSES):  # always down
        log.rate("always_down", _prompt(k), GOOD[k], "down")
        log.rate("always_down", _prompt(k), BAD[k], "down")
    for k in range(N_RESPONSES // 2):  # careful: right on 20 ratings
        log.rate("careful", _prompt(k), GOOD[k], "up")
        log.rate("careful", _prompt(k), BAD[k], "down")
    for k in range(N_RESPONSES):  # random: half of each kind up, independent of quality (40 ratings)
        log.rate("random", _prompt(k), GOOD[k], "up" if k % 2 else "down")
        log.rate("random", _prompt(k), BAD[k], "up" if k % 2 == 0 else "down")
    for k in range(N_RESPONSES):  # contrarian: always wrong
        log.rate("contrarian", _prompt(k), GOOD[k], "down")
        log.rate("contrarian", _prompt(k), BAD[k], "up")
    log.rate("newcomer", _prompt(0), GOOD[0], "up")  # right, but only 2 ratings
    log.rate("newcomer", _prompt(0), BAD[0], "down")
    return log


def test_denoising_on_hand_made_users():
    stats = rate_users(_denoising_log().frame(), MineConfig())
    reason = stats["reason"].to_dict()
    assert reason["always_up"] == "constant" and reason["always_down"] == "constant"
    assert reason["careful"] == "kept"
    assert reason["random"] == "uninformative"
    assert reason["contrarian"] == "uninformative"
    assert reason["newcomer"] == "too_few_ratings"
    assert all(reason[f"bg{j}"] == "kept" for j in range(10))
    # The careful user's table against the kept users' leave-one-out consensus: 10 up&good, 10 down&bad,
    # so p = 1 / C(20, 10) (the one table at least as extreme).
    row = stats.loc["careful"]
    assert (row["a"], row["b"], row["c"], row["d"]) == (10, 0, 0, 10)
    assert row["p_value"] == pytest.approx(1 / 184756, rel=1e-9)
    # The random clicker's table is balanced: p = P(X ≥ 10) for X ~ Hypergeom(40, 20, 20), Fisher's one-sided.
    r = stats.loc["random"]
    assert (r["a"], r["b"], r["c"], r["d"]) == (10, 10, 10, 10)
    expected = fisher_exact([[10, 10], [10, 10]], alternative="greater").pvalue
    assert r["p_value"] == pytest.approx(expected, rel=1e-9)
    assert r["p_value"] > 0.5
    assert stats.loc["always_up", "p_value"] == 1.0  # a constant margin carries no information
    assert stats.loc["always_up", "up_rate"] == 1.0 and stats.loc["always_down", "up_rate"] == 0.0


def test_random_clicker_is_kept_only_by_chance_with_few_ratings():
    """With few ratings the test has no power either way: a perfect 6-rating user is not significant at 0.01."""
    log = Log().background()
    for k in range(3):
        log.rate("short", _prompt(k), GOOD[k], "up")
        log.rate("short", _prompt(k), BAD[k], "down")
    stats = rate_users(log.frame(), MineConfig(min_ratings_per_user=6, alpha=0.01))
    assert stats.loc["short", "p_value"] == pytest.approx(1 / 20)  # 1 / C(6, 3)
    assert stats.loc["short", "reason"] == "uninformative"
    assert rate_users(log.frame(), MineConfig(alpha=0.06)).loc["short", "reason"] == "kept"


# ------------------------------------------------------------------------------------------------ pairing


def test_pairing_rule_same_user_same_prompt_both_ways():
    log = _denoising_log()
    pairs, report = mine_pairs(log.frame(), MineConfig())
    # Only the careful user rated prompts both ways among kept users: one pair per prompt 0..9.
    assert set(pairs["user_id"]) == {"careful"}
    assert len(pairs) == N_RESPONSES // 2
    assert set(pairs["prompt"]) == {_prompt(k) for k in range(N_RESPONSES // 2)}
    for row in pairs.itertuples():
        k = int(row.prompt.split("clean_")[1].split("(")[0])
        assert row.chosen == GOOD[k] and row.rejected == BAD[k]
    assert (pairs["source"] == "logs").all() and (pairs["category"] == "strip").all()
    assert tuple(pairs.columns) == PAIR_COLUMNS
    assert report["users"]["kept"] == 11 and report["users"]["constant"] == 2
    assert report["log_pairs"]["kept"] == 10


def test_no_pairs_across_users_prompts_or_categories():
    log = Log().background()
    for k in range(6):  # two careful users, on different prompts and categories
        log.rate("ann", _prompt(k), GOOD[k], "up")
        log.rate("ann", _prompt(k + 6), BAD[k + 6], "down")  # same category, different prompt
        log.rate("bob", _prompt(k), BAD[k], "down")  # other user, same prompt as ann's up
        log.rate("bob", _prompt(k + 12), GOOD[k + 12], "up", category="other")
        log.rate("bob", _prompt(k + 12), BAD[k + 12], "down", category="other")
    pairs, report = mine_pairs(log.frame(), MineConfig(alpha=0.05))
    assert report["users"]["kept"] == 12
    # Only bob's own up/down on the same prompt (category "other") pair up.
    assert set(zip(pairs["user_id"], pairs["category"], strict=True)) == {("bob", "other")}
    assert len(pairs) == 6


def test_same_prompt_keyed_after_scrubbing_and_whitespace():
    log = Log().background()
    for k in range(6):
        log.rate("ann", f"user: Ann Lee\n{_prompt(k)}", GOOD[k], "up")
        log.rate("ann", f"user:  Bob Ray\n{_prompt(k)}  ", BAD[k].replace(" ", "  "), "down")
    pairs, _ = mine_pairs(log.frame(), MineConfig(alpha=0.05))
    assert len(pairs) == 6  # the two prompts differ only by PII and spacing: one prompt, so they pair
    assert pairs["prompt"].str.startswith("user: <NAME>").all()


def test_similarity_values():
    assert similarity("a b c d", "a b c d") == 1.0
    assert similarity("a b c d", "a b x d") == pytest.approx(2 * 3 / 8)
    assert similarity("a b", "c d") == 0.0
    assert similarity("", "") == 1.0
    # Tokens, not characters: spacing does not matter, punctuation does.
    assert similarity("f(x) + 1", "f( x )+1") == 1.0
    assert similarity("x == 1", "x != 1") == pytest.approx(2 * 3 / 8)  # x, =/!, =, 1 → 3 of 4 match


def test_similarity_filter_drops_near_identical_pairs():
    log = Log().background().calibrate("ann")
    for k in range(6):
        log.rate("ann", _prompt(k), GOOD[k], "up")
        log.rate("ann", _prompt(k), GOOD[k].replace("if x]", "if not x]"), "down")  # one token apart
    strict = MineConfig()
    sim = similarity(GOOD[0], GOOD[0].replace("if x]", "if not x]"))
    assert strict.similarity_threshold < sim < 1.0
    pairs, report = mine_pairs(log.frame(), strict)
    assert len(pairs) == 0 and report["log_pairs"]["too_similar"] == 6
    pairs, report = mine_pairs(log.frame(), MineConfig(similarity_threshold=1.0))
    assert len(pairs) == 6 and report["log_pairs"]["too_similar"] == 0


def test_dedupe_identical_and_near_identical_pairs():
    log = Log().background()
    for user in ("ann", "bob"):  # both make the same pair on prompt 0..5
        for k in range(6):
            log.rate(user, _prompt(k), GOOD[k], "up")
            log.rate(user, _prompt(k), BAD[k], "down")
    pairs, report = mine_pairs(log.frame(), MineConfig(alpha=0.05))
    assert len(pairs) == 6 and report["log_pairs"]["duplicates"] == 6
    assert set(pairs["user_id"]) == {"ann"}  # the earliest pair of each group is kept

    log = Log().background().calibrate("ann").calibrate("bob").calibrate("cid")
    for k in range(6):
        log.rate("ann", _prompt(k), GOOD[k], "up")
        log.rate("ann", _prompt(k), BAD[k], "down")
        log.rate("bob", _prompt(k), GOOD[k] + " ", "up")  # whitespace only: the same response
        log.rate("bob", _prompt(k), BAD[k], "down")
        variant = GOOD[k].replace("drop empty", "drop the empty ones")  # near-identical chosen
        log.rate("cid", _prompt(k), variant, "up")
        log.rate("cid", _prompt(k), BAD[k], "down")
    variant_sim = similarity(GOOD[0], GOOD[0].replace("drop empty", "drop the empty ones"))
    pairs, report = mine_pairs(log.frame(), MineConfig(dedupe_threshold=variant_sim - 0.01))
    assert len(pairs) == 6 and report["log_pairs"]["duplicates"] == 12
    pairs, report = mine_pairs(log.frame(), MineConfig(dedupe_threshold=1.0))
    assert len(pairs) == 12 and report["log_pairs"]["duplicates"] == 6  # only the whitespace twin


def test_double_clicks_dropped_within_window():
    log = Log().background()
    log.rate("ann", _prompt(0), GOOD[0], "up", t=10_000.0, event_id="first")
    log.rate("ann", _prompt(0), GOOD[0], "up", t=10_002.0, event_id="double")
    log.rate("ann", _prompt(0), GOOD[0], "up", t=10_100.0, event_id="later")  # 100 s on: a new rating
    _, report = mine_pairs(log.frame(), MineConfig())
    assert report["double_clicks_dropped"] == 1
    assert report["events_used"] == len(log.rows) - 1


def test_cap_per_user_and_category_is_seeded():
    log = Log().background()
    for k in range(6):
        log.rate("ann", _prompt(k), GOOD[k], "up")
        log.rate("ann", _prompt(k), BAD[k], "down")
    cfg = MineConfig(alpha=0.05, max_pairs_per_user_category=2)
    pairs, report = mine_pairs(log.frame(), cfg)
    assert len(pairs) == 2 and report["log_pairs"]["user_category_cap"] == 4
    again, _ = mine_pairs(log.frame(), cfg)
    pd.testing.assert_frame_equal(pairs, again)
    picks = {
        tuple(mine_pairs(log.frame(), MineConfig(alpha=0.05, max_pairs_per_user_category=2, seed=s))[0]["prompt"])
        for s in range(6)
    }
    assert len(picks) > 1  # the seed decides which pairs stay


def test_consensus_contradiction_drops_the_pair():
    log = Log().background().calibrate("ann")
    for k in range(8):
        log.rate("ann", _prompt(k), GOOD[k], "up")
        log.rate("ann", _prompt(k), BAD[k], "down")
    log.rate("ann", _prompt(9), BAD[9], "up")  # a slip: everybody else rates BAD[9] down, GOOD[9] up
    log.rate("ann", _prompt(9), GOOD[9], "down")
    pairs, report = mine_pairs(log.frame(), MineConfig())
    assert report["log_pairs"]["contradicts_consensus"] == 1
    assert len(pairs) == 8 and not (pairs["chosen"] == BAD[9]).any()
    pairs, report = mine_pairs(log.frame(), MineConfig(consensus_margin=-1.0))
    assert len(pairs) == 9


def test_invalid_rows_are_counted_and_dropped():
    log = _denoising_log()
    frame = log.frame()
    extra = frame.iloc[:4].copy()
    extra["event_id"] = ["x1", "x2", "x3", "x4"]
    extra.loc[extra.index[0], "rating"] = "meh"
    extra.loc[extra.index[1], "ts"] = "yesterday"
    extra.loc[extra.index[2], "prompt"] = None
    extra.loc[extra.index[3], "response"] = "   "
    pairs, report = mine_pairs(pd.concat([frame, extra], ignore_index=True), MineConfig())
    assert report["invalid_rows"] == {
        "invalid_rating": 1,
        "invalid_ts": 1,
        "missing_prompt": 1,
        "missing_response": 1,
    }
    assert report["events_in"] == len(frame) + 4
    assert len(pairs) == N_RESPONSES // 2
    with pytest.raises(ValueError, match="rating"):
        mine_pairs(frame.drop(columns=["rating"]))


def test_human_pairs_are_merged_tagged_and_deduplicated():
    log = _denoising_log()
    human = pd.DataFrame(
        [
            {"prompt": _prompt(0), "chosen": GOOD[0], "rejected": BAD[0], "annotator": "ann", "dimension": "x"},
            {
                "prompt": "Sort a list",
                "chosen": "sorted(xs)",
                "rejected": "xs",
                "annotator": "ann",
                "dimension": "style",
            },
            {
                "prompt": "Sort a list",
                "chosen": "sorted(xs)",
                "rejected": "xs",
                "annotator": "bob",
                "dimension": "style",
            },
            {"prompt": "Sort", "chosen": "", "rejected": "xs", "annotator": "bob", "dimension": "style"},
            {
                "prompt": "Mail",
                "chosen": "write to a.b@example.com",
                "rejected": "no",
                "annotator": None,
                "dimension": None,
            },
        ]
    )
    pairs, report = mine_pairs(log.frame(), MineConfig(), human_pairs=human)
    h = pairs[pairs["source"] == "human"]
    assert len(h) == 2
    assert set(h["category"]) == {"human:style", "human:unknown"}
    assert h["chosen_event_id"].isna().all()
    assert "write to <EMAIL>" in set(h["chosen"])
    assert report["human"] == {"in": 5, "invalid": 1, "too_similar": 0, "duplicates": 2, "kept": 2}
    assert report["per_source"] == {"human": 2, "logs": N_RESPONSES // 2}


def test_report_is_json_and_counts_add_up():
    pairs, report = mine_pairs(_denoising_log().frame(), MineConfig())
    json.dumps(report)
    rules = report["log_pairs"]
    removed = sum(v for k, v in rules.items() if k not in ("candidates", "kept"))
    assert rules["candidates"] - removed == rules["kept"] == len(pairs)
    assert sum(report["per_category"].values()) == report["pairs_kept"] == len(pairs)
    users = report["users"]
    assert users["total"] == sum(v for k, v in users.items() if k != "total")


# ------------------------------------------------------------------------------------------------ simulated logs


@pytest.fixture(scope="module")
def simulated():
    settings = SimSettings(pii_prompt_rate=0.5, pii_response_rate=0.2)
    return simulate_logs(PROBLEMS, n_events=8_000, n_users=200, seed=0, check=exec_check, settings=settings)


def test_mined_pairs_beat_naive_pairing_on_simulated_logs(simulated):
    events, truth = simulated
    pairs, report = mine_pairs(events, MineConfig())
    assert len(pairs) > 100
    g = truth.set_index("event_id")
    chosen, rejected = g.loc[pairs["chosen_event_id"]], g.loc[pairs["rejected_event_id"]]
    assert (chosen["behaviour"] == "careful").all()  # no indiscriminate or random rater survives
    assert (chosen["user_id"].to_numpy() == rejected["user_id"].to_numpy()).all()
    precision = (chosen["quality"].to_numpy() > rejected["quality"].to_numpy()).mean()
    # Naive: every up × down on the same prompt, any users, different responses.
    e = events.assign(q=truth["quality"].to_numpy())
    naive = e[e["rating"] == "up"].merge(e[e["rating"] == "down"], on="prompt")
    naive = naive[naive["response_x"] != naive["response_y"]]
    naive_precision = (naive["q_x"] > naive["q_y"]).mean()
    assert precision > 0.85 and precision > naive_precision + 0.1
    assert report["users"]["kept"] < report["users"]["total"] / 2


def test_mining_is_deterministic(simulated):
    events, _ = simulated
    a = mine_pairs(events, MineConfig())
    b = mine_pairs(events.copy(), MineConfig())
    pd.testing.assert_frame_equal(a[0], b[0])
    assert a[1] == b[1]


def test_no_raw_pii_leaves_mining(simulated):
    """Seed all PII kinds (≥ 10) into prompts, responses, user ids and human pairs; scan every output."""
    events, truth = simulated
    rng = np.random.default_rng(7)
    log = Log().background()
    secrets: list[str] = []
    for k, kind in enumerate(PII_KINDS):  # one careful rater per kind, whose pairs carry the PII
        user_sentence, user_raw = make_pii("email", rng)
        user = user_raw[0]  # the user id itself is an e-mail address
        p_sentence, p_raw = make_pii(kind, rng)
        r_sentence, r_raw = make_pii(kind, rng)
        secrets += user_raw + p_raw + r_raw
        log.calibrate(user)
        for j in range(6):
            prompt = f"{_prompt(j)}\n{p_sentence}"
            log.rate(user, prompt, f"{GOOD[j]}\n\n{r_sentence}", "up", category=f"cat{k}")
            log.rate(user, prompt, BAD[j], "down", category=f"cat{k}")
    hand = log.frame()
    hand["event_id"] = "hand-" + hand["event_id"]
    h_sentence, h_raw = make_pii("openai_key", rng)
    human = pd.DataFrame(
        [
            {
                "prompt": h_sentence,
                "chosen": "fine answer",
                "rejected": h_sentence,
                "annotator": secrets[0],
                "dimension": "safety",
            }
        ]
    )
    seeded = [s for raw in truth["pii"] for s in raw] + secrets
    all_events = pd.concat([events, hand], ignore_index=True)
    assert len(PII_KINDS) >= 10
    text = "\n".join(all_events["prompt"]) + "\n".join(all_events["response"]) + "\n".join(all_events["user_id"])
    assert all(s in text for s in secrets)  # the PII really is in the input
    secrets += h_raw

    pairs, report = mine_pairs(all_events, MineConfig(), human_pairs=human)
    out = pairs.to_json(orient="records") + json.dumps(report)
    leaks = sorted({s for s in seeded if s in out})
    assert leaks == []
    # Not vacuous: the hand-made PII pairs were mined, with every kind of placeholder.
    assert pairs["category"].str.startswith("cat").sum() >= len(PII_KINDS)
    assert all(report["placeholders_in_pairs"][ph] > 0 for ph in report["placeholders_in_pairs"])


# ------------------------------------------------------------------------------------------------ no pairs: loud


def test_zero_pairs_warns_with_the_reasons_counts_and_the_knobs():
    """Issue 44: `mine` on 200 events exited 0 with 0 pairs and no word (the reason, constant raters and raters with
    too few ratings, only in report.json). The warning gives each count of the report and the keys to turn."""
    events, _ = simulate_logs(PROBLEMS, n_events=200, n_users=100, seed=0, check=exec_check)
    pairs, report = mine_pairs(events, MineConfig())
    assert len(pairs) == 0
    users = report["users"]
    assert users == {"total": 50, "kept": 0, "constant": 29, "too_few_ratings": 21, "uninformative": 0}
    warning = no_pairs_warning(report)
    assert warning == (
        "mine kept 0 pairs from 200 events (196 used after 0 invalid rows and 4 double clicks); of 50 users 0 kept, "
        "29 constant raters (always up or always down: no signal), 21 with too few ratings (< mine.min_ratings_per_user"
        " = 6 ratings that other users also rated, mine.min_consensus_raters = 2), 0 uninformative (Fisher p >= "
        "mine.alpha = 0.01); to get pairs: lower mine.min_ratings_per_user or mine.min_consensus_raters; more ratings "
        "per user and per response (longer logs; simulated: simulate_logs.n_events)"
    )


def test_zero_pairs_after_the_filters_names_each_rules_key():
    report = {
        "events_in": 40,
        "events_used": 40,
        "invalid_rows": {},
        "double_clicks_dropped": 0,
        "users": {"total": 4, "kept": 2, "constant": 1, "too_few_ratings": 0, "uninformative": 1},
        "log_pairs": {
            "candidates": 5,
            "same_response_both_ways": 0,
            "contradicts_consensus": 2,
            "too_similar": 3,
            "duplicates": 0,
            "user_category_cap": 0,
            "kept": 0,
        },
        "pairs_kept": 0,
        "config": {"min_ratings_per_user": 6, "min_consensus_raters": 2, "alpha": 0.01},
    }
    warning = no_pairs_warning(report)
    assert (
        "5 candidate pairs (a kept user rating two responses to one prompt up and down): removed "
        "contradicts_consensus 2, too_similar 3" in warning
    )
    assert warning.endswith(
        "to get pairs: raise mine.alpha; lower mine.consensus_margin (-1 disables it); raise mine.similarity_threshold"
    )
    assert no_pairs_warning({**report, "pairs_kept": 3}) is None
    empty = no_pairs_warning({"events_in": 0, "events_used": 0, "users": {"total": 0}, "pairs_kept": 0})
    assert empty == (
        "mine kept 0 pairs from 0 events (0 used after 0 invalid rows and 0 double clicks); to get pairs: the logs "
        "hold no valid event: check validate.feedback_logs and data/validated/report.md"
    )
