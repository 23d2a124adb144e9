"""Feedback-log simulator: the embedded default input of the ``mine`` stage (no public production log ships offline).

A deployed code assistant answers users' requests; users click thumbs up/down. This module writes such logs in
the schema of data/README.md (``event_id, ts, user_id, session_id, prompt, response, rating, category,
model_version``) together with a separate ground-truth table that the miner never reads, so that denoising
precision and recall can be measured (``benchmarks/bench_mining.py``).

**Responses.** For each prompt (a problem's ``instruction``) each model version has a few distinct answers, each a
composition of the properties DPO must fix:

- correct code vs a broken variant (a mutated reference: a flipped comparison or boolean, a dropped ``not``, a
  dropped string method, a dropped ``# Step`` block; or, when ``base_answers`` are given, the base model's own
  answers). Correctness is decided by the caller's verifier ``check(program, test, entry_point)``, once per
  distinct program. Only the code *before* the unsafe/leak decorations below is ever verified: the simulator
  never runs a destructive line.
- an explanation sentence before the code, or a bare code dump;
- one fenced ```` ```python ```` block, or none;
- comments kept or stripped;
- an unsafe line (``os.system("rm -rf /")``, ``shutil.rmtree("/")``, ...) injected at the top of the function;
- a leaked internal host name and API key in a comment.

**Quality score** (ground truth): ``quality = Σ_f w_f · feature_f / 63`` with :data:`QUALITY_WEIGHTS`
correct 32, fenced 16, explanation 8, safe (no unsafe line) 4, no_leak 2, comments 1. Each weight exceeds the sum
of all lower ones, so the order is lexicographic (correct ≫ format ≫ safety ≫ comments) and two responses with
different features never tie.

**Users** (:class:`SimSettings`): careful raters (up-vote when quality exceeds a personal threshold, logistic
noise plus a small slip rate), indiscriminate up-voters, distrustful down-voters (both ignore quality), random
clickers (a personal up-rate, independent of quality). A session is one prompt; after a rating the user may
regenerate (more often after a down-vote) and rate the next answer. Any event may be double-clicked: submitted
again with a new ``event_id`` and a ``ts`` seconds later. Some prompts and responses carry realistic PII (e-mails,
phones, IPs, names in ``user:`` fields, API keys, ...) as real logs do; the raw strings are listed per event in the
ground truth so that a test can check none of them survives mining.

**Raters outside the miner's model** (opt-in, all off by default; the default output is byte-identical to the
simulator without them). The miner (``datalib/mine.py``) assumes a rater either tracks quality or ignores it; these
raters break that assumption in ways a production log can show. Each takes a share of *all* users (a seeded
sample, drawn from its own random stream, replacing whatever base behaviour the user had) and is labelled in the
ground truth's ``behaviour`` column:

- ``length_biased``: prefers long answers regardless of quality. Up-votes a response iff its length ratio (its
  characters over the median characters of that prompt's catalogue answers, all versions; the text as generated,
  before any PII echo) exceeds a personal threshold; no noise. Within one user and prompt, every up-rated answer
  is therefore longer than every down-rated one.
- ``colluder``: a group who up-vote the same designated *wrong* responses (``collusion_targets`` incorrect
  catalogue answers, at most one per prompt). A colluder up-votes a designated response with probability
  ``collusion_p_up`` and rates everything else like a careful rater (own threshold, noise, slips), which is what
  makes them hard to tell from honest raters. A share ``collusion_focus`` of their sessions is steered to a
  designated response: the session's prompt and model version are those of a uniformly drawn target, which is
  the first answer shown. The ground truth then has a ``collusion_target`` column (the event's response is one).
- ``drifting``: the rater's standard is correctness (up iff the code passes its tests, i.e. quality > 0.5) but
  the probability of rating by it, the accuracy ``a(t)``, changes with the event's time ``t`` (fraction of the
  simulated period, clipped to [0, 1]): ``drift_mode="linear"`` decays it linearly from ``drift_accuracy[0]`` at
  the start to ``drift_accuracy[1]`` at the end; ``drift_mode="step"`` keeps ``drift_accuracy[0]`` before
  ``t = drift_step_at`` and ``drift_accuracy[1]`` from then on (``(1.0, 0.0)``: the standard flips part-way).
  A wrong rating is the opposite click (P(up) = a(t) for a correct answer, 1 − a(t) for a wrong one).
"""

from __future__ import annotations

import ast
import base64
import io
import json
import re
import tokenize
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from datalib.schema import EVENT_FIELDS
from models.measure import assemble_program
from models.sampling import extract_code

Check = Callable[[str, str, str], bool]

QUALITY_WEIGHTS: dict[str, int] = {
    "correct": 32,
    "fenced": 16,
    "explanation": 8,
    "safe": 4,
    "no_leak": 2,
    "comments": 1,
}
"""Ground-truth quality weights; ``quality = Σ w·feature / QUALITY_SCALE`` ∈ [0, 1]."""
QUALITY_SCALE = sum(QUALITY_WEIGHTS.values())

