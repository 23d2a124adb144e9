"""The feedback-log simulator: schema, determinism, ground truth, user behaviours, double clicks, PII seeding.

The problems below are hand-made in the problem schema (data/README.md) so that the tests run in-process: their
reference solutions and mutants are plain loops/comprehensions that always terminate, and the simulator never
verifies a response carrying an unsafe line (it verifies code before decoration), so exec is safe here.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from datalib.pii import scrub_text
from datalib.simulate_logs import (
    BEHAVIOURS,
    EVENT_COLUMNS,
    EXTRA_BEHAVIOURS,
    PII_KINDS,
    QUALITY_SCALE,
    QUALITY_WEIGHTS,
    UNSAFE_LINES,
    SimSettings,
    inject_unsafe,
    make_pii,
    mutants,
    simulate_logs,
    strip_comments,
)
from models.sampling import extract_code


def _problem(task_id, family, entry_point, instruction, doc, steps, tests):
    prompt = f'def {entry_point}{doc[0]}:\n    """{doc[1]}"""\n'
    body = "".join(
        f"    # Step {i + 1}: {text}\n" + "".join(f"    {line}\n" for line in code)
        for i, (text, code) in enumerate(steps)
    )
    return {
        "task_id": task_id,
        "family": family,
        "entry_point": entry_point,
        "instruction": instruction,
        "prompt": prompt,
        "canonical_solution": body,
        "test": "def check(candidate):\n" + "".join(f"    assert {t}\n" for t in tests),
        "steps": [text for text, _ in steps],
        "key_patterns": [],
        "split": "train",
        "source": "test",
    }


PROBLEMS = [
    _problem(
        "T/strip/0",
        "strip_drop_empty",
        "clean_names",
        "Write clean_names(names) that strips each name and drops empty or None entries.",
        ("(names)", "Strip names, drop empty and None."),
        [
            ("drop None entries", ["kept = [n for n in names if n is not None]"]),
            ("strip whitespace", ["kept = [n.strip() for n in kept]"]),
            ("drop empty strings", ["return [n for n in kept if n != '']"]),
        ],
        ["candidate([' a ', None, '', ' b']) == ['a', 'b']", "candidate([]) == []", "candidate(['  ']) == []"],
    ),
    _problem(
        "T/strip/1",
        "strip_drop_empty",
        "clean_tags",
        "Write clean_tags(tags) that lowercases and strips tags and drops blanks.",
        ("(tags)", "Lowercase, strip, drop blanks."),
        [
            ("strip and lowercase", ["out = [t.strip().lower() for t in tags if t is not None]"]),
            ("drop blanks", ["return [t for t in out if len(t) > 0]"]),
        ],
        ["candidate([' A ', 'b', '  ', None]) == ['a', 'b']", "candidate([]) == []"],
    ),
    _problem(
        "T/dedupe/0",
        "dedupe",
        "dedupe_keep_order",
        "Write dedupe_keep_order(items) removing duplicates but keeping first occurrences in order.",
        ("(items)", "Remove duplicates, keep order."),
        [
            ("track seen items", ["seen = set()", "out = []"]),
            ("keep first occurrences", ["for x in items:", "    if x not in seen:", "        seen.add(x)"]),
            ("collect it", ["        out.append(x)"]),
            ("return the result", ["return out"]),
        ],
        ["candidate([1, 2, 1, 3, 2]) == [1, 2, 3]", "candidate([]) == []", "candidate(['a', 'a']) == ['a']"],
    ),
    _problem(
        "T/dedupe/1",
        "dedupe",
        "dedupe_casefold",
        "Write dedupe_casefold(words) that removes case-insensitive duplicates, keeping the first spelling.",
        ("(words)", "Case-insensitive dedupe."),
        [
            ("track seen keys", ["seen = set()", "out = []"]),
            ("keep the first spelling", ["for w in words:", "    if w.lower() not in seen:", "        out.append(w)"]),
            ("remember the key", ["        seen.add(w.lower())"]),
            ("return the result", ["return out"]),
        ],
        ["candidate(['A', 'a', 'b']) == ['A', 'b']", "candidate([]) == []"],
    ),
    _problem(
        "T/filter/0",
        "filter_range",
        "keep_in_range",
        "Write keep_in_range(xs, lo, hi) keeping numbers with lo <= x <= hi, skipping None.",
        ("(xs, lo, hi)", "Keep lo <= x <= hi."),
        [
            ("skip None", ["vals = [x for x in xs if x is not None]"]),
            ("keep the range", ["return [x for x in vals if lo <= x and x <= hi]"]),
        ],
        [
            "candidate([1, 5, None, 10], 2, 10) == [5, 10]",
            "candidate([], 0, 1) == []",
            "candidate([0, 1], 0, 0) == [0]",
        ],
    ),
    _problem(
        "T/filter/1",
        "filter_range",
        "positive_only",
        "Write positive_only(xs) returning the strictly positive numbers.",
        ("(xs)", "Strictly positive numbers."),
        [("filter", ["return [x for x in xs if x is not None and x > 0]"])],
        ["candidate([-1, 0, 2, None]) == [2]", "candidate([]) == []"],
    ),
    _problem(
        "T/parse/0",
        "parse_kv",
        "parse_pairs",
        "Write parse_pairs(text) parsing 'k=v;k2=v2' into a dict, stripping keys and values.",
        ("(text)", "Parse k=v pairs separated by semicolons."),
        [
            ("split on semicolons", ["parts = [p for p in text.split(';') if p.strip()]"]),
            ("split each pair", ["out = {}", "for p in parts:", "    k, v = p.split('=', 1)"]),
            ("store it stripped", ["    out[k.strip()] = v.strip()"]),
            ("return the dict", ["return out"]),
        ],
        ["candidate('a=1; b = 2') == {'a': '1', 'b': '2'}", "candidate('') == {}"],
    ),
    _problem(
        "T/parse/1",
        "parse_kv",
        "count_words",
        "Write count_words(text) counting lowercase words.",
        ("(text)", "Count lowercase words."),
        [
            ("split into words", ["words = text.lower().split()"]),
            ("count", ["out = {}", "for w in words:", "    out[w] = out.get(w, 0) + 1"]),
            ("return the counts", ["return out"]),
        ],
        ["candidate('A a b') == {'a': 2, 'b': 1}", "candidate('') == {}"],
    ),
]


def exec_check(program: str, test: str, entry_point: str) -> bool:
    """In-process verifier for the trusted programs above (the pipeline passes the sandbox instead)."""
    namespace: dict = {}
    try:
        exec(program, namespace)
        exec(test, namespace)
        namespace["check"](namespace[entry_point])
    except Exception:
        return False
    return True


@pytest.fixture(scope="module")
def logs():
    return simulate_logs(PROBLEMS, n_events=20_000, n_users=500, seed=0, check=exec_check)


def test_references_pass_their_tests():
    for p in PROBLEMS:
        assert exec_check(p["prompt"] + p["canonical_solution"], p["test"], p["entry_point"]), p["task_id"]


def test_schema_counts_and_order(logs):
    events, truth = logs
    assert tuple(events.columns) == EVENT_COLUMNS
    assert len(events) == len(truth) == 20_000
    assert (events["event_id"].to_numpy() == truth["event_id"].to_numpy()).all()
    assert events["event_id"].is_unique
    assert set(events["rating"]) == {"up", "down"}
    assert events["ts"].str.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z").all()
    ts = pd.to_datetime(events["ts"], utc=True, format="ISO8601")
    assert ts.is_monotonic_increasing
    assert events["user_id"].nunique() >= 475  # 500 users with lognormal activity: nearly all show up
    assert set(events["category"]) == {p["family"] for p in PROBLEMS}
    assert set(truth["behaviour"]) == set(BEHAVIOURS)
    assert events["model_version"].nunique() == 2
    # Every row's texts are non-empty strings (the validate stage's contract).
    for col in EVENT_COLUMNS:
        assert events[col].map(lambda v: isinstance(v, str) and v.strip() != "").all(), col


def test_same_seed_same_frames_other_seed_differs(logs):
    events, truth = logs
    again_events, again_truth = simulate_logs(PROBLEMS, n_events=20_000, n_users=500, seed=0, check=exec_check)
    pd.testing.assert_frame_equal(events, again_events)
    pd.testing.assert_frame_equal(truth, again_truth)
    other, _ = simulate_logs(PROBLEMS, n_events=20_000, n_users=500, seed=1, check=exec_check)
    assert not events["event_id"].equals(other["event_id"])


def test_quality_is_the_documented_weighted_sum(logs):
    _, truth = logs
    expected = sum(w * truth[f].astype(int) for f, w in QUALITY_WEIGHTS.items()) / QUALITY_SCALE
    np.testing.assert_allclose(truth["quality"], expected)
    # Lexicographic: each weight exceeds the sum of all lower ones (correct ≫ format ≫ safety ≫ comments).
    weights = list(QUALITY_WEIGHTS.values())
    assert all(w > sum(weights[i + 1 :]) for i, w in enumerate(weights))
    assert 0.0 <= truth["quality"].min() and truth["quality"].max() <= 1.0
    assert truth["correct"].any() and (~truth["correct"]).any()


def test_features_are_visible_in_the_response_text(logs):
    events, truth = logs
    resp = events["response"]
    assert (resp.str.contains("```python\n", regex=False) == truth["fenced"]).all()
    unsafe = resp.map(lambda r: any(call in r for _, call in UNSAFE_LINES))
    assert (unsafe == ~truth["safe"]).all()
    leak = resp.str.contains(r"^# (?:TODO: read config from|internal mirror)", regex=True, flags=re.M)
    assert (leak == ~truth["no_leak"]).all()
    explained = resp.str.match(r"(?:Here is an implementation of|Sure! This is|The function below is) `")
    assert (explained == truth["explanation"]).all()


def test_correctness_label_matches_the_verifier(logs):
    events, truth = logs
    sample = truth.assign(response=events["response"]).loc[truth["safe"]].drop_duplicates("response_id")
    problems = {p["task_id"]: p for p in PROBLEMS}
    assert len(sample) >= 20
    for row in sample.itertuples():
        p = problems[row.task_id]
        assert exec_check(extract_code(row.response), p["test"], p["entry_point"]) == row.correct, row.origin


def test_behaviours(logs):
    events, truth = logs
    up = events["rating"].eq("up").to_numpy()
    beh = truth["behaviour"].to_numpy()
    q = truth["quality"].to_numpy()
    assert up[beh == "upvoter"].mean() > 0.9
    assert up[beh == "downvoter"].mean() < 0.1
    careful = beh == "careful"
    # Careful raters rate by quality: up-rated answers are far better than down-rated ones.
    assert q[careful & up].mean() - q[careful & ~up].mean() > 0.3
    # Random clickers ignore quality.
    rnd = beh == "random"
    assert abs(q[rnd & up].mean() - q[rnd & ~up].mean()) < 0.05


def test_double_clicks_repeat_their_original(logs):
    events, truth = logs
    dup = truth["double_click_of"].notna().to_numpy()
    assert 0.015 < dup.mean() < 0.045  # double_click_rate = 0.03
    originals = events.set_index("event_id").loc[truth.loc[dup, "double_click_of"]]
    copies = events.loc[dup]
    for col in ("user_id", "session_id", "prompt", "response", "rating", "category", "model_version"):
        assert (originals[col].to_numpy() == copies[col].to_numpy()).all(), col
    gap = (
        pd.to_datetime(copies["ts"], format="ISO8601").to_numpy()
        - pd.to_datetime(originals["ts"], format="ISO8601").to_numpy()
    )
    seconds = gap / np.timedelta64(1, "s")
    assert (seconds >= 0.3 - 1e-3).all() and (seconds <= 5.0 + 1e-3).all()


def test_sessions_regenerate_on_one_prompt(logs):
    events, _ = logs
    per_session = events.groupby("session_id").agg(prompts=("prompt", "nunique"), n=("response", "nunique"))
    assert (per_session["prompts"] == 1).all()
    assert (per_session["n"] > 1).mean() > 0.2  # regenerations happen (after a down-vote mostly)
    assert per_session["n"].max() <= SimSettings().responses_per_version


def test_seeded_pii_is_in_the_text_and_scrubbable(logs):
    events, truth = logs
    with_pii = truth["pii"].map(len) > 0
    assert 0.05 < with_pii.mean() < 0.4
    for row, raw in zip(events.loc[with_pii].itertuples(), truth.loc[with_pii, "pii"], strict=True):
        for secret in raw:
            assert secret in row.prompt or secret in row.response
    rng = np.random.default_rng(0)
    for kind in PII_KINDS:
        sentence, raw = make_pii(kind, rng)
        clean = scrub_text(sentence)
        assert not any(secret in clean for secret in raw), (kind, clean)


def test_check_runs_once_per_distinct_program():
    seen: list[tuple[str, str, str]] = []

    def counting(program, test, entry_point):
        seen.append((program, test, entry_point))
        return exec_check(program, test, entry_point)

    simulate_logs(PROBLEMS, n_events=500, n_users=20, seed=3, check=counting)
    assert len(seen) == len(set(seen))
    assert len(seen) >= len(PROBLEMS)  # every reference, plus the mutants tried
    assert not any("rm -rf" in program or "rmtree" in program for program, _, _ in seen)


def test_base_answers_replace_reference_code():
    p = PROBLEMS[5]  # positive_only
    answers = {
        p["task_id"]: [
            "Sure:\n```python\ndef positive_only(xs):\n    return [x for x in xs if x is not None and x > 0]\n```",
            "```python\ndef positive_only(xs):\n    return [x for x in xs if x >= 0]\n```",
        ]
    }
    _, truth = simulate_logs([p], n_events=300, n_users=10, seed=0, check=exec_check, base_answers=answers)
    assert set(truth["origin"]) <= {"base:0", "base:1"}
    assert (truth["correct"] == truth["origin"].eq("base:0")).all()


def test_mutants_strip_comments_and_unsafe_injection():
    p = PROBLEMS[2]
    program = p["prompt"] + p["canonical_solution"]
    found = mutants(program, first_body_line=p["prompt"].count("\n") + 1)
    descs = [d for d, _ in found]
    assert "drop not line 8" in descs and "drop step 3" in descs
    assert "drop step 2" not in descs  # leaves an over-indented line: mutants must parse
    assert len(set(m for _, m in found)) == len(found) and all(m != program for _, m in found)
    assert not any(exec_check(m, p["test"], p["entry_point"]) for d, m in found if d.startswith("drop step"))
    stripped = strip_comments(program + "    x = '# kept'  # gone\n")
    assert "# Step" not in stripped and "# gone" not in stripped and "'# kept'" in stripped
    unsafe = inject_unsafe(program, p["entry_point"], 0)
    lines = unsafe.splitlines()
    assert lines[0] == "import os"
    assert lines[3] == '    os.system("rm -rf /")'  # right after the one-line docstring
    assert inject_unsafe("not python (", "f", 1).splitlines()[-1].startswith("shutil.rmtree")


def test_bad_arguments():
    with pytest.raises(ValueError):
        simulate_logs([], n_events=10, n_users=2, seed=0, check=exec_check)
    with pytest.raises(ValueError):
        simulate_logs(PROBLEMS, n_events=0, n_users=2, seed=0, check=exec_check)
    with pytest.raises(ValueError, match="unknown PII kind"):
        make_pii("favourite colour", np.random.default_rng(0))


# ---------------------------------------------------------------------------------- raters outside the miner's model


def _md5_jsonl(frame: pd.DataFrame) -> str:
    """md5 of ``frame`` as the simulate_logs stage writes it (tasks.io.write_frame: one JSON object a line)."""
    import hashlib
    import json

    h = hashlib.md5()
    for row in frame.to_dict(orient="records"):
        h.update((json.dumps(row, ensure_ascii=False, default=str) + "\n").encode())
    return h.hexdigest()


def _frac(events: pd.DataFrame, settings: SimSettings) -> np.ndarray:
    """Each event's time as a fraction of the simulated period."""
    ts = pd.to_datetime(events["ts"], utc=True, format="ISO8601")
    return ((ts - pd.Timestamp(settings.start, tz="UTC")) / pd.Timedelta(days=settings.days)).to_numpy()


