"""Small file I/O shared by stages: atomic JSON reports (retried, as all I/O)."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE


@task(retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def write_json(obj: dict, path: Path) -> None:
    """Write a JSON report (sorted keys, indented) atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