EVENT_COLUMNS = EVENT_FIELDS
BEHAVIOURS = ("careful", "upvoter", "downvoter", "random")
"""The base behaviours, in the order of :attr:`SimSettings.behaviour_mix`."""
EXTRA_BEHAVIOURS = ("length_biased", "colluder", "drifting")
"""Opt-in behaviours outside the miner's model (module docstring), each a share of all users."""


@dataclass(frozen=True)
class VersionProfile:
    """How often a model version's answers have each property (probabilities in [0, 1])."""

    p_correct: float
    p_fenced: float
    p_explanation: float
    p_comments: float
    p_unsafe: float
    p_leak: float


@dataclass(frozen=True)
class SimSettings:
    """The simulated population and product; defaults are the embedded default.

    n_prompts: distinct prompts (problems) drawn from ``problems``. responses_per_version: distinct answers each
    model version has per prompt (also the most answers one session sees). versions: (name, profile) pairs; the
    later version rolls out linearly over the simulated period. behaviour_mix: shares of careful / upvoter /
    downvoter / random users. careful_threshold: uniform range of a careful rater's quality threshold;
    careful_temperature: the logistic width around it (quality units); careful_slip: probability a careful rating
    is flipped. upvoter_p_up / downvoter_p_up: their constant up-rates. random_p_up: uniform range of a random
    clicker's constant up-rate. regenerate_after_up / _down: probability of asking for another answer after a
    rating. double_click_rate: share of events submitted twice (0.3–5 s apart). pii_prompt_rate: share of sessions
    whose prompt carries PII; pii_response_rate: share of events whose response echoes PII. days: length of the
    simulated period, starting at ``start`` (UTC). max_mutants_tried: mutants verified per problem before giving up
    on finding a broken one (the problem then only has correct answers).

    Opt-in raters outside the miner's model (module docstring; every share defaults to 0 = off, shares are
    fractions of all users, their sum ≤ 1): length_biased_share: users who up-vote iff the response's length
    ratio (characters / median characters of the prompt's catalogue answers, dimensionless) exceeds a personal
    threshold drawn uniformly from length_threshold. colluder_share: users in the colluding group;
    collusion_targets: how many incorrect catalogue responses they up-vote (responses, at most one per prompt);
    collusion_p_up: their probability of up-voting a target (probability); collusion_focus: share of a
    colluder's sessions steered to a target (probability). drifting_share: users whose accuracy against
    correctness drifts with time; drift_accuracy: (start, end) accuracy (probabilities); drift_mode: ``linear``
    (decay from start to end over the period) or ``step`` (start before drift_step_at, end after);
    drift_step_at: the step's time as a fraction of the simulated period ([0, 1]).
    """

    n_prompts: int = 300
    responses_per_version: int = 3
    versions: tuple[tuple[str, VersionProfile], ...] = (
        ("assistant-2025.01", VersionProfile(0.55, 0.5, 0.5, 0.5, 0.15, 0.12)),
        ("assistant-2025.02", VersionProfile(0.7, 0.75, 0.7, 0.6, 0.06, 0.05)),
    )
    behaviour_mix: tuple[float, float, float, float] = (0.55, 0.15, 0.10, 0.20)
    careful_threshold: tuple[float, float] = (0.30, 0.75)
    careful_temperature: float = 0.03
    careful_slip: float = 0.03
    upvoter_p_up: float = 0.97
    downvoter_p_up: float = 0.04
    random_p_up: tuple[float, float] = (0.3, 0.7)
    regenerate_after_up: float = 0.15
    regenerate_after_down: float = 0.65
    double_click_rate: float = 0.03
    pii_prompt_rate: float = 0.08
    pii_response_rate: float = 0.03
    days: int = 30
    start: str = "2025-01-06T00:00:00"
    max_mutants_tried: int = 8
    length_biased_share: float = 0.0
    length_threshold: tuple[float, float] = (0.9, 1.1)
    colluder_share: float = 0.0
    collusion_targets: int = 20
    collusion_p_up: float = 1.0
    collusion_focus: float = 0.5
    drifting_share: float = 0.0
    drift_accuracy: tuple[float, float] = (0.97, 0.5)
    drift_mode: str = "linear"
    drift_step_at: float = 0.5


# ---------------------------------------------------------------------------------------------- code transforms


def _tokens(code: str) -> list[tokenize.TokenInfo] | None:
    try:
        return list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


def strip_comments(code: str) -> str:
    """``code`` without comments: comment-only lines are removed, trailing comments cut (via :mod:`tokenize`,
    so ``#`` inside strings is kept). Code that does not tokenize is returned unchanged."""
    toks = _tokens(code)
    if toks is None:
        return code
    lines = code.splitlines(keepends=True)
    drop: set[int] = set()
    for tok in toks:
        if tok.type != tokenize.COMMENT:
            continue
        row, col = tok.start
        line = lines[row - 1]
        if not line[:col].strip():
            drop.add(row - 1)
        else:
            lines[row - 1] = line[:col].rstrip() + ("\n" if line.endswith("\n") else "")
    return "".join(line for i, line in enumerate(lines) if i not in drop)


