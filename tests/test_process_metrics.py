"""Process metrics on hand-made cases: stub models, hand-counted lines and complexity, hand-checked prefixes."""

import pytest

from models import process_metrics as pm

PROBLEM = {
    "task_id": "Hand/count_big/0",
    "source": "generated:v1",
    "split": "val",
    "entry_point": "count_big",
    "prompt": 'def count_big(values, limit):\n    """Count the values above limit."""\n',
    "canonical_solution": (
        "    # Step 1: start at zero\n"
        "    total = 0\n"
        "    # Step 2: count each value above the limit\n"
        "    for v in values:\n"
        "        if v > limit:\n"
        "            total = total + 1\n"
        "    return total\n"
    ),
    "test": (
        "def check(candidate):\n"
        "    assert candidate([1, 5, 7], 4) == 2\n"
        "    assert candidate([], 0) == 0\n"
        "    assert candidate([3], 3) == 0\n"
    ),
    "instruction": "Write a function `count_big` that counts the values above a limit.",
    "steps": ["start at zero", "count each value above the limit"],
    "key_patterns": [],
}
REFERENCE = "def count_big(values, limit):\n" + PROBLEM["canonical_solution"]


def run_tests(jobs):
    """In-process checker for the trusted hand-made programs of this file (the stage uses the sandbox)."""
    verdicts = []
    for problem, code in jobs:
        namespace: dict = {}
        try:
            exec(code + "\n" + problem["test"], namespace)
            namespace["check"](namespace[problem["entry_point"]])
            verdicts.append(True)
        except Exception:
            verdicts.append(False)
    return verdicts


def reference_remainder(requests, n, one_line):
    """A model that cannot fix anything: after a prefix of m lines it writes the reference's lines m, m+1, ..."""
    out = []
    for problem, prefix in requests:
        lines = pm.reference_code(problem).splitlines(keepends=True)
        rest = "".join(lines[len(prefix.splitlines()) :])
        out.append([pm.first_line(rest) if one_line else rest] * n)
    return out


def test_reference_lines_and_prefix_points():
    lines, shown = pm.reference_lines(PROBLEM)
    assert "".join(lines) == REFERENCE and shown == 1 and len(lines) - shown == 7
    assert pm.prefix_points(7, 3) == [0, 3, 6]
    assert pm.prefix_points(7, 3, start=1) == [1, 4, 6]  # 3.5 rounds to 4
    assert pm.prefix_points(7, 1) == [0]
    assert pm.prefix_points(2, 5) == [0, 1]  # no more distinct points than lines
    assert pm.prefix_points(1, 3, start=1) == []
    with pytest.raises(ValueError, match="at least one prefix"):
        pm.prefix_points(7, 0)


def test_agreement_rate_normalises_whitespace():
    assert pm.agreement_rate(["x = 1", "  x  =  1 ", "y = 2", "x=1\n"]) == 0.75
    assert pm.normalise_line("  return  a  +  f( b )") == "return a+f(b)"
    assert pm.agreement_rate(["a", "b", "c", "d"]) == 0.25
    with pytest.raises(ValueError):
        pm.agreement_rate([])


def test_a_model_that_always_writes_the_same_line_is_fully_consistent():
    def same_line(requests, n, one_line):
        assert one_line  # consistency only asks for next lines
        return [["    return 0\n"] * n for _ in requests]

    result = pm.decision_consistency([PROBLEM, PROBLEM], same_line, n_prefixes=3, n_samples=4)
    assert result.mean == 1.0 and result.per_problem == (1.0, 1.0) and result.n_prefixes == 6


