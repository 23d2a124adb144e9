"""Test harness for :mod:`sandbox.verifier`: the test transform, the two processes of a run, the verdict protocol.

Standard library only: imported by the parent (to validate tests and count cases) and by the sandbox worker
(``sandbox/worker.py``), which forks two sandboxed processes per program:

* the **candidate process** loads the program and then only serves calls: it reads ``(name, args, kwargs)``
  requests from a socket, calls the named object of its namespace and writes back the return value, copied into
  plain builtin data (:func:`encode`), or the name and message of the exception it raised (:func:`serve_candidate`);
* the **test process**, forked from the pristine worker and never running a line of the candidate's code, runs
  the test module with the pristine builtins and modules; ``candidate`` (and any other name the test uses that
  only the program defines, e.g. HumanEval/38's ``encode_cyclic``) is a proxy that sends a request and rebuilds
  the answer from data (:func:`decode`); it alone writes the verdict lines (:func:`run_tests`).

The two run as different unprivileged uids, each as pid 1 of its own PID namespace, and the test process is not
dumpable: the candidate cannot name, signal, trace or read the test process, and it never holds the verdict pipe.
Whatever the candidate does in its own interpreter (frames, ``gc``, tracebacks, patched builtins or modules,
``sys.exit``, printing, closing or writing fds, killing what it can) it can only change the values its functions
return, or end its process early, which the test process sees as a failed call. Names of builtins are never
proxied: a program defining ``abs`` does not change the ``abs`` the tests call.

Verdict protocol (test process → worker): each line is prefixed by a per-run nonce; in order ``loaded`` (or
``load <reason>``), one ``<k> <reason>`` line per test case, an optional ``setup <reason>`` and a final ``done``;
anything else marks the run ``protocol`` (failed). When the candidate process dies mid-call the test process stops
at once; the worker then gives the case in flight the process-level reason (timeout or crash) and later ones
``not_run``.

A test is HumanEval-style: module-level code (``METADATA``, imports, helpers) plus ``def check(candidate):``. Each
top-level ``assert`` in ``check``'s body is one test case, except an assert of a constant (``assert True, "..."``),
which tests nothing and is dropped; the other top-level statements are setup run in order (a failing setup
statement fails every later case with its reason); a body without top-level asserts is one case.
"""

from __future__ import annotations

import ast
import builtins
import collections
import copy
import json
import os
import sys
import types

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


def _constant_assert(stmt: ast.stmt) -> bool:
    """``assert <constant>`` (e.g. HumanEval's ``assert True, "This prints if this assert fails"``): not a test."""
    return isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Constant)


