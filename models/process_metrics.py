"""Process metrics: how a model writes code, not only whether the final program passes.

Source: the project's seed article on DiDPO for coding agents (process-level evaluation: decision consistency,
error recovery, trajectory complexity, syntactic validity along the way) and issue #8. Each metric is defined
below with its unit; all are plain Python over strings, so tests pass stubs instead of a model.

A *model* here is a **continuer**: ``continue_fn(requests, n, one_line) -> list[list[str]]`` takes
``(problem, code_prefix)`` pairs and returns, for each, ``n`` sampled continuations of the answer's code block
after ``code_prefix`` (the code that follows it, without the closing fence). With ``one_line`` the continuer may
stop at the first newline. `make_continuer` builds the real one from a causal LM (`models.sampling.sample`).
A *checker* is ``check_fn(jobs) -> list[bool]``: each ``(problem, code)`` job passes all of the problem's tests or
not (the real one runs `models.measure.assemble_program` in the sandbox verifier).

Reference prefixes: the reference answer's code is `models.prompts.reference_code` (what the user was shown —
the signature, or HumanEval's whole prompt — followed by the canonical body). "The prefix after j lines" is the
shown code plus the first j lines of the body (j = 0 is the bare signature).
"""

from __future__ import annotations

import codeop
import hashlib
import io
import random
import re
import tokenize
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from models.answer_format import check_format
from models.prompts import code_to_complete, reference_code, user_message
from models.sampling import build_chat_prompt, sample
from models.sft import explanation_sentence

ContinueFn = Callable[[Sequence[tuple[dict, str]], int, bool], list[list[str]]]
CheckFn = Callable[[Sequence[tuple[dict, str]]], list[bool]]

NEXT_LINE_TOKENS = 48  # a next-line sample stops here; code lines rarely exceed ~40 tokens
MAX_CORRUPTION_TRIES = 4  # seeded corruption candidates tried per prefix (the first one that breaks the tests wins)

_INSIGNIFICANT_SPACE = re.compile(r"(?<!\w) | (?!\w)")

# swap_operator: each operator becomes one that changes the program's meaning
_SWAPS = {
    "==": "!=",
    "!=": "==",
    "<": ">=",
    ">": "<=",
    "<=": ">",
    ">=": "<",
    "+": "-",
    "-": "+",
    "and": "or",
    "or": "and",
}


# ------------------------------------------------------------------------------------------ reference prefixes


def reference_lines(problem: dict) -> tuple[list[str], int]:
    """The reference answer's code as lines (newlines kept) and the number of leading lines that are the shown
    code (`models.prompts.code_to_complete`); the body lines follow."""
    return reference_code(problem).splitlines(keepends=True), len(code_to_complete(problem).splitlines())


def prefix_points(n_body_lines: int, k: int, start: int = 0) -> list[int]:
    """Up to `k` distinct, evenly spaced prefix lengths j in ``[start, n_body_lines - 1]`` (a prefix always leaves
    at least one reference line to write), ascending; [] when that range is empty.

    Raises:
        ValueError: `k` < 1.
    """
    if k < 1:
        raise ValueError(f"need at least one prefix per problem, got k={k}")
    last = n_body_lines - 1
    if last < start:
        return []
    if k == 1:
        return [start]
    return sorted({round(start + i * (last - start) / (k - 1)) for i in range(k)})


def normalise_line(line: str) -> str:
    """Whitespace-normalised line: whitespace only counts where it separates two word characters (there it becomes
    one space), so ``x=1``, ``x = 1`` and ``  x  =  1`` are the same line (inside string literals too)."""
    return _INSIGNIFICANT_SPACE.sub("", " ".join(line.split()))


def first_line(continuation: str) -> str:
    """The first line of a continuation (up to the first newline); "" for an empty continuation."""
    return continuation.split("\n", 1)[0]


# ------------------------------------------------------------------------------------------ decision consistency


