"""The validate stage: JSONL parsing, the GX data contracts, quarantine records, thresholds and reports.

GX takes seconds to import; the stage shares one GX context per process, so only the first test pays that.
"""

from __future__ import annotations

import json
import random
import re
from datetime import datetime
from pathlib import Path

import pytest

from datalib.jsonl import iter_jsonl, parse_line
from tasks.validate import (
    EXPECTATIONS_DIR,
    SuiteError,
    ValidationFailed,
    ensure_passed,
    load_suite,
    normalise_prompt,
    prompt_hash,
    quarantine_summary,
    top_reasons,
    validate_feedback_logs,
    validate_pairs,
    validate_problems,
    write_report,
)

# ----------------------------------------------------------------------------------------------- helpers


def log_event(i: int, **changes) -> dict:
    event = {
        "event_id": f"e{i}",
        "ts": "2024-05-01T12:00:00Z",
        "user_id": f"u{i % 3}",
        "session_id": f"s{i}",
        "prompt": "Write a function that strips whitespace from every string in a list.",
        "response": "def f(xs):\n    return [x.strip() for x in xs]\n",
        "rating": "up" if i % 2 else "down",
        "category": "strings",
        "model_version": "sft-1",
    }
    event.update(changes)
    return event


LETTERS = str.maketrans("0123456789/", "abcdefghij-")  # digits do not count in prompt normalisation


def problem(task_id: str, split: str = "train", *, prompt: str | None = None, body: str = "    return x + 1\n"):
    variant = task_id.translate(LETTERS)  # distinct prompts for distinct ids
    return {
        "task_id": task_id,
        "prompt": prompt or f'def inc(x):\n    """Add one to x; variant {variant}."""\n',
        "entry_point": "inc",
        "canonical_solution": body,
        "test": "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(-1) == 0\n",
        "steps": [],
        "instruction": "Add one.",
        "key_patterns": ["+ 1"],
        "family": "user",
        "split": split,
        "source": "user:test.jsonl",
    }


def write(path: Path, lines: list[str | bytes]) -> Path:
    path.write_bytes(b"\n".join(x if isinstance(x, bytes) else x.encode() for x in lines) + b"\n")
    return path


def read_records(path: Path) -> dict[int, dict]:
    return {r["line"]: r for r in map(json.loads, path.read_text(encoding="utf-8").splitlines())}


def exec_check(rows: list[dict]) -> list[bool | str]:
    """In-process reference-solution check (trusted test data only; the stage itself uses the sandbox)."""
    verdicts: list[bool | str] = []
    for row in rows:
        namespace: dict = {}
        try:
            exec(row["prompt"] + row["canonical_solution"] + "\n" + row["test"], namespace)
            namespace["check"](namespace[row["entry_point"]])
            verdicts.append(True)
        except Exception as exc:  # noqa: BLE001 - any failure is the verdict
            verdicts.append(f"{type(exc).__name__}: {exc}")
    return verdicts


# ------------------------------------------------------------------------------------------------ parsing


def test_parse_line_reasons():
    assert parse_line(b"", 1).error == "blank line"
    assert parse_line(b"  \t", 2).check == "non_blank_line"
    assert parse_line(b"[1,2]", 3).error == "not a JSON object (got a JSON array)"
    assert parse_line(b'"str"', 3).error == "not a JSON object (got a JSON string)"
    assert parse_line(b"42", 3).error == "not a JSON object (got a JSON number)"
    assert parse_line(b"null", 3).error == "not a JSON object (got a JSON null)"
    assert parse_line(b'{"a": NaN}', 3).error == "invalid JSON: non-standard JSON constant NaN"
    assert parse_line(b'{"a": 1, "a": 2}', 3).error == "invalid JSON: duplicate key 'a'"
    bad = parse_line(b'{"a": "\xff"}', 4)
    assert (bad.check, bad.error, bad.text) == (
        "valid_utf8",
        "invalid UTF-8 (byte 0xff at offset 7)",
        '{"a": "\\xff"}',
    )
    ok = parse_line(b'{"a": 1}\r', 5)
    assert (ok.obj, ok.text, ok.check) == ({"a": 1}, '{"a": 1}', None)
    assert parse_line('\ufeff{"a": 1}'.encode(), 1).obj == {"a": 1}  # a BOM opening the file is ignored