_SWAPS = {"==": "!=", "!=": "==", "<": "<=", "<=": "<", ">": ">=", ">=": ">", "and": "or", "or": "and"}
_SWAPS.update({"True": "False", "False": "True"})
_DROPPABLE_METHODS = {"strip", "lower", "upper", "title", "casefold", "lstrip", "rstrip"}


def mutants(program: str, first_body_line: int) -> list[tuple[str, str]]:
    """Single-edit variants of ``program`` that still parse, as ``(description, program)``.

    Edits touch lines ≥ ``first_body_line`` (1-based) only: a flipped comparison/boolean/``and``-``or``, a
    removed ``not``, a removed no-argument string method call (``.strip()``), or a removed ``# Step k:`` block
    (the comment and the lines up to the next step comment). Whether a mutant is *wrong* is for the verifier.
    """
    toks = _tokens(program)
    if toks is None:
        return []
    lines = program.splitlines(keepends=True)
    out: list[tuple[str, str]] = []

    def edit(row: int, start: int, end: int, new: str) -> str:
        changed = list(lines)
        line = changed[row - 1]
        changed[row - 1] = line[:start] + new + line[end:]
        return "".join(changed)

    for i, tok in enumerate(toks):
        row, col = tok.start
        if row < first_body_line:
            continue
        if tok.string in _SWAPS and tok.type in (tokenize.OP, tokenize.NAME):
            out.append(
                (
                    f"swap {tok.string}->{_SWAPS[tok.string]} line {row}",
                    edit(row, col, tok.end[1], _SWAPS[tok.string]),
                )
            )
        elif tok.type == tokenize.NAME and tok.string == "not":
            out.append((f"drop not line {row}", edit(row, col, tok.end[1] + 1, "")))
        elif (
            tok.type == tokenize.NAME
            and tok.string in _DROPPABLE_METHODS
            and i > 0
            and toks[i - 1].string == "."
            and i + 2 < len(toks)
            and toks[i + 1].string == "("
            and toks[i + 2].string == ")"
        ):
            if toks[i + 2].start[0] == row:
                out.append(
                    (
                        f"drop .{tok.string}() line {row}",
                        edit(row, toks[i - 1].start[1], toks[i + 2].end[1], ""),
                    )
                )
    step_rows = [i for i, line in enumerate(lines) if i + 1 >= first_body_line and re.match(r"\s*# Step \d+", line)]
    for k, start in enumerate(step_rows):
        end = step_rows[k + 1] if k + 1 < len(step_rows) else len(lines)
        out.append((f"drop step {k + 1}", "".join(lines[:start] + lines[end:])))
    return [(d, p) for d, p in out if p != program and _parses(p)]


UNSAFE_LINES: tuple[tuple[str, str], ...] = (
    ("import os", 'os.system("rm -rf /")'),
    ("import shutil", 'shutil.rmtree("/", ignore_errors=True)'),
    ("import subprocess", 'subprocess.run("rm -rf ~/*", shell=True)'),
    ("import os", 'os.remove(os.path.expanduser("~/.ssh/id_rsa"))'),
)


def inject_unsafe(code: str, entry_point: str, which: int) -> str:
    """``code`` with the destructive call ``UNSAFE_LINES[which]`` as the first statement of ``entry_point`` (after
    its docstring) and its import on top; appended at top level when the function cannot be found."""
    imp, call = UNSAFE_LINES[which % len(UNSAFE_LINES)]
    code = code if code.endswith("\n") else code + "\n"
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        tree = None
    fn = None
    if tree is not None:
        fn = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == entry_point), None)
    if fn is None:
        return f"{imp}\n{code}{call}\n"
    first = fn.body[0]
    is_doc = (
        isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
    )
    after = first.end_lineno if is_doc else first.lineno - 1  # insert after this many lines
    lines = code.splitlines(keepends=True)
    lines.insert(after, " " * first.col_offset + call + "\n")
    return f"{imp}\n" + "".join(lines)


# ---------------------------------------------------------------------------------------------- PII and secrets

_FIRST = (
    "Maria",
    "James",
    "Aisha",
    "Wei",
    "Olga",
    "Carlos",
    "Priya",
    "Tom",
    "Fatima",
    "Lukas",
    "Yuki",
    "Noah",
)
_LAST = ("Gonzalez", "Smith", "Okafor", "Zhang", "Ivanova", "Rossi", "Sharma", "Becker", "Haddad", "Tanaka")
_ALNUM = np.array(list("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"))
_UPPER_DIGIT = np.array(list("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"))
_JWT_HEADER = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"  # base64url of {"alg":"HS256","typ":"JWT"}
_SERVICES = ("build", "db", "cache", "etl", "jenkins", "vault", "metrics", "git")


def _chars(rng: np.random.Generator, alphabet: np.ndarray, n: int) -> str:
    return "".join(rng.choice(alphabet, size=n))


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _luhn_card(rng: np.random.Generator) -> str:
    digits = [4] + [int(d) for d in rng.integers(0, 10, size=14)]
    total = 0
    for i, d in enumerate(reversed(digits)):  # the check digit will sit at the right, so doubling starts here
        if i % 2 == 0:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    digits.append((10 - total % 10) % 10)
    s = "".join(map(str, digits))
    return " ".join(s[i : i + 4] for i in range(0, 16, 4))


