"""Hostile programs: each is contained, gets the right verdict, leaves no process behind and no file changed
outside its sandbox, and the machine stays responsive.

Where an attack is not in itself a wrong answer (writing outside, the network, secrets, a background process, a
flood of output), the program reports from inside what it managed to do and the test's ``check`` asserts that it
managed nothing, so the verdict passes only if the sandbox held; the test also checks from the outside.
"""

import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from sandbox.verifier import Verifier, VerifierConfig

TIMEOUT_S = 2.0
CHECK_F = "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(2) == 3\n"
CHECK_NOTHING_ESCAPED = "def check(candidate):\n    assert candidate() == []\n"


@pytest.fixture(scope="module")
def verifier():
    with Verifier(VerifierConfig(workers=2, timeout_s=TIMEOUT_S, cpu_s=2)) as v:
        yield v


def processes_of(uids: set[int]) -> list[int]:
    """Pids of live (or zombie) processes whose real uid is one of ``uids``."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as f:
                    status = f.read()
            except OSError:
                continue
            if int(status.split("Uid:")[1].split()[0]) in uids:
                out.append(int(entry))
    return out


def zombie_children_of(parents: set[int]) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] == "Z" and int(fields[1]) in parents:
                out.append(int(entry))
    return out


@pytest.fixture(autouse=True)
def nothing_survives(verifier):
    """After every test: no process of a sandbox uid, no zombie, and the machine and the verifier respond."""
    yield
    uids = set(verifier.sandbox_uids)
    assert uids, "programs are expected to run as unprivileged uids on this machine"
    deadline = time.monotonic() + 2.0
    while processes_of(uids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_of(uids) == []
    assert zombie_children_of(set(verifier.worker_pids) | {os.getpid()}) == []
    t0 = time.monotonic()
    assert subprocess.run(["true"], timeout=10).returncode == 0
    assert verifier.check("def f(x):\n    return x + 1\n", CHECK_F, "f").passed
    assert time.monotonic() - t0 < 5.0


# ---------------------------------------------------------------- resource abuse


def test_infinite_loop_times_out(verifier):
    for program in ("def f(x):\n    while True:\n        pass\n", "while True:\n    pass\n"):
        v = verifier.check(program, CHECK_F, "f")
        assert not v.passed and v.reason == "timeout"
        assert TIMEOUT_S <= v.duration_s < TIMEOUT_S + 1.5


def test_sleeping_forever_times_out(verifier):
    v = verifier.check("import time\ndef f(x):\n    time.sleep(3600)\n", CHECK_F, "f")
    assert (v.passed, v.reason) == (False, "timeout")


def test_huge_allocations_raise_memory(verifier):
    for program in (
        "def f(x):\n    b = bytearray(8 << 30)\n    return x + 1\n",
        "def f(x):\n    b = [0] * (1 << 30)\n    return x + 1\n",
        "b = b'x' * (8 << 30)\ndef f(x):\n    return x + 1\n",
    ):
        v = verifier.check(program, CHECK_F, "f")
        assert (v.passed, v.reason) == (False, "memory"), program


FORK_PROBE = """
import os, time
def f():
    children = 0
    for _ in range(64):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        children += 1
    return children
"""


def test_fork_bomb_is_contained(verifier):
    # A harmless probe first: at most 64 sleeping children. Only if the cap is shown to bind does the bomb run.
    probe = verifier.check(FORK_PROBE, "def check(candidate):\n    assert candidate() < 32\n", "f")
    if not probe.passed:
        pytest.skip(f"no process cap in force here (probe verdict: {probe.reason}); not running a fork bomb")
    bomb = "import os\ndef f(x):\n    while True:\n        try:\n            os.fork()\n"
    bomb += "        except OSError:\n            pass\n"
    t0 = time.monotonic()
    v = verifier.check(bomb, CHECK_F, "f")
    assert (v.passed, v.reason) == (False, "timeout")
    assert time.monotonic() - t0 < TIMEOUT_S + 5
    assert verifier.isolation["process_cap"] != "none"


def test_filling_the_disk_stops_at_the_scratch_cap(verifier):
    program = """
import errno
def f():
    total, error, chunk = 0, None, b"\\0" * (1 << 20)
    try:
        for i in range(100000):
            with open(f"fill{i}", "wb") as fh:
                for _ in range(8):
                    fh.write(chunk)
                    fh.flush()
                    total += len(chunk)
    except OSError as e:
        error = errno.errorcode[e.errno]
    try:
        with open("big", "wb") as fh:
            fh.write(b"\\0" * (20 << 20))  # one file over the 16 MiB file-size limit
        big = "written"
    except OSError as e:
        big = errno.errorcode[e.errno]
    return [total <= (64 << 20), error, big]
