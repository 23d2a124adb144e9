"""Feedback logs through the stage path (write → validate with PII scrubbing → mine → write): no raw PII or secret
reaches any output file, the quarantine included, and nothing is dropped silently."""

import json

import numpy as np
import pytest

from datalib.mine import EVENT_COLUMNS, mine_pairs
from datalib.pii import scrub_text
from datalib.simulate_logs import PII_KINDS, SimSettings, make_pii, simulate_logs
from tasks.config import MineConfig
from tasks.io import read_frame, write_frame
from tasks.validate import validate_feedback_logs
from tests.test_simulate_logs import PROBLEMS, exec_check


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    out = tmp_path_factory.mktemp("feedback")
    settings = SimSettings(pii_prompt_rate=0.5, pii_response_rate=0.2)
    events, truth = simulate_logs(PROBLEMS, n_events=4000, n_users=120, seed=3, check=exec_check, settings=settings)
    rng = np.random.default_rng(0)
    seeded = [s for raw in truth["pii"] for s in raw]
    kinds = set()
    bad_lines = []
    for kind in PII_KINDS:  # every kind of PII also sits in a malformed line, which goes to quarantine verbatim
        sentence, raw = make_pii(kind, rng)
        seeded += raw
        kinds.add(kind)
        bad_lines.append(json.dumps({"event_id": None, "prompt": sentence, "response": sentence}))
    logs = out / "logs.jsonl"
    write_frame.fn(events, logs)
    with logs.open("a") as f:
        f.write("\n".join(bad_lines) + "\n{broken json " + make_pii("email", rng)[0] + "\n")
        seeded.append(make_pii("email", np.random.default_rng(0))[1][0])
    report = validate_feedback_logs(
        logs, out / "valid.jsonl", out / "quarantine.jsonl", max_bad_row_rate=0.05, redact=scrub_text
    )
    pairs, mine_report = mine_pairs(read_frame(out / "valid.jsonl", EVENT_COLUMNS), MineConfig())
    write_frame.fn(pairs, out / "pairs.jsonl")
    (out / "report.json").write_text(json.dumps(mine_report))
    return out, report, seeded, kinds, len(events) + len(bad_lines) + 1


def test_at_least_ten_kinds_were_seeded(outputs):
    _, _, seeded, kinds, _ = outputs
    assert len(kinds) >= 10 and len(seeded) > 100


def test_nothing_dropped_and_bad_lines_quarantined(outputs):
    out, report, _, _, n_lines = outputs
    assert report.rows_in == n_lines == report.rows_valid + report.rows_quarantined
    assert report.rows_quarantined >= len(PII_KINDS) + 1
    assert len((out / "quarantine.jsonl").read_text().splitlines()) == report.rows_quarantined


def test_zero_leaks_in_every_output_file(outputs):
    out, _, seeded, _, _ = outputs
    written = {p.name: p.read_text() for p in out.iterdir() if p.name != "logs.jsonl"}
    assert set(written) == {"valid.jsonl", "quarantine.jsonl", "pairs.jsonl", "report.json"}
    leaks = [(name, s) for name, text in written.items() for s in set(seeded) if s and s in text]
    assert leaks == []
    assert "<EMAIL>" in written["quarantine.jsonl"] and "<EMAIL>" in written["valid.jsonl"]
