"""Sandbox worker behind :class:`sandbox.verifier.Verifier`: isolation, two forked processes per program, cleanup.

The verifier starts one worker per pool slot as ``python -I sandbox/worker.py`` (standard library only; the
script runs outside the package). A worker sets up its isolation once, forks its **zygote** (before any job, so
before any test reached its memory), then runs jobs read from stdin one at a time: it forks the **test process**
itself (from its pristine memory) and has the zygote fork the **candidate process**, joined by a socketpair; it
writes one JSON verdict line per job (the protocol between the two is described in ``harness``).

Isolation, set up once per worker when it runs as root (``Worker.describe`` is the honest report of what is on):
  * two unused uids claimed with lock files, one for candidate processes and one for test processes; each runs
    with no groups, no capabilities and no-new-privs, so RLIMIT_NPROC binds (it never binds root), neither can
    signal, trace or write anything of the other's or the host's, and the test process is also not dumpable;
  * a pids cgroup (v1 ``pids`` hierarchy or cgroup v2) with a name no other worker can have (pid + random token)
    that the worker joins, capped at max_procs + 3 (the worker, its zygote and the test process), which binds root
    too;
  * new network, mount, IPC and UTS namespaces: no network at all (not even loopback or abstract unix sockets);
    the project, the caller's cwd and home and the virtualenv are covered by empty tmpfs (reference solutions and
    data stay out of reach; programs get the standard library only), as is every folder on the way to the
    interpreter that other users cannot traverse (e.g. a 0700 ``/root`` above a pyenv install), re-exposing only
    the interpreter; /dev holds only null, zero, full, random, urandom and tty; /proc shows a program only its own
    processes (hidepid); every mount is read-only except a private size-capped tmpfs;
  * a new PID namespace per process: each is pid 1 of its own, cannot see the other or its parents, and when it
    dies the kernel kills every process it started (double forks and ``setsid`` included) — no orphan survives.
Per process: its own session, rlimits (CPU seconds, address space, file size, open files, processes, no core),
an environment of four variables, stdio on /dev/null, and a wall-clock deadline after which everything is killed;
the candidate's cwd, HOME and TMPDIR are the scratch tmpfs (emptied after each program), the test process's cwd is /.
If no sandbox uid can run the interpreter, programs run as root without capabilities (cgroupfs and procfs then
read-only for them): reported as degraded. Not root: rlimits, a user+network namespace when the kernel allows
one, a temporary folder; reported as degraded: programs then run as the caller's uid and can signal the caller's
processes and open their pipes through /proc (the worker itself is not dumpable, the verifier's parent is).
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import gc
import json
import os
import resource
import secrets
import select
import shutil
import signal
import socket
import stat
import sys
import tempfile
import time

if __package__:  # imported as sandbox.worker (tests)
    from sandbox.harness import (
        assemble,
        borrowed_names,
        make_sender,
        read_message,
        run_tests,
        serve_candidate,
        transform_test,
        write_message,
    )
else:  # run as a script with -I: the harness sits next to this file
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from harness import (
        assemble,
        borrowed_names,
        make_sender,
        read_message,
        run_tests,
        serve_candidate,
        transform_test,
        write_message,
    )

    del sys.path[0]  # programs must not import project code

# ----------------------------------------------------------------------------------------------------------
# Linux plumbing.

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 18, 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 36, 38
_MOUNT_OPTION_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
}
_SCRATCH = "/tmp/run"
# Never masked even when asked (the caller's cwd or home may be one of them).
_SYSTEM_DIRS = frozenset(
    "/ /bin /boot /dev /etc /home /lib /lib32 /lib64 /media /mnt /opt /proc /run /sbin /srv /sys /tmp /usr /var".split()
    + ["/usr/bin", "/usr/lib", "/usr/local", "/usr/local/bin", "/usr/local/lib", "/usr/share"]
)
_MAX_RESULT_BYTES = 1 << 20
# Imported once in the worker so programs find them loaded (forks share them); import errors are ignored.
_PRELOAD = (
    "abc array base64 binascii bisect calendar cmath collections collections.abc contextlib copy dataclasses "
    "datetime decimal enum fractions functools hashlib heapq io itertools json math numbers operator pprint "
    "random re statistics string struct textwrap threading time typing unicodedata"
).split()


class _Libc:
    """ctypes wrappers that raise OSError on failure."""

    def __init__(self):
        self.lib = ctypes.CDLL(None, use_errno=True)
        self._prctl = self.lib.prctl  # typed once: the call in each program's process stays cheap
        self._prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
        self._prctl.restype = ctypes.c_int

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    def unshare(self, flags: int) -> None:
        self._check(self.lib.unshare(flags), "unshare")

    def setns(self, fd: int, nstype: int) -> None:
        self._check(self.lib.setns(fd, nstype), "setns")

    def mount(self, source: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
        enc = [None if s is None else s.encode() for s in (source, target, fstype, data)]
        self._check(self.lib.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {target}")

    def umount(self, target: str) -> None:
        self._check(self.lib.umount2(target.encode(), MNT_DETACH), f"umount {target}")

    def prctl(self, option: int, arg: int) -> None:
        self._check(self._prctl(option, arg, 0, 0, 0), "prctl")

    def drop_capabilities(self) -> None:
        """Empty the effective, permitted and inheritable capability sets of this process."""

        class Header(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

        class Data(ctypes.Structure):
            _fields_ = [(f, ctypes.c_uint32) for f in ("effective", "permitted", "inheritable")]

        header, data = Header(0x20080522, 0), (Data * 2)()
        self._check(self.lib.capset(ctypes.byref(header), data), "capset")


def _mountinfo() -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, per-mount options) for each mount of this mount namespace."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")  # octal escapes like \040
            out.append((point, fields[fields.index("-") + 1], set(fields[5].split(","))))
    return out


def _flags(options: set[str]) -> int:
    """The mount flags to keep when remounting a mount that has these per-mount options."""
    return sum(flag for option, flag in _MOUNT_OPTION_FLAGS.items() if option in options)


def _blocked(path: str) -> tuple[str, str] | None:
    """(first ancestor of ``path`` other users cannot traverse, the entry below it on the way), or None."""
    parts = [p for p in path.split("/") if p]
    current = "/"
    for part in parts[:-1] if len(parts) > 1 else []:
        current = os.path.join(current, part)
        if current != "/" and not os.stat(current).st_mode & stat.S_IXOTH:
            rest = os.path.relpath(path, current).split("/")[0]
            return current, rest
    return None


# ----------------------------------------------------------------------------------------------------------
# The worker.


class Worker:
    """One pool slot: sets up isolation once, then runs jobs (see the module docstring)."""

    def __init__(self, config: dict):
        self.cfg = config
        self.libc = _Libc()
        self.pid = os.getpid()
        self.is_root = os.geteuid() == 0
        self.uid: int | None = None  # the candidate process's uid
        self.test_uid: int | None = None  # the test process's uid (another one: neither can touch the other)
        self.lock_fds: list[int] = []
        self.cgroup: str | None = None
        self.cgroup_base: str | None = None
        self.pidns_fd: int | None = None
        self.facts: dict[str, bool | str] = {}
        self.test_cache: dict[str, tuple[object, int, list[str]]] = {}
        self.current: list[int] = []
        self.keep: set[int] = {self.pid}  # never killed by a cleanup: this worker and its zygote
        self.zygote: tuple[int, socket.socket] | None = None
        self.scratch: str | None = None
        self.nproc = config["max_procs"]
        self.mount_ns = False
        self.max_fd = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        if self.max_fd == resource.RLIM_INFINITY or self.max_fd > 1 << 20:
            self.max_fd = 1 << 20

    # ---- setup -------------------------------------------------------------------------------------------
    def setup(self) -> None:
        """Claim a uid and a cgroup, enter namespaces, prepare the filesystem, preload modules, probe."""
        os.chdir("/")
        f = self.facts
        f["running_as_root"] = self.is_root
        if self.is_root:
            self._claim_uids()
        self._make_cgroup()
        f["network_namespace"] = f["mount_namespace"] = f["pid_namespace"] = False
        f["readonly_filesystem"] = f["interpreter_exposed"] = f["minimal_dev"] = f["proc_hidepid"] = False
        self.mount_ns = False
        if self.is_root:
            try:
                self.libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS)
            except OSError as exc:  # e.g. a container without CAP_SYS_ADMIN: degrade, and say so
                f["namespace_error"] = str(exc)
            else:  # from here on a failure is a bug or a broken host: the worker does not start
                f["network_namespace"] = f["mount_namespace"] = self.mount_ns = True
                self.libc.mount(None, "/", None, MS_REC | MS_PRIVATE, None)
                f["interpreter_exposed"], masked = self._mask_paths()
                f["hidden_paths"] = ", ".join(masked) or "none"
                self._minimal_dev()
                f["minimal_dev"] = True
                self._private_proc()
                f["proc_hidepid"] = True
                f["readonly_filesystem"] = self._remount_readonly()
                self.libc.mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0711,size=1m")
                os.mkdir(_SCRATCH, 0o700)
            try:
                pidns_fd = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
                self.libc.unshare(CLONE_NEWPID)  # checked here; each program gets a fresh one (see _run)
                self.pidns_fd = pidns_fd
                f["pid_namespace"] = True
            except OSError as exc:
                f["pid_namespace_error"] = str(exc)
        else:
            try:  # an unprivileged user namespace, when the kernel allows it, gives a private network
                uid, gid = os.getuid(), os.getgid()
                self.libc.unshare(CLONE_NEWUSER | CLONE_NEWNET)
                for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
                    with open(f"/proc/self/{name}", "w") as fh:
                        fh.write(text)
                f["network_namespace"] = True
            except OSError as exc:
                f["namespace_error"] = str(exc)
            # RLIMIT_NPROC counts every task of this user, so leave room for the ones already running.
            self.nproc = self.cfg["max_procs"] + _user_tasks(os.getuid())
        if self.pidns_fd is None:  # orphans of a program then come back to us, for _sweep to kill
            self.libc.prctl(PR_SET_CHILD_SUBREAPER, 1)
        for name in _PRELOAD:
            try:
                __import__(name)
            except ImportError:
                pass
        # Inherited by every program: no setuid gains, and (with a fixed scratch path) the whole environment.
        self.libc.prctl(PR_SET_NO_NEW_PRIVS, 1)
        if self.mount_ns:
            os.environ.clear()
            os.environ.update(_environment(_SCRATCH))
        mib = 1 << 20
        self.rlimits = [
            (resource.RLIMIT_CPU, (self.cfg["cpu_s"], self.cfg["cpu_s"] + 1)),
            (resource.RLIMIT_AS, (self.cfg["memory_mb"] * mib,) * 2),
            (resource.RLIMIT_FSIZE, (self.cfg["file_size_mb"] * mib,) * 2),
            (resource.RLIMIT_NOFILE, (self.cfg["max_open_files"],) * 2),
            (resource.RLIMIT_NPROC, (self.nproc,) * 2),
            (resource.RLIMIT_CORE, (0, 0)),
        ]
        self._probe()
        self.libc.prctl(PR_SET_DUMPABLE, 0)  # same-uid processes (the unprivileged fallback) cannot read our fds
        self._start_zygote()

    def _claim_uids(self) -> None:
        """Lock two unused uids in [uid_base, uid_base + 4096) (candidate, tests) so concurrent verifiers never
        share one."""
        import pwd

        lock_dir = "/tmp/didpo-verifier-uids"
        os.makedirs(lock_dir, mode=0o700, exist_ok=True)
        claimed = []
        for uid in range(self.cfg["sandbox_uid_base"], self.cfg["sandbox_uid_base"] + 4096):
            try:
                pwd.getpwuid(uid)
                continue  # a real account: never borrow it
            except KeyError:
                pass
            fd = os.open(f"{lock_dir}/{uid}.lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            claimed.append(uid)
            self.lock_fds.append(fd)
            if len(claimed) == 2:
                self.uid, self.test_uid = claimed
                return
        raise RuntimeError("no free sandbox uids")

    def _make_cgroup(self) -> None:
        """Join a new pids cgroup (v1 ``pids`` hierarchy, else cgroup v2) capped at max_procs + 3 (this worker,
        its zygote and the test process).

        Programs are forked from the worker, so they start in it without a per-program attach. The group's name
        is new to this worker (pid and a random token; created with exclusive mkdir), so no other verifier, in this
        process or another, can ever hold, reuse or clean up the same group; empty groups a killed worker left
        behind are removed once they are a minute old.
        """
        self.facts["pids_cgroup"] = False
        name = f"didpo-verifier-{self.pid}-{secrets.token_hex(8)}"
        for base in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup"):
            if base == "/sys/fs/cgroup":
                try:
                    with open(f"{base}/cgroup.controllers") as fh:
                        if "pids" not in fh.read().split():
                            continue
                except OSError:
                    continue
            path = f"{base}/{name}"
            _remove_stale_cgroups(base)
            try:
                os.mkdir(path)
                with open(f"{path}/pids.max", "w") as fh:
                    fh.write(str(self.cfg["max_procs"] + 3))
                with open(f"{path}/cgroup.procs", "w") as fh:
                    fh.write(str(self.pid))
            except OSError:
                continue
            self.cgroup, self.cgroup_base = path, base
            self.facts["pids_cgroup"] = True
            return

    def _kill_cgroup(self, path: str) -> None:
        """SIGKILL every member of the cgroup but this worker and its zygote, until none is left (≤ 1 s)."""
        for _ in range(100):
            with open(f"{path}/cgroup.procs") as fh:
                pids = [int(p) for p in fh.read().split() if int(p) not in self.keep]
            if not pids:
                return
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)

    def _mask_paths(self) -> tuple[bool, list[str]]:
        """Cover folders with an empty tmpfs, re-exposing only the way to the standard library.

        Masked: the folders the parent asked to hide (the project with its data and reference solutions, the
        caller's cwd and home, the virtualenv) and every folder on the way to the stdlib that other users cannot
        traverse (e.g. a 0700 /root above a pyenv install). Returns (stdlib reachable by other users, masked).
        """
        keep = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix)}
        hide = set()
        for path in self.cfg.get("hide", []):
            path = os.path.realpath(path)
            inside_keep = any(path == k or path.startswith(k + "/") for k in keep)
            if os.path.isdir(path) and path not in _SYSTEM_DIRS and not inside_keep:
                hide.add(path)
        masked: list[str] = []
        for _ in range(8):
            targets: dict[str, set[str]] = {m: set() for m in hide if m not in masked}
            for k in keep:
                hit = _blocked(k)
                if hit:
                    targets.setdefault(hit[0], set())
            for m, entries in targets.items():
                entries.update(os.path.relpath(k, m).split("/")[0] for k in keep if k.startswith(m + "/"))
            if not targets:
                return True, masked
            for m in sorted(targets, key=len):
                if os.path.isdir(m):  # an outer mask may already have hidden it
                    self._mask(m, targets[m])
                masked.append(m)
        return False, masked

    def _mask(self, folder: str, entries: set[str]) -> None:
        fds = {e: os.open(os.path.join(folder, e), os.O_PATH) for e in entries}
        try:
            self.libc.mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k")
            for entry, fd in fds.items():
                target = os.path.join(folder, entry)
                if stat.S_ISDIR(os.fstat(fd).st_mode):
                    os.mkdir(target)
                else:
                    open(target, "w").close()
                self.libc.mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC, None)
        finally:
            for fd in fds.values():
                os.close(fd)

    def _minimal_dev(self) -> None:
        """Replace /dev by a tmpfs with only null, zero, full, random, urandom and tty (no disks, no consoles)."""
        nodes = {name: os.stat(f"/dev/{name}") for name in ("null", "zero", "full", "random", "urandom", "tty")}
        self.libc.mount("tmpfs", "/dev", "tmpfs", MS_NOSUID, "mode=0755,size=64k")
        for name, st in nodes.items():
            os.mknod(f"/dev/{name}", stat.S_IFCHR | 0o666, st.st_rdev)
            os.chmod(f"/dev/{name}", 0o666)
        for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1")):
            os.symlink(target, f"/dev/{name}")
        os.symlink("/proc/self/fd/2", "/dev/stderr")

    def _private_proc(self) -> None:
        """A procfs where unprivileged processes see only their own processes (not the host's command lines)."""
        flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
        try:
            self.libc.mount("proc", "/proc", "proc", flags, "hidepid=invisible")
        except OSError:
            self.libc.mount("proc", "/proc", "proc", flags, "hidepid=2")

    def _remount_readonly(self) -> bool:
        """Bind-remount every mount read-only (except proc and cgroup); True when all succeeded."""
        ok = True
        for point, fstype, options in _mountinfo():
            if fstype in ("proc", "cgroup", "cgroup2") or "ro" in options:
                continue
            flags = MS_BIND | MS_REMOUNT | MS_RDONLY | _flags(options)
            try:
                self.libc.mount(None, point, None, flags, None)
            except FileNotFoundError:
                pass  # under a mask (e.g. the old /dev/shm): no path reaches it any more
            except OSError:
                ok = False
        return ok

    def _probe(self) -> None:
        """Run a probe in a sandboxed child and record what it could and could not do."""
        program = (
            "import errno, os, socket, sys\n"
            "def probe():\n"
            "    out = {'uid': str(os.getuid())}\n"
            "    try:\n"
            "        socket.create_connection(('127.0.0.1', 9), timeout=0.5).close(); out['net'] = 'connected'\n"
            "    except OSError as e:\n"
            "        out['net'] = errno.errorcode.get(e.errno, str(e.errno))\n"
            "    for path in ('/etc/.didpo-probe', '/var/tmp/.didpo-probe', '/dev/shm/.didpo-probe'):\n"
            "        try:\n"
            "            open(path, 'w').close(); os.unlink(path); out['wrote'] = path\n"
            "        except OSError:\n"
            "            pass\n"
            "    try:\n"
            "        open('scratch', 'w').write('x'); out['scratch'] = True\n"
            "    except OSError:\n"
            "        out['scratch'] = False\n"
            "    try:\n"
            "        import colorsys; out['import'] = True\n"
            "    except ImportError:\n"
            "        out['import'] = False\n"
            "    return out\n"
        )
        result = self._run(program, None, "probe", probe=True)
        if self.uid is not None and not (result or {}).get("import"):
            # The unprivileged uid cannot even start the harness: fall back to root without capabilities.
            self.facts["uid_fallback"] = "sandbox uid could not run the interpreter; running as root"
            self.uid = self.test_uid = None
            if self.scratch is not None:
                os.chown(self.scratch, 0, 0)
            result = self._run(program, None, "probe", probe=True)
        p = result or {}
        f = self.facts
        f["unprivileged_user"] = p.get("uid", "0") != "0"
        if f["unprivileged_user"]:
            f["sandbox_uid"] = p["uid"]
        f["rlimit_nproc_binds"] = f["unprivileged_user"]
        f["network_blocked"] = p.get("net") not in (None, "connected", "ECONNREFUSED", "ETIMEDOUT")
        f["host_files_writable"] = p.get("wrote", False) if p else "probe failed"
        f["private_tmp"] = bool(p.get("scratch"))
        f["stdlib_importable"] = bool(p.get("import"))

    def describe(self) -> dict[str, bool | str]:
        """The isolation report sent to the parent (keys documented in sandbox.verifier.Verifier.isolation)."""
        f = dict(self.facts)
        caps = [c for c, on in (("pids cgroup", f["pids_cgroup"]), ("RLIMIT_NPROC", f["rlimit_nproc_binds"])) if on]
        f["process_cap"] = " + ".join(caps) if caps else "none"
        f["scratch"] = f"tmpfs {self.cfg['scratch_mb']} MiB" if self.mount_ns else "temporary directory"
        f["rlimits"] = "cpu, address space, file size, open files, processes, core"
        f["verdict_process"] = (
            "separate: tests run in a pristine process of their own uid"
            if self.test_uid is not None
            else "separate: tests run in a pristine, non-dumpable process of the same uid"
        )
        f["tests_out_of_program_memory"] = self.zygote is not None
        f["bubblewrap"] = (
            "not installed" if shutil.which("bwrap") is None else "installed, unused (namespaces set up directly)"
        )
        f["degraded"] = not (
            f["unprivileged_user"]
            and f["process_cap"] != "none"
            and f["network_blocked"]
            and f["readonly_filesystem"]
            and f["pid_namespace"]
            and f["host_files_writable"] is False
            and f["stdlib_importable"]
        )
        return f

    # ---- one job -----------------------------------------------------------------------------------------
    def run_job(self, job: dict) -> dict:
        """Run one program against one test; returns the JSON-able verdict for the parent."""
        test = job["test"]
        if test not in self.test_cache:
            if len(self.test_cache) > 1024:
                self.test_cache.clear()
            tree, n = transform_test(test)
            code = compile(tree, "<test>", "exec", dont_inherit=True, optimize=0)
            self.test_cache[test] = (code, n, borrowed_names(tree))
        code, n, names = self.test_cache[test]
        start = time.monotonic()
        lines, ended, ends = self._run(job["program"], (code, names), job["entry_point"])
        xcpu = [st is not None and os.WIFSIGNALED(st) and os.WTERMSIG(st) == signal.SIGXCPU for st, _ in ends]
        if ended == "timeout" or any(xcpu) or any(cpu >= self.cfg["cpu_s"] - 0.05 for _, cpu in ends):
            why = "timeout"
        else:
            why = "crash"
        tests, reason = assemble(n, lines, ended, why)
        return {"id": job["id"], "tests": tests, "reason": reason, "duration_s": time.monotonic() - start}

    def _run(self, program: str, test, entry_point: str, probe: bool = False):
        """Fork the test process, have the zygote fork the candidate process, collect the verdict lines until
        done/EOF/deadline, kill and reap everything. ``test`` is (compiled test module, borrowed names).

        Returns (lines, ended, [(wait status, cpu seconds) of the test process, of the candidate process]) — or,
        with ``probe`` (``program`` defining ``probe()``, run alone as the candidate uid), the probe's dict or None.
        """
        nonce = secrets.token_hex(16)
        self._mount_scratch()
        verdict_r, verdict_w = os.pipe()
        tests_end, candidate_end = socket.socketpair()
        candidate = None
        try:
            if probe:

                def probe_body():
                    ns: dict = {}
                    exec(compile(program, "<probe>", "exec"), ns)
                    os.write(3, json.dumps(ns["probe"]()).encode())

                self.current.append(self._spawn(self.uid, [verdict_w], probe_body, self.scratch))
            else:
                code, names = test

                def tests():
                    run_tests(code, program, entry_point, names, make_sender(3, nonce), 4)

                # The test process first: a fork bomb of the candidate's cannot keep it from starting.
                self.current.append(self._spawn(self.test_uid, [verdict_w, tests_end.fileno()], tests, "/", True))
                candidate = self._zygote_call({"cwd": self.scratch}, candidate_end.fileno())
        finally:
            os.close(verdict_w)
            tests_end.close()
            candidate_end.close()
        try:
            deadline = time.monotonic() + (10.0 if probe else self.cfg["timeout_s"])
            data, ended = self._collect(verdict_r, deadline, nonce if not probe else None)
        finally:
            os.close(verdict_r)
            ends = [self._zygote_call({"kill": True})] if candidate is not None else []
            ends = self._kill_and_reap(self.current) + ends
            self.current = []
            self._clean_scratch()
        if probe:
            try:
                return json.loads(data) if ends[0][0] == 0 else None
            except ValueError:
                return None
        prefix = nonce + " "
        lines = [ln[len(prefix) :] if ln.startswith(prefix) else None for ln in data.split("\n")[:-1]]
        if data and not data.endswith("\n"):
            lines.append(None)
        return lines, ended, ends

    # ---- the zygote: forks candidate processes from a memory that never held a test ----------------------
    def _start_zygote(self) -> None:
        """Fork the zygote now, before any job (hence any test) has reached this worker.

        A candidate process forked from the worker would inherit a copy of its memory: the compiled tests and their
        expected values, readable through frames, ``gc`` or ``/proc/self/mem``. Forked from the zygote, it holds
        only this worker's configuration and the programs it is sent.
        """
        ours, theirs = socket.socketpair()
        if self.pidns_fd is not None:  # the zygote lives in our own PID namespace, not in the probe's
            self.libc.setns(self.pidns_fd, CLONE_NEWPID)
        pid = os.fork()
        if pid == 0:
            ours.close()
            try:
                self._zygote_serve(theirs)
            finally:
                os._exit(0)
        theirs.close()
        self.zygote = (pid, ours)
        self.keep.add(pid)

    def _zygote_serve(self, sock: socket.socket) -> None:
        """The zygote's loop: (socket end + working folder) → fork the candidate process; ``kill`` → kill, reap,
        report. It never receives a program or a test: the candidate gets its program from the test process."""
        worker_pid, self.pid = self.pid, os.getpid()
        self.keep = {worker_pid, self.pid}
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for fd in (self.proto_in, self.proto_out, self.wakeup_r):
            os.close(fd)
        self.libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != worker_pid:
            return
        if self.pidns_fd is None:  # orphans of a candidate come back to the zygote, for _sweep to kill
            self.libc.prctl(PR_SET_CHILD_SUBREAPER, 1)
        fd = sock.fileno()
        while True:
            _, fds, _, _ = socket.recv_fds(sock, 1, 1)
            job = read_message(fd) if fds else None
            if job is None:
                return
            body = functools.partial(serve_candidate, 3)
            self.current = [self._spawn(self.uid, fds, body, job["cwd"])]
            os.close(fds[0])
            if read_message(fd) is None:
                return
            write_message(fd, self._kill_and_reap(self.current)[0])
            self.current = []

    def _zygote_call(self, message: dict, channel: int | None = None):
        """Send the zygote a job (with the candidate's end of the channel) or ``kill`` (returns the candidate
        process's (wait status, cpu seconds)). A dead zygote stops this worker: the parent replaces it."""
        _, sock = self.zygote
        try:
            if channel is not None:
                socket.send_fds(sock, [b"J"], [channel])
            write_message(sock.fileno(), message)
            if channel is not None:
                return True
            reply = read_message(sock.fileno())
        except OSError:
            raise _Stop() from None
        if reply is None:
            raise _Stop()
        return tuple(reply)

    def _spawn(self, uid: int | None, fds: list[int], body, cwd: str, undumpable: bool = False) -> int:
        """Fork one sandboxed process (pid 1 of a fresh PID namespace when available) that runs ``body()`` with
        ``fds`` as its fds 3, 4, ...; returns its pid. The child exits 0 when ``body`` returns, else 1."""
        if self.pidns_fd is not None:
            self.libc.setns(self.pidns_fd, CLONE_NEWPID)  # back to our own namespace, then a fresh one
            self.libc.unshare(CLONE_NEWPID)
        gc.freeze()  # the child's collector then leaves our objects alone: far fewer copy-on-write faults
        pid = os.fork()
        if pid == 0:  # ---------------- child
            status = 1
            try:
                self._enter_sandbox(fds, uid, cwd, undumpable)
                body()
                status = 0
            except BaseException:
                pass
            finally:
                os._exit(status)
        return pid

    def _mount_scratch(self) -> None:
        """The program's private tmpfs: a fresh one for every program (`_clean_scratch` unmounts it)."""
        if not self.mount_ns:
            self.scratch = tempfile.mkdtemp(prefix="didpo-sandbox-")
            if self.uid is not None:
                os.chown(self.scratch, self.uid, self.uid)
        elif self.scratch is None:
            uid = self.uid if self.uid is not None else 0
            opts = f"size={self.cfg['scratch_mb']}m,nr_inodes=16384,mode=0700,uid={uid},gid={uid}"
            self.libc.mount("tmpfs", _SCRATCH, "tmpfs", MS_NOSUID | MS_NODEV, opts)
            self.scratch = _SCRATCH

    def _clean_scratch(self) -> None:
        """Drop the scratch space: the tmpfs is unmounted (the next program gets a fresh one, so nothing of this
        program's files, its folder's mode or its extended attributes reaches the next), a temporary folder is
        removed."""
        if self.scratch is None:
            return
        if not self.mount_ns:
            shutil.rmtree(self.scratch, ignore_errors=True)
        else:
            self.libc.umount(self.scratch)
        self.scratch = None

    def _enter_sandbox(self, fds: list[int], uid: int | None, cwd: str, undumpable: bool) -> None:
        """In the child, as root: own session, cwd, fds (``fds`` become 3, 4, ...; nothing else stays open),
        rlimits, environment, then drop privileges to ``uid`` (root without capabilities when None)."""
        os.setsid()
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        os.chdir(cwd)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 3 + len(fds) + 256) for fd in fds]  # above every target
        for i, fd in enumerate(high):
            os.dup2(fd, 3 + i)
        os.closerange(3 + len(fds), self.max_fd)
        for which, value in self.rlimits:
            resource.setrlimit(which, value)
        if not self.mount_ns:  # the scratch folder differs per program
            os.environ.clear()
            os.environ.update(_environment(self.scratch))
            tempfile.tempdir = None
        if self.mount_ns:  # SysV IPC objects die with the process: no channel to the next program, no memory left
            self.libc.unshare(CLONE_NEWIPC)
        if uid is not None:
            u = uid
            os.setgroups([])
            os.setresgid(u, u, u)
            os.setresuid(u, u, u)
            if os.getresuid() != (u, u, u) or u == 0:
                raise RuntimeError("privilege drop failed")
        else:  # root fallback: make cgroupfs and procfs read-only for this program, then drop every capability
            if self.mount_ns:
                self.libc.unshare(CLONE_NEWNS)
                for point, fstype, options in _mountinfo():
                    if fstype in ("proc", "cgroup", "cgroup2") and "ro" not in options:
                        self.libc.mount(None, point, None, MS_BIND | MS_REMOUNT | MS_RDONLY | _flags(options), None)
            self.libc.drop_capabilities()
        if undumpable:  # no ptrace, no /proc/<pid>/mem, no core even for a process of the same uid
            self.libc.prctl(PR_SET_DUMPABLE, 0)
        self.libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if self.pidns_fd is None and os.getppid() != self.pid:
            raise RuntimeError("worker died")

    def _collect(self, fd: int, deadline: float, nonce: str | None) -> tuple[str, str]:
        """Read the child's pipe until ``<nonce> done``, EOF, the deadline or the size cap."""
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.register(self.proto_in, 0)  # only POLLHUP: the parent went away
        poller.register(self.wakeup_r, select.POLLIN)  # SIGTERM
        buf = bytearray()
        done_marker = None if nonce is None else f"{nonce} done\n".encode()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return buf.decode("utf-8", "replace"), "timeout"
            for ready, events in poller.poll(left * 1000):
                if ready != fd:
                    if ready == self.wakeup_r or events & (select.POLLHUP | select.POLLERR):
                        raise _Stop()
                    continue
                data = os.read(fd, 65536)
                if not data:
                    return buf.decode("utf-8", "replace"), "eof"
                buf += data
                if len(buf) > _MAX_RESULT_BYTES:
                    return "", "overflow"
                if done_marker is not None and buf.endswith(done_marker):
                    return buf.decode("utf-8", "replace"), "done"

    def _kill_and_reap(self, pids: list[int]) -> list[tuple[int | None, float]]:
        """SIGKILL the run's processes (a PID namespace goes with its pid 1) and reap them; returns
        [(wait status, cpu seconds)] in the order of ``pids``."""
        for pid in pids:
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self.pidns_fd is not None:
            ends = []
            for pid in pids:
                _, status, usage = os.wait4(pid, 0)
                ends.append((status, usage.ru_utime + usage.ru_stime))
            return ends
        return self._sweep(pids)

    def _sweep(self, pids: list[int]) -> list[tuple[int | None, float]]:
        """Without a PID namespace: kill the groups, the cgroup and our direct children until none is left."""
        ends: dict[int, tuple[int | None, float]] = {}
        deadline = time.monotonic() + 5.0
        while True:
            for pid in pids:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if self.cgroup:
                self._kill_cgroup(self.cgroup)
            for child in _children(self.pid):
                if child in self.keep:
                    continue
                try:
                    os.kill(child, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                while True:
                    got, st, usage = os.wait4(-1, os.WNOHANG)
                    if got == 0:
                        break
                    if got in pids:
                        ends[got] = (st, usage.ru_utime + usage.ru_stime)
            except ChildProcessError:
                return [ends.get(pid, (None, 0.0)) for pid in pids]
            if time.monotonic() > deadline:
                print("didpo sandbox: processes survived the cleanup", file=sys.stderr)
                return [ends.get(pid, (None, 0.0)) for pid in pids]
            time.sleep(0.002)

    def close(self) -> None:
        """Kill any running program and remove the cgroup (called on every way out)."""
        if self.zygote is not None:  # its candidate process dies with it (parent-death signal, PID namespace)
            pid, sock = self.zygote
            self.zygote = None
            sock.close()
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        if self.current:
            self._kill_and_reap(self.current)
            self.current = []
        self._clean_scratch()
        if self.cgroup:
            try:
                self._kill_cgroup(self.cgroup)
                with open(f"{self.cgroup_base}/cgroup.procs", "w") as fh:
                    fh.write(str(self.pid))
                os.rmdir(self.cgroup)
            except OSError:
                pass

    # ---- protocol with the parent ------------------------------------------------------------------------
    def serve(self) -> None:
        """Read the config line, set up, answer ``ready``, then one verdict line per job line until EOF."""
        self.wakeup_r, wakeup_w = os.pipe()
        os.set_blocking(wakeup_w, False)
        signal.set_wakeup_fd(wakeup_w)
        signal.signal(signal.SIGTERM, lambda *a: None)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            self.setup()
            self._send({"ready": True, "isolation": self.describe(), "pid": self.pid, "cgroup": self.cgroup})
        except Exception as exc:  # report, then exit: the parent raises with this message
            self._send({"ready": False, "error": f"{type(exc).__name__}: {exc}"})
            raise
        while True:
            line = self._read_line()
            if line is None:
                return
            job = json.loads(line)
            try:
                result = self.run_job(job)
            except _Stop:
                return
            except Exception as exc:  # our bug, not the program's: the parent logs it as sandbox_error
                result = {"id": job["id"], "error": f"{type(exc).__name__}: {exc}"}
            self._send(result)

    def _send(self, obj: dict) -> None:
        data = (json.dumps(obj) + "\n").encode()
        while data:
            data = data[os.write(self.proto_out, data) :]

    def _read_line(self) -> str | None:
        poller = select.poll()
        poller.register(self.proto_in, select.POLLIN)
        poller.register(self.wakeup_r, select.POLLIN)
        while b"\n" not in self.inbuf:
            for ready, _ in poller.poll():
                if ready == self.wakeup_r:
                    return None
            chunk = os.read(self.proto_in, 1 << 20)
            if not chunk:
                return None
            self.inbuf += chunk
        line, _, rest = bytes(self.inbuf).partition(b"\n")
        self.inbuf = bytearray(rest)
        return line.decode()


class _Stop(Exception):
    """The parent went away or asked us to stop."""


def _environment(scratch: str) -> dict[str, str]:
    """The whole environment of a program: nothing of the caller's (no secrets)."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8"}


def _user_tasks(uid: int) -> int:
    """Number of tasks (threads) of processes whose real uid is ``uid``, from /proc."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as fh:
                fields = dict(line.split(":", 1) for line in fh if ":" in line)
        except OSError:
            continue
        if int(fields["Uid"].split()[0]) == uid:
            total += int(fields["Threads"])
    return total


def _remove_stale_cgroups(base: str, min_age_s: float = 60.0) -> None:
    """Remove empty ``didpo-verifier-*`` groups under ``base`` older than ``min_age_s`` (left by killed workers).

    rmdir fails on a group with a member, so a live worker's group (it holds the worker) is never removed; the age
    keeps a group another worker has just created, and not yet joined, out of reach.
    """
    try:
        entries = os.listdir(base)
    except OSError:
        return
    for entry in entries:
        if entry.startswith("didpo-verifier-"):
            path = f"{base}/{entry}"
            try:
                if time.time() - os.stat(path).st_mtime > min_age_s:
                    os.rmdir(path)
            except OSError:
                pass


def _children(parent: int) -> list[int]:
    """Direct children of ``parent`` found by scanning /proc (no CONFIG_PROC_CHILDREN needed)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent:
            out.append(int(entry))
    return out


def main(worker_class: type[Worker] = Worker) -> None:
    """Worker entry point: protocol on the original stdin/stdout; stray output goes to stderr.

    stdin: one JSON config line, then one JSON job line per program ({id, program, test, entry_point}); stdout: a
    ``ready`` line, then one verdict line per job. EOF on stdin or SIGTERM: clean up and exit.
    """
    proto_in, proto_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)
    os.close(null)
    config = b""
    while not config.endswith(b"\n"):
        chunk = os.read(proto_in, 1 << 16)
        if not chunk:
            return
        config += chunk
    line, _, rest = config.partition(b"\n")
    worker = worker_class(json.loads(line))
    worker.proto_in, worker.proto_out, worker.inbuf = proto_in, proto_out, bytearray(rest)
    try:
        worker.serve()
    finally:
        worker.close()


if __name__ == "__main__":
    main()
