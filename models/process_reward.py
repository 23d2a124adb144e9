"""Process rewards for DiDPO version 2 (DIDPO.md): the prefix score Φ, control curves, gaps, potential-based
shaping, and the outcome reward.

For a rollout i of prompt x whose code has N_i lines (steps), DIDPO.md, "Objects" and "The two differences":

- Φ(prefix) ∈ [0, 1]: the weighted mean (weights normalised to sum 1) of four components in [0, 1] (`prefix_score`);
  prefix j is compared (semantic component) with the reference's first min(j, M) lines, so Φ depends on the
  prefix alone;
- progress u_j = min(1, j / L_x), L_x the control's mean number of lines (`progress`), known before the rollout;
- a control curve C_x(u) (`mean_control`): the mean over control rollouts of each rollout's Φ placed on its own
  relative progress k / N_c and linearly interpolated between those knots (`rollout_curve`); the mean of
  piecewise-linear curves is piecewise linear on the union of their knots, so it is stored exactly there;
- gap G_{i,j} = Φ_i(j) − C_x(u_j), G_{i,0} = 0; DiD step reward d_{i,j} = G_{i,j} − G_{i,j−1};
- shaping "potential" (default): F_{i,j} = d_{i,j} for j < N_i and F_{i,N} = −G_{i,N−1}, so Σ_j F = 0 exactly and
  the return is the outcome (Ng, Harada & Russell 1999, potential-based shaping with terminal potential 0);
  "bonus" (version 1's reading, for the ablation): F = d, Σ_j F = G_{i,N}.

The outcome R_i = V1 + w_partial·V2 (0 ≤ w_partial < 1) with a bounded format term goes on the last token
(`terminal_reward`); an answer with no code earns 0 (the verifier's reason ``no_code``). DAPO's soft overlong
penalty (`overlong_penalty`) is dapo's alone.

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

from models.config import SHAPINGS, ProcessRewardConfig
from models.sampling import _FENCED_BLOCK, _PYTHON_TAGS

if TYPE_CHECKING:
    import torch

# pycodestyle checks that do not apply to a code prefix made of steps: blank lines are not steps, so the blank-line
# rules (E3) and the end-of-file ones (W391, W292) would fire on every prefix; syntax errors (E9) are the syntax
# component's business. The rest of pycodestyle's default selection stays (its default ignore list included).
_STYLE_IGNORE = ("E3", "E9", "W391", "W292")
# The line length the project's own code uses (pyproject's ruff setting), not PEP 8's 79: prompts hold longer
# signatures, and answers should not be penalised for copying them.
MAX_LINE_LENGTH = 120
# Python tokens that carry no code content for the similarity (layout and comments).
_LAYOUT_TOKENS = {tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER, tokenize.COMMENT}
NO_CODE = "no_code"  # the verifier's reason for an answer without code of its own (`sandbox.verifier.has_no_code`)


@dataclass(frozen=True)
class DiDRewards:
    """The process terms of one rollout against its control (numpy float64).

    Attributes:
        phi: (N+1,) Φ_i(j) of the prefixes with 0..N lines.
        progress: (N+1,) u_j = min(1, j / L_x).
        control: (N+1,) C_x(u_j).
        gap: (N+1,) G_{i,j} = Φ_i(j) − C_x(u_j), with G_{i,0} = 0.
        d: (N,) d_{i,j} = G_{i,j} − G_{i,j−1}.
        shaped: (N,) F_{i,j}: potential shaping (d_j for j < N, −G_{N−1} at j = N; Σ = 0) or bonus (F = d).
    """

    phi: np.ndarray
    progress: np.ndarray
    control: np.ndarray
    gap: np.ndarray
    d: np.ndarray
    shaped: np.ndarray


@dataclass(frozen=True)
class Control:
    """A control for prompt x: its piecewise-linear curve C_x and its mean length L_x.

    Attributes:
        knots: (K,) float64, increasing progress values from 0 to 1 (the union of the control rollouts' k / N_c).
        curve: (K,) float64, C_x at the knots; `control_at` interpolates linearly between them.
        lines: L_x, the control rollouts' mean number of code lines (≥ 0).
    """

    knots: np.ndarray
    curve: np.ndarray
    lines: float


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
    """Φ of a code prefix (DIDPO.md, "Objects"): Σ_k w_k·c_k / Σ_k w_k ∈ [0, 1] over the components of the prefix
    source (each line followed by a newline):

    - syntax ∈ {0, 1}: `syntax_ok`;
    - style ∈ [0, 1]: max(0, 1 − style_scale × the number of `lint_violations`);
    - semantic ∈ [0, 1]: `similarity` to `reference_lines` (the aligned reference prefix);
    - task ∈ [0, 1]: fraction of ``problem["key_patterns"]`` (substrings) present; 0 when there are none.

    Args:
        lines: the prefix's code lines (no newlines).
        problem: the problem record (only ``key_patterns`` is read).
        reference_lines: the reference prefix aligned with this prefix (`prefix_scores` takes its first min(j, M)).
        cfg: the weights.

    Returns:
        Φ ∈ [0, 1]; 0 when every weight is 0.
    """
    total = cfg.weight_sum
    if total == 0:
        return 0.0
    source = _source(lines)
    score = 0.0
    if cfg.w_syntax:
        score += cfg.w_syntax * float(syntax_ok(source))
    if cfg.w_style:
        score += cfg.w_style * max(0.0, 1.0 - cfg.style_scale * len(lint_violations(source)))
    if cfg.w_semantic:
        score += cfg.w_semantic * similarity(source, _source(reference_lines))
    if cfg.w_task:
        score += cfg.w_task * _task(source, problem)
    return score / total


def prefix_scores(
    lines: Sequence[str], problem: dict, reference_lines: Sequence[str], cfg: ProcessRewardConfig
) -> np.ndarray:
    """Φ of the prefixes with 0..N lines; prefix j is compared with the reference's first min(j, M) lines (line
    count alignment: it depends on the prefix alone, never on the completion's final length).

    Returns:
        (N+1,) float64 in [0, 1].
    """
    return np.array(
        [prefix_score(lines[:j], problem, reference_lines[:j], cfg) for j in range(len(lines) + 1)],
        dtype=np.float64,
    )


def reference_curve(reference_lines: Sequence[str], problem: dict, cfg: ProcessRewardConfig) -> np.ndarray:
    """Ψ: Φ of the reference's own prefixes with 0..M lines (its semantic component is 1: each prefix is compared
    with itself). Returns (M+1,) float64."""
    return prefix_scores(reference_lines, problem, reference_lines, cfg)


def progress(n_steps: int, control_lines: float) -> np.ndarray:
    """u_j = min(1, j / L_x) for j = 0..N (DIDPO.md, "The two differences"); L_x = 0 (a control without code) puts
    every step j ≥ 1 at u = 1.

    Returns:
        (N+1,) float64, u_0 = 0, non-decreasing, ≤ 1.

    Raises:
        ValueError: n_steps < 0 or control_lines < 0.
    """
    if n_steps < 0 or control_lines < 0:
        raise ValueError(f"need n_steps >= 0 and control_lines >= 0, got {n_steps} and {control_lines}")
    j = np.arange(n_steps + 1, dtype=np.float64)
    if control_lines == 0:
        return np.minimum(j, 1.0)
    return np.minimum(1.0, j / control_lines)


def _own_knots(phi: np.ndarray) -> np.ndarray:
    n = phi.size - 1
    return np.array([0.0, 1.0]) if n == 0 else np.arange(n + 1) / n


def rollout_curve(phi: Sequence[float], u: np.ndarray) -> np.ndarray:
    """One control rollout's Φ placed on relative progress, read at `u`: its N_c + 1 prefix scores at u = k / N_c
    (its own length: the control is complete before any policy rollout), linearly interpolated; a rollout without
    code (N_c = 0) is the constant Φ(empty).

    Raises:
        ValueError: an empty phi.
    """
    phi = np.asarray(phi, dtype=np.float64)
    if phi.ndim != 1 or phi.size == 0:
        raise ValueError(f"phi must be a non-empty (N+1,) array, got shape {phi.shape}")
    values = np.repeat(phi, 2) if phi.size == 1 else phi
    return np.interp(np.asarray(u, dtype=np.float64), _own_knots(phi), values)


def mean_control(phis: Sequence[Sequence[float]]) -> Control:
    """The control of a set of control rollouts: C_x = the mean of their `rollout_curve`s, exact on the union of
    their knots; L_x = their mean number of lines (len(phi) − 1).

    Raises:
        ValueError: no rollouts.
    """
    if not phis:
        raise ValueError("a control needs at least one rollout")
    knots = np.unique(np.concatenate([_own_knots(np.asarray(phi)) for phi in phis]))
    curve = np.mean([rollout_curve(phi, knots) for phi in phis], axis=0)
    return Control(knots=knots, curve=curve, lines=float(np.mean([len(phi) - 1 for phi in phis])))


def control_at(control: Control, u: np.ndarray) -> np.ndarray:
    """C_x(u): the control's curve, linearly interpolated between its knots, at `u` (any shape, in [0, 1])."""
    return np.interp(np.asarray(u, dtype=np.float64), control.knots, control.curve)