def test_consistency_of_disagreeing_samples():
    seen = []

    def three_to_one(requests, n, one_line):
        seen.extend(prefix for _, prefix in requests)
        return [["    x = 1\n", "    x = 1\n", "    x=1", "    y = 2\n"] for _ in requests]

    result = pm.decision_consistency([PROBLEM], three_to_one, n_prefixes=3, n_samples=4)
    assert result.mean == 0.75 and result.n_prefixes == 3
    lines = REFERENCE.splitlines(keepends=True)
    assert seen == ["".join(lines[:1]), "".join(lines[:4]), "".join(lines[:7])]  # j = 0, 3, 6 body lines

    def all_different(requests, n, one_line):
        return [[f"    v{i} = {i}" for i in range(n)] for _ in requests]

    assert pm.decision_consistency([PROBLEM], all_different, 2, 5).mean == pytest.approx(0.2)
    with pytest.raises(ValueError, match="n_samples >= 2"):
        pm.decision_consistency([PROBLEM], all_different, 2, 1)


def test_corruption_candidates_by_hand():
    # j = 6: body lines 1-6 of the reference may change (line 0 is the signature, line 7 `return total` is not in it)
    found = [(c.kind, c.line, c.after.strip()) for c in pm.corruption_candidates(PROBLEM, 6)]
    assert found == [
        ("drop_line", 2, ""),  # `total = 0`; `total = total + 1` is alone in its block and is not dropped
        ("off_by_one", 2, "total = 1"),
        ("swap_operator", 5, "if v <= limit:"),
        ("swap_operator", 6, "total = total - 1"),
        ("off_by_one", 6, "total = total + 2"),
    ]
    lines = REFERENCE.splitlines(keepends=True)
    swap = pm.corruption_candidates(PROBLEM, 6)[2]
    assert swap.prefix == "".join(lines[:5]) + "        if v <= limit:\n" + lines[6]
    drop = pm.corruption_candidates(PROBLEM, 6)[0]
    assert drop.prefix == "".join(lines[:2] + lines[3:7])
    assert pm.corruption_candidates(PROBLEM, 1) == []  # only the step comment is in the prefix
    # seeded: same inputs, same order; a subset of the candidates
    a = pm.seeded_corruptions(PROBLEM, 6, seed=3)
    assert a == pm.seeded_corruptions(PROBLEM, 6, seed=3) and len(a) == pm.MAX_CORRUPTION_TRIES
    assert set(a) <= set(pm.corruption_candidates(PROBLEM, 6))


def test_a_corrupted_prefix_the_model_cannot_fix_gives_recovery_zero():
    result = pm.error_recovery([PROBLEM], reference_remainder, run_tests, n_prefixes=3, n_samples=2, seed=0)
    # prefixes at j = 1 (no candidate: skipped), 4 and 6
    assert result.n_prefixes == 2
    assert result.clean_pass_rate == 1.0  # the clean prefix + the reference's rest is the reference
    assert result.corrupted_pass_rate == 0.0
    assert result.recovery == 0.0
    assert len(result.corruptions) == 2 and not any(REFERENCE.startswith(c.prefix) for c in result.corruptions)


def test_recovery_ratio_and_the_zero_over_zero_case():
    def marker_check(jobs):  # a program passes when it holds the marker line
        return ["# fixed" in code for _, code in jobs]

    def half_and_quarter(requests, n, one_line):
        out = []
        for problem, prefix in requests:
            clean = pm.reference_code(problem).startswith(prefix)
            passing = 2 if clean else 1
            out.append(["# fixed\n"] * passing + ["pass\n"] * (n - passing))
        return out

    result = pm.error_recovery([PROBLEM], half_and_quarter, marker_check, n_prefixes=3, n_samples=4)
    assert result.n_prefixes == 2
    assert (result.clean_pass_rate, result.corrupted_pass_rate, result.recovery) == (0.5, 0.25, 0.5)

    def never(requests, n, one_line):
        return [["pass\n"] * n for _ in requests]

    nothing = pm.error_recovery([PROBLEM], never, marker_check, n_prefixes=3, n_samples=4)
    assert (nothing.clean_pass_rate, nothing.corrupted_pass_rate, nothing.recovery) == (0.0, 0.0, None)


