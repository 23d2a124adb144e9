"""Test harness for :mod:`models.verifier`: the test transform, the in-process runner, the verdict protocol.

Standard library only: imported by the parent (to validate tests and count cases) and by the sandbox worker
(``models/_sandbox_worker.py``), whose forked children run :func:`run_harness` after dropping privileges.

Verdict protocol (what generated code cannot fake by ordinary means): before any candidate code runs, the harness
holds a per-run random nonce and a pipe fd that only it writes; the worker accepts, in order, ``loaded`` (or
``load <reason>``), one ``<k> <reason>`` line per test case, an optional ``setup <reason>`` and a final ``done``,
each prefixed by the nonce; anything else marks the run ``protocol`` (failed). The program cannot reach the
worker's memory, so exiting early (``sys.exit``, ``os._exit``, ``atexit``), printing, killing the parent or
redefining ``check`` only produces missing lines, hence failures. Values the candidate returns are copied into
plain builtin types (custom classes and subclasses are rejected, so an always-true ``__eq__`` cannot pass), the
tests run with a pristine copy of the builtins, the harness uses references bound before the candidate runs,
and tracing hooks are disabled. Limit of the guarantee: the candidate shares the harness's interpreter, so a
program written specifically against this harness (walking frames or ``gc`` to reach the nonce or the
recorder) could forge lines; the OS-level isolation (see the worker) still contains it.

A test is HumanEval-style: module-level code (``METADATA``, imports, helpers) plus ``def check(candidate):``. Each
top-level ``assert`` in ``check``'s body is one test case; the other top-level statements are setup run in order
(a failing setup statement fails every later case with its reason); a body without top-level asserts is one case.
"""

from __future__ import annotations

import ast
import builtins
import copy
import os
import sys

# ----------------------------------------------------------------------------------------------------------
# Test transform (also imported by the parent to validate tests and count cases).

_MAKE = "__didpo_make_check__"
_RECORD = "__didpo_record__"
_SETUP_FAILED = "__didpo_setup_failed__"
_BASE_EXC = "__didpo_base_exception__"
_EXC = "__didpo_exc__"


def _call(func: str, *args: ast.expr) -> ast.Expr:
    return ast.Expr(ast.Call(ast.Name(func, ast.Load()), list(args), []))


def _guard_case(body: list[ast.stmt], k: int) -> ast.Try:
    """``try: body / except BaseException as e: record(k, e) / else: record(k, None)``."""
    handler = ast.ExceptHandler(
        ast.Name(_BASE_EXC, ast.Load()), _EXC, [_call(_RECORD, ast.Constant(k), ast.Name(_EXC, ast.Load()))]
    )
    node = ast.Try(body, [handler], [_call(_RECORD, ast.Constant(k), ast.Constant(None))], [])
    return ast.copy_location(node, body[0])


def _guard_setup(stmt: ast.stmt) -> ast.Try:
    """``try: stmt / except BaseException as e: setup_failed(e); return``."""
    handler = ast.ExceptHandler(
        ast.Name(_BASE_EXC, ast.Load()),
        _EXC,
        [_call(_SETUP_FAILED, ast.Name(_EXC, ast.Load())), ast.Return(None)],
    )
    return ast.copy_location(ast.Try([stmt], [handler], [], []), stmt)


def transform_test(test: str) -> tuple[ast.Module, int]:
    """Split a HumanEval-style test into guarded cases.

    Keeps the module as is and appends ``__didpo_make_check__(record, setup_failed, BaseException)``, which
    returns a copy of the last top-level ``check`` whose top-level asserts each report through ``record``.

    Returns:
        (module AST ready for ``compile``, number of test cases ≥ 1).
    Raises:
        ValueError: the test does not parse, or defines no top-level ``check`` taking the candidate.
    """
    try:
        tree = ast.parse(test, "<test>")
    except (SyntaxError, ValueError) as exc:
        raise ValueError(f"test is not valid Python: {exc}") from exc
    checks = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "check"]
    if not checks:
        raise ValueError("test must define a top-level `def check(candidate):`")
    check = copy.deepcopy(checks[-1])
    if not (check.args.posonlyargs or check.args.args or check.args.vararg):
        raise ValueError("check() must take the candidate function as its first argument")
    if any(isinstance(stmt, ast.Assert) for stmt in check.body):
        body, n = [], 0
        for stmt in check.body:
            if isinstance(stmt, ast.Assert):
                body.append(_guard_case([stmt], n))
                n += 1
            else:
                body.append(_guard_setup(stmt))
    else:
        body, n = [_guard_case(check.body, 0)], 1
    check.body, check.decorator_list = body, []
    params = [ast.arg(name) for name in (_RECORD, _SETUP_FAILED, _BASE_EXC)]
    maker = ast.FunctionDef(
        name=_MAKE,
        args=ast.arguments(posonlyargs=[], args=params, kwonlyargs=[], kw_defaults=[], defaults=[]),
        body=[check, ast.copy_location(ast.Return(ast.Name("check", ast.Load())), check)],
        decorator_list=[],
    )
    tree.body.append(ast.copy_location(maker, check))
    return ast.fix_missing_locations(tree), n