def transform_test(test: str) -> tuple[ast.Module, int]:
    """Split a HumanEval-style test into guarded cases.

    Keeps the module as is and appends ``__didpo_make_check__(record, setup_failed, BaseException)``, which
    returns a copy of the last top-level ``check`` whose top-level asserts each report through ``record``.
    Asserts of a constant are dropped (they neither pass nor count).

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
    statements = [stmt for stmt in check.body if not _constant_assert(stmt)] or [ast.Pass()]
    if any(isinstance(stmt, ast.Assert) for stmt in statements):
        body, n = [], 0
        for stmt in statements:
            if isinstance(stmt, ast.Assert):
                body.append(_guard_case([stmt], n))
                n += 1
            else:
                body.append(_guard_setup(stmt))
    else:
        body, n = [_guard_case(statements, 0)], 1
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


def borrowed_names(tree: ast.Module) -> list[str]:
    """Names the test reads that are neither builtins nor internal: the ones the program may have to lend it.

    A superset (locals of ``check`` are included); the candidate process reports which of them it defines.
    """
    loaded = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    return sorted(n for n in loaded if n not in builtins.__dict__ and not n.startswith("__didpo_"))


# ----------------------------------------------------------------------------------------------------------
# Plain data across the pipe: JSON with tagged containers (never pickle or marshal: the candidate writes it).

_MAX_MESSAGE_BYTES = 16 << 20
_SMALL_INT = 1 << 62


class _InvalidReturn(Exception):
    """The candidate returned something other than plain builtin data."""


def _candidate_gone():
    """The candidate process died or broke the call protocol: the test process ends at once, before any test
    code could catch an exception (a bare ``except:`` around the call must not turn a dead program into a pass).
    The worker then gives the case in flight the process-level reason."""
    os._exit(3)


def encode(value, depth: int = 0):
    """A JSON-able copy of plain builtin data (candidate side); raises _InvalidReturn for anything else.

    Atoms (None, bool, str, float, ints below 2**62) are JSON values; big ints, bytes, complex numbers and every
    container are ``[tag, ...]`` lists. Exact types only (by identity): a subclass, a custom ``__eq__`` or a
    generator is refused. Counter, OrderedDict and defaultdict become dicts, bytearray becomes bytes.
    """
    if depth > 64:
        raise _InvalidReturn("nested deeper than 64 levels")
    t = type(value)
    if value is None or t is bool or t is str or t is float:
        return value
    if t is int:
        return value if -_SMALL_INT < value < _SMALL_INT else ["i", hex(value)]
    if t is bytes or t is bytearray:
        return ["b", bytes(value).hex()]
    if t is complex:
        return ["c", value.real, value.imag]
    for container, tag in ((list, "l"), (tuple, "t"), (set, "s"), (frozenset, "f")):
        if t is container:
            return [tag, [encode(v, depth + 1) for v in value]]
    if t is dict or t is collections.Counter or t is collections.OrderedDict or t is collections.defaultdict:
        return ["d", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in dict.items(value)]]
    raise _InvalidReturn(f"returned a {getattr(t, '__name__', '?')!s:.64}")


def decode(data, depth: int = 0):
    """Plain builtin data back from :func:`encode`'s form (test side). Raises _InvalidReturn on anything else."""
    if depth > 66:
        raise _InvalidReturn("nested too deep")
    t = type(data)
    if data is None or t is bool or t is str or t is float or t is int:
        return data
    if t is not list or not data or type(data[0]) is not str:
        raise _InvalidReturn("malformed value")
    tag, rest = data[0], data[1:]
    try:
        if tag == "i" and len(rest) == 1 and type(rest[0]) is str:
            return int(rest[0], 16)
        if tag == "b" and len(rest) == 1 and type(rest[0]) is str:
            return bytes.fromhex(rest[0])
        if tag == "c" and len(rest) == 2 and all(type(x) in (int, float) for x in rest):
            return complex(rest[0], rest[1])
        if tag in ("l", "t", "s", "f") and len(rest) == 1 and type(rest[0]) is list:
            items = [decode(v, depth + 1) for v in rest[0]]
            return {"l": list, "t": tuple, "s": set, "f": frozenset}[tag](items)
        if tag == "d" and len(rest) == 1 and type(rest[0]) is list:
            pairs = rest[0]
            if not all(type(p) is list and len(p) == 2 for p in pairs):
                raise _InvalidReturn("malformed dict")
            return {decode(k, depth + 1): decode(v, depth + 1) for k, v in pairs}
    except (TypeError, ValueError) as exc:  # unhashable set member or key, bad hex
        raise _InvalidReturn(f"malformed value: {type(exc).__name__}") from None
    raise _InvalidReturn("malformed value")


def write_message(fd: int, obj) -> None:
    """Write ``obj`` as one length-prefixed JSON message (4-byte big-endian length, then UTF-8 JSON)."""
    data = json.dumps(obj, separators=(",", ":")).encode()
    data = len(data).to_bytes(4, "big") + data
    while data:
        data = data[os.write(fd, data) :]


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_message(fd: int):
    """One message; None at EOF. Raises ValueError (bad length, bad JSON) or RecursionError."""
    head = _read_exact(fd, 4)
    if head is None:
        return None
    size = int.from_bytes(head, "big")
    if size > _MAX_MESSAGE_BYTES:
        raise ValueError("message too large")
    body = _read_exact(fd, size)
    if body is None:
        return None
    return json.loads(body)


# ----------------------------------------------------------------------------------------------------------
# Reasons.

_CHILD_REASONS = frozenset({"ok", "assertion", "memory", "syntax_error", "invalid_return"})