"""
    v = verifier.check(program, "def check(candidate):\n    assert candidate() == [True, 'ENOSPC', 'ENOSPC']\n", "f")
    # once the tmpfs is full even the big write fails with ENOSPC; a fresh scratch shows EFBIG for it below
    assert v.passed, v
    big_only = "def f():\n    try:\n        open('big', 'wb').write(b'\\0' * (20 << 20))\n"
    big_only += "    except OSError as e:\n        return e.errno\n"
    v = verifier.check(big_only, f"def check(candidate):\n    assert candidate() == {errno.EFBIG}\n", "f")
    assert v.passed, v


def test_output_flood_is_discarded(verifier):
    program = (
        "import sys\ndef f(x):\n    line = 'x' * (1 << 20)\n    for _ in range(512):\n        print(line)\n"
        "    sys.stderr.write(line)\n    return x + 1\n"
    )
    v = verifier.check(program, "def check(candidate):\n    assert candidate(1) == 2\n", "f")
    assert v.passed and v.duration_s < TIMEOUT_S, v


# ---------------------------------------------------------------- escapes


@pytest.fixture
def victims(tmp_path):
    """World-writable folders with a world-writable file, in /var/tmp and in the test's tmp dir."""
    dirs = [tempfile.mkdtemp(dir="/var/tmp", prefix="didpo-victim-"), str(tmp_path)]
    files = []
    for d in dirs:
        os.chmod(d, 0o777)
        path = os.path.join(d, "victim.txt")
        with open(path, "w") as f:
            f.write("original")
        os.chmod(path, 0o666)
        files.append(path)
    before = {p: (open(p).read(), os.stat(p).st_mode, os.stat(p).st_mtime_ns) for p in files}
    listing = {d: sorted(os.listdir(d)) for d in dirs}
    yield dirs, files
    for p, state in before.items():
        assert (open(p).read(), os.stat(p).st_mode, os.stat(p).st_mtime_ns) == state
    assert {d: sorted(os.listdir(d)) for d in dirs} == listing
    shutil.rmtree(dirs[0])


ATTEMPTS = """
import os, shutil
DIRS, FILES = {dirs!r}, {files!r}
def attempt(name, fn, done):
    try:
        fn()
        done.append(name)
    except OSError:
        pass
def f():
    done = []
    for d, p in zip(DIRS, FILES):
        {body}
    return done
"""


def test_writing_outside_the_sandbox_fails(verifier, victims):
    dirs, files = victims
    body = "; ".join(
        [
            "attempt('overwrite ' + p, lambda: open(p, 'w').write('pwned'), done)",
            "attempt('append ' + p, lambda: open(p, 'a').write('pwned'), done)",
            "attempt('create in ' + d, lambda: open(os.path.join(d, 'new.txt'), 'w').write('x'), done)",
            "attempt('chmod ' + p, lambda: os.chmod(p, 0o600), done)",
            "attempt('utime ' + p, lambda: os.utime(p, (0, 0)), done)",
            "attempt('symlink in ' + d, lambda: os.symlink('/etc/passwd', os.path.join(d, 'l')), done)",
            "attempt('mkdir in ' + d, lambda: os.mkdir(os.path.join(d, 'sub')), done)",
        ]
    )
    extra = "\n        ".join(
        [
            "attempt('write /etc', lambda: open('/etc/didpo-pwned', 'w'), done)",
            "attempt('write /tmp', lambda: open('/tmp/didpo-pwned', 'w'), done)",
            "attempt('write /dev/shm', lambda: open('/dev/shm/didpo-pwned', 'w'), done)",
            "attempt('write home', lambda: open(os.path.expanduser('~root/didpo-pwned'), 'w'), done)",
        ]
    )
    program = ATTEMPTS.format(dirs=dirs, files=files, body=body + "\n        " + extra)
    v = verifier.check(program, CHECK_NOTHING_ESCAPED, "f")
    assert v.passed, v
    for path in ("/etc/didpo-pwned", "/tmp/didpo-pwned", "/dev/shm/didpo-pwned", "/root/didpo-pwned"):
        assert not os.path.exists(path)


def test_deleting_files_outside_the_sandbox_fails(verifier, victims):
    dirs, files = victims
    body = "; ".join(
        [
            "attempt('remove ' + p, lambda: os.remove(p), done)",
            "attempt('rename ' + p, lambda: os.rename(p, p + '.moved'), done)",
            "attempt('truncate ' + p, lambda: os.truncate(p, 0), done)",
            "attempt('rmtree ' + d, lambda: shutil.rmtree(d), done)",
        ]
    )
    v = verifier.check(ATTEMPTS.format(dirs=dirs, files=files, body=body), CHECK_NOTHING_ESCAPED, "f")
    assert v.passed, v