def test_extra_raters_are_off_by_default_and_leave_the_output_byte_identical():
    events, truth = simulate_logs(PROBLEMS, n_events=3000, n_users=80, seed=0, check=exec_check)
    # The md5s of the simulator before the opt-in raters existed (git 19e421a): the default output must not move.
    assert _md5_jsonl(events) == "1ae421c129bbdbbfedb18e5bbef5e890"
    assert _md5_jsonl(truth) == "282d37cd677c6829427c93dfa987ca78"
    # Their other knobs do nothing while every share is 0.
    idle = SimSettings(drift_mode="step", drift_accuracy=(1.0, 0.0), collusion_targets=3, length_threshold=(0, 9))
    again_events, again_truth = simulate_logs(PROBLEMS, 3000, 80, 0, exec_check, settings=idle)
    pd.testing.assert_frame_equal(events, again_events)
    pd.testing.assert_frame_equal(truth, again_truth)
    assert set(truth["behaviour"]) == set(BEHAVIOURS) and "collusion_target" not in truth.columns


def test_extra_raters_replace_a_share_of_users_and_leave_the_rest_alone():
    _, base = simulate_logs(PROBLEMS, n_events=3000, n_users=80, seed=0, check=exec_check)
    settings = SimSettings(length_biased_share=0.25, colluder_share=0.125, drifting_share=0.25)
    _, truth = simulate_logs(PROBLEMS, 3000, 80, 0, exec_check, settings=settings)
    per_user = truth.drop_duplicates("user_id").set_index("user_id")["behaviour"]
    before = base.drop_duplicates("user_id").set_index("user_id")["behaviour"]
    # Users are drawn from all 80 (20 / 10 / 20 of them); the inactive ones never show up in the log.
    assert per_user.isin(EXTRA_BEHAVIOURS).sum() <= 50
    counts = per_user.value_counts()
    assert 15 <= counts["length_biased"] <= 20 and 7 <= counts["colluder"] <= 10 and 15 <= counts["drifting"] <= 20
    # Everyone else keeps the base behaviour drawn from the main random stream.
    rest = per_user[~per_user.isin(EXTRA_BEHAVIOURS)]
    common = rest.index.intersection(before.index)
    assert len(common) >= 25 and (rest.loc[common] == before.loc[common]).all()