def did_rewards(phi: Sequence[float], control: Control, shaping: str = "potential") -> DiDRewards:
    """Gaps, DiD step rewards and shaped step rewards of one rollout (DIDPO.md, "The two differences").

    Args:
        phi: (N+1,) Φ_i(0..N) of the rollout's prefixes (`prefix_scores`).
        control: C_x and L_x.
        shaping: "potential": F_j = d_j for j < N, F_N = −G_{N−1} (Σ_j F_j = 0 exactly); "bonus": F = d.

    Returns:
        `DiDRewards`; N = 0 (no code) gives empty d and shaped, gap = [0].

    Raises:
        ValueError: unknown shaping, or an empty phi.
    """
    if shaping not in SHAPINGS:
        raise ValueError(f"shaping must be one of {SHAPINGS}, got {shaping!r}")
    phi = np.asarray(phi, dtype=np.float64)
    if phi.ndim != 1 or phi.size == 0:
        raise ValueError(f"phi must be a non-empty (N+1,) array, got shape {phi.shape}")
    u = progress(phi.size - 1, control.lines)
    c = control_at(control, u)
    gap = phi - c
    gap[0] = 0.0  # both start from the empty prefix
    d = np.diff(gap)
    shaped = d.copy()
    if shaping == "potential" and d.size:
        shaped[-1] = -gap[-2]  # terminal potential 0: Σ_{j<N} d_j − G_{N−1} = 0
    return DiDRewards(phi=phi, progress=u, control=c, gap=gap, d=d, shaped=shaped)


