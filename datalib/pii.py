"""PII and secret scrubbing: regex rules that replace personal data and credentials by typed placeholders.

Every text that leaves the ``mine`` stage (pairs, reports, quarantine rows, MLflow artifacts) goes
through :func:`scrub_text` / :func:`scrub_series` first. The rules run in the order of :data:`RULES`:
credentials embedded in larger structures first (private-key blocks, JWTs, URLs with a password) so
that a broader rule cannot split them; each replaces its match with a placeholder that no later rule
matches again.

Placeholders and what they replace:

- ``<SECRET>``: PEM private-key blocks, JWTs, the ``user:password`` part of URLs, vendor API keys
  (OpenAI ``sk-``, GitHub ``ghp_``/``github_pat_``, AWS ``AKIA``/``ASIA``, Slack ``xox?-``, Google
  ``AIza``, GitLab ``glpat-``, Stripe ``sk_live_``, Hugging Face ``hf_``), the token after ``Bearer``
  (16+ characters with a digit) and the value after ``api_key=`` / ``token:`` / ``password=``-style keys;
- ``<EMAIL>``: e-mail addresses;
- ``<HOST>``: internal host names (``*.internal``, ``*.corp``, ``*.local``, ``*.lan``,
  ``*.intranet``, ``*.localdomain``);
- ``<IP>``: IPv4 and IPv6 addresses (IPv6 candidates are validated with :mod:`ipaddress`);
- ``<CARD>``: 13-19 digit card numbers (optionally grouped by spaces/dashes) passing the Luhn check;
- ``<SSN>``: US social-security numbers ``ddd-dd-dddd``;
- ``<PHONE>``: phone numbers in international or grouped national form (``+1 415 555 0132``,
  ``(415) 555-0132``);
- ``<NAME>``: the value of a ``user:`` / ``username:`` / ``name:`` / ``author:`` / ``customer:``
  field that starts a line (optionally after ``#``, ``//``, ``>``, ``*`` or ``-``).

The rules are tuned for texts that mix prose and Python: a keyed secret must be a quoted literal of
4+ characters or an unquoted token of 16+ characters with a digit, so ``key = k.strip()`` or
``token = tokens[0]`` is kept; names are taken only from line-leading fields, so a ``name: str``
annotation in a signature is kept. Regex scrubbing is a floor, not a guarantee: names in free prose
are not detected.

Identifiers (user and session ids, ...) must stay usable as keys, so a placeholder would merge every
user whose id is an e-mail: :func:`pseudonym` replaces such an identifier with a stable opaque one.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc


@dataclass(frozen=True)
class Rule:
    """One scrubbing rule.

    kind: its name in reports. pattern: what is replaced (Python ``re``, ASCII semantics).
    repl: a template or a callable (which may return the match unchanged to reject it).
    trigger: a cheaper pattern matching every text that ``pattern`` could change (a superset, in the
    common subset of Python ``re`` and RE2 syntax); :func:`scrub_series` runs ``pattern`` only on
    the texts this RE2 pre-filter flags.
    """

    kind: str
    pattern: re.Pattern[str]
    repl: str | Callable[[re.Match[str]], str]
    trigger: str


def _luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card_repl(m: re.Match[str]) -> str:
    digits = re.sub(r"\D", "", m.group(0))
    return "<CARD>" if 13 <= len(digits) <= 19 and _luhn_ok(digits) else m.group(0)


def _ipv6_repl(m: re.Match[str]) -> str:
    text = m.group(0)
    # ``x[1::2]`` is a slice, not an address: require at least three hex groups besides validating.
    if sum(1 for g in text.split(":") if g) < 3:
        return text
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return text
    return "<IP>"


_SECRET_NAME = re.compile(
    r"api[_-]?key|apikey|access[_-]?key|secret|token|bearer|passw(?:or)?d|pwd|private[_-]?key|credential",
    re.I,
)


def _bearer_repl(m: re.Match[str]) -> str:
    # Like an unquoted keyed secret, the token must have a digit: prose ("the bearer of good news") is kept.
    return f"{m.group(1)}<SECRET>" if any(ch.isdigit() for ch in m.group(2)) else m.group(0)


def _keyed_secret_repl(m: re.Match[str]) -> str:
    name, sep, quote, quoted, bare = m.group(1, 2, 3, 4, 5)
    if not _SECRET_NAME.search(name):
        return m.group(0)
    if quoted is not None:
        return m.group(0) if quoted == "<SECRET>" else f"{name}{sep}{quote}<SECRET>{quote}"
    # An unquoted value counts only when it looks like a token (has a digit): ``token = tokens0[i]`` is kept.
    if not any(ch.isdigit() for ch in bare):
        return m.group(0)
    return f"{name}{sep}<SECRET>"


_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_A = re.ASCII

RULES: tuple[Rule, ...] = (
    Rule(
        "private_key",
        re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)", re.S | _A),
        "<SECRET>",
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----",
    ),
    Rule(
        "jwt",
        re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", _A),
        "<SECRET>",
        r"eyJ[A-Za-z0-9_-]{8,}\.eyJ",
    ),
    Rule(
        "url_credentials",
        re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)[^\s/:@]+:[^\s/@]+@", _A),
        r"\1<SECRET>@",
        r"://[^\s/:@]+:[^\s/@]+@",
    ),
    Rule(
        "api_key",
        re.compile(
            r"\b(?:sk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,}"
            r"|(?:AKIA|ASIA)[0-9A-Z]{16}|xox[abposr]-[A-Za-z0-9-]{10,}|AIza[0-9A-Za-z_-]{35}"
            r"|glpat-[A-Za-z0-9_-]{20,}|(?:sk|rk|pk)_live_[A-Za-z0-9]{16,}|hf_[A-Za-z0-9]{30,})",
            _A,
        ),
        "<SECRET>",
        r"(?:sk-|gh[pousr]_|github_pat_|AKIA|ASIA|xox[abposr]-|AIza|glpat-|_live_|hf_)[A-Za-z0-9_-]{10}",
    ),
    Rule(
        "bearer",
        re.compile(r"\b((?i:bearer)[ \t]+)([A-Za-z0-9._~+/-]{16,}=*)", _A),
        _bearer_repl,
        r"(?i)bearer[ \t]+[A-Za-z0-9._~+/-]{16}",
    ),
    Rule(
        "keyed_secret",
        re.compile(
            r"\b([A-Za-z_][A-Za-z0-9_-]*)([\"']?[ \t]*[:=][ \t]*)"
            r"(?:([\"'])([^\"'\s]{4,})\3|([A-Za-z0-9+/_.-]{16,}=*))",
            _A,
        ),
        _keyed_secret_repl,
        r"(?i)(?:key|secret|token|bearer|passw|pwd|credential)[A-Za-z0-9_-]*[\"']?[ \t]*[:=][ \t]*"
        r"(?:[\"'][^\"'\s]{4,}[\"']|[A-Za-z0-9+/_.-]{16,})",
    ),
    Rule(
        "email",
        re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b", _A),
        "<EMAIL>",
        r"[A-Za-z0-9._%+-]@[A-Za-z0-9-]+\.",
    ),
    Rule(
        "internal_host",
        re.compile(
            r"\b(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)+(?:internal|corp|local|lan|intranet|localdomain)\b"
            r"(?![\w-]|\s*\()",
            re.I | _A,
        ),
        "<HOST>",
        r"(?i)\.(?:internal|corp|local|lan|intranet|localdomain)",
    ),
    Rule(
        "ipv6",
        re.compile(r"(?<![\w:.])(?:[0-9A-Fa-f]{1,4})?(?::[0-9A-Fa-f]{0,4}){2,7}(?:%\w+)?(?![\w:])", _A),
        _ipv6_repl,
        r"[0-9A-Fa-f]:[0-9A-Fa-f]*:[0-9A-Fa-f]*:",
    ),
    Rule(
        "ipv4",
        re.compile(rf"(?<![\w.]){_OCTET}(?:\.{_OCTET}){{3}}(?!\.?\d)(?!\w)", _A),
        "<IP>",
        r"\d\.\d{1,3}\.\d{1,3}\.\d",
    ),
    Rule("card", re.compile(r"(?<![\w.-])\d(?:[ -]?\d){12,18}(?![\w-])", _A), _card_repl, r"\d(?:[ -]?\d){12}"),
    Rule("ssn", re.compile(r"(?<![\w-])\d{3}-\d{2}-\d{4}(?![\w-])", _A), "<SSN>", r"\d{3}-\d{2}-\d{4}"),
    Rule(
        "phone",
        re.compile(
            r"(?<![\w.+-])(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,4}\)[ .-]?|\d{2,4}[ .-])\d{3,4}[ .-]\d{3,4}"
            r"(?![\w.-]?\d)(?!\w)",
            _A,
        ),
        "<PHONE>",
        r"\d{3,4}[ .-]\d{3,4}",
    ),
    Rule(
        "name_field",
        re.compile(
            r"^([ \t]*(?:#|//|>|\*|-)?[ \t]*(?:user|username|name|author|customer)[ \t]*:[ \t]*)"
            r"(?!<NAME>)\S[^\n]*",
            re.I | re.M | _A,
        ),
        r"\1<NAME>",
        r"(?im)^[ \t]*(?:#|//|>|\*|-)?[ \t]*(?:user|username|name|author|customer)[ \t]*:",
    ),
)
"""The rules, in the order they are applied."""

PLACEHOLDERS: tuple[str, ...] = (
    "<SECRET>",
    "<EMAIL>",
    "<HOST>",
    "<IP>",
    "<CARD>",
    "<SSN>",
    "<PHONE>",
    "<NAME>",
)


PSEUDONYM_KEY = b"didpo-pipeline/pseudonym/v1"
"""The default HMAC key of :func:`pseudonym`. It is public (it is in the code): see :func:`pseudonym`."""


def pseudonym(value: str, prefix: str, key: bytes = PSEUDONYM_KEY) -> str:
    """A stable, opaque stand-in for the identifier ``value``: ``prefix`` + the first 16 hex digits of
    HMAC-SHA256(``key``, ``value``), e.g. ``pseudonym("maria@example.com", "user-")`` -> ``user-`` + 16 hex.

    Deterministic: the same value gets the same pseudonym in every row and every run (per-user statistics
    keep working, DVC outputs stay reproducible); distinct values get distinct ones (64 bits: a collision is
    unlikely below ~10^8 distinct ids). The value is hashed exactly as given (``Maria@x.com`` and
    ``maria@x.com`` are two users, as they were two ids). No rule of :data:`RULES` matches a pseudonym.
    With the public default key, whoever can guess a value (an e-mail address) can hash it and recognise its
    pseudonym; pass a secret ``key`` where that matters.
    """
    return prefix + hmac.new(key, value.encode("utf-8"), hashlib.sha256).hexdigest()[:16]


def scrub_text(text: str) -> str:
    """``text`` with every match of :data:`RULES` replaced by its placeholder (idempotent)."""
    for rule in RULES:
        text = rule.pattern.sub(rule.repl, text)
    return text


def find_pii(text: str) -> list[tuple[str, str]]:
    """The ``(kind, matched text)`` findings of :data:`RULES` in ``text``, in rule order.

    Each rule sees the text left after the earlier rules' replacements, as in :func:`scrub_text`.
    """
    found: list[tuple[str, str]] = []
    for rule in RULES:

        def record(m: re.Match[str], rule: Rule = rule) -> str:
            out = rule.repl(m) if callable(rule.repl) else m.expand(rule.repl)
            if out != m.group(0):
                found.append((rule.kind, m.group(0)))
            return out

        text = rule.pattern.sub(record, text)
    return found


def scrub_series(texts: pd.Series) -> pd.Series:
    """Scrub a column of texts; missing values stay missing, the index is kept.

    Vectorised: each distinct text is scrubbed once (logs repeat prompts and responses a lot); per
    rule, pyarrow's RE2 kernel flags the distinct texts that match the rule's ``trigger`` and pandas
    ``.str.replace`` runs the rule on those only. Returns an object-dtype Series equal elementwise to
    ``texts.map(scrub_text)``.

    Raises:
        TypeError: a non-missing value is not a string.
    """
    codes, uniques = pd.factorize(texts, use_na_sentinel=True)
    clean = pd.Series(np.asarray(uniques, dtype=object), dtype=object)
    if len(clean) and not all(isinstance(v, str) for v in clean):
        raise TypeError("scrub_series: every non-missing value must be a str")
    for rule in RULES:
        if not len(clean):
            break
        hit = pc.match_substring_regex(pa.array(clean, type=pa.large_string()), rule.trigger)
        hit = hit.to_numpy(zero_copy_only=False)
        if hit.any():
            clean[hit] = clean[hit].str.replace(rule.pattern, rule.repl, regex=True)
    values = np.append(clean.to_numpy(dtype=object), None)  # code -1 (missing) picks the trailing None
    return pd.Series(values[codes], index=texts.index, name=texts.name, dtype=object)


def scrub_frame(frame: pd.DataFrame, columns: list[str] | tuple[str, ...]) -> pd.DataFrame:
    """A copy of ``frame`` with the text ``columns`` scrubbed by :func:`scrub_series` (non-string cells are
    converted with ``str`` first; missing cells stay missing)."""
    out = frame.copy()
    for col in columns:
        s = out[col]
        s = s.where(s.isna(), s.astype(str)) if len(s) else s
        out[col] = scrub_series(s)
    return out
