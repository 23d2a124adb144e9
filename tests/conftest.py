"""Test-session environment: what `flows.env.setup_environment` gives every entry point, for tests that run a flow or
a task in this process (no CLI entry runs there)."""

from __future__ import annotations

import os
import signal


def pytest_configure(config):
    from flows.env import TELEMETRY_OFF

    # telemetry off for what the tests start in this process too (a Prefect server of their own), also when pytest
    # runs without the Makefile, which exports the same settings
    for key, value in TELEMETRY_OFF.items():
        os.environ.setdefault(key, value)
    # A flow or task run outside a Prefect API starts Prefect's temporary server; its 20 s default start-up limit was
    # missed on CI's loaded 2 cores (RuntimeError: Timed out while attempting to connect to ephemeral Prefect API
    # server). The value the CLI sets (flows/env.py).
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    # Tests send SIGINT (Ctrl-C) to programs they start. A shell starts a background job (`make test &`, nohup) with
    # SIGINT ignored, every child inherits that, and those tests then fail (the interrupt "lost"; `didpo ui` never
    # stopping), as a session's background fresh-clone run did. Python's own handler here: children start with the
    # default disposition again (a caught signal is reset at exec), as under a terminal or CI.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