def outcome_reward(passed: int, total: int, cfg: ProcessRewardConfig, reason: str = "") -> float:
    """The outcome R = V1 + w_partial·V2 (DIDPO.md, "Objects"): V1 = 1.0 when every test passed, else 0.0;
    V2 = passed / total. 0.0 for an answer with no code (`reason` "no_code") and for a problem without tests.

    Raises:
        ValueError: negative counts or passed > total.
    """
    if passed < 0 or total < 0 or passed > total:
        raise ValueError(f"need 0 <= passed <= total, got passed={passed}, total={total}")
    if total == 0 or reason == NO_CODE:
        return 0.0
    reward = float(passed == total)
    if cfg.w_partial:
        reward += cfg.w_partial * passed / total
    return reward


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


def terminal_reward(passed: int, total: int, text: str, cfg: ProcessRewardConfig, reason: str = "") -> float:
    """The return's terms on the last token: `outcome_reward` + w_format·`format_reward`; 0.0 for an answer with
    no code (nothing pays it)."""
    if reason == NO_CODE:
        return 0.0
    reward = outcome_reward(passed, total, cfg, reason)
    if cfg.w_format:
        reward += cfg.w_format * format_reward(text)
    return reward


def token_rewards(
    step_rewards: np.ndarray, step_end_tokens: Sequence[int], outcome: float, length: int
) -> torch.Tensor:
    """Per-token rewards of one completion (the critic's rewards, DIDPO.md "Advantage").

    Args:
        step_rewards: (N,) e.g. w_did·``DiDRewards.shaped``.
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
    _check_steps(len(step_rewards), step_end_tokens, length)
    out = np.zeros(length)
    np.add.at(out, np.asarray(step_end_tokens, dtype=np.int64), step_rewards)
    out[length - 1] += outcome
    return torch.from_numpy(out).to(torch.float32)


def token_gaps(gap: Sequence[float], step_end_tokens: Sequence[int], length: int) -> np.ndarray:
    """G_{i, j(t)−1} for every token t (DIDPO.md, "Advantage"): j(t) is the step token t belongs to, the first j
    with t ≤ t_j (tokens before the first step's end: step 1, G_0 = 0); tokens after the last step's end carry 0.

    Args:
        gap: (N+1,) ``DiDRewards.gap``.
        step_end_tokens: N non-decreasing token indices.
        length: tokens in the completion.

    Returns:
        (length,) float64.

    Raises:
        ValueError: as `token_rewards`, or len(gap) != N + 1.
    """
    gap = np.asarray(gap, dtype=np.float64).reshape(-1)
    if len(gap) != len(step_end_tokens) + 1:
        raise ValueError(f"{len(gap)} gaps for {len(step_end_tokens)} steps (need N + 1)")
    _check_steps(len(step_end_tokens), step_end_tokens, length)
    out, start = np.zeros(length), 0
    for j, end in enumerate(step_end_tokens, start=1):
        out[start : end + 1] = gap[j - 1]
        start = max(start, end + 1)
    return out


def _check_steps(n: int, step_end_tokens: Sequence[int], length: int) -> None:
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    if n != len(step_end_tokens):
        raise ValueError(f"{n} step rewards but {len(step_end_tokens)} step end tokens")
    if any(not 0 <= t < length for t in step_end_tokens):
        raise ValueError(f"step end tokens must lie in [0, {length}), got {list(step_end_tokens)}")
