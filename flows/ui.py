"""The MLflow and Prefect UIs over this project's embedded state, served by their own servers (`didpo ui`, and
`scripts/screenshots.py` on free ports).

- MLflow: ``mlflow ui --backend-store-uri <tracking uri>`` (runs, metrics, artifacts, the model registry). MLflow 3's
  UI opens in its GenAI view unless the address asks for the model-training one (``MLFLOW_VIEW``).
- Prefect: ``prefect server start`` on ``PREFECT_HOME``'s database, the one every run's temporary API wrote; the runs'
  "View at" links point at ``flows.env.PREFECT_UI``, this server's default address.

Each server runs in its own session and is stopped as a process group (SIGTERM, then SIGKILL after 20 s): MLflow's UI
starts worker processes of its own (uvicorn's, its job consumer) that outlive a signal sent to the leader alone. The
servers start and stop in parallel.

Source: MLflow's ``mlflow ui`` / ``/health`` (mlflow/server/__init__.py), Prefect's ``prefect server start`` and
``/api/health`` (prefect/server/api/server.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

BIN = Path(sys.executable).parent
MLFLOW_VIEW = "#/experiments?workflowType=machine_learning"  # the model-training view of the experiment list


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something already listens on `host`:`port` (TCP)."""
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mlflow_command(tracking_uri: str, port: int) -> list[str]:
    """``mlflow ui`` on `tracking_uri` (a local store: ``sqlite:///…`` or a folder) at 127.0.0.1:`port`."""
    return [str(BIN / "mlflow"), "ui", "--backend-store-uri", tracking_uri, "--host", "127.0.0.1", "--port", str(port)]


def prefect_command(port: int) -> tuple[list[str], dict[str, str]]:
    """``prefect server start`` at 127.0.0.1:`port` and its environment: this process's, without a run's API address
    (the server is the API), with the page told to ask this port's API (else it asks the default port's)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_UI_URL")}
    env["PREFECT_UI_API_URL"] = f"http://127.0.0.1:{port}/api"
    return [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)], env


def wait_for(url: str, proc: subprocess.Popen, timeout_s: float = 180.0) -> None:
    """Poll `url` until it answers 200.

    Raises:
        RuntimeError: `proc` exited, or `timeout_s` passed, before `url` answered.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{Path(proc.args[0]).name} exited ({proc.returncode}) before {url} answered")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        time.sleep(1.0)
    raise RuntimeError(f"{url} did not answer within {timeout_s:.0f} s")


def stop_groups(procs: list[subprocess.Popen], timeout_s: float = 20.0) -> None:
    """SIGTERM to each of `procs`' process groups (each leads its own session), all at once; SIGKILL to the groups
    with members left after `timeout_s`. Returns when every group is empty: the servers stop in parallel, so the
    slowest sets the time.

    SIGINT and SIGTERM to this process wait until the stop is done (a second Ctrl-C would otherwise abort it and
    leave a group running); they take effect after it.
    """
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for proc in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
            deadline = time.monotonic() + timeout_s
            while any(map(_group_alive, procs)):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            else:
                return
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _group_alive(proc: subprocess.Popen) -> bool:
    """Whether `proc`'s process group has a member left (the leader reaped first: a zombie still counts)."""
    proc.poll()
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    return True


class Server(NamedTuple):
    """A server to run: its command, the URL that answers 200 once it is up, the file its output goes to, and its
    environment (None: this process's)."""

    command: list[str]
    health_url: str
    log: Path
    env: dict[str, str] | None = None


@contextlib.contextmanager
def serving(*servers: Server) -> Iterator[list[subprocess.Popen]]:
    """Run `servers`, each in its own session with its output to its log, until the block ends; they start and stop
    in parallel. Yields their processes once every health URL answers.

    Raises:
        RuntimeError: a server exited or never answered (the message names its log).
    """
    procs: list[subprocess.Popen] = []
    try:
        for server in servers:
            server.log.parent.mkdir(parents=True, exist_ok=True)
            with server.log.open("w") as out:
                procs.append(
                    subprocess.Popen(
                        server.command, env=server.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                    )
                )
        for server, proc in zip(servers, procs, strict=True):
            try:
                wait_for(server.health_url, proc)
            except RuntimeError as err:
                raise RuntimeError(f"{err} (its output: {server.log})") from err
        yield procs
    finally:
        stop_groups(procs)