def test_iter_jsonl_counts_every_line(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(b'{"a": 1}\n\n{"b": 2}')  # no final newline
    (tmp_path / "b.jsonl").write_bytes(b'{"a": 1}\n\n{"b": 2}\n')  # the final newline is not a line
    for name in ("a.jsonl", "b.jsonl"):
        lines = list(iter_jsonl(tmp_path / name))
        assert [ln.line for ln in lines] == [1, 2, 3]
        assert [ln.obj for ln in lines] == [{"a": 1}, None, {"b": 2}]


def test_normalise_prompt():
    assert normalise_prompt("  Return  the 3 Largest\n\tvalues 42 ") == "return the largest values"
    assert prompt_hash("A 1 b") == prompt_hash("a   B 22") != prompt_hash("a c")


# -------------------------------------------------------------------------------------------------- suites


def test_suites_load_from_data_expectations():
    for name in ("problems", "feedback_logs", "preference_pairs"):
        data = json.loads((EXPECTATIONS_DIR / f"{name}.json").read_text())
        suite = load_suite(name)
        assert suite.name == name
        assert [e.meta["name"] for e in suite.expectations] == [e["meta"]["name"] for e in data["expectations"]]
    critical = {e.meta["name"] for e in load_suite("problems").expectations if e.severity.value == "critical"}
    assert critical == {"has_rows", "task_id_unique", "solution_passes_tests"}


def test_load_suite_rejects_bad_files(tmp_path):
    with pytest.raises(SuiteError, match="not found"):
        load_suite("nope", tmp_path)
    exp = {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "a"}, "meta": {"name": "x"}}
    (tmp_path / "dup.json").write_text(json.dumps({"name": "dup", "expectations": [exp, exp]}))
    with pytest.raises(SuiteError, match="'x' is used twice"):
        load_suite("dup", tmp_path)
    (tmp_path / "bad.json").write_text(json.dumps({"name": "bad", "expectations": [{**exp, "type": "expect_magic"}]}))
    with pytest.raises(SuiteError, match="not a valid Great Expectations suite"):
        load_suite("bad", tmp_path)


# ---------------------------------------------------------------------------------------------- feedback logs


def test_ts_regex_agrees_with_python_iso_parser():
    """The contract's ISO 8601 regex accepts exactly the timestamps of its grammar that really exist.

    (Offset minutes stay within 00-59: Python also takes ``+05:60``, which the contract rejects on purpose.)
    """
    (exp,) = [e for e in load_suite("feedback_logs").expectations if e.meta["name"] == "ts_iso8601"]
    rng = random.Random(0)
    years = [1900, 2000, 2023, 2024, 2100, 2400, 1, 9999] + [rng.randint(1, 9999) for _ in range(20)]
    accepted = 0
    for _ in range(5000):
        text = (
            f"{rng.choice(years):04d}-{rng.randint(0, 13):02d}-{rng.randint(0, 32):02d}{rng.choice('T ')}"
            f"{rng.randint(0, 24):02d}:{rng.randint(0, 60):02d}"
            + rng.choice(["", f":{rng.randint(0, 60):02d}", f":{rng.randint(0, 59):02d}.{rng.randint(0, 999999)}"])
            + rng.choice(["", "Z", f"{rng.choice('+-')}{rng.randint(0, 24):02d}:{rng.randint(0, 59):02d}"])
        )
        try:
            datetime.fromisoformat(text)
            parses = True
        except ValueError:
            parses = False
        assert (re.search(exp.regex, text) is not None) == parses, text
        accepted += parses
    assert 500 < accepted < 4500  # both outcomes well represented
    assert re.search(exp.regex, "2024-02-29T00:00Z") and not re.search(exp.regex, "2023-02-29T00:00Z")
    assert not re.search(exp.regex, "2024-01-01T00:00:00Z\n")


