"""The ``validate`` stage: Great Expectations data contracts for problems, feedback logs and preference pairs.

The contracts are GX 1.x ExpectationSuite JSON files in ``data/expectations/`` (``problems.json``,
``feedback_logs.json``, ``preference_pairs.json``), edited as data. Each expectation carries ``meta.name``
(its name in quarantine records and reports), ``meta.description`` (the human-readable reason, with
``{parameter}`` placeholders filled in) and GX's ``severity``.

One dataset is validated in three steps; every input line ends up in exactly one of the two outputs
(``rows_valid + rows_quarantined == rows_in``, blank lines included):

1. parse (:mod:`datalib.jsonl`): blank lines, invalid UTF-8, invalid JSON and non-object JSON are quarantined;
2. schema pass: the null/type expectations run on a pandas frame of the parsed objects (index = line number);
3. value pass: every other expectation runs on the same frame with the values that failed step 2 set to null,
   so a wrong-typed value cannot make a value check raise, and each row still gets every reason that applies.

A row that fails several expectations is quarantined once, with all reasons. Uniqueness expectations keep the
first occurrence and quarantine the later duplicates. Derived columns (problems only) bring cross-row checks
into the suite: ``_no_train_leakage`` (a val/test/humaneval/heldout prompt equal to a train prompt after
:func:`normalise_prompt`) and ``_solution_passes`` (the caller's ``check_solutions`` hook, run last and only on
rows that passed every other expectation; the expectation is skipped without a hook).

A dataset fails when a ``critical`` expectation fails or its bad-row rate exceeds its threshold. The shipped
contracts mark three expectations critical, all for problems: ``has_rows`` (an empty problem set trains
nothing), ``task_id_unique`` and ``solution_passes_tests`` (duplicate ids or a broken reference solution mean
the problem source itself is broken). :func:`ensure_passed` raises :class:`ValidationFailed`; call it after
:func:`write_report`, so the report that explains the failure is on disk.

What is written (feedback logs and preference pairs; problems are code and are written as they are):

- fields that are neither in the dataset's schema (:mod:`datalib.schema`) nor named by its suite are dropped from
  valid rows and from quarantine records, and counted per field name in ``DatasetReport.dropped_fields``;
- with a ``redact`` scrubber (the stage passes :func:`datalib.pii.scrub_text`), every string of a row (nested ones
  too) is scrubbed before it is written, in valid rows and quarantine records alike, and so are the reasons, notes
  and dropped field names. Identifiers (``event_id``, ``user_id``, ``session_id``; ``annotator``) are keys for
  the mine stage, so one that the scrubber would change (an e-mail as ``user_id``) is replaced whole by its
  :func:`datalib.pii.pseudonym` (``user-`` + 16 hex digits of an HMAC-SHA256): the same e-mail gets the same id in
  every row, two e-mails two ids; identifiers without PII are kept as they are. A line that did not parse is
  scrubbed as text.

GX is imported lazily (it takes seconds) with telemetry off (``GX_ANALYTICS_ENABLED=False`` unless set);
one ephemeral context is shared by the process. It is not thread-safe: validate datasets one after another.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from datalib.generate import normalise_text as normalise_prompt  # the leakage key, one definition
from datalib.jsonl import PARSE_CHECKS, JsonlLine, iter_jsonl
from datalib.pii import pseudonym, scrub_text
from datalib.schema import EVENT_FIELDS, PAIR_FIELDS, PROBLEM_FIELDS
from tasks.config import ValidateConfig
from tasks.io import atomic_write_lines, write_json
from tasks.sandbox import make_verifier

if TYPE_CHECKING:
    import pandas as pd
    from great_expectations.core.expectation_suite import ExpectationSuite

EXPECTATIONS_DIR = Path(__file__).resolve().parents[1] / "data" / "expectations"
RAW_CHARS = 2000  # quarantine records keep at most this many characters of the original line
HELD_OUT_SPLITS = frozenset({"val", "test", "humaneval", "heldout"})

# The fields of each dataset (data/README.md, DESIGN.md); always frame columns (null where absent).
FIELDS = {"problems": PROBLEM_FIELDS, "feedback_logs": EVENT_FIELDS, "preference_pairs": PAIR_FIELDS}
DERIVED = {"problems": ("_no_train_leakage", "_solution_passes"), "feedback_logs": (), "preference_pairs": ()}
# Identifier fields (kept usable as keys: a PII-bearing one becomes a pseudonym with this prefix) of the datasets
# whose unknown fields are dropped and whose strings are scrubbed (see the module docstring).
IDENTIFIERS = {
    "feedback_logs": {"event_id": "event-", "user_id": "user-", "session_id": "session-"},
    "preference_pairs": {"annotator": "annotator-"},
}

# Expectations deciding whether a value is there with the right type: they run first (the "schema pass").
SCHEMA_TYPES = frozenset(
    {
        "expect_column_values_to_not_be_null",
        "expect_column_values_to_be_of_type",
        "expect_column_values_to_be_in_type_list",
    }
)
UNIQUE_TYPES = frozenset({"expect_column_values_to_be_unique", "expect_compound_columns_to_be_unique"})

SolutionCheck = Callable[[list[dict[str, Any]]], Sequence[Any]]

# The params key of each dataset's bad-row-rate threshold (``ValidateConfig``), named wherever the rate is reported.
THRESHOLD_KEYS = {
    "problems": "validate.max_bad_row_rate_problems",
    "feedback_logs": "validate.max_bad_row_rate_logs",
    "preference_pairs": "validate.max_bad_row_rate_pairs",
}


Redact = Callable[[str], str]


class SuiteError(ValueError):
    """A suite file is missing, not JSON, not a valid GX suite, or breaks a convention of this stage."""


@dataclass(frozen=True)
class DatasetReport:
    """The outcome of validating one dataset (one JSONL file).

    rows_in: lines in the input (blank and malformed lines included) = rows_valid + rows_quarantined.
    bad_row_rate: rows_quarantined / rows_in (0 for an empty file). failures: rows failing each expectation
    (parse checks included; a row failing two expectations counts once in each). critical_failed: names of the
    critical expectations that failed. skipped: expectations not run (e.g. no ``check_solutions`` hook).
    notes: human-readable lines about dataset-level failures and expectations that raised.
    passed: no critical failure and bad_row_rate <= max_bad_row_rate.
    dropped_fields: rows (valid or quarantined) per unknown field name that was dropped before writing.
    """

    name: str
    source: str
    quarantine: str
    rows_in: int
    rows_valid: int
    rows_quarantined: int
    bad_row_rate: float
    max_bad_row_rate: float
    failures: dict[str, int]
    critical_failed: tuple[str, ...]
    skipped: tuple[str, ...]
    notes: tuple[str, ...]
    passed: bool
    dropped_fields: dict[str, int] = field(default_factory=dict)

    def problems(self) -> list[str]:
        """Why this dataset failed, one readable line per reason (empty when it passed)."""
        lines = []
        if self.bad_row_rate > self.max_bad_row_rate:
            key = THRESHOLD_KEYS.get(self.name, "the threshold")
            lines.append(
                f"bad-row rate {self.bad_row_rate:.2%} ({self.rows_quarantined} of {self.rows_in} rows"
                f" quarantined) exceeds the threshold {self.max_bad_row_rate:.2%}: fix the rows, or raise {key}"
                " in params.yaml"
            )
        for name in self.critical_failed:
            count = self.failures.get(name, 0)
            lines.append(f"critical expectation {name} failed" + (f" ({count} rows)" if count else ""))
        return lines


class ValidationFailed(Exception):
    """A dataset failed validation; the message says which and why. ``reports`` holds all the reports."""

    def __init__(self, reports: Sequence[DatasetReport]):
        self.reports = tuple(reports)
        super().__init__(failure_summary(self.reports))


# ---------------------------------------------------------------------------------------------------- suites


def load_suite(name: str, directory: str | Path | None = None) -> ExpectationSuite:
    """The GX ExpectationSuite stored in ``<directory>/<name>.json`` (default ``data/expectations/``).

    Raises:
        SuiteError: the file is missing or not JSON, GX rejects it, or a ``meta.name`` is missing or repeated.
    """
    path = Path(directory or EXPECTATIONS_DIR) / f"{name}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SuiteError(f"{path}: expectation suite not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SuiteError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("expectations"), list):
        raise SuiteError(f"{path}: expected an object with an 'expectations' list")
    seen: set[str] = set()
    for i, exp in enumerate(data["expectations"]):
        meta_name = exp.get("meta", {}).get("name") if isinstance(exp, dict) else None
        if not isinstance(meta_name, str) or not meta_name:
            raise SuiteError(f"{path}: expectation #{i} has no meta.name")
        if meta_name in seen or meta_name in PARSE_CHECKS:
            raise SuiteError(f"{path}: expectation name {meta_name!r} is used twice")
        seen.add(meta_name)
    _gx_batch_definition()  # sets GX telemetry off before the first GX import
    from great_expectations.core.expectation_suite import ExpectationSuite

    try:
        suite = ExpectationSuite(**data)
    except Exception as exc:  # GX raises a variety of types for a bad suite
        raise SuiteError(f"{path}: not a valid Great Expectations suite: {exc}") from None
    loaded = {e.meta.get("name") for e in suite.expectations}
    dropped = [n for n in seen if n not in loaded]  # GX logs and drops an expectation it cannot build
    if dropped:
        raise SuiteError(f"{path}: not a valid Great Expectations suite: GX rejected {', '.join(sorted(dropped))}")
    return suite


@cache
def _gx_batch_definition():
    """One ephemeral GX context per process, with a pandas whole-dataframe batch definition."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    asset = context.data_sources.add_pandas("validate").add_dataframe_asset("rows")
    return asset.add_batch_definition_whole_dataframe("all_rows")


