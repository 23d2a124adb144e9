"""The sandbox as the stages use it: params.yaml's ``verifier`` section → a :class:`sandbox.verifier.Verifier`."""

from __future__ import annotations

from sandbox.verifier import Verifier, VerifierConfig
from tasks.config import VerifierSection


def make_verifier(cfg: VerifierSection):
    """A :class:`sandbox.verifier.Verifier` configured from params.yaml's ``verifier`` section (a context manager)."""
    import os

    return Verifier(
        VerifierConfig(
            timeout_s=cfg.timeout_s,
            cpu_s=cfg.cpu_s,
            memory_mb=cfg.memory_mb,
            workers=cfg.workers or os.cpu_count() or 1,
        )
    )
