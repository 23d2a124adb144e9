"""DiDPO v2's reward never prefers a failing program (DIDPO.md v2, "Must hold"): dominance on every bundled problem,
version 1's counter-example (a copy of the reference with one bug out-scored two correct programs written
differently) through the real sandbox, a trivial constant program and an answer without code earn nothing.

The return of a rollout is what its per-token rewards sum to: the terminal terms (`terminal_reward`) plus the shaped
step rewards Σ_j F_j (`did_rewards`, potential shaping).
"""

from __future__ import annotations

import ast
import functools

import numpy as np
import pytest

from models.measure import assemble_program
from models.process_reward import (
    ProcessRewardConfig,
    did_rewards,
    mean_control,
    prefix_scores,
    terminal_reward,
)
from models.prompts import reference_code
from models.sampling import format_answer
from sandbox.verifier import Verifier, VerifierConfig

# Allowed weights at and near the bounds: w_partial < 1 and w_format < 1 − w_partial.
ALLOWED = [(0.0, 0.0), (0.0, 0.99), (0.5, 0.49), (0.9, 0.099)]
CHEAP_PHI = dict(w_syntax=0.0, w_style=0.0, w_semantic=0.0, w_task=1.0)  # substring tests: 1,600 problems in seconds


@functools.lru_cache(maxsize=1)
def bundled_problems() -> tuple[dict, ...]:
    """The embedded default's problems: `tasks.prepare` generates them with `datalib.generate.generate_problems`."""
    from datalib.generate import generate_problems
    from tasks.config import PrepareConfig

    cfg = PrepareConfig()
    return tuple(generate_problems(cfg.n_problems, cfg.seed))


def n_tests(test: str) -> int:
    """Top-level asserts of ``check`` (one test case each, as the verifier counts them)."""
    check = next(n for n in ast.parse(test).body if isinstance(n, ast.FunctionDef) and n.name == "check")
    return sum(isinstance(stmt, ast.Assert) for stmt in check.body)


def lines_of(code: str) -> list[str]:
    return [line for line in code.splitlines() if line.strip()]


def one_bug(lines: list[str]) -> list[str]:
    """The reference with one bug: its last line (the return) returns None instead."""
    indent = lines[-1][: len(lines[-1]) - len(lines[-1].lstrip())]
    return [*lines[:-1], indent + "return None"]


def trajectory_return(phi, control, passed, total, text, cfg) -> float:
    """Σ_t per-token rewards = terminal terms + Σ_j F_j."""
    return terminal_reward(passed, total, text, cfg) + float(did_rewards(phi, control, cfg.shaping).shaped.sum())


def check_dominance(problems, phi_weights) -> None:
    """For each problem and allowed weights: the reference passing, without the format term, out-scores its copy with
    one bug given the most favourable failing verdict (every test but one passes) and the format term, against the
    reference's own control and against a control made of both."""
    for problem in problems:
        total = n_tests(problem["test"])
        assert total >= 2, problem["task_id"]
        reference = lines_of(reference_code(problem))
        phi_cfg = ProcessRewardConfig(**phi_weights)  # Φ does not depend on w_partial or w_format
        good = prefix_scores(reference, problem, reference, phi_cfg)  # = the reference's own curve
        bad = prefix_scores(one_bug(reference), problem, reference, phi_cfg)
        controls = (mean_control([good]), mean_control([good, bad]))
        for w_partial, w_format in ALLOWED:
            cfg = ProcessRewardConfig(**phi_weights, w_partial=w_partial, w_format=w_format)
            for control in controls:
                passing = trajectory_return(good, control, total, total, "no fence", cfg)
                failing = trajectory_return(bad, control, total - 1, total, format_answer("x"), cfg)
                assert passing > failing, (problem["task_id"], w_partial, w_format)
                assert passing == pytest.approx(1 + w_partial, abs=1e-12)  # potential shaping: the outcome alone


def test_a_passing_program_out_scores_any_failing_one_on_every_bundled_problem():
    problems = bundled_problems()
    assert len(problems) == 1600 and len({p["family"] for p in problems}) == 20
    check_dominance(problems, CHEAP_PHI)


