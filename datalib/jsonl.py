"""Robust JSONL reading: every physical line of a file comes back, parsed or with the reason it did not parse.

Nothing is skipped: a blank line, a line that is not UTF-8, a line that is not JSON and a JSON value that is
not an object each come back as a :class:`JsonlLine` with ``obj=None`` and a ``check``/``error`` saying why,
so a caller can quarantine it and keep ``lines in = lines out``. The newline that ends the file does not make
an extra line; ``\\r\\n`` endings are accepted; a UTF-8 byte-order mark opening the file is ignored.

JSON is read strictly: ``NaN``/``Infinity`` (not JSON, though Python's parser accepts them) and an object that
repeats a key (the parser would keep the last value silently) are errors.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Names of the parse-level checks, as they appear in quarantine records and validation reports.
NON_BLANK = "non_blank_line"
VALID_UTF8 = "valid_utf8"
VALID_JSON = "valid_json"
JSON_OBJECT = "json_object"
PARSE_CHECKS = (NON_BLANK, VALID_UTF8, VALID_JSON, JSON_OBJECT)


@dataclass(frozen=True)
class JsonlLine:
    """One physical line of a JSONL file.

    line: 1-based line number. text: the line without its newline, decoded as UTF-8 (invalid bytes shown
    as ``\\xNN`` escapes). obj: the parsed JSON object, or None when the line did not parse. check: the
    parse check that failed (one of :data:`PARSE_CHECKS`) or None. error: a human-readable reason, or None.
    """

    line: int
    text: str
    obj: dict[str, Any] | None
    check: str | None = None
    error: str | None = None


class _StrictJsonError(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    raise _StrictJsonError(f"non-standard JSON constant {name}")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _StrictJsonError(f"duplicate key {key!r}")
            seen.add(key)
    return obj


def parse_line(raw: bytes, line: int) -> JsonlLine:
    """Decode and parse one line (bytes without the newline) into a :class:`JsonlLine`; never raises."""
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = raw[exc.start : exc.start + 1].hex()
        return JsonlLine(
            line,
            raw.decode("utf-8", errors="backslashreplace"),
            None,
            VALID_UTF8,
            f"invalid UTF-8 (byte 0x{bad} at offset {exc.start})",
        )
    if line == 1 and text.startswith("\ufeff"):
        text = text[1:]
    if not text.strip():
        return JsonlLine(line, text, None, NON_BLANK, "blank line")
    try:
        value = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except _StrictJsonError as exc:
        return JsonlLine(line, text, None, VALID_JSON, f"invalid JSON: {exc}")
    except json.JSONDecodeError as exc:
        return JsonlLine(line, text, None, VALID_JSON, f"invalid JSON: {exc.msg} at column {exc.colno}")
    except RecursionError:
        return JsonlLine(line, text, None, VALID_JSON, "invalid JSON: nested too deeply")
    if not isinstance(value, dict):
        kind = {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")
        return JsonlLine(line, text, None, JSON_OBJECT, f"not a JSON object (got a JSON {kind})")
    return JsonlLine(line, text, value)


def iter_jsonl(path: str | Path) -> Iterator[JsonlLine]:
    """Every line of a JSONL file as a :class:`JsonlLine`, in order (streams; the file is read as bytes).

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    with Path(path).open("rb") as f:
        for number, raw in enumerate(f, start=1):
            yield parse_line(raw[:-1] if raw.endswith(b"\n") else raw, number)