def count_tests(test: str) -> int:
    """Number of test cases in ``test`` (see :func:`transform_test`; raises ValueError the same way)."""
    return transform_test(test)[1]


# ----------------------------------------------------------------------------------------------------------
# Verdict assembly (worker side; pure).

_CHILD_REASONS = frozenset({"ok", "assertion", "memory", "syntax_error", "invalid_return"})


def _valid_reason(reason: str) -> bool:
    if reason in _CHILD_REASONS:
        return True
    name = reason.removeprefix("exception:")
    return name != reason and name.isascii() and name.isidentifier() and len(name) <= 64


def assemble(n: int, lines: list[str | None], ended: str, process_reason: str) -> tuple[list[list], str]:
    """Turn the harness's lines into per-test results and a verdict reason.

    Args:
        n: number of test cases.
        lines: the payloads after the nonce, in arrival order; None for a line without the nonce.
        ended: "done" (final line seen), "eof" (pipe closed), "timeout" (wall clock) or "overflow" (too much data).
        process_reason: why the process ended when it did not finish ("timeout", "crash", ...).
    Returns:
        ([[passed, reason], ...] of length n, verdict reason: "ok" iff every case passed and ``done`` was seen).
    """
    results: list[str | None] = [None] * n
    load, setup, done, tampered, k = None, None, False, ended == "overflow", 0
    for line in lines:
        kind, _, arg = (line or "").partition(" ")
        if line is None or done:
            tampered = True
        elif load is None:
            if kind == "loaded" and not arg:
                load = "ok"
            elif kind == "load" and _valid_reason(arg) and arg != "ok":
                load = arg
            else:
                tampered = True
        elif load != "ok":
            tampered = True
        elif kind == "done" and not arg:
            done = True
        elif setup is None and kind == "setup" and _valid_reason(arg) and arg != "ok":
            setup = arg
        elif setup is None and kind == str(k) and k < n and _valid_reason(arg):
            results[k] = arg
            k += 1
        else:
            tampered = True
        if tampered:
            break
    if tampered:
        return [[False, "protocol"] for _ in range(n)], "protocol"
    if load is None:
        return [[False, process_reason] for _ in range(n)], process_reason
    if load != "ok":
        return [[False, load] for _ in range(n)], load
    tests = []
    for i, r in enumerate(results):
        if r is not None:
            tests.append([r == "ok", r])
        elif setup is not None:
            tests.append([False, setup])
        elif not done and i == k:
            tests.append([False, process_reason])
        else:
            tests.append([False, "not_run"])
    failed = [r for ok, r in tests if not ok]
    if done and not failed:
        return tests, "ok"
    return tests, failed[0] if failed else process_reason


# ----------------------------------------------------------------------------------------------------------
# The in-process harness (runs in the sandboxed child, after privileges are dropped).


class _InvalidReturn(Exception):
    """The candidate returned something other than plain builtin data."""