def test_logs_every_bad_kind_is_quarantined_with_its_reason(tmp_path):
    good = [json.dumps(log_event(i)) for i in range(4)]
    cases = [  # (line content, expected first expectation, reason substring)
        ("", "non_blank_line", "blank line"),
        ("{not json", "valid_json", "invalid JSON"),
        ("[1, 2]", "json_object", "got a JSON array"),
        ('"str"', "json_object", "got a JSON string"),
        ("42", "json_object", "got a JSON number"),
        (b'{"event_id": "\xff\xfe"}', "valid_utf8", "invalid UTF-8"),
        (
            json.dumps({k: v for k, v in log_event(10).items() if k != "ts"}),
            "ts_present",
            "ts is required (missing)",
        ),
        (json.dumps(log_event(11, user_id=None)), "user_id_present", "user_id is required (null)"),
        (json.dumps(log_event(12, session_id=7)), "session_id_is_string", "got a number"),
        (json.dumps(log_event(13, rating="meh")), "rating_in_set", "(got 'meh')"),
        (json.dumps(log_event(14, ts="yesterday")), "ts_iso8601", "(got 'yesterday')"),
        (json.dumps(log_event(15, ts="2024-02-30T10:00:00")), "ts_iso8601", "exists on the calendar"),
        (json.dumps(log_event(0, rating="down")), "event_id_unique", "duplicate of line 1"),
        (json.dumps(log_event(16, prompt="")), "prompt_length", "got 0 characters"),
        (json.dumps(log_event(17, response="y" * 3_000_000)), "response_length", "got 3,000,000 characters"),
    ]
    path = write(tmp_path / "logs.jsonl", good + [c[0] for c in cases])
    report = validate_feedback_logs(
        path, tmp_path / "valid.jsonl", tmp_path / "q.jsonl", max_bad_row_rate=1.0, max_text_chars=20_000
    )
    records = read_records(tmp_path / "q.jsonl")
    assert sorted(records) == list(range(5, 5 + len(cases)))
    for offset, (_, expectation, reason) in enumerate(cases):
        rec = records[5 + offset]
        assert rec["expectation"] == expectation, rec
        assert reason in rec["reason"], rec
        assert rec["source"] == str(path)
    assert (report.rows_in, report.rows_valid, report.rows_quarantined) == (19, 4, 15)
    assert report.rows_valid + report.rows_quarantined == report.rows_in
    assert report.bad_row_rate == pytest.approx(15 / 19)
    assert report.failures["json_object"] == 3 and report.failures["valid_utf8"] == 1
    assert (tmp_path / "valid.jsonl").read_text().splitlines() == good
    big = records[5 + len(cases) - 1]
    assert len(big["raw"]) == 2000 and big["raw_chars"] == len(cases[-1][0])
    assert records[10]["raw"] == '{"event_id": "\\xff\\xfe"}'


def test_a_row_failing_several_expectations_is_quarantined_once(tmp_path):
    lines = [json.dumps(log_event(0, rating="meh", ts="2024-13-01T00:00:00", session_id=[1]))]
    path = write(tmp_path / "logs.jsonl", lines + [json.dumps(log_event(1))])
    report = validate_feedback_logs(path, tmp_path / "v.jsonl", tmp_path / "q.jsonl", max_bad_row_rate=1.0)
    (rec,) = read_records(tmp_path / "q.jsonl").values()
    assert rec["expectations"] == ["session_id_is_string", "rating_in_set", "ts_iso8601"]
    assert rec["reason"].count(";") == 2
    assert (report.rows_quarantined, report.rows_valid) == (1, 1)
    assert report.failures["rating_in_set"] == report.failures["ts_iso8601"] == 1