def agreement_rate(lines: Sequence[str]) -> float:
    """Fraction of `lines` equal (after `normalise_line`) to their most common value, in (0, 1].

    Raises:
        ValueError: no lines.
    """
    if not lines:
        raise ValueError("agreement rate of zero samples")
    counts = Counter(normalise_line(line) for line in lines)
    return max(counts.values()) / len(lines)


@dataclass(frozen=True)
class Consistency:
    """Decision consistency.

    mean: the mean agreement rate over every measured (problem, prefix), in [1/n, 1]; None when nothing was
        measured. per_problem: each problem's mean agreement (None for a problem without a usable prefix).
        n_prefixes: (problem, prefix) pairs measured.
    """

    mean: float | None
    per_problem: tuple[float | None, ...]
    n_prefixes: int


def decision_consistency(
    problems: Sequence[dict], continue_fn: ContinueFn, n_prefixes: int, n_samples: int
) -> Consistency:
    """How consistently the model makes the same next decision at the same point of a reference solution.

    At `n_prefixes` evenly spaced reference prefixes per problem (`prefix_points`, j from 0), draw `n_samples`
    next lines (`first_line` of a one-line continuation; an empty line or the closing fence is a decision too)
    and take their `agreement_rate`; average over all prefixes. 1.0 means the model always writes the same
    next line; 1/n means every sample differs.

    Raises:
        ValueError: `n_samples` < 2 (one sample always agrees with itself), `n_prefixes` < 1.
    """
    if n_samples < 2:
        raise ValueError(f"decision consistency needs n_samples >= 2, got {n_samples}")
    requests, owners = [], []
    for index, problem in enumerate(problems):
        lines, shown = reference_lines(problem)
        for j in prefix_points(len(lines) - shown, n_prefixes):
            requests.append((problem, "".join(lines[: shown + j])))
            owners.append(index)
    samples = continue_fn(requests, n_samples, True) if requests else []
    rates: list[list[float]] = [[] for _ in problems]
    for owner, continuations in zip(owners, samples, strict=True):
        rates[owner].append(agreement_rate([first_line(c) for c in continuations]))
    flat = [r for per in rates for r in per]
    return Consistency(
        mean=sum(flat) / len(flat) if flat else None,
        per_problem=tuple(sum(per) / len(per) if per else None for per in rates),
        n_prefixes=len(flat),
    )


# ------------------------------------------------------------------------------------------------ error recovery


@dataclass(frozen=True)
class Corruption:
    """One deliberate mistake in a reference prefix.

    kind: "drop_line" (a one-line simple statement removed), "swap_operator" (``==``↔``!=``, ``<``→``>=``,
    ``>``→``<=``, ``<=``→``>``, ``>=``→``<``, ``+``↔``-``, ``and``↔``or``) or "off_by_one" (an integer literal
    n → n + 1). line: index of the changed line in `models.prompts.reference_code`'s lines. before/after: that
    line before and after (after is "" for drop_line). prefix: the corrupted prefix code.
    """

    kind: str
    line: int
    before: str
    after: str
    prefix: str


def corruption_candidates(problem: dict, j: int) -> list[Corruption]:
    """Every corruption of the reference prefix after `j` body lines, in source order (drops first).

    Only body lines inside the prefix are touched (never the signature the user supplied).
    """
    import ast

    lines, shown = reference_lines(problem)
    source = "".join(lines)
    prefix_rows = range(shown, shown + j)  # 0-based line indices the corruption may touch
    out: list[Corruption] = []

    def make(kind: str, index: int, new_line: str) -> Corruption:
        prefix = "".join(lines[:index]) + new_line + "".join(lines[index + 1 : shown + j])
        return Corruption(kind, index, lines[index], new_line, prefix)

    tree = ast.parse(source)
    for node in ast.walk(tree):
        for body in (getattr(node, name, None) for name in ("body", "orelse", "finalbody")):
            if not isinstance(body, list) or len(body) < 2:  # dropping the only statement leaves an empty block
                continue
            for stmt in body:
                simple = not hasattr(stmt, "body") and stmt.lineno == stmt.end_lineno
                docstring = isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
                if simple and not docstring and stmt.lineno - 1 in prefix_rows:
                    out.append(make("drop_line", stmt.lineno - 1, ""))
    out.sort(key=lambda c: c.line)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        (row, col), (end_row, end_col) = tok.start, tok.end
        index = row - 1
        if index not in prefix_rows or row != end_row:
            continue
        line = lines[index]
        if (tok.type == tokenize.OP or tok.string in ("and", "or")) and tok.string in _SWAPS:
            out.append(make("swap_operator", index, line[:col] + _SWAPS[tok.string] + line[end_col:]))
        elif tok.type == tokenize.NUMBER and tok.string.isdigit():
            out.append(make("off_by_one", index, line[:col] + str(int(tok.string) + 1) + line[end_col:]))
    return out