def _run_gx(configs: list[dict], frame: pd.DataFrame, parameters: dict[str, Any]) -> list:
    from great_expectations.core.expectation_suite import ExpectationSuite

    if not configs:
        return []
    suite = ExpectationSuite(name="validate", expectations=configs)
    batch = _gx_batch_definition().get_batch(batch_parameters={"dataframe": frame})
    return batch.validate(suite, result_format="COMPLETE", expectation_parameters=parameters).results


def _columns(kwargs: dict[str, Any]) -> list[str]:
    cols = [kwargs[k] for k in ("column", "column_A", "column_B") if isinstance(kwargs.get(k), str)]
    return cols + list(kwargs.get("column_list") or [])


# ------------------------------------------------------------------------------------------ derived columns


def prompt_hash(prompt: str) -> str:
    """sha256 hex digest of :func:`normalise_prompt` (UTF-8)."""
    return hashlib.sha256(normalise_prompt(prompt).encode("utf-8")).hexdigest()


def _leakage_column(frame: pd.DataFrame) -> list[Any]:
    """True, or why a held-out row leaks a train prompt; None for train rows and rows without a str prompt."""
    train: dict[str, tuple[int, Any]] = {}
    for line, prompt, split, task_id in zip(
        frame.index, frame["prompt"], frame["split"], frame["task_id"], strict=True
    ):
        if split == "train" and isinstance(prompt, str):
            train.setdefault(prompt_hash(prompt), (line, task_id))
    out: list[Any] = []
    for prompt, split in zip(frame["prompt"], frame["split"], strict=True):
        if split in HELD_OUT_SPLITS and isinstance(prompt, str):
            hit = train.get(prompt_hash(prompt))
            out.append(True if hit is None else f"same prompt as train problem {hit[1]!r} on line {hit[0]}")
        else:
            out.append(None)
    return out