def test_clean_logs_pass_and_are_copied_verbatim(tmp_path):
    path = write(tmp_path / "logs.jsonl", [json.dumps(log_event(i)) for i in range(20)])
    report = validate_feedback_logs(path, tmp_path / "v.jsonl", tmp_path / "q.jsonl", max_bad_row_rate=0.0)
    assert (report.rows_in, report.rows_valid, report.rows_quarantined, report.passed) == (20, 20, 0, True)
    assert set(report.failures.values()) == {0} and report.critical_failed == ()
    assert (tmp_path / "v.jsonl").read_bytes() == path.read_bytes()
    assert (tmp_path / "q.jsonl").read_text() == ""
    ensure_passed([report])  # does not raise


def test_quarantine_summary_counts_top_reasons_and_paths(tmp_path):
    """What the validate stage prints (issue 44: 8 of 208 rows quarantined with good reasons, and the console said
    nothing): the count of the total, the rate against its threshold's key, the top reasons with their counts, the
    quarantine file and the report."""
    good = [json.dumps(log_event(i)) for i in range(200)]
    bad = [json.dumps(log_event(200 + i, rating="meh")) for i in range(4)]
    bad += [json.dumps(log_event(210, ts="yesterday")), json.dumps(log_event(211, ts="2024-02-30T10:00:00"))]
    bad += ["{not json", "[1, 2]"]
    path = write(tmp_path / "logs.jsonl", good + bad)
    logs = validate_feedback_logs(path, tmp_path / "v.jsonl", tmp_path / "q.jsonl", max_bad_row_rate=0.05)
    clean = tmp_path / "pairs.jsonl"
    clean.write_text("")  # the optional human pairs, empty by default
    pairs = validate_pairs(clean, tmp_path / "pv.jsonl", tmp_path / "pq.jsonl", max_bad_row_rate=0.05)
    lines = quarantine_summary([logs, pairs], "data/validated/report.md")
    assert lines == [
        "feedback_logs: 8 of 208 rows quarantined (3.85%; the stage fails above validate.max_bad_row_rate_logs = "
        "5.00%); top reasons: rating_in_set 4, ts_iso8601 2, valid_json 1 (+1 more); rows with their reasons: "
        f"{tmp_path / 'q.jsonl'}; report: data/validated/report.md"
    ]
    assert top_reasons(logs, 10) == [("rating_in_set", 4), ("ts_iso8601", 2), ("valid_json", 1), ("json_object", 1)]
    assert quarantine_summary([pairs], "r.md") == ["no row quarantined (0 preference_pairs rows); report: r.md"]


def test_a_rate_over_its_threshold_names_its_key_once(tmp_path):
    lines = [json.dumps(log_event(i)) for i in range(9)] + [json.dumps(log_event(9, rating="meh"))]
    path = write(tmp_path / "logs.jsonl", lines)
    report = validate_feedback_logs(path, tmp_path / "v.jsonl", tmp_path / "q.jsonl", max_bad_row_rate=0.05)
    with pytest.raises(ValidationFailed) as info:
        ensure_passed([report])
    message = str(info.value)
    assert message.splitlines()[0] == "validation failed for 1 of 1 dataset(s): feedback_logs"
    assert (
        "bad-row rate 10.00% (1 of 10 rows quarantined) exceeds the threshold 5.00%: fix the rows, or raise "
        "validate.max_bad_row_rate_logs in params.yaml" in message
    )
    summary = quarantine_summary([report], "report.md")
    assert summary[0].startswith("feedback_logs: 1 of 10 rows quarantined (10.00%, over its threshold); top reasons")
    # the console shows the summary, then the failure: the key once in all
    assert (message + "\n".join(summary)).count("validate.max_bad_row_rate_logs") == 1