def test_code_size_of_a_known_function():
    code = (
        "def f(x):\n"
        '    """doc"""\n'
        "    def g(y):\n"
        "        if y:\n"
        "            return 1\n"
        "        return 2\n"
        "    out = []\n"
        "    # a comment\n"
        "\n"
        "    for v in x:\n"
        "        if v and v > 1:\n"
        "            out.append(g(v))\n"
        "    return out\n"
    )
    # 10 code lines (docstring, comment and blank line excluded); f: 1 + for + if + `and` = 4, g: 1 + if = 2
    assert pm.code_size(code) == pm.CodeSize(lines=10, complexity=6)
    assert pm.code_size(REFERENCE) == pm.CodeSize(lines=6, complexity=3)  # 1 + for + if
    assert pm.code_size("def f(:\n") is None


def test_trajectory_complexity_relative_to_the_reference():
    longer = (
        "def count_big(values, limit):\n"
        "    total = 0\n"
        "    for v in values:\n"
        "        if v > limit and v is not None:\n"
        "            total += 1\n"
        "    return total\n"
    )  # 6 lines, 1 + for + if + and = 4
    shorter = "def count_big(values, limit):\n    return len([v for v in values if v > limit])\n"
    shorter_cc = pm.code_size(shorter).complexity
    result = pm.trajectory_complexity([(longer, REFERENCE), (shorter, REFERENCE), ("def broken(:", REFERENCE)])
    assert result.n == 2
    assert result.lines_ratio == pytest.approx((6 / 6 + 2 / 6) / 2)
    assert result.complexity_ratio == pytest.approx((4 / 3 + shorter_cc / 3) / 2)
    assert pm.trajectory_complexity([("x = (", REFERENCE)]) == pm.Complexity(None, None, 0)
    with pytest.raises(ValueError, match="reference"):
        pm.trajectory_complexity([(longer, "x = 1\n")])


def test_valid_prefix_rate_on_hand_made_code():
    assert pm.valid_prefix_rate(REFERENCE) == 1.0  # every prefix of a correct program is valid so far
    # "def f(x):" is incomplete but fine; "return x +" ends the expression too early; the third prefix stays wrong
    assert pm.valid_prefix_rate("def f(x):\n    return x +\n    y\n") == pytest.approx(1 / 3)
    # indentation inside brackets is free (prefix 3 is fine); `else` without `if` is wrong
    assert pm.valid_prefix_rate("def f(x):\n    y = [\n  1]\n  else:\n") == pytest.approx(3 / 4)
    # the third line dedents to a level that never existed
    assert pm.valid_prefix_rate("def f(x):\n    x = 1\n  y = 2\n") == pytest.approx(2 / 3)
    assert pm.valid_prefix_rate("x = 1\n)\n") == 0.5
    # a bare body continues the prompt: its lines are judged after the prompt, which itself is not counted
    assert pm.valid_prefix_rate("    return 1\n", context=PROBLEM["prompt"]) == 1.0
    assert pm.valid_prefix_rate("    return 1\n") == 0.0
    assert pm.valid_prefix_rate("\n  \n") is None
    assert pm.is_valid_so_far("def f(x):\n    if x:\n") and not pm.is_valid_so_far("    x = 1\n")


def test_format_rates():
    good = "The function `f` below returns one.\n\n```python\ndef f():\n    return 1\n```"
    unsafe = "The function `f` below cleans up.\n\n```python\nimport os\n\ndef f():\n    os.system('rm -rf /')\n```"
    bare = "```python\ndef f():\n    return 1\n```"
    rates = pm.format_rates([good, unsafe, bare])
    assert (rates.compliance, rates.unsafe_rate, rates.explanation_rate, rates.n) == (1 / 3, 1 / 3, 2 / 3, 3)
    with pytest.raises(ValueError):
        pm.format_rates([])


