"""Run every benchmark and record what each measured in docs/results/benchmarks.md (``make bench``).

    .venv/bin/python benchmarks/run_all.py [--only bench_verifier bench_mining ...] [--out docs/results/benchmarks.md]

Each benchmark runs as its own process, one at a time (two heavy jobs on 2 cores slow each other far more than 2×),
with its output streamed to the terminal and kept in docs/results/bench_logs/<name>.txt. The table gets, per
benchmark: the command, its ``CHECK same_work=…`` line (what both sides were checked to compute alike), its last
``RESULT …`` line, the wall time and the commit it ran on; the header gives the machine (CPU model, cores, torch's
CPU capability), the date and the commit of the last run. A benchmark that exits non-zero (a failed same-work check
included) is recorded as failed, and the runner exits 1 after the others have run. With ``--only`` the other rows
of an existing file are kept.

Needs the converted base model and the prepared problems for the real-model benchmarks (``dvc repro base_model
prepare``; ``make bench`` does it) and the OpenVINO export environment for bench_generation (``make export-env``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# name → arguments: the README's "Measured" table quotes these runs (1 thread where the peer runs 1).
BENCHMARKS = {
    "bench_verifier": [],
    "bench_validate": [],
    "bench_mining": [],
    "bench_promotion": [],
    "bench_sft": ["--threads", "1"],
    "bench_dpo": ["--threads", "1"],
    "bench_rl": ["--threads", "1"],
    "bench_sampling": ["--threads", "2"],
    "bench_generation": [],
    "bench_export": [],
    "bench_sft_recipe": [],
    "bench_orchestration": [],
    "bench_rl_update": ["--stages"],
}
HEADER = "| benchmark | command | same work | result | wall | commit, start |\n|---|---|---|---|---|---|\n"


def machine() -> str:
    """One line: CPU model, cores, torch's CPU capability, OS."""
    model = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor() or "unknown CPU",
        )
        if Path("/proc/cpuinfo").exists()
        else platform.processor()
    )
    capability = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return f"{model}, {os.cpu_count()} cores, torch CPU capability {capability or '?'}, {platform.system()}"


def run(name: str, args: list[str], logs: Path, commit: str) -> dict:
    """Run one benchmark, tee its output to ``logs/<name>.txt``; returns its row's fields."""
    command = [sys.executable, f"benchmarks/{name}.py", *args]
    shown = " ".join([".venv/bin/python", f"benchmarks/{name}.py", *args])
    print(f"== {shown}", flush=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    started = time.perf_counter()
    lines = []
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            lines.append(line)
    seconds = time.perf_counter() - started
    (logs / f"{name}.txt").write_text(f"# {shown}\n" + "".join(lines))
    check = next((ln.strip() for ln in reversed(lines) if ln.startswith("CHECK same_work=")), "no CHECK line")
    result = next((ln.strip() for ln in reversed(lines) if ln.startswith("RESULT ")), None)
    if proc.returncode != 0:
        result = f"FAILED (exit {proc.returncode})" + (f"; last RESULT: {result}" if result else "")
    return {
        "command": shown,
        "check": check,
        "result": result or "no RESULT line",
        "seconds": seconds,
        "ok": proc.returncode == 0,
        "commit": f"{commit}, {stamp}",
    }


def row(name: str, r: dict) -> str:
    return (
        f"| {name} | `{r['command']}` | {r['check']} | {r['result']} | {r['seconds'] / 60:.1f} min | {r['commit']} |\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(BENCHMARKS), help="run these; keep the file's other rows")
    parser.add_argument("--out", type=Path, default=ROOT / "docs/results/benchmarks.md")
    args = parser.parse_args()
    logs = args.out.parent / "bench_logs"
    logs.mkdir(parents=True, exist_ok=True)
    names = args.only or list(BENCHMARKS)
    kept: dict[str, str] = {}
    if args.only and args.out.exists():
        for line in args.out.read_text().splitlines():
            m = re.match(r"\| (bench_\w+) \|", line)
            if m and m.group(1) not in names:
                kept[m.group(1)] = line + "\n"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    commit = commit.stdout.strip() + (" (uncommitted changes)" if dirty else "")
    head = (
        "# Benchmarks (written by `make bench`, `benchmarks/run_all.py`)\n\n"
        f"Machine: {machine()}. Last run started {stamp} ({', '.join(names)}), commit {commit}; each row names the "
        "commit and start of its own run. Each benchmark's full output: `bench_logs/<name>.txt`.\n"
        "Every ratio is ours / the peer's on the same work (the CHECK column says what was compared); the figure is "
        "the median of alternating repeats unless the RESULT line says otherwise.\n\n"
    )
    results = {}
    for name in names:  # the file is rewritten after each benchmark, so a stop loses only the one running
        results[name] = run(name, BENCHMARKS[name], logs, commit)
        kept[name] = row(name, results[name])
        args.out.write_text(head + HEADER + "".join(kept[n] for n in BENCHMARKS if n in kept))
    print(f"wrote {args.out}")
    failed = [name for name, r in results.items() if not r["ok"]]
    if failed:
        sys.exit(f"failed: {failed}")


if __name__ == "__main__":
    main()