def test_bad_row_rate_above_threshold_raises(tmp_path):
    lines = [json.dumps(log_event(i)) for i in range(9)] + [json.dumps(log_event(9, rating="meh"))]
    path = write(tmp_path / "logs.jsonl", lines)
    at_threshold = validate_feedback_logs(path, tmp_path / "v.jsonl", tmp_path / "q.jsonl", max_bad_row_rate=0.1)
    assert at_threshold.passed and at_threshold.bad_row_rate == pytest.approx(0.1)
    report = validate_feedback_logs(path, tmp_path / "v.jsonl", tmp_path / "q.jsonl", max_bad_row_rate=0.05)
    assert not report.passed and report.critical_failed == ()
    with pytest.raises(ValidationFailed) as info:
        ensure_passed([at_threshold, report])
    message = str(info.value)
    assert "feedback_logs" in message and "10.00%" in message and "5.00%" in message
    assert "1 of 10 rows" in message and str(tmp_path / "q.jsonl") in message
    assert info.value.reports == (at_threshold, report)


# ------------------------------------------------------------------------------------------------- problems


def test_problems_duplicate_task_id_is_critical(tmp_path):
    rows = [problem("P/0"), problem("P/1"), problem("P/0", prompt="def inc(x):\n    'other'\n")]
    path = write(tmp_path / "p.jsonl", [json.dumps(r) for r in rows])
    report = validate_problems(path, tmp_path / "v.jsonl", tmp_path / "q.jsonl", max_bad_row_rate=1.0)
    assert report.critical_failed == ("task_id_unique",) and not report.passed
    assert report.failures["task_id_unique"] == 1  # the first P/0 is kept
    assert (
        read_records(tmp_path / "q.jsonl")[3]["reason"] == "task_id must be unique (duplicate of line 1, which is kept)"
    )
    assert report.skipped == ("solution_passes_tests",)
    with pytest.raises(ValidationFailed, match="critical expectation task_id_unique failed"):
        ensure_passed([report])


def test_problems_leakage_and_solution_check(tmp_path):
    rows = [
        problem("P/0", "train", prompt='def inc(x):\n    """Add 1 to x."""\n'),
        problem("P/1", "test", prompt='def inc(x):\n    """ADD 2   to x."""\n'),  # same after normalisation
        problem("P/2", "val"),
        problem("P/3", "train", body="    return x + 2\n"),  # a broken reference solution
        problem("P/4", "holdout"),
        problem("P/5", "train", prompt="  \n"),
    ]
    path = write(tmp_path / "p.jsonl", [json.dumps(r) for r in rows])
    seen: list[str] = []

    def check(rows: list[dict]) -> list[bool | str]:
        seen.extend(r["task_id"] for r in rows)
        return exec_check(rows)

    report = validate_problems(
        path, tmp_path / "v.jsonl", tmp_path / "q.jsonl", max_bad_row_rate=1.0, check_solutions=check
    )
    assert seen == ["P/0", "P/2", "P/3"]  # the sandbox only runs rows that passed every other expectation
    records = read_records(tmp_path / "q.jsonl")
    assert sorted(records) == [2, 4, 5, 6]
    assert records[2]["expectation"] == "no_train_leakage"
    assert "same prompt as train problem 'P/0' on line 1" in records[2]["reason"]
    assert records[4]["expectation"] == "solution_passes_tests" and "AssertionError" in records[4]["reason"]
    assert records[5]["expectation"] == "split_in_set" and "(got 'holdout')" in records[5]["reason"]
    assert records[6]["expectation"] == "prompt_not_blank"
    assert [json.loads(x)["task_id"] for x in (tmp_path / "v.jsonl").read_text().splitlines()] == [
        "P/0",
        "P/2",
    ]
    assert report.critical_failed == ("solution_passes_tests",) and report.skipped == ()


