"""The nightly deployment: the whole pipeline on a cron schedule (new feedback logs in, a model out when it wins)."""

from __future__ import annotations

from pathlib import Path

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


def deploy_nightly(
    pool: str,
    cron: str = "0 2 * * *",
    name: str = "nightly",
    params_path: str = "params.yaml",
    root: Path | None = None,
    parameters: dict | None = None,
) -> str:
    """Register the nightly deployment in work pool `pool` of the Prefect API (``PREFECT_API_URL``): the pipeline flow
    from this clone's folder (`root`, default the working directory), which the pool's worker runs there (a process
    work pool: the worker's machine has the clone). `parameters` replace the nightly ones (``push``, ``params_path``,
    ``stages``). Returns the deployment's id.

    Raises:
        ValueError: the pool does not exist (Prefect's own error: start its worker or create it first).
    """
    root = Path(root or Path.cwd()).resolve()
    flow = pipeline.from_source(source=str(root), entrypoint="flows/pipeline.py:pipeline")
    deployment_id = flow.deploy(
        name=name,
        work_pool_name=pool,
        cron=cron,
        parameters=parameters or {"push": True, "params_path": params_path},
        description="Nightly didpo-pipeline run: reproduce the DVC graph, push outputs, promote only a better model.",
        tags=["didpo", "nightly"],
        build=False,
        push=False,
        print_next_steps=False,
    )
    return str(deployment_id)
