"""The MLflow and Prefect UIs over this project's embedded state, served by their own servers (`didpo ui`, and
`scripts/screenshots.py` on free ports).

- MLflow: ``mlflow ui --backend-store-uri <tracking uri>`` (runs, metrics, artifacts, the model registry). MLflow 3's
  UI opens in its GenAI view unless the address asks for the model-training one (``MLFLOW_VIEW``).
- Prefect: ``prefect server start`` on ``PREFECT_HOME``'s database, the one every run's temporary API wrote; the runs'
  "View at" links point at ``flows.env.PREFECT_UI``, this server's default address.

Each server runs in its own session and is stopped as a process group (SIGTERM, then SIGKILL after 20 s): MLflow's UI
starts worker processes of its own (uvicorn's, its job consumer) that outlive a signal sent to the leader alone.

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


def stop_group(proc: subprocess.Popen, timeout_s: float = 20.0) -> None:
    """SIGTERM to `proc`'s process group (it leads its own session), SIGKILL to what is left after `timeout_s`.

    SIGINT and SIGTERM to this process wait until the stop is done (a second Ctrl-C would otherwise abort it and
    leave the group running); they take effect after it.
    """
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        _stop_group(proc, timeout_s)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _stop_group(proc: subprocess.Popen, timeout_s: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            continue
        # the leader is gone; its children may not be: a group with members left still answers signal 0
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


@contextlib.contextmanager
def serving(
    command: list[str], health_url: str, log: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen]:
    """Run a server in its own session, its output to `log`, until the block ends; yields once `health_url` answers.

    Raises:
        RuntimeError: the server exited or never answered (see `log`).
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            try:
                wait_for(health_url, proc)
            except RuntimeError as err:
                raise RuntimeError(f"{err} (its output: {log})") from err
            yield proc
        finally:
            stop_group(proc)