def test_problems_clean_and_empty_files(tmp_path):
    path = write(tmp_path / "p.jsonl", [json.dumps(problem(f"P/{i}", "train" if i else "val")) for i in range(3)])
    ok = validate_problems(
        path, tmp_path / "v.jsonl", tmp_path / "q.jsonl", max_bad_row_rate=0.0, check_solutions=exec_check
    )
    assert (ok.rows_valid, ok.rows_quarantined, ok.passed) == (3, 0, True)
    (tmp_path / "empty.jsonl").write_bytes(b"")
    empty = validate_problems(
        tmp_path / "empty.jsonl", tmp_path / "v.jsonl", tmp_path / "q.jsonl", max_bad_row_rate=0.0
    )
    assert (empty.rows_in, empty.bad_row_rate, empty.critical_failed) == (0, 0.0, ("has_rows",))


# --------------------------------------------------------------------------------------------------- pairs


def test_pairs(tmp_path):
    rows = [
        {"prompt": "p", "chosen": "a", "rejected": "b", "annotator": "ann", "dimension": "correctness"},
        {"prompt": "p", "chosen": "a", "rejected": "b"},  # optional fields may be absent
        {"prompt": "p", "chosen": "same", "rejected": "same"},
        {"prompt": "p", "chosen": "a"},
        {"prompt": " ", "chosen": "a", "rejected": "b", "annotator": 5},
    ]
    path = write(tmp_path / "pairs.jsonl", [json.dumps(r) for r in rows])
    report = validate_pairs(path, tmp_path / "v.jsonl", tmp_path / "q.jsonl", max_bad_row_rate=0.5)
    records = read_records(tmp_path / "q.jsonl")
    assert {k: r["expectations"] for k, r in records.items()} == {
        3: ["chosen_differs_from_rejected"],
        4: ["rejected_present"],
        5: ["annotator_is_string", "prompt_not_blank"],
    }
    assert (report.rows_valid, report.rows_quarantined, report.passed) == (2, 3, False)


def test_edited_suite_extra_field_and_an_expectation_that_raises(tmp_path, monkeypatch):
    """Suites are edited as data: a new field is checked; an expectation GX cannot run fails the stage."""
    suite = json.loads((EXPECTATIONS_DIR / "preference_pairs.json").read_text())
    suite["expectations"] += [
        {
            "type": "expect_column_values_to_be_in_set",
            "kwargs": {"column": "source", "value_set": ["human"]},
            "meta": {"name": "source_is_human", "description": "source must be human"},
            "severity": "warning",
        },
        {
            "type": "expect_column_values_to_match_regex",
            "kwargs": {"column": "prompt", "regex": "("},
            "meta": {"name": "broken_regex"},
            "severity": "warning",
        },
    ]
    (tmp_path / "preference_pairs.json").write_text(json.dumps(suite))
    monkeypatch.setattr("tasks.validate.EXPECTATIONS_DIR", tmp_path)
    rows = [{"prompt": "p", "chosen": "a", "rejected": "b", "source": s} for s in ("human", "bot")]
    path = write(tmp_path / "pairs.jsonl", [json.dumps(r) for r in rows])
    report = validate_pairs(path, tmp_path / "v.jsonl", tmp_path / "q.jsonl", max_bad_row_rate=1.0)
    assert read_records(tmp_path / "q.jsonl")[2]["reason"] == "source must be human (got 'bot')"
    assert report.critical_failed == ("broken_regex",) and not report.passed
    assert report.notes[0].startswith("broken_regex could not run")


# -------------------------------------------------------------------------------------------------- reports