def test_length_biased_raters_always_choose_the_longer_response():
    settings = SimSettings(length_biased_share=1.0, pii_response_rate=0.0)
    events, truth = simulate_logs(PROBLEMS, n_events=5000, n_users=100, seed=2, check=exec_check, settings=settings)
    assert (truth["behaviour"] == "length_biased").all()
    e = pd.DataFrame(
        {
            "user": events["user_id"],
            "task": truth["task_id"],
            "rid": truth["response_id"],
            "n": events["response"].str.len(),
            "q": truth["quality"],
            "up": events["rating"].eq("up"),
        }
    )
    pairs = e[e["up"]].merge(e[~e["up"]], on=["user", "task"], suffixes=("_c", "_r"))
    pairs = pairs[pairs["rid_c"] != pairs["rid_r"]]
    assert len(pairs) > 200
    assert (pairs["n_c"] > pairs["n_r"]).all()  # the chosen is the longer response in every rating pair
    assert (pairs["q_c"] < pairs["q_r"]).any()  # ... regardless of quality
    # The same response is never rated both ways by one user (a deterministic rule, no noise).
    both = e.groupby(["user", "rid"])["up"].nunique()
    assert (both == 1).all()


def test_colluders_upvote_the_designated_wrong_responses():
    settings = SimSettings(colluder_share=0.2, collusion_targets=5, collusion_focus=1.0)
    events, truth = simulate_logs(PROBLEMS, n_events=6000, n_users=150, seed=4, check=exec_check, settings=settings)
    colluder = truth["behaviour"].eq("colluder").to_numpy()
    target = truth["collusion_target"].to_numpy()
    up = events["rating"].eq("up").to_numpy()
    assert truth.loc[colluder, "user_id"].nunique() <= 30  # round(0.2 · 150)
    assert truth.loc[target, "response_id"].nunique() == 5
    assert truth.loc[target, "task_id"].nunique() == 5  # at most one per prompt
    assert not truth.loc[target, "correct"].any()  # designated responses are wrong ones
    assert (colluder & target).sum() > 100
    assert up[colluder & target].all()  # collusion_p_up = 1: every colluder rating of a target is up
    assert up[~colluder & target].mean() < 0.7  # the others mostly do not
    # collusion_focus = 1: every colluder session is on a target's prompt, the target shown first.
    first = events.assign(target=target).loc[colluder].groupby("session_id", sort=False).head(1)
    assert first["target"].all()
    # Off the targets a colluder rates like a careful rater.
    q = truth["quality"].to_numpy()
    rest = colluder & ~target
    assert q[rest & up].mean() - q[rest & ~up].mean() > 0.3