def test_no_network_not_even_loopback(verifier):
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(8)
    tcp.settimeout(0.5)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(0.5)
    abstract_name = f"\0didpo-test-{uuid.uuid4().hex}"
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(abstract_name)
    unix.listen(1)
    unix.settimeout(0.5)
    tcp_port, udp_port = tcp.getsockname()[1], udp.getsockname()[1]
    program = f"""
import socket
def f():
    done = []
    try:
        socket.create_connection(("127.0.0.1", {tcp_port}), timeout=1).close()
        done.append("tcp")
    except OSError:
        pass
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.sendto(b"leak", ("127.0.0.1", {udp_port}))
        done.append("udp")
    except OSError:
        pass
    try:
        u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        u.connect({abstract_name!r})
        done.append("abstract unix")
    except OSError:
        pass
    try:
        socket.getaddrinfo("example.com", 80)
        done.append("dns")
    except OSError:
        pass
    return done
"""
    try:
        v = verifier.check(program, CHECK_NOTHING_ESCAPED, "f")
        assert v.passed, v
        for receive in (tcp.accept, lambda: udp.recvfrom(16), unix.accept):
            with pytest.raises(TimeoutError):
                receive()
    finally:
        for s in (tcp, udp, unix):
            s.close()


def test_background_process_does_not_outlive_the_run(verifier):
    marker = f"dbg{uuid.uuid4().hex[:10]}"  # a process name (comm, ≤ 15 chars) to look for
    program = f"""
import ctypes, os, time
def f(x):
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            ctypes.CDLL(None).prctl(15, {marker.encode()!r}, 0, 0, 0)  # PR_SET_NAME
            time.sleep(600)
        os._exit(0)
    os.waitpid(pid, 0)
    time.sleep(1.0)
    return x + 1
"""

    def named(name):
        found = []
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/comm") as f:
                    if f.read().strip() == name:
                        found.append(int(entry))
            except (OSError, ValueError):
                continue
        return found

    seen, result = [], {}
    check_once = "def check(candidate):\n    assert candidate(1) == 2\n"
    runner = threading.Thread(target=lambda: result.update(v=verifier.check(program, check_once, "f")))
    runner.start()
    while runner.is_alive():
        seen += named(marker)  # positive control: the double-forked daemon does exist during the run
        time.sleep(0.05)
    runner.join()
    assert result["v"].passed, result["v"]
    assert seen, "the background process was never observed; the check below would prove nothing"
    assert named(marker) == []
    for pid in set(seen):
        assert not os.path.exists(f"/proc/{pid}")


def test_secrets_in_the_environment_are_not_visible(monkeypatch):
    secret = f"hunter2-{uuid.uuid4().hex}"
    monkeypatch.setenv("DIDPO_FAKE_SECRET", secret)
    program = f"""
import os
def f():
    found = []
    if any({secret!r} in v for v in os.environ.values()):
        found.append("os.environ")
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{{entry}}/environ", "rb") as fh:
                if {secret.encode()!r} in fh.read():
                    found.append(entry)
        except OSError:
            pass
    return found
"""
    with Verifier(VerifierConfig(workers=1)) as v:
        verdict = v.check(program, CHECK_NOTHING_ESCAPED, "f")
        env = v.check(
            "import os\ndef f():\n    return sorted(os.environ)\n",
            "def check(candidate):\n    assert candidate() == ['HOME', 'LANG', 'PATH', 'TMPDIR']\n",
            "f",
        )
    assert verdict.passed, verdict
    assert env.passed, env


def test_project_home_devices_and_other_processes_are_hidden(verifier):
    project = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    readable = [__file__, os.path.join(project, "pyproject.toml"), "/dev/vda", "/dev/mem", "/root/.bash_history"]
    program = f"""
import os
def f():
    seen = []
    for path in {readable!r}:
        try:
            open(path, "rb").read(1)
            seen.append(path)
        except OSError:
            pass
    others = [p for p in os.listdir("/proc") if p.isdigit() and os.stat("/proc/" + p).st_uid != os.getuid()]
    if others:
        seen.append("processes of other users: " + " ".join(others[:5]))
    try:  # the project's parent may itself be unreadable in the sandbox (e.g. a clone under /tmp): hidden too
        if os.path.basename({project!r}) in os.listdir(os.path.dirname({project!r})) and os.listdir({project!r}):
            seen.append("project folder listing")
    except OSError:
        pass
    import colorsys  # the standard library stays importable
    return seen
"""
    assert any(os.path.exists(p) for p in readable[:2])
    v = verifier.check(program, CHECK_NOTHING_ESCAPED, "f")
    assert v.passed, v
    assert project in verifier.isolation["hidden_paths"]


# ---------------------------------------------------------------- faked verdicts

