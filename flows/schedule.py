"""The nightly deployment: the whole pipeline on a cron schedule (new feedback logs in, a model out when it wins)."""

from __future__ import annotations

from flows.pipeline import pipeline


def nightly_deployment(cron: str = "0 2 * * *", name: str = "nightly", params_path: str = "params.yaml"):
    """A Prefect ``RunnerDeployment`` of :func:`flows.pipeline.pipeline` on ``cron`` (serve it with ``didpo serve``)."""
    return pipeline.to_deployment(
        name=name,
        cron=cron,
        parameters={"push": True, "params_path": params_path},
        description="Nightly didpo-pipeline run: reproduce the DVC graph, push outputs, promote only a better model.",
        tags=["didpo", "nightly"],
    )
