"""General Python exercises: they render, their references pass their own tests, they are diverse and short, and
they share nothing with HumanEval (the decontamination check is shown to fire on a planted copy)."""

import json
from collections import Counter

from datalib.exercises import FAMILY, INSTRUCTION, KINDS, N_VARIANTS, SOURCE, exercise_problems, humaneval_overlap
from models.prompts import code_to_complete, user_message
from models.sft import render_answer
from tasks.config import PrepareConfig
from tasks.prepare import humaneval_problems, prepare_report
from tasks.validate import FIELDS


def _run(problem: dict) -> None:
    namespace: dict = {}
    exec(problem["prompt"] + problem["canonical_solution"] + "\n" + problem["test"], namespace)
    namespace["check"](namespace[problem["entry_point"]])


def test_every_exercise_renders_in_the_schema_and_passes_its_own_tests():
    rows = exercise_problems()
    assert len(rows) == len(KINDS) * N_VARIANTS == 312
    assert len({r["task_id"] for r in rows}) == len({r["prompt"] for r in rows}) == len(rows)
    assert all(set(r) == set(FIELDS["problems"]) for r in rows)
    assert {(r["split"], r["source"], r["family"], r["instruction"]) for r in rows} == {
        ("train", SOURCE, FAMILY, INSTRUCTION)
    }
    for row in rows:
        _run(row)
        assert row["test"].count("assert candidate(") >= 5


def test_exercises_are_deterministic_bytes():
    first = [json.dumps(r, sort_keys=True) for r in exercise_problems()]
    assert first == [json.dumps(r, sort_keys=True) for r in exercise_problems()]


def test_exercises_are_short_and_do_not_open_with_the_missing_input_guard():
    rows = exercise_problems()
    steps = Counter(len(r["steps"]) for r in rows)
    assert set(steps) <= {1, 2, 3} and steps[1] / len(rows) > 0.7  # mostly one step, as simple tasks are
    assert not [r["task_id"] for r in rows if "missing" in r["steps"][0] or "None" in r["steps"][0]]
    names = Counter(r["entry_point"] for r in rows)
    assert len(names) >= 2 * len(KINDS)  # names vary inside a kind (113 names for 52 kinds), not only across kinds


def test_exercises_are_put_to_the_model_as_an_external_problem():
    row = exercise_problems()[0]
    assert code_to_complete(row) == row["prompt"]  # the whole prompt, docstring and example included
    assert user_message(row).startswith(INSTRUCTION + "\n\n```python\n")
    answer = render_answer(row)
    assert answer.startswith(f"Here is the completed `{row['entry_point']}` function; each step is commented.")
    assert "    # Step 1: count the elements divisible by 3\n" in answer


def test_no_exercise_shares_an_entry_point_or_a_ten_word_run_with_humaneval():
    humaneval = humaneval_problems.fn()
    report = humaneval_overlap(exercise_problems(), humaneval)
    assert (report["checked"], report["n_entry_points"], report["n_ngram_hits"]) == (312, 0, 0)


def test_the_decontamination_check_fires_on_a_planted_copy():
    humaneval = humaneval_problems.fn()
    rows = exercise_problems()[:3]
    planted = dict(rows[1], canonical_solution=rows[1]["canonical_solution"] + humaneval[53]["prompt"])
    renamed = dict(rows[2], entry_point="has_close_elements")
    report = humaneval_overlap([rows[0], planted, renamed], humaneval)
    assert report["entry_points"] == ["has_close_elements"]
    assert [(hit[0], hit[1]) for hit in report["ngram_hits"]] == [(planted["task_id"], "HumanEval/53")]
    # A 10-word run is needed: 9 shared words are not a hit.
    words = "def add x int y int int add two numbers".split()
    nine = dict(rows[0], canonical_solution=" ".join(words[:9]))
    assert humaneval_overlap([nine], humaneval)["n_ngram_hits"] == 0


def test_prepare_report_records_the_decontamination():
    rows = exercise_problems()
    report = prepare_report([*rows, *humaneval_problems.fn()], user_lines=0, cfg=PrepareConfig())
    assert report["sources"][SOURCE] == 312 and report["splits"]["train"] == 312
    assert report["exercise_decontamination"]["n_ngram_hits"] == 0
    assert PrepareConfig().include_exercises is True