FAKES = {
    "sys.exit at import": "import sys\ndef f(x):\n    return 0\nsys.exit(0)\n",
    "sys.exit in the function": "import sys\ndef f(x):\n    sys.exit(0)\n",
    "os._exit at import": "import os\ndef f(x):\n    return 0\nos._exit(0)\n",
    "os._exit in the function": "import os\ndef f(x):\n    os._exit(0)\n",
    "always-equal object": (
        "class A:\n    def __eq__(self, o):\n        return True\n    def __ne__(self, o):\n        return False\n"
        "    __hash__ = object.__hash__\ndef f(x):\n    return A()\n"
    ),
    "always-equal int subclass": (
        "class I(int):\n    def __eq__(self, o):\n        return True\n    __hash__ = int.__hash__\n"
        "def f(x):\n    return I(0)\n"
    ),
    "always-equal list inside a list": (
        "class L(list):\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return [L()]\n"
    ),
    "printing success": (
        "import sys\nprint('passed')\nprint('All tests passed')\nprint('{\"passed\": true}')\n"
        "sys.stderr.write('OK\\n')\ndef f(x):\n    print('passed')\n    return 0\n"
    ),
    "redefining check": "def check(candidate):\n    return True\ndef f(x):\n    return 0\n",
    "redefining check at call time": (
        "def f(x):\n    global check\n    check = lambda c: None\n    import sys\n"
        "    sys.modules['__main__'].__dict__['check'] = check\n    return 0\n"
    ),
    "atexit": (
        "import atexit, os\natexit.register(print, 'passed')\natexit.register(os._exit, 0)\ndef f(x):\n    return 0\n"
    ),
    "killing the parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\ndef f(x):\n    return 0\n",
    "killing every process it can": "import os, signal\ndef f(x):\n    os.kill(-1, signal.SIGKILL)\n    return 0\n",
    "killing every pid it can find": (
        "import os\nfor p in os.listdir('/proc'):\n    if p.isdigit() and int(p) != os.getpid():\n        try:\n"
        "            os.kill(int(p), 9)\n        except OSError:\n            pass\n"
        "for p in range(2, 40000):\n    try:\n        os.kill(p, 9)\n    except OSError:\n        pass\n"
        "def f(x):\n    return 0\n"
    ),
    "forged result lines on every fd": (
        "import os\nfor fd in range(64):\n    for line in (b'loaded\\n', b'0 ok\\n', b'1 ok\\n', b'done\\n'):\n"
        "        try:\n            os.write(fd, line)\n        except OSError:\n            pass\n"
        "def f(x):\n    return 0\n"
    ),
    "closing every fd": "import os\nos.closerange(0, 1024)\ndef f(x):\n    return x + 1\n",
    "patching builtins and os.write": (
        "import builtins, os\nreal = os.write\n"
        "os.write = lambda fd, b: real(fd, b.replace(b'assertion', b'ok'))\n"
        "builtins.AssertionError = type('Nope', (Exception,), {})\nbuiltins.abs = lambda v: 0\n"
        "def f(x):\n    return 0\n"
    ),
    "tracing to jump over asserts": (
        "import sys\ndef tracer(frame, event, arg):\n    return tracer\nsys.settrace(tracer)\ndef f(x):\n    return 0\n"
    ),
}


@pytest.mark.parametrize("name", list(FAKES))
def test_faked_verdicts_fail(verifier, name):
    workers = verifier.worker_pids
    v = verifier.check(FAKES[name], CHECK_F, "f")
    assert not v.passed and v.n_passed == 0, (name, v)
    assert v.reason != "sandbox_error", (name, v)
    assert verifier.worker_pids == workers  # no worker was harmed


def test_correct_program_under_the_same_test_passes(verifier):
    # control for the test above: the same check passes an honest solution
    assert verifier.check("def f(x):\n    return x + 1\n", CHECK_F, "f").passed


# ---------------------------------------------------------------- forging the verdict from inside the program
# Each of these reaches for the verdict channel or the tests through the program's own interpreter. On the
# single-process harness (main at 9a8562d) frames, gc, traceback, test constants, test source in memory and
# shadowed builtins each forged a full PASS (outcome reward 1.0). The expected value below appears nowhere in the
# programs, so only reading the tests or forging the verdict passes.

CHECK_SECRET = (
    "def check(candidate):\n    assert candidate(1234567) == 7654321\n    assert candidate(1234567) == 7654321\n"
)
CHECK_BUILTINS = "def check(candidate):\n    assert abs(candidate(1)) == 2\n    assert len([candidate(2)]) == 3\n"