def _verdict(value: Any) -> Any:
    if isinstance(value, str):
        return value or "the reference solution failed its tests"
    if hasattr(value, "passed"):  # a sandbox.verifier.Verdict
        return True if value.passed else (getattr(value, "reason", None) or "failed its tests")
    if value is True or value is False or value in (0, 1):
        return True if value else "the reference solution failed its tests"
    raise TypeError(f"check_solutions must return bools, reason strings or verdicts, got {type(value).__name__}")


def _solutions_column(lines: list[int], rows: dict[int, dict], check: SolutionCheck, index: Iterable) -> list:
    """The hook's verdicts for the rows on ``lines`` (those that passed every other expectation), laid out on
    ``index`` (all line numbers); None for the other rows.

    Raises:
        ValueError: the hook returned a different number of verdicts than rows. TypeError: a verdict of an
        unknown kind.
    """
    verdicts = list(check([rows[line] for line in lines]))
    if len(verdicts) != len(lines):
        raise ValueError(f"check_solutions returned {len(verdicts)} verdicts for {len(lines)} rows")
    by_line = dict(zip(lines, (_verdict(v) for v in verdicts), strict=True))
    return [by_line.get(int(line)) for line in index]


# ------------------------------------------------------------------------------------------------- reasons


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return {str: "a string", list: "an array", dict: "an object"}.get(type(value), type(value).__name__)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fill(description: str, parameters: dict[str, Any]) -> str:
    for key, value in parameters.items():
        shown = f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)
        description = description.replace("{" + key + "}", shown)
    return description


