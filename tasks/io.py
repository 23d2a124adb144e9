"""File input and output shared by stages: reading a split of a problems file; every write is atomic (temp file +
rename), so a crash never leaves half a file."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.config import InputError


def atomic_write_lines(path: str | Path, lines: Iterable[str]) -> None:
    """Write ``lines`` (no newlines inside) to ``path``, one per line, UTF-8, creating parent folders.

    Lone surrogates (bytes that were not UTF-8 in the input, kept by ``surrogateescape``) are written back as the
    original bytes, so a pass-through line stays byte-identical.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8", errors="surrogateescape", newline="\n") as f:
        for line in lines:
            f.write(line + "\n")
    tmp.replace(path)


@task(retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def write_lines(lines: list[str], path: Path) -> None:
    """Write already-serialised lines to ``path`` (see :func:`atomic_write_lines`)."""
    atomic_write_lines(path, lines)


@task(retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def write_json(obj: dict, path: Path) -> None:
    """Write a JSON report (sorted keys, indented) atomically."""
    atomic_write_lines(path, [json.dumps(obj, indent=2, sort_keys=True)])


@task(retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def write_frame(frame, path: Path) -> None:
    """A DataFrame as one JSON object per row (UTF-8, column order kept), written atomically."""
    atomic_write_lines(path, (json.dumps(r, ensure_ascii=False, default=str) for r in frame.to_dict(orient="records")))


def read_frame(path: Path, columns: tuple[str, ...]):
    """A validated JSONL file as a pandas DataFrame with ``columns`` (an empty file gives an empty frame)."""
    import pandas as pd  # only the feedback-log stages read frames; the others need not import pandas

    rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    return pd.DataFrame(rows, columns=list(columns))


def split_history(history: list[dict]) -> dict[str, list[dict]]:
    """A training history (`emit` rows) as DVC plot tables of uniform rows: ``train`` (the per-step rows) and
    ``eval`` (the held-out rows, those with an ``…/eval_…`` key). DVC drops a plot file whose rows lack its y key,
    which a mixed history always does (issue 19: the SFT and DPO loss curves were silently missing)."""
    tables: dict[str, list[dict]] = {"train": [], "eval": []}
    for row in history:
        tables["eval" if any("/eval_" in key for key in row) else "train"].append(row)
    return tables


@task(retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def write_history(history: list[dict], path: Path) -> None:
    """The history as ``path`` (``{"history": rows}``) and its plot tables (`split_history`) as
    ``<path's folder>/plots/{train,eval}.json`` (a JSON list each), for dvc.yaml's plots."""
    atomic_write_lines(path, [json.dumps({"history": history}, indent=2, sort_keys=True)])
    for name, rows in split_history(history).items():
        atomic_write_lines(Path(path).parent / "plots" / f"{name}.json", [json.dumps(rows, indent=1, sort_keys=True)])


def headline(report: dict, columns: Mapping[str, str]) -> dict:
    """A stage's DVC metric: ``{column: report's figure at the dotted path}`` (``"splits.train"`` is
    ``report["splits"]["train"]``); a path the report lacks is left out. ``dvc metrics show`` prints one table whose
    columns are every metric file's keys, so each stage names a few figures and stages share a column where the
    figure means the same (``val.pass@1``, ``eval_loss``, ``pairs``); the full report stays an output beside it
    (issue 19: 697 columns, then 4,280 characters a line).

    Example: ``headline({"n_problems": 9, "splits": {"val": 2}}, {"problems": "n_problems"}) == {"problems": 9}``.
    """
    out = {}
    for column, path in columns.items():
        node = report
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            out[column] = node
    return out


# What fills each split (the keys to turn when one is empty).
SPLIT_SOURCES = {
    "train": "prepare.n_problems, prepare.include_exercises and prepare.user_problems",
    "val": "prepare.val_frac (and user problems with split val)",
    "test": "prepare.test_frac (and user problems with split test)",
    "heldout": "prepare.heldout_families",
    "humaneval": "prepare.include_humaneval",
}


def read_problems(path: str | Path, split: str, limit: int = 0, *, required: bool = False) -> list[dict]:
    """The rows of one split of a validated problems file, in file order; ``limit`` > 0 keeps the first ones.

    Raises:
        tasks.config.InputError: `required` and the split has no problem (the message names the keys that fill it).
    """
    rows = []
    with Path(path).open(encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if row["split"] == split:
                rows.append(row)
                if limit and len(rows) == limit:
                    break
    if required and not rows:
        raise InputError(
            f"{path} has no {split!r} problem: the split is filled by {SPLIT_SOURCES.get(split, 'prepare')}; rows the "
            "validate stage quarantined are in data/validated/report.md"
        )
    return rows


def read_pairs(path: str | Path) -> list[dict]:
    """The rows of a pairs JSONL file; [] when the file is missing or empty."""
    path = Path(path)
    if not path.is_file():
        return []
    with path.open(encoding="utf-8", errors="surrogateescape") as f:
        return [json.loads(line) for line in f if line.strip()]