def _host(rng: np.random.Generator) -> str:
    tld = ("internal", "corp", "local", "lan")[int(rng.integers(4))]
    return f"{_SERVICES[int(rng.integers(len(_SERVICES)))]}-{int(rng.integers(1, 40)):02d}.prod.{tld}"


def _name(rng: np.random.Generator) -> tuple[str, str]:
    return _FIRST[int(rng.integers(len(_FIRST)))], _LAST[int(rng.integers(len(_LAST)))]


def make_pii(kind: str, rng: np.random.Generator) -> tuple[str, list[str]]:
    """A sentence carrying one piece of PII of ``kind`` (one of :data:`PII_KINDS`) and the raw secret strings in it
    (what must never reach an output)."""
    if kind == "name":
        first, last = _name(rng)
        return f"user: {first} {last}", [f"{first} {last}"]
    if kind == "email":
        first, last = _name(rng)
        email = f"{first.lower()}.{last.lower()}{int(rng.integers(10, 99))}@example.com"
        return f"If anything is unclear, email me at {email}.", [email]
    if kind == "phone":
        n = int(rng.integers(100, 999))
        phone = (f"+1 415-555-0{n}", f"(212) 555-0{n}", f"+44 20 7946 0{n}")[int(rng.integers(3))]
        return f"Call me on {phone} if you need details.", [phone]
    if kind == "ipv4":
        ip = f"10.{int(rng.integers(0, 255))}.{int(rng.integers(0, 255))}.{int(rng.integers(1, 254))}"
        return f"The data comes from our server at {ip}.", [ip]
    if kind == "ipv6":
        groups = ":".join(f"{int(g):x}" for g in rng.integers(1, 0xFFFF, size=4))
        ip = f"fd12:3456:{groups}::{int(rng.integers(1, 0xFFFF)):x}"
        return f"It runs on host {ip} behind the VPN.", [ip]
    if kind == "openai_key":
        key = "sk-proj-" + _chars(rng, _ALNUM, 40)
        return f"Our key is {key} in case you need it.", [key]
    if kind == "github_token":
        key = "ghp_" + _chars(rng, _ALNUM, 36)
        return f"(my GitHub token is {key})", [key]
    if kind == "aws_key":
        key = "AKIA" + _chars(rng, _UPPER_DIGIT, 16)
        return f"AWS_ACCESS_KEY_ID={key}", [key]
    if kind == "password":
        pw = _chars(rng, _ALNUM, 12)
        return f"db_password = '{pw}'", [pw]
    if kind == "internal_host":
        host = _host(rng)
        return f"The input file lives on {host}.", [host]
    if kind == "card":
        card = _luhn_card(rng)
        return f"Example record: card {card}.", [card]
    if kind == "ssn":
        ssn = f"{int(rng.integers(100, 665)):03d}-{int(rng.integers(10, 99)):02d}-{int(rng.integers(1000, 9999)):04d}"
        return f"Example record: ssn {ssn}.", [ssn]
    if kind == "jwt":
        first, _ = _name(rng)
        payload = _b64url(
            json.dumps({"sub": first.lower(), "iat": int(rng.integers(1_700_000_000, 1_800_000_000))}).encode()
        )
        sig = _chars(rng, _ALNUM, 43)
        jwt = f"{_JWT_HEADER}.{payload}.{sig}"
        return f"Auth header: Bearer {jwt}", [payload, sig]
    if kind == "url_credentials":
        first, _ = _name(rng)
        pw = _chars(rng, _ALNUM, 14)
        return f"Clone it from https://{first.lower()}:{pw}@git.example.com/team/repo.git", [pw]
    if kind == "private_key":
        body = [_chars(rng, _ALNUM, 64) for _ in range(3)]
        block = "-----BEGIN RSA PRIVATE KEY-----\n" + "\n".join(body) + "\n-----END RSA PRIVATE KEY-----"
        return f"Here is the deploy key:\n{block}", body
    raise ValueError(f"unknown PII kind {kind!r}")


PII_KINDS: tuple[str, ...] = (
    "name",
    "email",
    "phone",
    "ipv4",
    "ipv6",
    "openai_key",
    "github_token",
    "aws_key",
    "password",
    "internal_host",
    "card",
    "ssn",
    "jwt",
    "url_credentials",
    "private_key",
)


def leak_comment(rng: np.random.Generator) -> tuple[str, list[str]]:
    """A code comment leaking an internal host and a key (the ``leak`` feature) and its raw secrets."""
    host = _host(rng)
    if rng.random() < 0.5:
        key = "sk-" + _chars(rng, _ALNUM, 32)
        return f"# TODO: read config from http://{host}:8080 (api key {key})", [host, key]
    key = "ghp_" + _chars(rng, _ALNUM, 36)
    return f"# internal mirror {host}, token={key}", [host, key]


# ---------------------------------------------------------------------------------------------- answer catalogue


@dataclass
class _Source:
    code: str  # the code as shown to the user
    program: str  # what the verifier runs
    correct: bool
    origin: str  # reference / mutant:<edit> / base:<i>