def _detail(etype: str, kwargs: dict[str, Any], value: Any, present: bool, redact: Redact | None = None) -> str:
    """What was wrong with the value, in a few words (the reason's parenthesis); a quoted string is passed
    through ``redact`` before it is shortened (a cut-off e-mail would no longer be recognised)."""
    if etype == "expect_column_values_to_not_be_null":
        return "null" if present else "missing"
    if etype in SCHEMA_TYPES:
        return f"got {_json_type(value)}"
    if etype.startswith("expect_column_value_lengths") and isinstance(value, str):
        return f"got {len(value):,} characters"
    if str(kwargs.get("column", "")).startswith("_"):
        return str(value)
    if "column" not in kwargs:
        return ""
    if redact is not None and isinstance(value, str):
        value = redact(value)
    return f"got {_short(value)}"


def _exception_message(info: Any) -> str | None:
    """The message of an exception GX caught while running an expectation, or None."""
    if not isinstance(info, dict):
        return None
    if info.get("raised_exception"):
        return str(info.get("exception_message"))
    for nested in info.values():
        if isinstance(nested, dict) and nested.get("raised_exception"):
            return str(nested.get("exception_message"))
    return None


class _Findings:
    """Collects, across passes, every (expectation, reason) of every bad row and each outcome."""

    def __init__(self, order: dict[str, int], redact: Redact | None = None):
        self.order = order
        self.redact = redact
        self.rows: dict[int, list[tuple[int, str, str]]] = {}
        self.failures: dict[str, int] = dict.fromkeys([*PARSE_CHECKS, *order], 0)
        self.critical: list[str] = []
        self.notes: list[str] = []

    def flag(self, line: int, name: str, reason: str) -> None:
        self.rows.setdefault(line, []).append((self.order.get(name, -1), name, reason))
        self.failures[name] += 1

    def collect(self, results: Iterable, frame: pd.DataFrame, rows: dict[int, dict], parameters: dict) -> dict:
        """Record the GX results; returns {column: [lines]} of the rows flagged per single column."""
        flagged: dict[str, list[int]] = {}
        for result in results:
            config = result.expectation_config
            name, etype, kwargs = config.meta["name"], config.type, config.kwargs
            critical = getattr(config.severity, "value", config.severity) == "critical"
            error = _exception_message(result.exception_info)
            if error is not None:
                self.critical.append(name)
                self.notes.append(f"{name} could not run: {error.splitlines()[0] if error else 'error'}")
                continue
            index = result.result.get("unexpected_index_list")
            if index is None:  # a dataset-level expectation (row count, column statistics, ...)
                if not result.success:
                    observed = result.result.get("observed_value")
                    self.notes.append(f"{name} failed: {_fill(config.meta.get('description', etype), parameters)}")
                    if observed is not None:
                        self.notes[-1] += f" (observed {_short(observed)})"
                    if critical:
                        self.critical.append(name)
                continue
            description = _fill(config.meta.get("description", etype), parameters)
            cols = _columns(kwargs)
            lines = sorted(int(i) for i in index)
            first: dict[str, int] = {}
            for line in lines:
                values = [frame.at[line, c] for c in cols]
                if etype in UNIQUE_TYPES:
                    key = json.dumps(values, sort_keys=True, default=str)
                    if key not in first:
                        first[key] = line  # the first occurrence is kept
                        continue
                    detail = f"duplicate of line {first[key]}, which is kept"
                else:
                    value = values[0] if len(cols) == 1 else None
                    present = len(cols) != 1 or cols[0] in rows[line]
                    detail = _detail(etype, kwargs, value, present, self.redact)
                self.flag(line, name, f"{description} ({detail})" if detail else description)
                if len(cols) == 1:
                    flagged.setdefault(cols[0], []).append(line)
            if critical and not result.success:
                self.critical.append(name)
        return flagged


# ------------------------------------------------------------------------------------------------- datasets


def _frame(rows: dict[int, dict], columns: Iterable[str]) -> pd.DataFrame:
    import pandas as pd

    index = pd.Index(list(rows), dtype="int64")
    objs = list(rows.values())
    return pd.DataFrame(
        {c: pd.Series([o.get(c) for o in objs], index=index, dtype=object) for c in columns}, index=index
    )


