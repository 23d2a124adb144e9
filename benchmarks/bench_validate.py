"""Validation throughput on generated feedback logs: the GX stage vs plain pandas doing the same checks.

    .venv/bin/python benchmarks/bench_validate.py [--rows 100000] [--bad-frac 0.01] [--repeats 3]

Generates ``--rows`` log lines (seeded), about ``--bad-frac`` of them bad in the ways the stage must catch
(blank, malformed JSON, non-object JSON, invalid UTF-8, missing/null/wrong-typed fields, bad rating, bad
timestamps, duplicate ids, oversized responses), then times, after one warm-up call that pays the GX import:

- ours: :func:`tasks.validate.validate_feedback_logs` end to end (read, parse, two GX passes, write outputs);
- peer: the same parse, the same checks as pandas boolean masks, the same outputs.

Both must quarantine the same lines in every pass (``CHECK same_work=ok``, else ``FAIL`` and exit 1). The sides
alternate (A B, B A, ...) over ``--repeats`` passes; each side's median seconds is reported with its range. The goal
is <= 60 s for 100k rows on 2 cores; GX costs something over plain pandas, so ratio = ours/peer throughput < 1 is
expected. Last line: ``RESULT rows_per_s=<ours> seconds=<ours> pandas_rows_per_s=<peer> ratio=<ours/peer>``
(medians).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import pandas as pd
from repeats import alternate, check_same_work, spread

from datalib.jsonl import iter_jsonl
from datalib.schema import EVENT_FIELDS
from tasks.validate import load_suite, validate_feedback_logs

FIELDS = EVENT_FIELDS
MAX_TEXT_CHARS = 20_000


def generate(path: Path, rows: int, bad_frac: float, seed: int = 0) -> int:
    """Write ``rows`` log lines to ``path``; returns how many were made bad on purpose."""
    rng = random.Random(seed)
    bad_kinds = [
        lambda e: b"",
        lambda e: b'{"event_id": "x", ',
        lambda e: b"[1, 2]",
        lambda e: b"42",
        lambda e: json.dumps(e).encode()[:-2] + b'\xff"}',
        lambda e: json.dumps({k: v for k, v in e.items() if k != "user_id"}).encode(),
        lambda e: json.dumps({**e, "event_id": None}).encode(),
        lambda e: json.dumps({**e, "session_id": 123}).encode(),
        lambda e: json.dumps({**e, "rating": "meh"}).encode(),
        lambda e: json.dumps({**e, "ts": "last tuesday"}).encode(),
        lambda e: json.dumps({**e, "ts": "2024-02-30T10:00:00Z"}).encode(),
        lambda e: json.dumps({**e, "event_id": "e0"}).encode(),  # a duplicate of the first event
        lambda e: json.dumps({**e, "response": "y" * (MAX_TEXT_CHARS + 1)}).encode(),
        lambda e: json.dumps({**e, "prompt": ""}).encode(),
    ]
    n_bad = 0
    with path.open("wb") as f:
        for i in range(rows):
            event = {
                "event_id": f"e{i}",
                "ts": f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:"
                f"{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z",
                "user_id": f"u{rng.randint(0, 999)}",
                "session_id": f"s{rng.randint(0, 99_999)}",
                "prompt": "Write a function that removes empty strings from a list. " * rng.randint(1, 6),
                "response": "def clean(xs):\n    return [x for x in xs if x.strip()]\n" * rng.randint(1, 8),
                "rating": rng.choice(("up", "down")),
                "category": rng.choice(("strings", "lists", "dicts", "parsing")),
                "model_version": "sft-1",
            }
            if i > 0 and rng.random() < bad_frac:
                line, n_bad = rng.choice(bad_kinds)(event), n_bad + 1
            else:
                line = json.dumps(event).encode()
            f.write(line + b"\n")
    return n_bad


def pandas_peer(path: Path, out_valid: Path, out_quarantine: Path) -> set[int]:
    """The feedback-log contract as plain pandas masks; returns the quarantined line numbers."""
    lines = list(iter_jsonl(path))
    rows = {ln.line: ln.obj for ln in lines if ln.obj is not None}
    index = pd.Index(list(rows), dtype="int64")
    frame = pd.DataFrame({c: pd.Series([o.get(c) for o in rows.values()], index=index, dtype=object) for c in FIELDS})
    bad = pd.Series(False, index=index)
    clean = {}
    for col in FIELDS:
        is_str = frame[col].map(lambda v: isinstance(v, str))
        bad |= frame[col].isna() | (frame[col].notna() & ~is_str)
        clean[col] = frame[col].where(is_str).astype("string")
    ids = clean["event_id"]
    bad |= ids.notna() & ids.duplicated(keep="first")
    for col in ("event_id", "user_id", "session_id"):
        bad |= clean[col].notna() & ~clean[col].str.contains(r"\S", regex=True).fillna(False).astype(bool)
    bad |= clean["rating"].notna() & ~clean["rating"].isin(["up", "down"])
    suite = {e.meta["name"]: e for e in load_suite("feedback_logs").expectations}
    ts = clean["ts"]
    bad |= ts.notna() & ~ts.str.contains(suite["ts_iso8601"].regex, regex=True).fillna(False).astype(bool)
    for col in ("prompt", "response"):
        length = clean[col].str.len()
        bad |= length.notna() & ((length < 1) | (length > MAX_TEXT_CHARS))
    quarantined = {ln.line for ln in lines if ln.obj is None} | set(bad.index[bad].tolist())
    with out_valid.open("w", encoding="utf-8") as fv, out_quarantine.open("w", encoding="utf-8") as fq:
        for ln in lines:
            if ln.line in quarantined:
                fq.write(json.dumps({"source": str(path), "line": ln.line, "raw": ln.text[:2000]}) + "\n")
            else:
                fv.write(ln.text + "\n")
    return quarantined


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--bad-frac", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="alternating passes of each side; the median counts")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        logs = tmp / "logs.jsonl"
        n_bad = generate(logs, args.rows, args.bad_frac, args.seed)
        size_mb = logs.stat().st_size / 2**20
        print(f"generated {args.rows} rows ({size_mb:.1f} MiB), {n_bad} made bad on purpose")

        t0 = time.perf_counter()
        (tmp / "warm.jsonl").write_text(logs.read_text(encoding="utf-8", errors="replace").split("\n", 1)[0] + "\n")
        validate_feedback_logs(tmp / "warm.jsonl", tmp / "wv", tmp / "wq", max_bad_row_rate=1.0)
        print(f"warm-up (GX import + first run): {time.perf_counter() - t0:.1f} s")

        quarantined: dict[str, list[set[int]]] = {"ours": [], "pandas": []}
        reports = []

        def ours() -> float:
            t0 = time.perf_counter()
            reports.append(
                validate_feedback_logs(
                    logs, tmp / "v.jsonl", tmp / "q.jsonl", max_bad_row_rate=0.05, max_text_chars=MAX_TEXT_CHARS
                )
            )
            seconds = time.perf_counter() - t0
            lines = (tmp / "q.jsonl").read_text(encoding="utf-8").splitlines()
            quarantined["ours"].append({json.loads(x)["line"] for x in lines})
            return seconds

        def peer() -> float:
            t0 = time.perf_counter()
            quarantined["pandas"].append(pandas_peer(logs, tmp / "pv.jsonl", tmp / "pq.jsonl"))
            return time.perf_counter() - t0

        seconds = alternate({"ours": ours, "pandas": peer}, args.repeats)

    report = reports[0]
    assert report.rows_valid + report.rows_quarantined == report.rows_in == args.rows
    first = quarantined["ours"][0]
    differ = set().union(*(lines ^ first for side in quarantined.values() for lines in side))
    check_same_work(
        not differ,
        f"the same {len(first)} of {args.rows} lines quarantined by both sides in all {args.repeats} passes"
        if not differ
        else f"ours and pandas disagree on lines {sorted(differ)[:10]}",
    )
    ours_s = spread("ours", seconds["ours"], "s")
    peer_s = spread("pandas", seconds["pandas"], "s")
    print(
        f"ours (GX):     {args.rows / ours_s:9.0f} rows/s  "
        f"quarantined {report.rows_quarantined} ({report.bad_row_rate:.2%}), passed={report.passed}"
    )
    print(f"peer (pandas): {args.rows / peer_s:9.0f} rows/s")
    failing = {k: v for k, v in report.failures.items() if v}
    print("quarantined per expectation:", json.dumps(failing))
    print(
        f"RESULT rows_per_s={args.rows / ours_s:.0f} seconds={ours_s:.2f} "
        f"pandas_rows_per_s={args.rows / peer_s:.0f} ratio={peer_s / ours_s:.3f}"
    )


if __name__ == "__main__":
    main()