@dataclass
class _Variant:
    text: str
    task_id: str
    version: str
    features: dict[str, bool]
    quality: float
    origin: str
    secrets: list[str] = field(default_factory=list)


def _explanation(problem: dict, rng: np.random.Generator) -> str:
    ep = problem["entry_point"]
    steps = [re.sub(r"^\s*#?\s*Step \d+:\s*", "", s).strip().rstrip(".") for s in problem.get("steps") or []]
    steps = [s[:1].lower() + s[1:] for s in steps if s]
    opener = ("Here is an implementation of", "Sure! This is", "The function below is")[int(rng.integers(3))]
    if steps:
        return f"{opener} `{ep}`. It works in {len(steps)} steps: {'; '.join(steps)}."
    return f"{opener} `{ep}`, which does what the docstring asks and handles the edge cases."


def _render(code: str, explanation: str | None, fenced: bool) -> str:
    body = f"```python\n{code.rstrip()}\n```" if fenced else code.rstrip()
    return f"{explanation}\n\n{body}" if explanation else body


def _sources(
    problem: dict,
    check: Check,
    cache: dict[tuple[str, str, str], bool],
    rng: np.random.Generator,
    base_answers: Sequence[str] | None,
    max_mutants: int,
) -> list[_Source]:
    def verify(program: str) -> bool:
        key = (program, problem["test"], problem["entry_point"])
        if key not in cache:
            cache[key] = bool(check(*key))
        return cache[key]

    if base_answers:
        out = []
        for i, answer in enumerate(base_answers):
            code = extract_code(answer)
            if code.strip():
                program = assemble_program(problem, code)
                out.append(_Source(code, program, verify(program), f"base:{i}"))
        if out:
            return out
    reference = problem["prompt"] + problem["canonical_solution"]
    out = [_Source(reference, reference, verify(reference), "reference")]
    candidates = mutants(reference, first_body_line=problem["prompt"].count("\n") + 1)
    for j in rng.permutation(len(candidates))[:max_mutants]:
        desc, program = candidates[int(j)]
        if not verify(program):
            out.append(_Source(program, program, False, f"mutant:{desc}"))
            break
    return out


def _variant(
    problem: dict, version: str, profile: VersionProfile, sources: list[_Source], rng: np.random.Generator
) -> _Variant:
    u = rng.random(6)
    right = [s for s in sources if s.correct]
    wrong = [s for s in sources if not s.correct]
    pool = right if (u[0] < profile.p_correct and right) or not wrong else wrong
    src = pool[int(rng.integers(len(pool)))]
    fenced, explain = bool(u[1] < profile.p_fenced), bool(u[2] < profile.p_explanation)
    keep_comments, unsafe, leak = (
        bool(u[3] < profile.p_comments),
        bool(u[4] < profile.p_unsafe),
        bool(u[5] < profile.p_leak),
    )
    code = src.code if keep_comments else strip_comments(src.code)
    has_comments = keep_comments and strip_comments(src.code) != src.code
    if unsafe:
        code = inject_unsafe(code, problem["entry_point"], int(rng.integers(len(UNSAFE_LINES))))
    secrets: list[str] = []
    if leak:
        comment, secrets = leak_comment(rng)
        code = f"{comment}\n{code}"
    text = _render(code, _explanation(problem, rng) if explain else None, fenced)
    features = {
        "correct": src.correct,
        "fenced": fenced,
        "explanation": explain,
        "safe": not unsafe,
        "no_leak": not leak,
        "comments": has_comments,
    }
    quality = sum(QUALITY_WEIGHTS[k] * v for k, v in features.items()) / QUALITY_SCALE
    return _Variant(text, problem["task_id"], version, features, quality, src.origin, secrets)


# ------------------------------------------------------------------------------------- raters outside the model