def _rng(seed: int, *keys: object) -> random.Random:
    digest = hashlib.sha256(repr((seed, *keys)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def seeded_corruptions(problem: dict, j: int, seed: int, tries: int = MAX_CORRUPTION_TRIES) -> list[Corruption]:
    """Up to `tries` distinct corruptions of the prefix after `j` body lines, in a seeded random order
    (``random.Random`` seeded from sha256 of ``(seed, task_id, j)``: the same inputs give the same choice on any
    machine)."""
    candidates = corruption_candidates(problem, j)
    _rng(seed, problem["task_id"], j).shuffle(candidates)
    return candidates[:tries]


@dataclass(frozen=True)
class Recovery:
    """Error recovery.

    clean_pass_rate / corrupted_pass_rate: fraction of continuations whose program passes every test, from the
        clean and from the corrupted prefixes, pooled over the measured (problem, prefix) pairs; None when none.
    recovery: corrupted_pass_rate / clean_pass_rate; None when clean_pass_rate is 0 or None (0/0 and x/0 are
        undefined: without successes from clean prefixes there is nothing to recover relative to). 0 means no
        corrupted prefix was ever repaired; 1 means mistakes cost nothing; it may exceed 1 by chance.
    n_prefixes: measured (problem, prefix) pairs (those with an effective corruption).
    corruptions: the corruption used at each measured pair.
    """

    clean_pass_rate: float | None
    corrupted_pass_rate: float | None
    recovery: float | None
    n_prefixes: int
    corruptions: tuple[Corruption, ...]


def error_recovery(
    problems: Sequence[dict],
    continue_fn: ContinueFn,
    check_fn: CheckFn,
    n_prefixes: int,
    n_samples: int,
    seed: int = 0,
) -> Recovery:
    """How often the model still reaches a passing program after a mistake, relative to no mistake.

    At `n_prefixes` evenly spaced reference prefixes per problem with at least one body line (`prefix_points`,
    j from 1), take the first of `seeded_corruptions` that is *effective* (the corrupted prefix followed by the
    rest of the reference fails the tests: a corruption that changes nothing measures nothing); prefixes without
    one are skipped. From both the clean and the corrupted prefix draw `n_samples` continuations; a sample passes
    when prefix + continuation passes every test. See `Recovery` for the figures and the 0/0 case.

    Raises:
        ValueError: `n_samples` < 1 or `n_prefixes` < 1.
    """
    if n_samples < 1:
        raise ValueError(f"error recovery needs n_samples >= 1, got {n_samples}")
    options: list[tuple[dict, str, str, list[Corruption]]] = []  # problem, clean prefix, remainder, corruptions
    for problem in problems:
        lines, shown = reference_lines(problem)
        for j in prefix_points(len(lines) - shown, n_prefixes, start=1):
            corruptions = seeded_corruptions(problem, j, seed)
            if corruptions:
                options.append((problem, "".join(lines[: shown + j]), "".join(lines[shown + j :]), corruptions))
    jobs = [(p, c.prefix + rest) for p, _, rest, cs in options for c in cs]
    verdicts = iter(check_fn(jobs) if jobs else [])
    chosen: list[tuple[dict, str, Corruption]] = []
    for problem, clean, _, corruptions in options:
        passed = [next(verdicts) for _ in corruptions]
        effective = [c for c, ok in zip(corruptions, passed, strict=True) if not ok]
        if effective:
            chosen.append((problem, clean, effective[0]))
    if not chosen:
        return Recovery(None, None, None, 0, ())
    requests = [(p, clean) for p, clean, _ in chosen] + [(p, c.prefix) for p, _, c in chosen]
    samples = continue_fn(requests, n_samples, False)
    programs = [(p, prefix + cont) for (p, prefix), conts in zip(requests, samples, strict=True) for cont in conts]
    results = check_fn(programs)
    half = len(results) // 2
    clean_rate = sum(results[:half]) / half
    corrupted_rate = sum(results[half:]) / half
    return Recovery(
        clean_pass_rate=clean_rate,
        corrupted_pass_rate=corrupted_rate,
        recovery=corrupted_rate / clean_rate if clean_rate > 0 else None,
        n_prefixes=len(chosen),
        corruptions=tuple(c for _, _, c in chosen),
    )


# ------------------------------------------------------------------------------------------ trajectory complexity


@dataclass(frozen=True)
class CodeSize:
    """lines: radon's source lines of code (``sloc``: no blank lines, comments or docstrings). complexity: the
    sum of radon's cyclomatic complexity (McCabe: 1 + decision points) over every function, nested functions and
    methods included."""

    lines: int
    complexity: int


def code_size(code: str) -> CodeSize | None:
    """`CodeSize` of a program; None when it does not parse."""
    from radon.complexity import cc_visit
    from radon.raw import analyze

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            blocks = cc_visit(code)
            lines = analyze(code).sloc
    except (SyntaxError, ValueError):
        return None

    def total(block) -> int:
        inner = list(getattr(block, "closures", [])) + list(getattr(block, "methods", []))
        own = 0 if hasattr(block, "methods") else block.complexity  # a class adds only its methods
        return own + sum(total(b) for b in inner)

    return CodeSize(lines=lines, complexity=sum(total(b) for b in blocks))


@dataclass(frozen=True)
class Complexity:
    """Trajectory complexity relative to the reference: means over the completions that parse.

    lines_ratio: completion sloc / reference sloc. complexity_ratio: completion cyclomatic complexity / reference
    complexity. 1.0 = as long / as branchy as the reference. None when no completion parses. n: completions
    measured.
    """

    lines_ratio: float | None
    complexity_ratio: float | None
    n: int


def trajectory_complexity(pairs: Sequence[tuple[str, str]]) -> Complexity:
    """Mean size ratios of ``(completion_program, reference_program)`` pairs (complete programs, e.g. both from
    `models.measure.assemble_program`); pairs whose completion does not parse are skipped.

    Raises:
        ValueError: a reference that does not parse or has no code line or no function.
    """
    lines, complexity = [], []
    for program, reference in pairs:
        ref = code_size(reference)
        if ref is None or ref.lines == 0 or ref.complexity == 0:
            raise ValueError(f"reference program without a parseable function:\n{reference[:200]}")
        size = code_size(program)
        if size is None:
            continue
        lines.append(size.lines / ref.lines)
        complexity.append(size.complexity / ref.complexity)
    return Complexity(
        lines_ratio=sum(lines) / len(lines) if lines else None,
        complexity_ratio=sum(complexity) / len(complexity) if complexity else None,
        n=len(lines),
    )


# ------------------------------------------------------------------------------------ syntactically valid prefixes


def is_valid_so_far(source: str) -> bool:
    """True when `source` is complete Python or an incomplete start that more lines could complete
    (``codeop.compile_command(..., "exec")`` returns code or None); False when it is already wrong."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            codeop.compile_command(source, "<prefix>", "exec")
    except (SyntaxError, ValueError, OverflowError):
        return False
    return True


def valid_prefix_rate(code: str, context: str = "") -> float | None:
    """Fraction of the line prefixes of `code` (its first 1, 2, …, L lines) that are valid so far
    (`is_valid_so_far` of ``context`` + the prefix), in [0, 1]; None for code without a non-blank line.

    `context` is code the answer continues (e.g. the problem's prompt when the answer is a bare function body); it
    is not counted itself.
    """
    lines = code.splitlines()
    if not any(line.strip() for line in lines):
        return None
    valid = [is_valid_so_far(context + "\n".join(lines[:i]) + "\n") for i in range(1, len(lines) + 1)]
    return sum(valid) / len(valid)


# --------------------------------------------------------------------------------------------- format and safety


@dataclass(frozen=True)
class FormatRates:
    """Over answers: compliance = fraction `models.answer_format.check_format` calls compliant; unsafe_rate =
    fraction with at least one unsafe pattern; explanation_rate = fraction with a short explanation. n: answers."""

    compliance: float
    unsafe_rate: float
    explanation_rate: float
    n: int


def format_rates(answers: Sequence[str]) -> FormatRates:
    """`FormatRates` of raw answers (decoded text). Raises ValueError for no answers."""
    if not answers:
        raise ValueError("format rates of zero answers")
    reports = [check_format(a) for a in answers]
    n = len(reports)
    return FormatRates(
        compliance=sum(r.compliant for r in reports) / n,
        unsafe_rate=sum(bool(r.unsafe) for r in reports) / n,
        explanation_rate=sum(r.has_explanation for r in reports) / n,
        n=n,
    )


# ------------------------------------------------------------------------------------------- the real continuer


def continuation_prompt(tokenizer, problem: dict, code_prefix: str) -> str:
    """The chat prompt (`models.sampling.build_chat_prompt` of `models.prompts.user_message`) followed by the
    assistant's answer start as SFT renders it (`models.sft.explanation_sentence`, a blank line, the opening
    python fence) up to `code_prefix`."""
    chat = build_chat_prompt(tokenizer, user_message(problem))
    return f"{chat}{explanation_sentence(problem)}\n\n```python\n{code_prefix}"


def make_continuer(model, tokenizer, sampling) -> ContinueFn:
    """A `ContinueFn` over a causal LM: `models.sampling.sample` from `continuation_prompt`, stopping at the
    closing fence (``one_line``: after at most `NEXT_LINE_TOKENS` tokens; callers take the first line); `sampling` (a
    `models.sampling.SamplingConfig`) gives temperature, top_p, max_new_tokens, batch size and seed.

    Token healing: a prompt that ends in a bare newline token is a boundary the model never saw in training (the
    tokenizer merges a newline with the next line's indentation), and there the SFT model closes the code block at
    once (measured: 4 of 4 samples on a val prefix; every continuation came back empty). So a prefix's final newline
    is left out of the prompt and taken off the sample again; a sample that instead goes on with the prefix's last
    line is returned as it is (then ``prefix + continuation`` has one newline more than the model wrote)."""

    def continue_fn(requests: Sequence[tuple[dict, str]], n: int, one_line: bool) -> list[list[str]]:
        cfg = replace(
            sampling,
            n=n,
            stop=("```",),
            stop_on_code_block=False,
            max_new_tokens=min(NEXT_LINE_TOKENS, sampling.max_new_tokens) if one_line else sampling.max_new_tokens,
        )
        healed = [prefix.endswith("\n") for _, prefix in requests]
        prompts = [
            continuation_prompt(tokenizer, p, prefix[:-1] if heal else prefix)
            for (p, prefix), heal in zip(requests, healed, strict=True)
        ]
        out = sample(model, tokenizer, prompts, cfg, progress=False)
        results = []
        for heal, samples in zip(healed, out, strict=True):
            texts = [c.text.split("```", 1)[0] for c in samples]
            results.append([t[1:] if heal and t.startswith("\n") else t for t in texts])
        return results

    return continue_fn