@dataclass(frozen=True)
class _Writer:
    """What a parsed row becomes when it is written (a valid row, or the ``raw`` of a quarantine record).

    keep: the fields kept (None: all). ids: identifier field -> pseudonym prefix. redact: the text scrubber (None:
    strings are written as they are). A line that changes in none of these ways is written verbatim.
    """

    keep: frozenset[str] | None = None
    ids: Mapping[str, str] = field(default_factory=dict)
    redact: Redact | None = None

    def scrub(self, text: str) -> str:
        return text if self.redact is None else self.redact(text)

    def row(self, obj: dict[str, Any]) -> dict[str, Any]:
        """``obj`` without the unknown fields; identifiers with PII pseudonymised, every other string scrubbed."""
        out = {k: v for k, v in obj.items() if self.keep is None or k in self.keep}
        if self.redact is None:
            return out

        for k, v in out.items():
            if k in self.ids and isinstance(v, str):
                out[k] = v if self.redact(v) == v else pseudonym(v, self.ids[k])
            else:
                out[k] = _redact_values(v, self.redact)
        return out

    def text(self, line: JsonlLine) -> str:
        if line.obj is None:  # JSON escapes (``\\n``) would hide word boundaries from the scrubber
            return line.text if self.redact is None else self.redact(line.text.replace("\\n", "\n"))
        if self.redact is None and (self.keep is None or self.keep.issuperset(line.obj)):
            return line.text
        return json.dumps(self.row(line.obj), ensure_ascii=False)

    def dropped(self, rows: Iterable[dict[str, Any]]) -> dict[str, int]:
        """Rows per unknown field name (the names scrubbed too), sorted by name."""
        if self.keep is None:
            return {}
        counts = Counter(self.scrub(k) for obj in rows for k in obj if k not in self.keep)
        return dict(sorted(counts.items()))


def _quarantine_record(source: str, line: JsonlLine, reasons: list[tuple[int, str, str]], writer: _Writer) -> str:
    reasons = sorted(reasons)
    record = {
        "source": source,
        "line": line.line,
        "expectation": reasons[0][1],
        "expectations": [name for _, name, _ in reasons],
        "reason": writer.scrub("; ".join(reason for _, _, reason in reasons)),  # reasons may quote values
        "raw": writer.text(line)[:RAW_CHARS],
        "raw_chars": len(line.text),
    }
    return json.dumps(record, ensure_ascii=False)