def test_real_continuer_on_a_tiny_model():
    from models.policy import build_tiny_causal_lm
    from models.sampling import SamplingConfig

    model, tokenizer = build_tiny_causal_lm(seed=0)
    prefix = "def count_big(values, limit):\n    total = 0\n"
    prompt = pm.continuation_prompt(tokenizer, PROBLEM, prefix)
    assert prompt.endswith("each step is commented.\n\n```python\n" + prefix)
    assert prompt.startswith("<|im_start|>user\nWrite a function `count_big`")
    continuer = pm.make_continuer(model, tokenizer, SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=12))
    full = continuer([(PROBLEM, prefix), (PROBLEM, prefix + "    for v in values:\n")], 3, False)
    assert [len(samples) for samples in full] == [3, 3]
    assert all(isinstance(s, str) and "```" not in s for samples in full for s in samples)
    assert continuer([(PROBLEM, prefix)], 3, False) == full[:1]  # seeded: the same request, the same samples
    lines = continuer([(PROBLEM, prefix)], 4, True)[0]
    assert len(lines) == 4 and all(len(tokenizer(s)["input_ids"]) <= pm.NEXT_LINE_TOKENS for s in lines)


def test_real_continuer_heals_the_prefix_newline(monkeypatch):
    """The prompt stops before the prefix's last newline; the sampled newline is taken off again, so
    prefix + continuation is the program the model wrote (a bare trailing newline made the SFT model close the
    block)."""
    from types import SimpleNamespace

    import models.process_metrics
    from models.process_metrics import make_continuer
    from models.sampling import SamplingConfig

    seen = []

    def fake_sample(model, tokenizer, prompts, config, progress=True):
        seen.extend(prompts)
        texts = ["\n    y = x + 1\n    return y\n```", "    # same line\n"]
        return [[SimpleNamespace(text=t) for t in texts] for _ in prompts]

    monkeypatch.setattr(models.process_metrics, "sample", fake_sample)
    monkeypatch.setattr("models.process_metrics.continuation_prompt", lambda tok, p, prefix: "PROMPT:" + prefix)
    fn = make_continuer(None, None, SamplingConfig(n=1))
    out = fn([({}, "def f(x):\n"), ({}, "def f(x):")], 2, True)
    assert seen == ["PROMPT:def f(x):", "PROMPT:def f(x):"]
    assert out[0] == ["    y = x + 1\n    return y\n", "    # same line\n"]  # healed: the leading newline is dropped
    assert out[1] == ["\n    y = x + 1\n    return y\n", "    # same line\n"]  # no trailing newline: as sampled


def rewrite_after_mistake(requests, n, one_line):
    """A positive control for error recovery: a model that, after any prefix, closes the open block and writes the
    whole reference function again (the later definition replaces the damaged one), so it recovers from every
    corruption. A metric that stays 0 for this model could not measure recovery at all."""
    out = []
    for problem, prefix in requests:
        last = prefix.rstrip("\n").splitlines()[-1]
        indent = len(last) - len(last.lstrip())
        close = " " * (indent + 4) + "pass\n" if last.rstrip().endswith(":") else ""
        out.append([close + pm.reference_code(problem)] * n)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_error_recovery_reaches_one_for_a_model_that_rewrites_the_damaged_code(seed):
    """Positive control: on the hand problem and on 12 bundled generated problems, with every effective corruption
    the seed picks, the rewriting model passes from the corrupted prefix as often as from the clean one (recovery
    1.0), while the model that only continues (`reference_remainder`) recovers at most by accident (< 0.2: a dropped
    line shifts its remainder by one line, which now and then writes the missing line back) on the same prefixes:
    the metric spans its range, and the 0.000 measured for every checkpoint says the models never rewrite the code
    a mistake damaged."""
    from datalib.generate import generate_problems

    problems = [PROBLEM, *generate_problems(12, seed)]
    fixed = pm.error_recovery(problems, rewrite_after_mistake, run_tests, n_prefixes=3, n_samples=2, seed=seed)
    stuck = pm.error_recovery(problems, reference_remainder, run_tests, n_prefixes=3, n_samples=2, seed=seed)
    assert fixed.n_prefixes == stuck.n_prefixes >= 10
    assert (fixed.clean_pass_rate, fixed.corrupted_pass_rate, fixed.recovery) == (1.0, 1.0, 1.0)
    assert stuck.clean_pass_rate == 1.0 and stuck.corrupted_pass_rate < 0.2 and stuck.recovery < fixed.recovery