def make_sanitizer(_type=type, _list=list, _tuple=tuple, _dict=dict, _set=set, _frozenset=frozenset, _items=dict.items):
    """A function copying a return value into exact builtin types; raises _InvalidReturn otherwise."""
    import collections

    atoms = (int, float, bool, str, bytes, complex, type(None))
    dict_like = (collections.Counter, collections.OrderedDict, collections.defaultdict)
    invalid = _InvalidReturn

    def sanitize(value, depth=0):
        if depth > 64:
            raise invalid("nested deeper than 64 levels")
        t = _type(value)
        for atom in atoms:  # identity, not ==: a metaclass could make a class compare equal to int
            if t is atom:
                return value
        if t is bytearray:
            return bytes(value)
        if t is _list or t is _tuple:
            out = [sanitize(v, depth + 1) for v in value]
            return out if t is _list else _tuple(out)
        if t is _set or t is _frozenset:
            out = {sanitize(v, depth + 1) for v in value}
            return out if t is _set else _frozenset(out)
        if t is _dict or any(t is d for d in dict_like):
            return {sanitize(k, depth + 1): sanitize(v, depth + 1) for k, v in _items(value)}
        raise invalid(f"returned a {getattr(t, '__name__', '?')!s:.64}")

    return sanitize


def make_reason(_type=type, _isinstance=isinstance, _str=str, _len=len, _getattr=getattr):
    invalid, assertion, memory = _InvalidReturn, AssertionError, MemoryError

    def reason(exc) -> str:
        t = _type(exc)
        if t is invalid:
            return "invalid_return"
        if _isinstance(exc, assertion):
            return "assertion"
        if _isinstance(exc, memory):
            return "memory"
        name = _getattr(t, "__name__", None)
        if _type(name) is not _str or not (name.isascii() and name.isidentifier()) or _len(name) > 64:
            name = "UnknownError"
        return "exception:" + name

    return reason


def _lock_tracing() -> None:
    """Tracing/profiling hooks could jump over an assert; turn them off for good in this process."""

    def denied(*args, **kwargs):
        raise PermissionError("tracing is disabled in the sandbox")

    sys.settrace(None)
    sys.setprofile(None)
    sys.settrace = sys.setprofile = denied
    threading = sys.modules.get("threading")
    if threading is not None:
        threading.settrace = threading.setprofile = denied


def run_harness(
    program: str,
    test_code,
    entry_point: str,
    send,
    test_builtins: dict,
    sanitize,
    reason,
    _compile=compile,
    _exec=exec,
    _dict=dict,
    _str=str,
    _base=BaseException,
) -> None:
    """Load the candidate, then the test module, then run every case, reporting through ``send``.

    ``send(payload)`` writes one nonce-prefixed line; ``test_builtins`` is a pristine copy of the builtins (taken
    before any candidate ran; this process's copy may be changed freely); ``sanitize`` and ``reason`` come from
    :func:`make_sanitizer` and :func:`make_reason`. Returns normally only after sending ``done``.
    """
    _lock_tracing()
    try:
        code = _compile(program, "<candidate>", "exec", dont_inherit=True, optimize=0)
    except MemoryError:
        send("load memory")
        return
    except (SyntaxError, ValueError, OverflowError, RecursionError):
        send("load syntax_error")
        return
    prog_ns = {"__name__": "__candidate__", "__builtins__": builtins}
    try:
        _exec(code, prog_ns)
    except _base as exc:
        send("load " + reason(exc))
        return
    test_ns = _dict(prog_ns)
    test_ns["__builtins__"], test_ns["__name__"] = test_builtins, "__test__"
    try:
        _exec(test_code, test_ns)
    except _base as exc:
        send("load " + reason(exc))
        return
    if entry_point not in test_ns:
        send("load exception:NameError")
        return
    fn, make = test_ns[entry_point], test_ns[_MAKE]

    def candidate(*args, **kwargs):
        return sanitize(fn(*args, **kwargs))

    def record(k, exc):
        send(_str(k) + (" ok" if exc is None else " " + reason(exc)))

    def setup_failed(exc):
        send("setup " + reason(exc))

    check = make(record, setup_failed, _base)
    send("loaded")
    check(candidate)
    send("done")


def make_sender(fd: int, nonce: str, _write=os.write):
    """``send(payload)``: write ``<nonce> <payload>\\n`` to ``fd`` in full (one write for short lines: atomic)."""
    prefix = (nonce + " ").encode()

    def send(payload: str) -> None:
        data = prefix + payload.encode("utf-8", "replace") + b"\n"
        while data:
            data = data[_write(fd, data) :]

    return send