def _redact_values(obj: Any, redact: Redact) -> Any:
    """``obj`` with every string inside it, the keys of nested objects included, passed through ``redact``."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {redact(k): _redact_values(v, redact) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_redact_values(v, redact) for v in obj]
    return obj


def _validate(
    dataset: str,
    path: str | Path,
    out_valid: str | Path,
    out_quarantine: str | Path,
    *,
    max_bad_row_rate: float,
    parameters: dict[str, Any],
    check_solutions: SolutionCheck | None = None,
    redact: Redact | None = None,
) -> DatasetReport:
    suite = load_suite(dataset)
    configs = [e.configuration.to_json_dict() for e in suite.expectations]
    redact = cache(redact) if redact is not None else None  # ids, categories and prompts repeat a lot
    findings = _Findings({c["meta"]["name"]: i for i, c in enumerate(configs)}, redact)

    lines = list(iter_jsonl(path))
    for ln in lines:
        if ln.obj is None:
            findings.flag(ln.line, ln.check, ln.error)
    rows = {ln.line: ln.obj for ln in lines if ln.obj is not None}

    referenced = [c for cfg in configs for c in _columns(cfg["kwargs"])]
    unknown = sorted({c for c in referenced if c.startswith("_") and c not in DERIVED[dataset]})
    if unknown:
        raise SuiteError(f"{dataset}: unknown derived column(s) {unknown}; this dataset provides {DERIVED[dataset]}")
    columns = dict.fromkeys([*FIELDS[dataset], *(c for c in referenced if not c.startswith("_"))])
    frame = _frame(rows, columns)
    if dataset in IDENTIFIERS:
        writer = _Writer(frozenset(columns), IDENTIFIERS[dataset], redact)
    else:
        writer = _Writer(redact=redact)

    def is_schema(cfg: dict) -> bool:
        return cfg["type"] in SCHEMA_TYPES or cfg["type"].startswith("expect_table_")

    flagged = findings.collect(
        _run_gx([c for c in configs if is_schema(c)], frame, parameters), frame, rows, parameters
    )
    clean = frame.copy()
    for column, bad_lines in flagged.items():
        if column in clean.columns:
            clean.loc[bad_lines, column] = None  # later checks see only well-typed values

    # Value pass: derived columns that are cheap come first; the solution check (a sandbox run per row) only
    # gets the rows that passed everything else, so it never sees a malformed test or entry point.
    if dataset == "problems":
        clean["_no_train_leakage"] = _leakage_column(clean)
    clean = clean.astype(object)
    value_configs = [c for c in configs if not is_schema(c)]
    late = [c for c in value_configs if "_solution_passes" in _columns(c["kwargs"])]
    findings.collect(_run_gx([c for c in value_configs if c not in late], clean, parameters), clean, rows, parameters)
    skipped = []
    if late and check_solutions is None:
        skipped = [c["meta"]["name"] for c in late]
    elif late:
        good = [int(line) for line in clean.index if line not in findings.rows]
        clean["_solution_passes"] = _solutions_column(good, rows, check_solutions, clean.index)
        findings.collect(_run_gx(late, clean.astype(object), parameters), clean, rows, parameters)

    source = str(path)
    atomic_write_lines(Path(out_valid), (writer.text(ln) for ln in lines if ln.line not in findings.rows))
    atomic_write_lines(
        Path(out_quarantine),
        (_quarantine_record(source, ln, findings.rows[ln.line], writer) for ln in lines if ln.line in findings.rows),
    )
    rows_in, rows_quarantined = len(lines), len(findings.rows)
    rows_valid = sum(1 for ln in lines if ln.line not in findings.rows)
    if rows_valid + rows_quarantined != rows_in:  # an invariant: each line is in exactly one output
        raise RuntimeError(f"{dataset}: {rows_valid} valid + {rows_quarantined} quarantined != {rows_in} lines")
    rate = rows_quarantined / rows_in if rows_in else 0.0
    critical = tuple(dict.fromkeys(findings.critical))
    return DatasetReport(
        name=dataset,
        source=source,
        quarantine=str(out_quarantine),
        rows_in=rows_in,
        rows_valid=rows_valid,
        rows_quarantined=rows_quarantined,
        bad_row_rate=rate,
        max_bad_row_rate=max_bad_row_rate,
        failures=findings.failures,
        critical_failed=critical,
        skipped=tuple(skipped),
        notes=tuple(writer.scrub(note) for note in findings.notes),
        passed=not critical and rate <= max_bad_row_rate,
        dropped_fields=writer.dropped(rows.values()),
    )


def validate_problems(
    path: str | Path,
    out_valid: str | Path,
    out_quarantine: str | Path,
    *,
    max_bad_row_rate: float,
    check_solutions: SolutionCheck | None = None,
) -> DatasetReport:
    """Validate a problems JSONL file (data/README.md schema) against ``data/expectations/problems.json``.

    Valid lines are copied verbatim to ``out_valid``; bad lines go to ``out_quarantine`` as JSON records
    ``{source, line, expectation, expectations, reason, raw, raw_chars}``.

    check_solutions: called once with the list of row dicts that passed every other expectation (so their
        prompt, canonical_solution, test and entry_point are well formed); returns one verdict per row: True
        (passes), False or a reason string (fails), or an object with ``passed``/``reason`` (e.g.
        ``sandbox.verifier.Verdict``). None skips ``solution_passes_tests``.

    Raises:
        SuiteError: the suite is missing or invalid. ValueError/TypeError: the hook returned the wrong number
        or kind of verdicts. OSError: a file cannot be read or written. A failed validation does not raise:
        see :func:`ensure_passed`.
    """
    return _validate(
        "problems",
        path,
        out_valid,
        out_quarantine,
        max_bad_row_rate=max_bad_row_rate,
        parameters={},
        check_solutions=check_solutions,
    )


def validate_feedback_logs(
    path: str | Path,
    out_valid: str | Path,
    out_quarantine: str | Path,
    *,
    max_bad_row_rate: float,
    max_text_chars: int = 20_000,
    redact: Redact | None = None,
) -> DatasetReport:
    """Validate a feedback-log JSONL file against ``data/expectations/feedback_logs.json``.

    max_text_chars: the upper bound on prompt and response lengths (characters; the suite's ``max_text_chars``
    parameter). redact: a text scrubber (e.g. ``datalib.pii.scrub_text``) applied before anything is written: to every
    string of valid and quarantined rows, with ``event_id``, ``user_id`` and ``session_id`` pseudonymised instead
    when it would change them, and to reasons and notes (module docstring). Fields outside the schema are dropped
    and counted in ``dropped_fields``, with or without ``redact``. Outputs and errors as :func:`validate_problems`.
    """
    return _validate(
        "feedback_logs",
        path,
        out_valid,
        out_quarantine,
        max_bad_row_rate=max_bad_row_rate,
        parameters={"max_text_chars": max_text_chars},
        redact=redact,
    )


def validate_pairs(
    path: str | Path,
    out_valid: str | Path,
    out_quarantine: str | Path,
    *,
    max_bad_row_rate: float,
    max_text_chars: int = 20_000,
    redact: Redact | None = None,
) -> DatasetReport:
    """Validate a human preference-pair JSONL file against ``data/expectations/preference_pairs.json``.

    max_text_chars: the upper bound on prompt, chosen and rejected lengths (characters). redact: as in
    :func:`validate_feedback_logs`, with ``annotator`` the identifier that is pseudonymised. Outputs and errors as
    :func:`validate_problems`.
    """
    return _validate(
        "preference_pairs",
        path,
        out_valid,
        out_quarantine,
        max_bad_row_rate=max_bad_row_rate,
        parameters={"max_text_chars": max_text_chars},
        redact=redact,
    )


# ------------------------------------------------------------------------------------------------- reports


def failure_summary(reports: Sequence[DatasetReport]) -> str:
    """A multi-line, human-readable account of every dataset that failed (empty string when all passed)."""
    failed = [r for r in reports if not r.passed]
    if not failed:
        return ""
    out = [f"validation failed for {len(failed)} of {len(reports)} dataset(s): {', '.join(r.name for r in failed)}"]
    for r in failed:
        out.append(f"  {r.name} ({r.source}):")
        out.extend(f"    - {line}" for line in r.problems())
        out.extend(f"    - {note}" for note in r.notes)
        out.append(f"    quarantined rows and their reasons: {r.quarantine}")
    return "\n".join(out)


def top_reasons(report: DatasetReport, top: int = 3) -> list[tuple[str, int]]:
    """The `top` expectations that quarantined the most rows of `report`, ``(name, rows)``, most first (ties in
    the suite's order); a row failing two expectations counts in both."""
    failing = [(name, count) for name, count in report.failures.items() if count]
    return sorted(failing, key=lambda item: -item[1])[:top]


def quarantine_summary(reports: Sequence[DatasetReport], report_path: str | Path) -> list[str]:
    """What the stage tells the console about its quarantine, one line per dataset with quarantined rows: how many
    of how many, the rate against its threshold (named by its params key), the top reasons with their counts, and
    where the rows and the report are; one line when nothing was quarantined."""
    lines = []
    for r in reports:
        if not r.rows_quarantined:
            continue
        reasons = top_reasons(r)
        more = sum(1 for count in r.failures.values() if count) - len(reasons)
        shown = ", ".join(f"{name} {count}" for name, count in reasons) + (f" (+{more} more)" if more > 0 else "")
        if r.bad_row_rate > r.max_bad_row_rate:
            rate = f"{r.bad_row_rate:.2%}, over its threshold"  # the failure names the key, once
        else:
            key = THRESHOLD_KEYS.get(r.name, "its threshold")
            rate = f"{r.bad_row_rate:.2%}; the stage fails above {key} = {r.max_bad_row_rate:.2%}"
        lines.append(
            f"{r.name}: {r.rows_quarantined} of {r.rows_in} rows quarantined ({rate}); top reasons: {shown}; "
            f"rows with their reasons: {r.quarantine}; report: {report_path}"
        )
    if not lines:
        counts = ", ".join(f"{r.rows_in} {r.name}" for r in reports)
        lines.append(f"no row quarantined ({counts} rows); report: {report_path}")
    return lines


def ensure_passed(reports: Sequence[DatasetReport]) -> None:
    """Raise :class:`ValidationFailed` (message: :func:`failure_summary`) when any dataset failed."""
    if any(not r.passed for r in reports):
        raise ValidationFailed(reports)


def report_dict(reports: Sequence[DatasetReport]) -> dict[str, Any]:
    """The JSON validation report (DVC metrics): ``{passed, datasets: {name: fields of DatasetReport}}``."""
    datasets = {}
    for r in reports:
        d = asdict(r)
        d["bad_row_rate"] = round(r.bad_row_rate, 6)
        d["critical_failed"], d["skipped"], d["notes"] = (
            list(r.critical_failed),
            list(r.skipped),
            list(r.notes),
        )
        datasets[r.name] = d
    return {"passed": all(r.passed for r in reports), "datasets": datasets}


def report_markdown(reports: Sequence[DatasetReport]) -> str:
    """The validation report for people: a summary table, then each dataset's failing expectations."""
    status = "PASSED" if all(r.passed for r in reports) else "FAILED"
    out = [
        "# Validation report",
        "",
        f"**{status}**",
        "",
        "| dataset | rows in | valid | quarantined | bad-row rate | threshold | result |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in reports:
        out.append(
            f"| {r.name} | {r.rows_in} | {r.rows_valid} | {r.rows_quarantined} | {r.bad_row_rate:.2%} "
            f"| {r.max_bad_row_rate:.2%} | {'passed' if r.passed else 'FAILED'} |"
        )
    for r in reports:
        out += ["", f"## {r.name}", "", f"Source: `{r.source}`; quarantine: `{r.quarantine}`.", ""]
        out += [f"- **{line}**" for line in r.problems()]
        out += [f"- {note}" for note in r.notes]
        if r.skipped:
            out.append(f"- skipped: {', '.join(r.skipped)}")
        failing = {k: v for k, v in r.failures.items() if v}
        if failing:
            out += ["", "| expectation | rows |", "|---|---:|"]
            out += [f"| {k}{' (critical)' if k in r.critical_failed else ''} | {v} |" for k, v in failing.items()]
        elif not r.notes and not r.critical_failed:
            out.append("Every row met every expectation.")
        if r.dropped_fields:
            out += ["", "Fields not in the schema, dropped from every output:", "", "| field | rows |", "|---|---:|"]
            out += [f"| {k} | {v} |" for k, v in r.dropped_fields.items()]
    return "\n".join(out) + "\n"


def write_report(reports: Sequence[DatasetReport], json_path: str | Path, md_path: str | Path) -> None:
    """Write :func:`report_dict` (JSON) to ``json_path`` and :func:`report_markdown` to ``md_path``."""
    atomic_write_lines(Path(json_path), [json.dumps(report_dict(reports), indent=2, sort_keys=True)])
    atomic_write_lines(Path(md_path), [report_markdown(reports).rstrip("\n")])


@task(cache_policy=NO_CACHE)
def validate_problems_task(params, source: Path, out_valid: Path, out_quarantine: Path):
    """Problems contract; reference solutions run against their own tests in the sandbox (when configured)."""
    cfg = params.validate
    if not cfg.check_solutions:
        return validate_problems(source, out_valid, out_quarantine, max_bad_row_rate=cfg.max_bad_row_rate_problems)
    with make_verifier(params.verifier) as verifier:

        def check(rows):
            jobs = [(r["prompt"] + r["canonical_solution"], r["test"], r["entry_point"]) for r in rows]
            return verifier.check_many(jobs, progress=True)

        return validate_problems(
            source,
            out_valid,
            out_quarantine,
            max_bad_row_rate=cfg.max_bad_row_rate_problems,
            check_solutions=check,
        )


@task(cache_policy=NO_CACHE)
def validate_logs_task(cfg: ValidateConfig, source: Path, out_valid: Path, out_quarantine: Path):
    """Feedback-log contract; PII and secrets are scrubbed from everything written (valid rows and quarantine)."""
    return validate_feedback_logs(
        source,
        out_valid,
        out_quarantine,
        max_bad_row_rate=cfg.max_bad_row_rate_logs,
        max_text_chars=cfg.max_text_chars,
        redact=scrub_text,
    )


@task(cache_policy=NO_CACHE)
def validate_pairs_task(cfg: ValidateConfig, source: Path, out_valid: Path, out_quarantine: Path):
    """Human preference-pair contract (chosen ≠ rejected, non-empty); PII and secrets scrubbed as for the logs."""
    return validate_pairs(
        source,
        out_valid,
        out_quarantine,
        max_bad_row_rate=cfg.max_bad_row_rate_pairs,
        max_text_chars=cfg.max_text_chars,
        redact=scrub_text,
    )


def validate(
    params,
    problems: Path,
    valid_problems: Path,
    valid_logs: Path,
    valid_pairs: Path,
    quarantine: Path,
    report_json: Path,
    report_md: Path,
    headline_out: Path,
) -> list[DatasetReport]:
    """The stage's work: the problems (`problems`), the feedback logs and the human pairs (``params.validate``'s
    paths) through their contracts; valid rows to `valid_problems`, `valid_logs`, `valid_pairs`, every bad row to
    `quarantine`/<dataset>.jsonl, the report to `report_json` and `report_md`, the rows quarantined (the DVC metric)
    to `headline_out`. Returns the datasets' reports; `ensure_passed` raises on a broken contract."""
    cfg = params.validate
    reports = [
        validate_problems_task(params, problems, valid_problems, quarantine / "problems.jsonl"),
        validate_logs_task(cfg, Path(cfg.feedback_logs), valid_logs, quarantine / "feedback_logs.jsonl"),
        validate_pairs_task(cfg, Path(cfg.human_pairs), valid_pairs, quarantine / "human_pairs.jsonl"),
    ]
    write_report(reports, report_json, report_md)
    write_json({"quarantined": sum(r.rows_quarantined for r in reports)}, headline_out)
    return reports
