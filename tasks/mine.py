"""The mine stage's work: preference pairs from the validated feedback logs and human pairs (`datalib.mine`), written
with the mining report and its headline."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from datalib.mine import EVENT_COLUMNS, HUMAN_COLUMNS, mine_pairs, no_pairs_warning
from tasks.config import MineConfig
from tasks.io import headline, read_frame, write_frame, write_json

HEADLINE = {"pairs": "pairs_kept"}  # the DVC metric (tasks.io.headline)


@task(cache_policy=NO_CACHE)
def mine(logs: Path, human_pairs: Path, cfg: MineConfig, pairs_out: Path, report_out: Path, headline_out: Path):
    """Mine `logs` (and `human_pairs` when it has rows) under `cfg`; writes the pairs (JSONL), the report (counts per
    rule, category, source) and its headline. Returns ``(report, n_pairs, n_events, warning)``: ``warning`` is
    `datalib.mine.no_pairs_warning`'s (why no pair was kept and the ``mine`` keys to turn), None when pairs were."""
    events = read_frame(logs, EVENT_COLUMNS)
    human = read_frame(human_pairs, HUMAN_COLUMNS)
    pairs, report = mine_pairs(events, cfg, human_pairs=human if len(human) else None)
    write_frame(pairs, pairs_out)
    write_json(report, report_out)
    write_json(headline(report, HEADLINE), headline_out)
    return report, len(pairs), len(events), no_pairs_warning(report)
