"""The simulate_logs stage's work: feedback logs over the generated train problems (the embedded default's logs),
each distinct program graded in the sandbox (`datalib.simulate_logs` simulates; this runs it with the verifier)."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from datalib.simulate_logs import SimSettings, simulate_logs
from tasks.config import SimulateConfig, VerifierSection
from tasks.io import read_problems, write_frame
from tasks.sandbox import make_verifier


@task(cache_policy=NO_CACHE)
def simulate(problems_path: Path, cfg: SimulateConfig, verifier_cfg: VerifierSection, logs_out: Path, truth_out: Path):
    """Simulated logs over the generated train problems, correctness of every distinct program from the sandbox;
    writes the events to `logs_out` and the ground truth to `truth_out`.

    Returns ``(events, ground_truth)`` DataFrames (see :func:`datalib.simulate_logs.simulate_logs`).
    """
    problems = [p for p in read_problems(problems_path, "train") if str(p["source"]).startswith("generated")]
    with make_verifier(verifier_cfg) as verifier:

        def check(program: str, test: str, entry_point: str) -> bool:
            return verifier.check(program, test, entry_point).passed

        events, truth = simulate_logs(
            problems, cfg.n_events, cfg.n_users, cfg.seed, check, settings=SimSettings(n_prompts=cfg.n_prompts)
        )
    write_frame(events, logs_out)
    write_frame(truth, truth_out)
    return events, truth