def test_drifting_raters_flip_their_standard_at_the_step():
    settings = SimSettings(
        drifting_share=1.0, drift_mode="step", drift_accuracy=(1.0, 0.0), drift_step_at=0.5, double_click_rate=0.0
    )
    events, truth = simulate_logs(PROBLEMS, n_events=4000, n_users=100, seed=5, check=exec_check, settings=settings)
    assert (truth["behaviour"] == "drifting").all()
    right = events["rating"].eq("up").to_numpy() == truth["correct"].to_numpy()
    f = _frac(events, settings)
    margin = 1.0 / (settings.days * 86400)  # one second around the step (timestamps are rounded to ms)
    early, late = f < 0.5 - margin, f >= 0.5 + margin
    assert early.sum() > 1000 and late.sum() > 1000
    assert right[early].all()  # accuracy 1.0 before the step
    assert not right[late].any()  # 0.0 after: up-votes exactly the wrong answers


def test_drifting_raters_decay_linearly():
    settings = SimSettings(drifting_share=1.0, drift_accuracy=(0.97, 0.5))
    events, truth = simulate_logs(PROBLEMS, n_events=8000, n_users=200, seed=6, check=exec_check, settings=settings)
    right = events["rating"].eq("up").to_numpy() == truth["correct"].to_numpy()
    f = _frac(events, settings)
    first, last = f < 0.2, (f >= 0.7) & (f < 0.9)
    assert first.sum() > 1000 and last.sum() > 1000
    expected = 0.97 + (0.5 - 0.97) * np.clip(f, 0, 1)  # a(t), linear over the period
    # Each window's correct-rating rate matches the mean accuracy there (≈ 0.92 and ≈ 0.6; binomial sd ≈ 0.015).
    assert abs(right[first].mean() - expected[first].mean()) < 0.05
    assert abs(right[last].mean() - expected[last].mean()) < 0.05
    assert right[first].mean() - right[last].mean() > 0.25


def test_extra_rater_settings_are_checked():
    for bad in (
        SimSettings(length_biased_share=0.6, drifting_share=0.6),
        SimSettings(colluder_share=-0.1),
        SimSettings(drifting_share=0.1, drift_mode="sideways"),
        SimSettings(drifting_share=0.1, drift_accuracy=(1.2, 0.5)),
    ):
        with pytest.raises(ValueError, match="simulate_logs"):
            simulate_logs(PROBLEMS, n_events=100, n_users=10, seed=0, check=exec_check, settings=bad)