def test_write_report(tmp_path):
    path = write(tmp_path / "logs.jsonl", [json.dumps(log_event(i)) for i in range(3)] + ["", "[]"])
    logs = validate_feedback_logs(path, tmp_path / "v.jsonl", tmp_path / "q.jsonl", max_bad_row_rate=0.5)
    write_report([logs], tmp_path / "r.json", tmp_path / "r.md")
    data = json.loads((tmp_path / "r.json").read_text())
    entry = data["datasets"]["feedback_logs"]
    assert data["passed"] is True
    assert (entry["rows_in"], entry["rows_valid"], entry["rows_quarantined"], entry["bad_row_rate"]) == (
        5,
        3,
        2,
        0.4,
    )
    assert entry["failures"]["non_blank_line"] == entry["failures"]["json_object"] == 1
    md = (tmp_path / "r.md").read_text()
    assert "| feedback_logs | 5 | 3 | 2 | 40.00% | 50.00% | passed |" in md
    assert "| json_object | 1 |" in md


# ------------------------------------------------------------------------------------------------ personal data

EMAIL = "maria.gonzalez42@example.com"
OTHER_EMAIL = "j.okafor@mailbox.example.org"
PHONE = "+1 415-555-0132"
TOKEN = "ghp_R8x2Lq9ZtV4mN7cJ1wK5yH3dF6bG0sPaE2uT"
EXTRA_EMAIL = "devops.oncall@acme-widgets.example.net"
EXTRA_TOKEN = "sk-proj-Zq81mVx0LkT4rBn6YcW2pJd9"
BEARER = "9f8e7d6c5b4a39281706f5e4d3c2b1a0"
# Every raw string planted below, and the local parts alone (a quoted value cut short must not leak them either).
LEAKS = (EMAIL, OTHER_EMAIL, PHONE, TOKEN, EXTRA_EMAIL, EXTRA_TOKEN, BEARER)
LEAKS += ("maria.gonzalez", "j.okafor", "devops.oncall")


def pii(field: str) -> str:
    return f"{field}: write to {EMAIL} or call {PHONE}, key {TOKEN}"


def all_outputs(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text(encoding="utf-8") for p in sorted(root.rglob("*")) if p.is_file()}


