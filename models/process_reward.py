"""Process rewards for DiDPO: the prefix score Φ, the reference's curve Ψ, DiD step rewards and the outcome reward.

DIDPO.md fixes the algorithm; in short, for a completion whose code has N lines (steps) and a reference with M:

- Φ(prefix) = w_syntax·syntax + w_style·style + w_semantic·semantic + w_task·task, each cheap and deterministic
  (see `prefix_score`);
- r_j = Φ_j − Φ_{j−1}: step j's own effect (potential-based shaping, Ng, Harada & Russell 1999: the sum
  telescopes to Φ(final) − Φ(empty));
- Ψ(u): the reference's own prefix scores over relative progress u ∈ [0, 1], linearly interpolated between lines;
  c_j = Ψ(u_j) − Ψ(u_{j−1}): the reference's improvement over the same stretch of progress (the common trend);
- d_j = r_j − c_j: the DiD reward, step j's improvement net of the trend; Σ d = [Φ_N − Φ_0] − [Ψ(1) − Ψ(0)].

The outcome reward (fraction of unit tests passed, or 0/1), the DAPO soft overlong penalty and the format term
go on the last token (`terminal_reward`, `token_rewards`).

Linting uses pycodestyle and pyflakes in-process (no subprocess per prefix); results are cached by source text,
since every sample of a prompt scores the same reference prefixes.
"""

from __future__ import annotations

import ast
import codeop
import difflib
import functools
import io
import tokenize
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from models.sampling import _FENCED_BLOCK, _PYTHON_TAGS

if TYPE_CHECKING:
    import torch

_OUTCOMES = ("v1", "v2")
_ALIGNMENTS = ("progress", "lines")
# pycodestyle checks that do not apply to a code prefix made of steps: blank lines are not steps, so the blank-line
# rules (E3) and the end-of-file ones (W391, W292) would fire on every prefix; syntax errors (E9) are the syntax
# component's business. The rest of pycodestyle's default selection stays (its default ignore list included).
_STYLE_IGNORE = ("E3", "E9", "W391", "W292")
# The line length the project's own code uses (pyproject's ruff setting), not PEP 8's 79: prompts hold longer
# signatures, and answers should not be penalised for copying them.
MAX_LINE_LENGTH = 120
# Python tokens that carry no code content for the similarity (layout and comments).
_LAYOUT_TOKENS = {tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER, tokenize.COMMENT}


@dataclass(frozen=True)
class ProcessRewardConfig:
    """How steps and outcomes are scored (DIDPO.md, "Objects" and "The two differences").

    Attributes:
        w_syntax: weight of the syntax component (1 when the prefix is valid-so-far Python, else 0).
        w_style: weight of the style component (minus `style_scale` per lint violation in the prefix).
        w_semantic: weight of the semantic component (token similarity in [0, 1] to the aligned reference prefix).
        w_task: weight of the task component (fraction in [0, 1] of the problem's ``key_patterns`` present).
        style_scale: style points lost per lint violation (pycodestyle + pyflakes).
        outcome: "v2" = fraction of unit tests passed (seed reward V2); "v1" = 1 when all pass, else 0.
        w_format: weight of the format term (1 when the answer has exactly one fenced python block); 0 disables.
        overlong_max: DAPO soft overlong punishment (Yu et al. 2025, eq. 13): the most completion tokens, L_max;
            0 disables the penalty.
        overlong_cache: the punishment interval L_cache (tokens): the penalty grows linearly from 0 at
            L_max − L_cache to −1 at L_max (and stays −1 beyond); 0 = a hard −1 beyond L_max.
        alignment: how policy step j is placed on the reference's progress axis: "progress" = u_j = j/N;
            "lines" = the relative position of the reference line matched to line j (difflib over stripped lines),
            kept non-decreasing, with u_N = 1.
    """

    w_syntax: float = 1.0
    w_style: float = 0.2
    w_semantic: float = 1.0
    w_task: float = 0.5
    style_scale: float = 0.1
    outcome: str = "v2"
    w_format: float = 0.0
    overlong_max: int = 0
    overlong_cache: int = 0
    alignment: str = "progress"

    def __post_init__(self):
        if self.outcome not in _OUTCOMES:
            raise ValueError(f"outcome must be one of {_OUTCOMES}, got {self.outcome!r}")
        if self.alignment not in _ALIGNMENTS:
            raise ValueError(f"alignment must be one of {_ALIGNMENTS}, got {self.alignment!r}")
        if self.style_scale < 0:
            raise ValueError(f"style_scale must be >= 0, got {self.style_scale}")
        if self.overlong_max < 0 or self.overlong_cache < 0:
            raise ValueError(
                f"overlong_max and overlong_cache must be >= 0, got {self.overlong_max} and {self.overlong_cache}"
            )
        if self.overlong_cache > self.overlong_max:
            raise ValueError(f"overlong_cache ({self.overlong_cache}) must be <= overlong_max ({self.overlong_max})")


