"""File output shared by stages: every write is atomic (temp file + rename), so a crash never leaves half a file."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE


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