def _valid_reason(reason: str) -> bool:
    if reason in _CHILD_REASONS:
        return True
    name = reason.removeprefix("exception:")
    return name != reason and name.isascii() and name.isidentifier() and len(name) <= 64


def reason_of(exc: BaseException) -> str:
    """The reason string of an exception: assertion, memory, invalid_return or ``exception:<TypeName>``."""
    t = type(exc)
    if t is _InvalidReturn:
        return "invalid_return"
    if isinstance(exc, AssertionError):
        return "assertion"
    if isinstance(exc, MemoryError):
        return "memory"
    name = getattr(t, "__name__", None)
    if type(name) is not str or not (name.isascii() and name.isidentifier()) or len(name) > 64:
        name = "UnknownError"
    return "exception:" + name


# ----------------------------------------------------------------------------------------------------------
# Verdict assembly (worker side; pure).


def assemble(n: int, lines: list[str | None], ended: str, process_reason: str) -> tuple[list[list], str]:
    """Turn the test process's lines into per-test results and a verdict reason.

    Args:
        n: number of test cases.
        lines: the payloads after the nonce, in arrival order; None for a line without the nonce.
        ended: "done" (final line seen), "eof" (pipe closed), "timeout" (wall clock) or "overflow" (too much data).
        process_reason: why the run ended when it did not finish ("timeout", "crash", ...).
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
# The candidate process: load the program, then serve calls.


def _kind(value) -> list:
    """How a lent name reaches the test process: a callable proxy, a stdlib module (imported there), or data."""
    if isinstance(value, types.ModuleType) and isinstance(getattr(value, "__name__", None), str):
        return ["module", value.__name__]
    if callable(value):
        return ["callable"]
    return ["data", encode(value)]


def serve_candidate(channel: int) -> None:
    """Run in the candidate process: receive the job, exec the program, report what it lends, answer calls until EOF.

    ``channel``: a socket to the test process, which sends the job first (``{"program", "entry_point", "names"}``:
    the program reaches this process only through it, so the zygote this process is forked from never holds a
    program, and no program can find an earlier one in its inherited memory). Messages sent: first
    ``{"load": "ok", "names": {name: kind}}``
    (kinds from the requested ``names``) or ``{"load": reason}``; then one per request ``[name, args, kwargs]``
    (encoded data): ``{"ok": value}``, ``{"invalid": message}`` or ``{"raise": [TypeName, message]}``. Nothing
    here is trusted: the program runs in this interpreter.
    """
    job = read_message(channel)
    if type(job) is not dict:
        return
    program, entry_point, names = job["program"], job["entry_point"], job["names"]
    try:
        code = compile(program, "<candidate>", "exec", dont_inherit=True, optimize=0)
    except MemoryError:
        return write_message(channel, {"load": "memory"})
    except (SyntaxError, ValueError, OverflowError, RecursionError):
        return write_message(channel, {"load": "syntax_error"})
    ns = {"__name__": "__candidate__", "__builtins__": builtins}
    try:
        exec(code, ns)
    except BaseException as exc:
        return write_message(channel, {"load": reason_of(exc)})
    if entry_point not in ns:
        return write_message(channel, {"load": "exception:NameError"})
    lent = {}
    for name in {entry_point, *names}:
        if name in ns:
            try:
                lent[name] = _kind(ns[name])
            except _InvalidReturn:
                pass  # data the tests could not use: the name stays undefined there
    objects = {name: ns[name] for name in lent}
    write_message(channel, {"load": "ok", "names": lent})
    while True:
        request = read_message(channel)
        if request is None:
            return
        name, args, kwargs = request
        try:
            result = objects[name](*decode(args), **decode(kwargs))
            reply = {"ok": encode(result)}
        except _InvalidReturn as exc:
            reply = {"invalid": str(exc)[:200]}
        except BaseException as exc:
            try:
                message = str(exc)[:1000]
            except BaseException:
                message = ""
            reply = {"raise": [type(exc).__name__, message]}
        write_message(channel, reply)


# ----------------------------------------------------------------------------------------------------------
# The test process: pristine interpreter, proxies, verdict lines.


def _rebuild_exception(name, message) -> BaseException:
    """The candidate's exception as the test sees it: the builtin class of that name, else a new Exception class."""
    if type(name) is not str or not (name.isascii() and name.isidentifier()) or len(name) > 64:
        name = "UnknownError"
    message = message if type(message) is str else ""
    cls = builtins.__dict__.get(name)
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        cls = type(name, (Exception,), {})
    try:
        return cls(message)
    except Exception:  # e.g. UnicodeDecodeError needs five arguments
        exc = cls.__new__(cls)
        exc.args = (message,)
        return exc