@dataclass(frozen=True)
class DiDRewards:
    """The step rewards of one completion against its reference (all numpy float64).

    Attributes:
        phi: (N+1,) Φ of the completion's prefixes with 0..N lines.
        psi: (M+1,) Ψ at the reference's own prefixes with 0..M lines (the knots of the interpolated curve).
        r: (N,) r_j = Φ_j − Φ_{j−1}.
        c: (N,) c_j = Ψ(u_j) − Ψ(u_{j−1}).
        d: (N,) d_j = r_j − c_j.
        progress: (N+1,) u_0 = 0 ≤ u_1 ≤ … ≤ u_N = 1 (u = [0] when N = 0).
    """

    phi: np.ndarray
    psi: np.ndarray
    r: np.ndarray
    c: np.ndarray
    d: np.ndarray
    progress: np.ndarray


def _source(lines: Sequence[str]) -> str:
    return "".join(line + "\n" for line in lines)


@functools.lru_cache(maxsize=8192)
def syntax_ok(source: str) -> bool:
    """True when `source` is valid-so-far Python: a complete program, or an incomplete one that some
    continuation could complete (an open block, bracket or string), per ``codeop.compile_command`` (the
    interactive interpreter's test; compiles, never runs). Compile-time errors such as ``return`` outside a
    function count as invalid."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            codeop.compile_command(source, "<prefix>", "exec")
    except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError):
        return False
    return True


@functools.lru_cache(maxsize=1)
def _style_options():
    import pycodestyle

    guide = pycodestyle.StyleGuide(quiet=True, max_line_length=MAX_LINE_LENGTH)
    options = guide.options
    options.ignore = tuple(options.ignore) + _STYLE_IGNORE

    class Collect(pycodestyle.BaseReport):
        def __init__(self, opts):
            super().__init__(opts)
            self.codes: list[str] = []

        def error(self, line_number, offset, text, check):
            code = super().error(line_number, offset, text, check)
            if code:
                self.codes.append(code)
            return code

    return options, Collect


@functools.lru_cache(maxsize=8192)
def lint_violations(source: str) -> tuple[str, ...]:
    """The lint violations of `source`: pycodestyle codes (max line length `MAX_LINE_LENGTH`, its default
    selection without blank-line, end-of-file and syntax-error checks) followed by pyflakes message class
    names (unused imports and variables, undefined names, redefinitions, …; only when `source` parses)."""
    import pycodestyle
    from pyflakes.checker import Checker

    options, collect = _style_options()
    report = collect(options)
    pycodestyle.Checker(lines=source.splitlines(keepends=True), options=options, report=report).check_all()
    codes = list(report.codes)
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError):
        return tuple(codes)
    codes.extend(type(message).__name__ for message in Checker(tree, filename="<prefix>").messages)
    return tuple(codes)


@functools.lru_cache(maxsize=8192)
def code_tokens(source: str) -> tuple[str, ...]:
    """The Python tokens of `source` as strings, without layout (newlines, indents) and comments; a prefix that
    stops inside a bracket or string yields the tokens before the point tokenize gives up."""
    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type not in _LAYOUT_TOKENS:
                out.append(tok.string)
    except (tokenize.TokenError, SyntaxError):
        pass
    return tuple(out)


def similarity(source: str, reference: str) -> float:
    """``difflib.SequenceMatcher`` ratio 2·matches/(len_a + len_b) ∈ [0, 1] between the `code_tokens` of the two
    sources (1 when both are empty)."""
    return difflib.SequenceMatcher(None, code_tokens(source), code_tokens(reference), autojunk=False).ratio()


def _task(source: str, problem: dict) -> float:
    patterns = problem.get("key_patterns") or []
    if not patterns:
        return 0.0
    return sum(pattern in source for pattern in patterns) / len(patterns)


def prefix_score(
    lines: Sequence[str], problem: dict, reference_lines: Sequence[str], cfg: ProcessRewardConfig
) -> float:
    """Φ of a code prefix (DIDPO.md, "Objects").

    Components of the prefix source (each line followed by a newline):

    - syntax ∈ {0, 1}: `syntax_ok`;
    - style ≤ 0: −style_scale × the number of `lint_violations`;
    - semantic ∈ [0, 1]: `similarity` to the aligned reference prefix `reference_lines`;
    - task ∈ [0, 1]: fraction of ``problem["key_patterns"]`` (substrings) present; 0 when there are none.

    Args:
        lines: the prefix's code lines (no newlines).
        problem: the problem record (only ``key_patterns`` is read).
        reference_lines: the reference prefix aligned with this prefix (`prefix_scores` chooses it from the
            whole reference).
        cfg: the weights.

    Returns:
        w_syntax·syntax + w_style·style + w_semantic·semantic + w_task·task.
    """
    source = _source(lines)
    score = 0.0
    if cfg.w_syntax:
        score += cfg.w_syntax * float(syntax_ok(source))
    if cfg.w_style:
        score -= cfg.w_style * cfg.style_scale * len(lint_violations(source))
    if cfg.w_semantic:
        score += cfg.w_semantic * similarity(source, _source(reference_lines))
    if cfg.w_task:
        score += cfg.w_task * _task(source, problem)
    return score


def progress(lines: Sequence[str], reference_lines: Sequence[str], alignment: str = "progress") -> np.ndarray:
    """The policy's relative progress u_j ∈ [0, 1] along the reference after each of its N steps.

    "progress": u_j = j/N. "lines": lines are matched to reference lines by ``difflib.SequenceMatcher`` over
    whitespace-stripped lines; a matched line's progress is (m+1)/M for reference line m (0-based), an unmatched
    line keeps its predecessor's, the sequence is made non-decreasing (running maximum), and the last step
    reaches u_N = 1 (the finished program is compared with the finished reference).

    Returns:
        (N+1,) float64 with u_0 = 0 and, when N ≥ 1, u_N = 1; ``[0.0]`` when N = 0.

    Raises:
        ValueError: unknown alignment.
    """
    n, m = len(lines), len(reference_lines)
    if alignment not in _ALIGNMENTS:
        raise ValueError(f"alignment must be one of {_ALIGNMENTS}, got {alignment!r}")
    if n == 0:
        return np.zeros(1)
    if alignment == "progress" or m == 0:
        return np.arange(n + 1) / n
    matcher = difflib.SequenceMatcher(
        None, [line.strip() for line in lines], [line.strip() for line in reference_lines], autojunk=False
    )
    matched = np.zeros(n + 1)
    for a, b, size in matcher.get_matching_blocks():
        for k in range(size):
            matched[a + k + 1] = (b + k + 1) / m
    u = np.maximum.accumulate(matched)
    u[n] = 1.0
    return u


def _aligned_count(u: float, m: int) -> int:
    """Reference lines in the prefix aligned with progress u: the nearest whole line, ⌊u·M + ½⌋."""
    return int(np.floor(u * m + 0.5))


def prefix_scores(
    lines: Sequence[str], problem: dict, reference_lines: Sequence[str], cfg: ProcessRewardConfig
) -> np.ndarray:
    """Φ of the completion's prefixes with 0..N lines.

    Prefix j is compared (semantic component) with the reference's first ⌊u_j·M + ½⌋ lines, u_j from
    `progress` with ``cfg.alignment``.

    Returns:
        (N+1,) float64.
    """
    u = progress(lines, reference_lines, cfg.alignment)
    m = len(reference_lines)
    return np.array(
        [
            prefix_score(lines[:j], problem, reference_lines[: _aligned_count(u[j], m)], cfg)
            for j in range(len(lines) + 1)
        ],
        dtype=np.float64,
    )


def reference_curve(reference_lines: Sequence[str], problem: dict, cfg: ProcessRewardConfig) -> np.ndarray:
    """Ψ at the reference's own prefixes: Φ of its first k lines, k = 0..M (its semantic component is 1: each
    prefix is compared with itself).

    Returns:
        (M+1,) float64.
    """
    m = len(reference_lines)
    return np.array(
        [prefix_score(reference_lines[:k], problem, reference_lines[:k], cfg) for k in range(m + 1)],
        dtype=np.float64,
    )


def did_rewards(
    lines: Sequence[str], reference_lines: Sequence[str], problem: dict, cfg: ProcessRewardConfig
) -> DiDRewards:
    """DiD step rewards of a completion against the reference (DIDPO.md, "The two differences").

    Ψ(u) interpolates the reference curve linearly over the knots u = k/M; c_j = Ψ(u_j) − Ψ(u_{j−1}).

    Edge cases: N = 0 (no code) gives empty r, c, d (nothing to credit; the outcome reward alone scores the
    answer) with phi = [Φ(empty)] and progress = [0]. M = 0 (empty reference) makes Ψ constant, so c = 0 and d = r.

    Returns:
        `DiDRewards`; for N ≥ 1, Σ r = Φ_N − Φ_0 and Σ d = [Φ_N − Φ_0] − [Ψ(1) − Ψ(0)].
    """
    phi = prefix_scores(lines, problem, reference_lines, cfg)
    psi = reference_curve(reference_lines, problem, cfg)
    u = progress(lines, reference_lines, cfg.alignment)
    m = len(reference_lines)
    psi_at_u = np.full_like(u, psi[0]) if m == 0 else np.interp(u, np.arange(m + 1) / m, psi)
    r = np.diff(phi)
    c = np.diff(psi_at_u)
    return DiDRewards(phi=phi, psi=psi, r=r, c=c, d=r - c, progress=u)


def outcome_reward(passed: int, total: int, cfg: ProcessRewardConfig) -> float:
    """The verifier's outcome reward: "v2" = passed/total, "v1" = 1.0 when every test passed, else 0.0.

    A problem without tests (total = 0) earns 0.0: nothing was verified.

    Raises:
        ValueError: negative counts or passed > total.
    """
    if passed < 0 or total < 0 or passed > total:
        raise ValueError(f"need 0 <= passed <= total, got passed={passed}, total={total}")
    if total == 0:
        return 0.0
    if cfg.outcome == "v1":
        return float(passed == total)
    return passed / total


def overlong_penalty(length: int, cfg: ProcessRewardConfig) -> float:
    """DAPO soft overlong punishment (Yu et al. 2025, "DAPO", eq. 13), `length` in completion tokens:
    0 when length ≤ L_max − L_cache, (L_max − L_cache − length)/L_cache up to L_max, −1 beyond;
    always 0 when ``cfg.overlong_max`` is 0.

    Raises:
        ValueError: negative length.
    """
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    if cfg.overlong_max == 0:
        return 0.0
    free = cfg.overlong_max - cfg.overlong_cache
    if length <= free:
        return 0.0
    if length > cfg.overlong_max:
        return -1.0
    return (free - length) / cfg.overlong_cache


def format_reward(text: str) -> float:
    """1.0 when the answer holds exactly one closed fenced code block tagged python/py/python3 or untagged (the
    project's answer format), else 0.0. Blocks in other languages do not count."""
    blocks = [m for m in _FENCED_BLOCK.finditer(text) if m.group(1).lower() in _PYTHON_TAGS]
    return float(len(blocks) == 1)


def terminal_reward(passed: int, total: int, text: str, length: int, cfg: ProcessRewardConfig) -> float:
    """What goes on the last token: `outcome_reward` + w_format·`format_reward` + `overlong_penalty`."""
    reward = outcome_reward(passed, total, cfg) + overlong_penalty(length, cfg)
    if cfg.w_format:
        reward += cfg.w_format * format_reward(text)
    return reward


def token_rewards(
    step_rewards: np.ndarray, step_end_tokens: Sequence[int], outcome: float, length: int
) -> torch.Tensor:
    """Per-token rewards of one completion (DIDPO.md, "Per-token reward").

    Args:
        step_rewards: (N,) e.g. ``DiDRewards.d``.
        step_end_tokens: N token indices (from `models.code_steps.code_line_ends`); a repeated index receives
            the sum of its steps' rewards.
        outcome: the terminal reward, added on the last token (length − 1).
        length: the completion's number of tokens.

    Returns:
        (length,) float32: step_rewards[j] on token step_end_tokens[j], outcome on the last, 0 elsewhere.

    Raises:
        ValueError: length < 1, mismatched lengths, or a step index outside [0, length).
    """
    import torch

    step_rewards = np.asarray(step_rewards, dtype=np.float64).reshape(-1)
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    if len(step_rewards) != len(step_end_tokens):
        raise ValueError(f"{len(step_rewards)} step rewards but {len(step_end_tokens)} step end tokens")
    if any(not 0 <= t < length for t in step_end_tokens):
        raise ValueError(f"step end tokens must lie in [0, {length}), got {list(step_end_tokens)}")
    out = np.zeros(length)
    np.add.at(out, np.asarray(step_end_tokens, dtype=np.int64), step_rewards)
    out[length - 1] += outcome
    return torch.from_numpy(out).to(torch.float32)