FORGERIES = {
    # walk the call stack up to whoever called us, find a verdict writer and report every case as passed
    "frames": """
import sys, os
def f(x):
    frame = sys._getframe(1)
    while frame is not None:
        for name, value in list(frame.f_locals.items()):
            if callable(value) and name in ("send", "record"):
                send = value if name == "send" else None
                if send is not None:
                    for line in ("0 ok", "1 ok", "done"):
                        send(line)
                    os._exit(0)
                value(0, None); value(1, None)
        frame = frame.f_back
    return 0
""",
    # the same through the garbage collector: every function object in the interpreter
    "gc": """
import gc, os, types
def f(x):
    for obj in gc.get_objects():
        if isinstance(obj, types.FunctionType) and obj.__name__ == "send" and obj.__code__.co_argcount == 1:
            for line in ("0 ok", "1 ok", "done"):
                obj(line)
            os._exit(0)
    return 0
""",
    # and through an exception's traceback frames (no sys._getframe, no gc)
    "traceback": """
import os
def f(x):
    try:
        raise ValueError
    except ValueError as exc:
        frame = exc.__traceback__.tb_frame
    while frame is not None:
        send = frame.f_locals.get("send")
        if callable(send):
            for line in ("0 ok", "1 ok", "done"):
                send(line)
            os._exit(0)
        frame = frame.f_back
    return 0
""",
    # read the expected value out of the compiled tests held anywhere in this process (frames, gc, modules)
    "test constants in objects": """
import gc, sys, types
def _codes():
    frame = sys._getframe()
    while frame is not None:
        yield frame.f_code
        for v in list(frame.f_locals.values()):
            yield v
            if isinstance(v, (tuple, list)):
                yield from v
            if hasattr(v, "__dict__"):
                for w in list(vars(v).values()):
                    yield w
                    if isinstance(w, dict):
                        for u in list(w.values()):
                            yield u
                            if isinstance(u, tuple):
                                yield from u
        frame = frame.f_back
    for obj in gc.get_objects():
        yield obj
def _expected(arg):
    stack = [c for c in _codes() if isinstance(c, types.CodeType)]
    while stack:
        code = stack.pop()
        consts = code.co_consts
        if arg in consts:
            i = consts.index(arg)
            rest = [c for c in consts[i + 1:] if type(c) is int]
            if rest:
                return rest[0]
        stack.extend(c for c in consts if isinstance(c, types.CodeType))
    return None
def f(x):
    return _expected(x)
""",
    # and as raw bytes anywhere in this process's address space (the test's source text)
    "test source in memory": """
import ctypes, re
NEEDLE = ("assert candidate(" + "1234567" + ") == ").encode()
def f(x):
    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: /proc/self/mem readable again
    with open("/proc/self/maps") as maps:
        regions = [line.split() for line in maps]
    with open("/proc/self/mem", "rb", 0) as mem:
        for fields in regions:
            if not fields[1].startswith("r"):
                continue
            lo, hi = (int(a, 16) for a in fields[0].split("-"))
            try:
                mem.seek(lo)
                chunk = mem.read(hi - lo)
            except (OSError, OverflowError, ValueError):
                continue
            for m in re.finditer(re.escape(NEEDLE) + rb"(\\d+)", chunk):
                return int(m.group(1))
    return -1
""",
    # signals: stop every process we can see, kill -1, SIGKILL/SIGSTOP by pid
    "signals": """
import os, signal
def f(x):
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        try:
            os.kill(-1, sig)
        except OSError:
            pass
    for pid in range(1, 5000):
        if pid != os.getpid():
            try:
                os.kill(pid, signal.SIGSTOP)
            except OSError:
                pass
    return 0
""",
    # inherited file descriptors: write forged verdict lines (with any nonce it can find) to every fd, and to
    # every other process's fds through /proc
    "inherited fds": """
import os, re
def f(x):
    lines = [b"loaded\\n", b"0 ok\\n", b"1 ok\\n", b"done\\n"]
    targets = list(range(0, 256))
    for fd in targets:
        for line in lines:
            try:
                os.write(fd, line)
            except OSError:
                pass
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    try:
                        w = os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK)
                        for line in lines:
                            os.write(w, line)
                        os.close(w)
                    except OSError:
                        pass
            except OSError:
                pass
    return 0
""",
    # shadow the builtins the tests use, and patch the modules they import
    "shadowed builtins": "def abs(x):\n    return 2\nlen = lambda x: 3\ndef f(x):\n    return 0\n",
}


@pytest.mark.parametrize("name", list(FORGERIES))
def test_forged_verdicts_fail(verifier, name):
    workers = verifier.worker_pids
    test = CHECK_BUILTINS if name == "shadowed builtins" else CHECK_SECRET
    v = verifier.check(FORGERIES[name], test, "f")
    assert not v.passed and v.n_passed == 0, (name, v)
    assert v.reason != "sandbox_error", (name, v)
    assert verifier.worker_pids == workers


def test_honest_programs_pass_the_forgery_checks(verifier):
    # controls: the same checks pass honest programs, so the failures above are the sandbox holding
    assert verifier.check("def f(x):\n    return 7654321\n", CHECK_SECRET, "f").passed
    assert verifier.check("def f(x):\n    return -2 if x == 1 else 0\n", CHECK_BUILTINS, "f").n_passed == 1