def test_no_personal_data_reaches_any_output_of_the_stage(tmp_path):
    """Issue 15: PII in every field of valid rows, in unknown extra fields and in quarantined rows (logs and human
    pairs) appears in none of the files the stage writes; PII-bearing ids become stable, distinct pseudonyms."""
    from tasks.config import ValidateConfig
    from tasks.validate import validate_logs_task, validate_pairs_task

    extras = {"debug": f"reach me at {EXTRA_EMAIL}, Authorization: Bearer {BEARER}", "note": EXTRA_TOKEN}
    full = {f: pii(f) for f in ("event_id", "user_id", "session_id", "prompt", "response", "category")}
    logs = [
        log_event(1, **full, model_version=pii("model_version"), **extras),  # every free field
        log_event(2, user_id=EMAIL),
        log_event(3, user_id=EMAIL, session_id=f"sess {PHONE}"),
        log_event(4, user_id=OTHER_EMAIL, internal_note="zebra-quartz-41"),
        log_event(5, user_id="u-plain"),
        # quarantined: a rating not in the set (its reason quotes the value, longer than a quote keeps) ...
        log_event(6, **{**full, "event_id": "e6"}, rating="thumbs " * 6 + EMAIL, ts=pii("ts"), **extras),
        # ... and a line that does not parse
        f'{{"user_id": "{EMAIL}", "prompt": "call {PHONE}", "token": "{TOKEN}", "debug": "{EXTRA_EMAIL}"',
    ]
    pairs = [
        {
            "prompt": pii("prompt"),
            "chosen": pii("chosen"),
            "rejected": pii("rejected"),
            "annotator": EMAIL,
            "dimension": pii("dimension"),
            **extras,
        },
        {"prompt": "p", "chosen": "a", "rejected": "b", "annotator": EMAIL},
        {"prompt": "p", "chosen": pii("x"), "rejected": pii("x"), "annotator": OTHER_EMAIL, **extras},  # quarantined
    ]
    inputs = tmp_path / "in"
    inputs.mkdir()
    write(inputs / "logs.jsonl", [x if isinstance(x, str) else json.dumps(x) for x in logs])
    write(inputs / "pairs.jsonl", [json.dumps(p) for p in pairs])
    out = tmp_path / "validated"
    cfg = ValidateConfig(max_bad_row_rate_logs=1.0, max_bad_row_rate_pairs=1.0)
    log_report = validate_logs_task.fn(
        cfg, inputs / "logs.jsonl", out / "feedback_logs.jsonl", out / "quarantine" / "feedback_logs.jsonl"
    )
    pair_report = validate_pairs_task.fn(
        cfg, inputs / "pairs.jsonl", out / "human_pairs.jsonl", out / "quarantine" / "human_pairs.jsonl"
    )
    write_report([log_report, pair_report], out / "report.json", out / "report.md")

    files = all_outputs(out)
    assert sorted(files) == [
        "feedback_logs.jsonl",
        "human_pairs.jsonl",
        "quarantine/feedback_logs.jsonl",
        "quarantine/human_pairs.jsonl",
        "report.json",
        "report.md",
    ]
    for name, text in files.items():
        for raw in (*LEAKS, "zebra-quartz-41"):
            assert raw not in text, (raw, name)

    assert (log_report.rows_valid, log_report.rows_quarantined) == (5, 2)
    assert (pair_report.rows_valid, pair_report.rows_quarantined) == (2, 1)
    valid = [json.loads(x) for x in files["feedback_logs.jsonl"].splitlines()]
    assert all(set(row) == set(log_event(0)) for row in valid)  # the extra fields are gone
    assert valid[0]["prompt"] == "prompt: write to <EMAIL> or call <PHONE>, key <SECRET>"
    assert valid[0]["model_version"] == "model_version: write to <EMAIL> or call <PHONE>, key <SECRET>"
    users = [row["user_id"] for row in valid]
    assert users[1] == users[2] and len({users[0], users[1], users[3]}) == 3
    assert all(re.fullmatch(r"user-[0-9a-f]{16}", u) for u in users[:4])
    assert users[4] == "u-plain" and valid[1]["session_id"] == "s2"  # ids without PII are kept
    assert re.fullmatch(r"event-[0-9a-f]{16}", valid[0]["event_id"]) and valid[1]["event_id"] == "e2"
    assert re.fullmatch(r"session-[0-9a-f]{16}", valid[2]["session_id"])
    annotators = [json.loads(x)["annotator"] for x in files["human_pairs.jsonl"].splitlines()]
    assert annotators[0] == annotators[1] and annotators[0].startswith("annotator-")

    quarantined = read_records(out / "quarantine" / "feedback_logs.jsonl")
    assert quarantined[6]["expectations"] == ["rating_in_set", "ts_iso8601"]
    assert json.loads(quarantined[6]["raw"])["user_id"] == users[0]  # the same pseudonym as in the valid rows
    assert "<EMAIL>" in quarantined[6]["reason"] and "<PHONE>" in quarantined[7]["raw"]

    assert log_report.dropped_fields == {"debug": 2, "internal_note": 1, "note": 2}
    assert pair_report.dropped_fields == {"debug": 2, "note": 2}
    report = json.loads(files["report.json"])
    assert report["datasets"]["feedback_logs"]["dropped_fields"] == log_report.dropped_fields
    assert "| internal_note | 1 |" in files["report.md"]


def test_without_a_scrubber_unknown_fields_are_still_dropped(tmp_path):
    rows = [log_event(0, contact=EMAIL), log_event(1)]
    path = write(tmp_path / "logs.jsonl", [json.dumps(r) for r in rows])
    report = validate_feedback_logs(path, tmp_path / "v.jsonl", tmp_path / "q.jsonl", max_bad_row_rate=0.0)
    assert report.dropped_fields == {"contact": 1}
    assert [json.loads(x) for x in (tmp_path / "v.jsonl").read_text().splitlines()] == [log_event(0), log_event(1)]