def test_dominance_with_the_default_process_score_one_problem_per_family():
    first = {}
    for problem in bundled_problems():
        first.setdefault(problem["family"], problem)
    check_dominance(list(first.values()), {})


@pytest.mark.slow
def test_dominance_with_the_default_process_score_on_every_bundled_problem():
    check_dominance(bundled_problems(), {})


# ------------------------------------------------------------------------------------------- through the sandbox

# Bundled problem 0 (family dedupe, keep the last occurrence, as a tuple): two correct programs that share little
# with the reference's text, the reference with one bug (its final reverse dropped), a trivial constant program.
ENTRY = "dedupe_keywords_keep_last_as_tuple"
CORRECT_A = f"""def {ENTRY}(keywords):
    values = [k for k in (keywords or []) if k is not None]
    kept = []
    for i, v in enumerate(values):
        if v not in values[i + 1 :]:
            kept.append(v)
    return tuple(kept)
"""
CORRECT_B = f"""def {ENTRY}(keywords):
    last = {{}}
    for i, v in enumerate(keywords or []):
        if v is not None:
            last[v] = i
    return tuple(sorted(last, key=last.get))
"""
CONSTANT = f"def {ENTRY}(keywords):\n    return ()\n"


@pytest.fixture(scope="module")
def scored():
    """Every program through the real verifier, its Φ (default weights) and its return against the group's
    leave-one-out control (potential shaping, default config)."""
    problem = bundled_problems()[0]
    assert problem["entry_point"] == ENTRY
    reference = lines_of(reference_code(problem))
    buggy = "\n".join(line for line in reference if line.strip() != "unique.reverse()") + "\n"
    assert buggy.count("\n") == len(reference) - 1  # exactly one line dropped
    programs = {"correct A": CORRECT_A, "correct B": CORRECT_B, "one bug": buggy, "constant": CONSTANT, "no code": ""}
    with Verifier(VerifierConfig(workers=2, timeout_s=5.0, cpu_s=5)) as verifier:
        jobs = [(assemble_program(problem, code), problem["test"], ENTRY) for code in programs.values()]
        verdicts = dict(zip(programs, verifier.check_many(jobs), strict=True))
    cfg = ProcessRewardConfig()
    phis = {name: prefix_scores(lines_of(code), problem, reference, cfg) for name, code in programs.items()}
    returns = {}
    for name, code in programs.items():
        control = mean_control([phi for other, phi in phis.items() if other != name])
        v = verdicts[name]
        text = format_answer(code) if code else "I cannot do that."
        shaped = did_rewards(phis[name], control, cfg.shaping).shaped.sum()
        returns[name] = terminal_reward(v.n_passed, v.n_tests, text, cfg, v.reason) + float(shaped)
    return problem, verdicts, phis, returns


def test_the_copy_of_the_reference_with_one_bug_scores_below_two_correct_programs(scored):
    """Version 1's counter-example (0.554 vs 0.438 / 0.414): the buggy copy is the closest to the reference in Φ,
    and still its return is 0 against 1 for each correct program."""
    _, verdicts, phis, returns = scored
    assert verdicts["correct A"].passed and verdicts["correct B"].passed
    assert not verdicts["one bug"].passed and verdicts["one bug"].n_passed > 0
    assert phis["one bug"][-1] > max(phis["correct A"][-1], phis["correct B"][-1])
    assert returns["correct A"] == pytest.approx(1.0, abs=1e-12) and returns["correct B"] == pytest.approx(
        1.0, abs=1e-12
    )
    assert returns["one bug"] == pytest.approx(0.0, abs=1e-12)


def test_a_trivial_constant_program_and_an_answer_without_code_earn_nothing(scored):
    """``return ()`` passes the empty-input cases (partial credit would pay it) but earns no outcome under the
    default V1; the answer without code is the verifier's ``no_code`` and earns 0 too."""
    _, verdicts, _, returns = scored
    constant, empty = verdicts["constant"], verdicts["no code"]
    assert 0 < constant.n_passed < constant.n_tests
    assert returns["constant"] == pytest.approx(0.0, abs=1e-12)
    assert empty.reason == "no_code" and empty.n_passed == 0
    assert returns["no code"] == 0.0
    assert np.isclose(returns["constant"], returns["no code"])  # neither is an attractor above the other