def test_tests_see_pristine_builtins_and_modules(verifier):
    """A wrong HumanEval-style answer that redefines what the tests call gains nothing: HumanEval/2's test calls
    ``abs``; here the program also patches ``math`` and ``builtins`` at import and the test uses both."""
    program = (
        "import builtins, math\nbuiltins.abs = lambda v: 0\nmath.isclose = lambda *a, **k: True\n"
        "builtins.round = lambda *a: 1.5\ndef abs(v):\n    return 0\ndef f(x):\n    return x\n"
    )
    test = (
        "import math\ndef check(candidate):\n    assert abs(candidate(3.5) - 0.5) < 1e-6\n"
        "    assert math.isclose(candidate(1.0), 2.0)\n    assert round(candidate(2.0)) == 1.5\n"
    )
    v = verifier.check(program, test, "f")
    assert v.n_passed == 0 and v.n_tests == 3, v
    assert verifier.check("def f(x):\n    return x - 3.0\n", test, "f").n_passed == 1  # control: honest abs


def test_a_dead_program_cannot_pass_through_a_bare_except(verifier):
    """A test that swallows every exception around a call must still fail a program that kills itself there."""
    test = (
        "def check(candidate):\n    try:\n        candidate(None)\n    except:\n        pass\n    assert True == True\n"
    )
    for program in (
        "import os\ndef f(x):\n    os._exit(0)\n",
        "import ctypes\ndef f(x):\n    ctypes.string_at(0)\n",  # a segfault
    ):
        v = verifier.check(program, test, "f")
        assert not v.passed and v.n_passed == 0 and v.reason == "crash", v
    assert verifier.check("def f(x):\n    raise TypeError\n", test, "f").passed  # control: exceptions are caught


def test_two_verifiers_never_kill_each_other(verifier):
    """A's worker dies and its uids are free again; B claims them. A's cleanup of its dead worker must not touch
    B's worker (on 9a8562d the cgroup was named after the uid, and A's cleanup SIGKILLed B's new worker)."""
    config = VerifierConfig(workers=1, timeout_s=TIMEOUT_S, cpu_s=2, sandbox_uid_base=2_700_000)
    a = Verifier(config)
    try:
        victim = a.worker_pids[0]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while os.path.exists(f"/proc/{victim}/status") and "zombie" not in open(f"/proc/{victim}/status").read():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with Verifier(config) as b:
            assert set(b.sandbox_uids) & {2_700_000}  # B got the dead worker's uid
            survivor = b.worker_pids
            a.close()  # A cleans up after its dead worker
            assert b.worker_pids == survivor and all(os.path.exists(f"/proc/{p}") for p in survivor)
            v = b.check("def f(x):\n    return x + 1\n", CHECK_F, "f")
            assert v.passed, v
            assert b.worker_pids == survivor
    finally:
        a.close()