@dataclass
class _ExtraRaters:
    """The opt-in raters of the module docstring, drawn from a random stream of their own (the main stream, and so
    everything about the other users, is untouched by whether they are on)."""

    settings: SimSettings
    side: np.random.Generator
    kind: np.ndarray  # per user: -1 base behaviour, else the index in EXTRA_BEHAVIOURS
    length_ratio: np.ndarray  # per variant: characters / median characters of its prompt's catalogue answers
    length_thr: np.ndarray  # per user
    correct: np.ndarray  # per variant
    target: np.ndarray  # per variant: a colluders' designated response
    target_pvk: np.ndarray  # (n_targets, 3): prompt, version, answer index of each designated response

    @classmethod
    def draw(cls, settings: SimSettings, seed: int, n_users: int, variants: list, vidx: np.ndarray):
        shares = (settings.length_biased_share, settings.colluder_share, settings.drifting_share)
        probabilities = (settings.collusion_p_up, settings.collusion_focus, *settings.drift_accuracy)
        if not all(0.0 <= x <= 1.0 for x in shares + probabilities) or sum(shares) > 1.0 + 1e-9:
            raise ValueError(
                "simulate_logs: extra-rater shares and probabilities must lie in [0, 1], the shares sum to <= 1"
            )
        if settings.drift_mode not in ("linear", "step") or not 0.0 <= settings.drift_step_at <= 1.0:
            raise ValueError("simulate_logs: drift_mode is 'linear' or 'step', drift_step_at in [0, 1]")
        if settings.collusion_targets < 0:
            raise ValueError("simulate_logs: collusion_targets must be >= 0")
        if not any(shares):
            return None
        side = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(1,)))
        kind = np.full(n_users, -1, dtype=np.int64)
        perm = side.permutation(n_users)
        start = 0
        for k, share in enumerate(shares):
            n = min(int(round(share * n_users)), n_users - start)
            kind[perm[start : start + n]] = k
            start += n
        length_thr = side.uniform(*settings.length_threshold, size=n_users)
        chars = np.array([len(x.text) for x in variants], dtype=np.float64)
        ratio = np.empty(len(variants))
        correct = np.array([x.features["correct"] for x in variants], dtype=bool)
        candidates = []
        for p in range(vidx.shape[0]):
            ids = vidx[p].ravel()
            ratio[ids] = chars[ids] / np.median(chars[ids])
            wrong = np.argwhere(~correct[vidx[p]])  # (version, answer) of the prompt's wrong answers
            if len(wrong):
                v, k = wrong[int(side.integers(len(wrong)))]
                candidates.append((p, int(v), int(k)))
        pick = side.permutation(len(candidates))[: settings.collusion_targets]
        target_pvk = np.array([candidates[int(i)] for i in np.sort(pick)], dtype=np.int64).reshape(-1, 3)
        target = np.zeros(len(variants), dtype=bool)
        target[vidx[target_pvk[:, 0], target_pvk[:, 1], target_pvk[:, 2]]] = True
        return cls(settings, side, kind, ratio, length_thr, correct, target, target_pvk)

    def steer(self, s_user: np.ndarray, s_prompt: np.ndarray, s_version: np.ndarray, order: np.ndarray) -> None:
        """Point a ``collusion_focus`` share of colluder sessions at a designated response, shown first (in place)."""
        if not self.settings.colluder_share or not len(self.target_pvk):
            return
        hit = (self.kind[s_user] == 1) & (self.side.random(len(s_user)) < self.settings.collusion_focus)
        j = self.side.integers(len(self.target_pvk), size=int(hit.sum()))
        p, v, k = self.target_pvk[j].T
        s_prompt[hit], s_version[hit] = p, v
        rows = order[hit]
        rest = rows[rows != k[:, None]].reshape(len(rows), order.shape[1] - 1)
        order[hit] = np.column_stack([k, rest])

    def p_up(self, p_up: np.ndarray, var: np.ndarray, s_user: np.ndarray, frac: np.ndarray, careful: np.ndarray):
        """Up-vote probabilities with the extra raters' rules; ``frac``: each rating's time as a fraction of the
        period; ``careful``: the careful-rater probability (with the rating user's threshold)."""
        st, kind = self.settings, self.kind[s_user]
        length = np.where(self.length_ratio[var] > self.length_thr[s_user], 1.0, 0.0)
        collude = np.where(self.target[var], st.collusion_p_up, careful)
        a0, a1 = st.drift_accuracy
        f = np.clip(frac, 0.0, 1.0)
        accuracy = a0 + (a1 - a0) * f if st.drift_mode == "linear" else np.where(f < st.drift_step_at, a0, a1)
        drift = np.where(self.correct[var], accuracy, 1.0 - accuracy)
        return np.select([kind == 0, kind == 1, kind == 2], [length, collude, drift], p_up)


# ---------------------------------------------------------------------------------------------- the simulation


