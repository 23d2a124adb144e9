"""Process environment for every entry point: telemetry off, offline model hub, embedded state in the repo.

Called from the CLI's entry (never at import time). Values already set by the user win (``setdefault``), so a team can
point ``PREFECT_API_URL``, ``MLFLOW_TRACKING_URI`` or ``HF_HUB_OFFLINE=0`` elsewhere.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path

PREFECT_UI = "http://127.0.0.1:4200"  # where `prefect server start` (see `didpo ui`) serves PREFECT_HOME's runs

TELEMETRY_OFF = {
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_CLOUD_ENABLE_ORCHESTRATION_TELEMETRY": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DVC_NO_ANALYTICS": "1",
    "GX_ANALYTICS_ENABLED": "False",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


# Library INFO lines that tell a person nothing to act on (issue 19: quiet by default): MLflow's four system-metrics
# lines a stage and its table creation on the first run, Great Expectations' temporary docs-site folder. Their
# warnings and errors still print. GX sets its module logger to INFO when imported (after this runs), so a filter on
# each logger backs the level up.
QUIET_LOGGERS = ("mlflow.system_metrics", "mlflow.store.db.utils", "great_expectations.data_context.types.base")
PREFECT_SERVER_DOCS = "\nSee https://www.prefect.io/docs/v3/concepts/server#how-to-guides"


class WarningsOnly(logging.Filter):
    """Passes records at WARNING or above."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING


class WithoutServerDocs(logging.Filter):
    """Keeps Prefect's "Starting temporary server on …" line and drops the docs link Prefect appends to it
    (`prefect.server.api.server.SubprocessASGIServer.start`): the temporary server is this tool's design."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and PREFECT_SERVER_DOCS in record.msg:
            record.msg = record.msg.split(PREFECT_SERVER_DOCS)[0]
        return True


def quiet_library_logs() -> None:
    """`QUIET_LOGGERS` at WARNING (their children follow) with `WarningsOnly` on each (a library resetting its own
    logger's level does not undo it), and `WithoutServerDocs` on the ``prefect`` logger. Idempotent."""

    def add_once(logger: logging.Logger, kind: type[logging.Filter]) -> None:
        if not any(isinstance(f, kind) for f in logger.filters):
            logger.addFilter(kind())

    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
        add_once(logging.getLogger(name), WarningsOnly)
    add_once(logging.getLogger("prefect"), WithoutServerDocs)


def setup_environment(root: Path | None = None) -> None:
    """Turn telemetry off and keep Prefect's state (its SQLite database) inside the project folder."""
    for key, value in TELEMETRY_OFF.items():
        os.environ.setdefault(key, value)
    # transformers 5.24 deprecates a method that peft 0.21 still calls on every LoRA model: two lines of noise at each
    # training stage's start that no setting of ours can act on
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    quiet_library_logs()
    # Stage commands run by dvc (`didpo stage ...`) and `dvc` itself must resolve to this interpreter's environment.
    bin_dir = str(Path(sys.executable).parent)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    root = root or Path.cwd()
    os.environ.setdefault("PREFECT_HOME", str(root / ".prefect"))
    # A stage run alone (no PREFECT_API_URL) starts Prefect's ephemeral server; on a busy 2-core box it can take
    # longer than Prefect's default 20 s to come up.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    if not os.environ.get("PREFECT_API_URL"):
        # Runs report to a temporary API (gone when the run ends) that writes PREFECT_HOME's database; `didpo ui`'s
        # `prefect server start` serves that database at PREFECT_UI, so the "View at" links point there.
        os.environ.setdefault("PREFECT_UI_URL", PREFECT_UI)
