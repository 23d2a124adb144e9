"""prepare: HumanEval import, user files passed through (bad lines kept verbatim for validate to quarantine)."""

import json

from tasks.config import PrepareConfig
from tasks.io import write_lines
from tasks.prepare import humaneval_problems, prepare_report, user_problem_lines
from tasks.validate import FIELDS


def test_humaneval_is_imported_whole_as_an_evaluation_split():
    rows = humaneval_problems.fn()
    assert len(rows) == 164
    assert {r["split"] for r in rows} == {"humaneval"}
    assert rows[0]["task_id"] == "HumanEval/0" and rows[0]["entry_point"] == "has_close_elements"
    assert all(set(r) == set(FIELDS["problems"]) for r in rows)


def test_user_lines_keep_every_line_and_bytes(tmp_path):
    good = {
        "task_id": "U/1",
        "prompt": "def f():\n",
        "entry_point": "f",
        "canonical_solution": "    return 1\n",
        "test": "def check(candidate):\n    assert candidate() == 1\n",
    }
    src = tmp_path / "mine.jsonl"
    src.write_bytes(
        json.dumps(good).encode()
        + b"\n"
        + b"{not json\n"
        + b"\n"
        + b'{"task_id": "U/2", "prompt": "caf\xff"}\n'
        + b"[1, 2]\n"
    )
    cfg = PrepareConfig(seed=0)
    lines = user_problem_lines.fn(str(src), cfg)
    assert len(lines) == 5  # nothing dropped, the final newline is not a line
    row = json.loads(lines[0])
    assert row["source"] == "user:mine.jsonl" and row["family"] == "user" and row["steps"] == []
    assert row["split"] in {"train", "val", "test"}
    assert user_problem_lines.fn(str(src), cfg)[0] == lines[0]  # the split is stable across runs
    assert lines[1:3] == ["{not json", ""]
    out = tmp_path / "out.jsonl"
    write_lines.fn(lines, out)
    written = out.read_bytes().split(b"\n")
    assert written[3] == b'{"task_id": "U/2", "prompt": "caf\xff"}'  # invalid UTF-8 survives byte for byte
    assert written[4] == b"[1, 2]"


def test_missing_user_file_names_the_key(tmp_path):
    import pytest

    with pytest.raises(FileNotFoundError, match="prepare.user_problems"):
        user_problem_lines.fn(str(tmp_path / "nope.jsonl"), PrepareConfig())


def test_report_counts_splits():
    rows = [
        {
            "split": "train",
            "family": "a",
            "source": "user:x.jsonl",
            "task_id": "x",
            "prompt": "p",
            "entry_point": "f",
            "instruction": "i",
        }
    ]
    report = prepare_report([*rows, *humaneval_problems.fn()], user_lines=2, cfg=PrepareConfig())
    assert report["n_problems"] == 167
    assert report["splits"] == {"humaneval": 164, "train": 1}