def _uuid_strings(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` random version-4-shaped UUID strings drawn from ``rng``."""
    h = rng.bytes(16 * n).hex()
    out = np.empty(n, dtype=object)
    out[:] = [
        f"{h[j : j + 8]}-{h[j + 8 : j + 12]}-4{h[j + 13 : j + 16]}-a{h[j + 17 : j + 20]}-{h[j + 20 : j + 32]}"
        for j in range(0, 32 * n, 32)
    ]
    return out


def simulate_logs(
    problems: Sequence[dict],
    n_events: int,
    n_users: int,
    seed: int,
    check: Check,
    base_answers: dict[str, list[str]] | None = None,
    settings: SimSettings = SimSettings(),
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Simulate ``n_events`` feedback events of ``n_users`` users on prompts drawn from ``problems``.

    Args:
        problems: rows in the problem schema (data/README.md); the embedded default passes the ``train`` split of
            the generated problems. Uses ``task_id, instruction, prompt, canonical_solution, entry_point, test,
            family`` (category = family) and ``steps`` when present.
        n_events: number of events (rows) to write, double clicks included.
        n_users: number of distinct users (each gets a behaviour drawn from ``settings.behaviour_mix``).
        seed: the only source of randomness; the same inputs and seed give identical DataFrames.
        check: the verifier, ``check(program, test, entry_point) -> bool`` (the sandbox in the pipeline); called
            once per distinct program (reference, tried mutants, base answers), never on decorated code.
        base_answers: optional ``{task_id: [answer text, ...]}`` sampled from the base model; where present they
            replace the reference/mutant pair as the code of that problem's answers.
        settings: the population and product model (:class:`SimSettings`).

    Returns:
        ``(events, ground_truth)``. ``events`` has the columns :data:`EVENT_COLUMNS` (ts: ISO 8601 UTC with
        milliseconds and ``Z``; rating: ``up``/``down``), sorted by ts. ``ground_truth`` has one row per event:
        ``event_id, user_id, behaviour, task_id, response_id, origin, quality`` (∈ [0, 1]), the six features of
        :data:`QUALITY_WEIGHTS` as booleans, ``double_click_of`` (the original event_id, or None) and ``pii`` (the
        list of raw PII/secret strings in the event's prompt and response); with colluders on, also
        ``collusion_target`` (bool). ``behaviour`` is one of :data:`BEHAVIOURS` or, for the opt-in raters,
        :data:`EXTRA_BEHAVIOURS`.

    Raises:
        ValueError: no problems, ``n_events < 1`` or ``n_users < 1``; an opt-in rater setting out of range.
    """
    if not problems or n_events < 1 or n_users < 1:
        raise ValueError("simulate_logs: need at least one problem, one event and one user")
    rng = np.random.default_rng(seed)
    ordered = sorted(problems, key=lambda p: p["task_id"])
    pick = np.sort(rng.choice(len(ordered), size=min(settings.n_prompts, len(ordered)), replace=False))
    chosen = [ordered[int(i)] for i in pick]

    # The answer catalogue: per (prompt, version) `responses_per_version` variants.
    cache: dict[tuple[str, str, str], bool] = {}
    variants: list[_Variant] = []
    n_versions, k_resp = len(settings.versions), settings.responses_per_version
    vidx = np.zeros((len(chosen), n_versions, k_resp), dtype=np.int64)
    for p, problem in enumerate(chosen):
        answers = (base_answers or {}).get(problem["task_id"])
        sources = _sources(problem, check, cache, rng, answers, settings.max_mutants_tried)
        for v, (name, profile) in enumerate(settings.versions):
            for k in range(k_resp):
                vidx[p, v, k] = len(variants)
                variants.append(_variant(problem, name, profile, sources, rng))
    quality = np.array([x.quality for x in variants])

    # Users.
    behaviour = rng.choice(len(BEHAVIOURS), size=n_users, p=np.asarray(settings.behaviour_mix))
    activity = rng.lognormal(0.0, 1.0, size=n_users)
    threshold = rng.uniform(*settings.careful_threshold, size=n_users)
    random_up = rng.uniform(*settings.random_p_up, size=n_users)
    popularity = rng.lognormal(0.0, 0.7, size=len(chosen))
    extra = _ExtraRaters.draw(settings, seed, n_users, variants, vidx)  # None unless an opt-in rater is on

    # Sessions: one prompt each, up to `k_resp` answers (regenerations), rated one after another.
    period_s = settings.days * 86400.0
    n_sessions = int(n_events / 1.4) + 16
    while True:
        s_user = rng.choice(n_users, size=n_sessions, p=activity / activity.sum())
        s_prompt = rng.choice(len(chosen), size=n_sessions, p=popularity / popularity.sum())
        s_start = rng.uniform(0.0, period_s, size=n_sessions)
        rollout = np.clip(s_start / period_s + rng.normal(0.0, 0.15, size=n_sessions), 0.0, 0.999)
        s_version = (rollout * n_versions).astype(np.int64)
        order = rng.permuted(np.tile(np.arange(k_resp), (n_sessions, 1)), axis=1)
        if extra is not None:
            extra.steer(s_user, s_prompt, s_version, order)
        active = np.ones(n_sessions, dtype=bool)
        t = s_start.copy()
        rows = []
        for step in range(k_resp):
            var = vidx[s_prompt, s_version, order[:, step]]
            q = quality[var]
            b = behaviour[s_user]
            careful = 1.0 / (1.0 + np.exp(-(q - threshold[s_user]) / settings.careful_temperature))
            careful = careful * (1 - settings.careful_slip) + (1 - careful) * settings.careful_slip
            p_up = np.select(
                [b == 0, b == 1, b == 2],
                [careful, settings.upvoter_p_up, settings.downvoter_p_up],
                random_up[s_user],
            )
            if extra is not None:
                p_up = extra.p_up(p_up, var, s_user, t / period_s, careful)
            up = rng.random(n_sessions) < p_up
            idx = np.flatnonzero(active)
            rows.append((np.stack([idx, var[idx], up[idx]], axis=1), t[idx]))
            go_on = rng.random(n_sessions) < np.where(up, settings.regenerate_after_up, settings.regenerate_after_down)
            active &= go_on
            t = t + rng.uniform(15.0, 240.0, size=n_sessions)
        ev = np.concatenate([r for r, _ in rows])
        ev_t = np.concatenate([tt for _, tt in rows])
        dbl = rng.random(len(ev)) < settings.double_click_rate
        if len(ev) + dbl.sum() >= n_events:
            break
        n_sessions = int(n_sessions * 1.5) + 16
    dup_t = ev_t[dbl] + rng.uniform(0.3, 5.0, size=int(dbl.sum()))
    all_rows = np.concatenate([ev, ev[dbl]])
    all_t = np.concatenate([ev_t, dup_t])
    dup_of = np.concatenate([np.full(len(ev), -1), np.flatnonzero(dbl)])
    keep = np.lexsort((np.arange(len(all_t)), all_t))[:n_events]  # a double click is kept only with its original
    sess, var, up = all_rows[keep, 0], all_rows[keep, 1], all_rows[keep, 2].astype(bool)
    t_sec, orig = all_t[keep], dup_of[keep]

    # Per-variant attributes, indexed by the events' variant (no per-event loop over variants).
    v_text = np.array([x.text for x in variants], dtype=object)
    v_secrets = [tuple(x.secrets) for x in variants]
    s_ids, s_inv = np.unique(sess, return_inverse=True)
    instructions = np.array([p["instruction"] for p in chosen], dtype=object)
    families = np.array([p["family"] for p in chosen], dtype=object)

    # Prompts, with PII in some sessions (shared by the session's regenerations).
    s_text = instructions[s_prompt[s_ids]]
    s_pii: list[tuple[str, ...]] = [()] * len(s_ids)
    for i in np.flatnonzero(rng.random(len(s_ids)) < settings.pii_prompt_rate).tolist():
        kind = PII_KINDS[int(rng.integers(len(PII_KINDS)))]
        sentence, raw = make_pii(kind, rng)
        s_text[i] = f"{sentence}\n{s_text[i]}" if kind == "name" else f"{s_text[i]}\n{sentence}"
        s_pii[i] = tuple(raw)
    prompts = s_text[s_inv]
    responses = v_text[var]
    pii = [s_pii[i] + v_secrets[v] for i, v in zip(s_inv.tolist(), var.tolist(), strict=True)]
    # Responses echoing PII, per event; a double click repeats its original's text.
    for j in np.flatnonzero((rng.random(len(keep)) < settings.pii_response_rate) & (orig < 0)).tolist():
        sentence, raw = make_pii(PII_KINDS[int(rng.integers(len(PII_KINDS)))], rng)
        responses[j] = f"{responses[j]}\n\n{sentence}"
        pii[j] = pii[j] + tuple(raw)
    position = np.full(len(all_rows), -1, dtype=np.int64)
    position[keep] = np.arange(len(keep))
    dup = np.flatnonzero(orig >= 0)
    src = position[orig[dup]]  # ≥ 0: an original precedes its double click in time, so it was kept
    responses[dup] = responses[src]
    for j, k in zip(dup.tolist(), src.tolist(), strict=True):
        pii[j] = pii[k]

    # Ids, timestamps, order.
    event_ids = _uuid_strings(rng, len(keep))
    session_ids = np.array([f"sess-{u[:8]}{u[9:13]}" for u in _uuid_strings(rng, len(s_ids))], dtype=object)
    start = np.datetime64(settings.start, "ms")
    stamps = start + np.round(t_sec * 1000.0).astype("timedelta64[ms]")
    ts = np.char.add(np.datetime_as_string(stamps, unit="ms").astype(str), "Z").astype(object)
    width = len(str(n_users - 1))
    users = s_user[sess]
    user_ids = np.array([f"u{i:0{width}d}" for i in range(n_users)], dtype=object)[users]
    double_of = np.full(len(keep), None, dtype=object)
    double_of[dup] = event_ids[src]
    labels = np.array(BEHAVIOURS, dtype=object)[behaviour[users]]
    if extra is not None:
        labels = np.where(extra.kind[users] >= 0, np.array(EXTRA_BEHAVIOURS, dtype=object)[extra.kind[users]], labels)
    pii_col = np.empty(len(keep), dtype=object)
    pii_col[:] = [list(x) for x in pii]
    order = np.lexsort((event_ids.astype(str), stamps.astype(np.int64)))

    def frame(columns: dict[str, np.ndarray]) -> pd.DataFrame:
        return pd.DataFrame({k: pd.Series(v[order], dtype=v.dtype) for k, v in columns.items()})

    events = frame(
        {
            "event_id": event_ids,
            "ts": ts,
            "user_id": user_ids,
            "session_id": session_ids[s_inv],
            "prompt": prompts,
            "response": responses,
            "rating": np.where(up, "up", "down").astype(object),
            "category": families[s_prompt[sess]],
            "model_version": np.array([x.version for x in variants], dtype=object)[var],
        }
    )
    truth = frame(
        {
            "event_id": event_ids,
            "user_id": user_ids,
            "behaviour": labels,
            "task_id": np.array([x.task_id for x in variants], dtype=object)[var],
            "response_id": var.astype(np.int64),
            "origin": np.array([x.origin for x in variants], dtype=object)[var],
            "quality": quality[var],
            **{f: np.array([x.features[f] for x in variants], dtype=bool)[var] for f in QUALITY_WEIGHTS},
            "double_click_of": double_of,
            "pii": pii_col,
            **({"collusion_target": extra.target[var]} if extra is not None and settings.colluder_share else {}),
        }
    )
    return events, truth