def test_concurrent_verifiers_replacing_workers_do_not_interfere():
    """Two pools on the same uid range, each losing workers to timeouts-turned-hangs: no foreign sandbox_error."""
    config = VerifierConfig(workers=2, timeout_s=TIMEOUT_S, cpu_s=2, sandbox_uid_base=2_600_000)
    with Verifier(config) as a, Verifier(config) as b:
        jobs = [("def f(x):\n    return x + 1\n", CHECK_F, "f")] * 20
        results = {}

        def run(name, v):
            for _ in range(3):
                victim = v.worker_pids[0]
                killer = threading.Timer(0.05, os.kill, (victim, signal.SIGKILL))
                killer.start()
                results.setdefault(name, []).extend(v.check_many(jobs))
                killer.join()

        threads = [threading.Thread(target=run, args=(n, v)) for n, v in (("a", a), ("b", b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for name in ("a", "b"):
            reasons = [r.reason for r in results[name]]
            # at most the job each killed worker had in flight (3 kills per pool)
            assert reasons.count("sandbox_error") <= 3, (name, reasons)
            assert reasons.count("ok") >= len(reasons) - 3, (name, reasons)


# ---------------------------------------------------------------- the parent is interrupted


KEYBOARD_INTERRUPT = """
import os, sys
from sandbox.verifier import Verifier, VerifierConfig
from tests.test_verifier_hostile import CHECK_F, processes_of

program = (
    "import os, time\\ndef f(x):\\n    if os.fork() == 0:\\n        os.setsid()\\n        time.sleep(600)\\n"
    "    time.sleep(600)\\n"
)
v = Verifier(VerifierConfig(workers=2, timeout_s=60, sandbox_uid_base=2_800_000))  # uids nobody else uses
workers, uids = v.worker_pids, set(v.sandbox_uids)
print("checking", flush=True)
try:
    v.check_many([(program, CHECK_F, "f")] * 4)
except KeyboardInterrupt:
    assert processes_of(uids) == [], processes_of(uids)
    for pid in workers:  # stopped and reaped by the verifier
        assert not os.path.exists(f"/proc/{pid}"), pid
    assert v.check("def f(x):\\n    return x + 1\\n", CHECK_F, "f").passed  # a fresh pool on demand
    v.close()
    print("interrupted and clean", flush=True)
    sys.exit(0)
sys.exit("check_many returned: the interrupt was lost")
"""


def test_keyboard_interrupt_kills_every_program():
    """Ctrl-C (SIGINT to the process, Python's default handler) while programs that fork and sleep are running.
    In a fresh interpreter, as a person's Ctrl-C reaches a run: inside the test process the libraries earlier tests
    loaded (their threads and signal handlers) once made the interrupt crash the interpreter (SIGSEGV in CI)."""
    root = Path(__file__).parents[1]
    child = subprocess.Popen(
        [sys.executable, "-c", KEYBOARD_INTERRUPT], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "checking", child.stderr.read()
        time.sleep(1.5)  # the programs are running (and forking)
        child.send_signal(signal.SIGINT)
        # generous: a lost interrupt ends by itself after the programs time out (2 rounds x 60 s) and says so;
        # only a hang reaches this limit (a loaded 2-core machine took > 60 s to clean up)
        out, err = child.communicate(timeout=300)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    assert out.strip() == "interrupted and clean", (out, err)


# ---------------------------------------------------------------- degraded set-ups, driven over the worker protocol

ROOT_WORKER = """
import sys
sys.path.insert(0, {models!r})
import worker as h

class RootWorker(h.Worker):
    def _claim_uids(self):  # as if no uid could be used: programs stay root, without capabilities
        pass

h.main(RootWorker)
"""

NO_PIDNS_WORKER = """
import sys
sys.path.insert(0, {models!r})
import worker as h

class NoPidnsWorker(h.Worker):
    def setup(self):  # as if PID namespaces were unavailable: cleanup by process group, cgroup and subreaper
        super().setup()
        self.libc.setns(self.pidns_fd, h.CLONE_NEWPID)
        self.pidns_fd = None
        self.libc.prctl(h.PR_SET_CHILD_SUBREAPER, 1)

h.main(NoPidnsWorker)
"""

ROOT_ESCAPES = """
import os
def f():
    done = []
    for path in ["/sys/fs/cgroup/pids/cgroup.procs", "/proc/sys/kernel/pid_max", "/etc/didpo-pwned", "/dev/vda"]:
        try:
            with open(path, "w") as fh:
                fh.write("1")
            done.append(path)
        except OSError:
            pass
    try:
        os.setgroups([0, 1])
        done.append("setgroups")
    except OSError:
        pass
    for p in range(2, 40000):
        try:
            os.kill(p, 0)
            done.append("signal host pid")
            break
        except OSError:
            pass
    return done
"""


def run_worker(script: str, jobs: list[dict]) -> list[dict]:
    """Drive a worker script over its stdin/stdout protocol; returns [ready line, one line per job]."""
    import json

    models = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sandbox")
    config = {"timeout_s": 2.0, "cpu_s": 2, "memory_mb": 1024, "file_size_mb": 16, "max_open_files": 64}
    config |= {"max_procs": 32, "scratch_mb": 16, "sandbox_uid_base": 2_900_000, "hide": [os.path.dirname(models)]}
    worker = subprocess.Popen(
        [os.sys.executable, "-I", "-c", script.format(models=models)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    try:  # stdin stays open until every answer is in: its EOF tells the worker to stop
        lines = []
        for message in [config, *jobs]:
            worker.stdin.write(json.dumps(message) + "\n")
            worker.stdin.flush()
            lines.append(json.loads(worker.stdout.readline()))
        worker.stdin.close()
        assert worker.wait(timeout=30) == 0
    finally:
        worker.kill()
        worker.wait()
    assert lines[0]["ready"], lines[0]
    return lines


@pytest.mark.skipif(os.geteuid() != 0, reason="the root fallback exists only when the verifier runs as root")
def test_root_fallback_still_contains_programs():
    """Without a sandbox uid (e.g. an interpreter other users cannot run) programs run as root with no
    capabilities: still no writes, no cgroup escape, no host signals, and the pids cgroup caps a fork bomb."""
    probe_test = "def check(candidate):\n    assert candidate() < 32\n"
    jobs = [
        {"id": 0, "program": ROOT_ESCAPES, "test": CHECK_NOTHING_ESCAPED, "entry_point": "f"},
        {"id": 1, "program": FORK_PROBE, "test": probe_test, "entry_point": "f"},
        {"id": 2, "program": FAKES["killing every pid it can find"], "test": CHECK_F, "entry_point": "f"},
    ]
    lines = run_worker(ROOT_WORKER, jobs)
    iso = lines[0]["isolation"]
    assert iso["unprivileged_user"] is False and iso["degraded"] is True and iso["process_cap"] == "pids cgroup"
    assert [r["reason"] for r in lines[1:]][:2] == ["ok", "ok"], lines[1:]
    assert lines[3]["reason"] != "ok"
    assert subprocess.run(["true"], timeout=10).returncode == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to set up the rest of the sandbox")
def test_without_pid_namespace_orphans_are_still_killed():
    daemon = (
        "import os, time\ndef f(x):\n    if os.fork() == 0:\n        os.setsid()\n        if os.fork() == 0:\n"
        "            time.sleep(600)\n        os._exit(0)\n    time.sleep(0.3)\n    return x + 1\n"
    )
    jobs = [{"id": i, "program": daemon, "test": CHECK_F, "entry_point": "f"} for i in range(2)]
    jobs.append({"id": 2, "program": "def f(x):\n    while True:\n        pass\n", "test": CHECK_F, "entry_point": "f"})
    lines = run_worker(NO_PIDNS_WORKER, jobs)
    assert lines[0]["isolation"]["pid_namespace"] is True  # set up, then dropped by the subclass
    assert [r["reason"] for r in lines[1:]] == ["ok", "ok", "timeout"]
    uid = int(lines[0]["isolation"]["sandbox_uid"])
    assert processes_of({uid}) == []


# ---------------------------------------------------------------- nothing of one program reaches the next
# Found by a red-team pass on the two-process design: each of these leaked from one job to the next on the same
# worker (the zygote's heap held earlier programs; the scratch root's mode and xattrs and SysV IPC objects
# survived the job).

HONEST_WITH_MARKERS = (  # a long answer: more of it survives in freed memory
    '"""Reverse the digits. ' + "Some explanation a model would write. " * 40 + '"""\n'
    "# ZZMARK_BEGIN\ndef f(x):\n    return int(str(x)[::-1]) if x > 9 else x + 1\n# ZZMARK_END\n"
)
STEAL_FROM_MEMORY = r"""
import ctypes
def _scan():
    begin, end = b"ZZMARK_" + b"BEGIN", b"# ZZMARK_" + b"END"
    found = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split()
            if not parts[1].startswith("rw") or (len(parts) > 5 and not parts[5].startswith("[")):
                continue
            lo, hi = (int(v, 16) for v in parts[0].split("-"))
            data = ctypes.string_at(lo, hi - lo)
            i = data.find(begin)
            while i >= 0:
                j = data.find(end, i)
                if 0 < j - i < 4000:
                    found.append(data[i + len(begin):j])
                i = data.find(begin, i + 1)
    return found
ns = {}
for chunk in _scan():
    source = chunk.decode("utf-8", "replace").replace("\\n", "\n").replace('\\"', '"')
    if "def f" in source:
        try:
            exec(source[source.index("def f"):], ns)
            break
        except Exception:
            pass
def f(x):
    return ns["f"](x) if "f" in ns else None
"""


def test_a_program_cannot_copy_an_earlier_program_from_memory():
    with Verifier(VerifierConfig(workers=1, timeout_s=TIMEOUT_S, cpu_s=2)) as v:
        assert v.check(HONEST_WITH_MARKERS, CHECK_SECRET, "f").passed  # control: the honest answer passes
        for _ in range(3):
            stolen = v.check(STEAL_FROM_MEMORY, CHECK_SECRET, "f")
            assert not stolen.passed and stolen.n_passed == 0, stolen


def test_the_scratch_folder_and_sysv_ipc_do_not_outlive_a_program():
    poison = (
        "import os, ctypes\nos.setxattr('.', 'user.leak', b'7654321')\nos.chmod('.', 0o500)\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.shmat.restype = ctypes.c_void_p\nlibc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]\n"
        "sid = libc.shmget(0x5eed00, 1 << 20, 0o1000 | 0o666)\np = libc.shmat(sid, None, 0)\n"
        "ctypes.memmove(p, b'7654321', 7)\nlibc.shmdt(ctypes.c_void_p(p))\n"
        "def f(x):\n    return sid\n"
    )
    look = (
        "import os, ctypes, tempfile\ndef f(x):\n    seen = []\n"
        "    try:\n        seen.append(os.getxattr('.', 'user.leak'))\n    except OSError:\n        pass\n"
        "    tempfile.TemporaryFile().close()\n"
        "    if os.stat('.').st_mode & 0o777 != 0o700:\n        seen.append('mode')\n"
        "    if ctypes.CDLL(None).shmget(0x5eed00, 0, 0) >= 0:\n        seen.append('shm')\n"
        "    return seen\n"
    )
    test = "def check(candidate):\n    assert candidate(0) == []\n"
    with Verifier(VerifierConfig(workers=1, timeout_s=TIMEOUT_S, cpu_s=2)) as v:
        first = v.check(poison, "def check(candidate):\n    assert candidate(0) >= 0\n", "f")
        assert first.passed, first  # the poisoning itself worked inside its own run
        for _ in range(2):
            v.check("def f(x):\n    return x\n", test, "f")
            after = v.check(look, test, "f")
            assert after.passed, after


def test_a_lent_module_is_never_imported_in_the_test_process(verifier):
    """A name the test reads (here ``candidate``, check's parameter) lent as a module object the test process has not
    imported: no import happens there (on 9a8562d+two-process, `unittest.__main__` ran in the verdict process)."""
    program = "import types\ncandidate = types.ModuleType('unittest.__main__')\ndef f(x):\n    return x + 1\n"
    assert verifier.check(program, CHECK_F, "f").passed
