"""Stage work for feedback logs: simulate them (embedded default), read validated logs, mine pairs, write outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.config import SimulateConfig, VerifierSection
from tasks.io import atomic_write_lines, read_problems
from tasks.sandbox import make_verifier


@task(cache_policy=NO_CACHE)
def simulate(problems_path: Path, cfg: SimulateConfig, verifier_cfg: VerifierSection):
    """Simulated logs over the generated train problems; correctness of every distinct program from the sandbox.

    Returns ``(events, ground_truth)`` DataFrames (see :func:`datalib.simulate_logs.simulate_logs`).
    """
    from datalib.simulate_logs import SimSettings, simulate_logs

    problems = [p for p in read_problems(problems_path, "train") if str(p["source"]).startswith("generated")]
    with make_verifier(verifier_cfg) as verifier:

        def check(program: str, test: str, entry_point: str) -> bool:
            return verifier.check(program, test, entry_point).passed

        return simulate_logs(
            problems, cfg.n_events, cfg.n_users, cfg.seed, check, settings=SimSettings(n_prompts=cfg.n_prompts)
        )


@task(retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def write_frame(frame: pd.DataFrame, path: Path) -> None:
    """One JSON object per row (UTF-8, column order kept), written atomically."""
    atomic_write_lines(path, (json.dumps(r, ensure_ascii=False, default=str) for r in frame.to_dict(orient="records")))


def read_frame(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    """A validated JSONL file as a DataFrame with ``columns`` (an empty file gives an empty frame)."""
    rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    return pd.DataFrame(rows, columns=list(columns))