def _make_proxy(name: str, channel: int):
    def proxy(*args, **kwargs):
        try:
            request = [name, encode(list(args)), encode(dict(kwargs))]
        except _InvalidReturn:
            raise TypeError("the sandbox passes only plain builtin data to the program") from None
        try:
            write_message(channel, request)
            reply = read_message(channel)
        except (OSError, ValueError, RecursionError):
            _candidate_gone()
        if type(reply) is not dict or len(reply) != 1:
            _candidate_gone()
        if "ok" in reply:
            try:
                return decode(reply["ok"])
            except RecursionError:
                raise _InvalidReturn("nested too deep") from None
        if "invalid" in reply:
            raise _InvalidReturn("returned something other than plain data")
        if "raise" in reply and type(reply["raise"]) is list and len(reply["raise"]) == 2:
            raise _rebuild_exception(*reply["raise"])
        _candidate_gone()

    proxy.__name__ = proxy.__qualname__ = name
    return proxy


def run_tests(test_code, program: str, entry_point: str, names: list[str], send, channel: int) -> None:
    """Run in the test process: send the candidate process its job, wait for its load report, run every case,
    report through ``send``.

    ``test_code``: the compiled :func:`transform_test` module; ``names``: its :func:`borrowed_names` (the only
    names the program may lend; a lent module must be one this process has already imported, so no import-time
    code runs here on the program's say-so); ``send(payload)`` writes one nonce-prefixed line. Returns after
    ``done``; ends the process early (no more lines) when the candidate process is gone. ``channel``: the socket
    to it.
    """
    try:
        write_message(channel, {"program": program, "entry_point": entry_point, "names": names})
        report = read_message(channel)
    except (OSError, ValueError, RecursionError):
        _candidate_gone()
    if type(report) is not dict or type(report.get("load")) is not str:
        _candidate_gone()
    if report["load"] != "ok":
        send("load " + (report["load"] if _valid_reason(report["load"]) else "exception:UnknownError"))
        return
    lent = report.get("names")
    if type(lent) is not dict:
        _candidate_gone()
    test_ns = {"__name__": "__test__", "__builtins__": builtins}
    for name in {entry_point, *names}:
        kind = lent.get(name)
        if kind == ["callable"]:
            test_ns[name] = _make_proxy(name, channel)
        elif type(kind) is list and len(kind) == 2 and kind[0] == "module" and type(kind[1]) is str:
            module = sys.modules.get(kind[1])  # preloaded by the worker (math, re, ...), never imported here
            if module is not None and kind[1].partition(".")[0] in sys.stdlib_module_names:
                test_ns[name] = module
        elif type(kind) is list and len(kind) == 2 and kind[0] == "data":
            try:
                test_ns[name] = decode(kind[1])
            except (_InvalidReturn, RecursionError):
                pass
    if lent.get(entry_point) != ["callable"]:
        send("load exception:TypeError")  # the entry point is not a function
        return
    candidate = test_ns[entry_point]
    try:
        exec(test_code, test_ns)
    except BaseException as exc:
        send("load " + reason_of(exc))
        return

    def record(k, exc):
        send(str(k) + (" ok" if exc is None else " " + reason_of(exc)))

    def setup_failed(exc):
        send("setup " + reason_of(exc))

    check = test_ns[_MAKE](record, setup_failed, BaseException)
    send("loaded")
    check(candidate)
    send("done")


def make_sender(fd: int, nonce: str):
    """``send(payload)``: write ``<nonce> <payload>\\n`` to ``fd`` in full (one write for short lines: atomic)."""
    prefix = (nonce + " ").encode()

    def send(payload: str) -> None:
        data = prefix + payload.encode("utf-8", "replace") + b"\n"
        while data:
            data = data[os.write(fd, data) :]

    return send
