"""The nightly deployment: its cron schedule reaches the Prefect API and the scheduler creates runs on it."""

import asyncio

import pytest

from flows.schedule import nightly_deployment


def test_nightly_deployment_defaults():
    deployment = nightly_deployment()
    assert deployment.name == "nightly"
    assert deployment.schedules[0].schedule.cron == "0 2 * * *"
    assert deployment.parameters == {"push": True, "params_path": "params.yaml"}


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory):
    from flows.env import setup_environment

    setup_environment(tmp_path_factory.mktemp("prefect-home"))
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):  # 30 s (the default) was missed once on shared cores
        yield


def test_short_schedule_is_scheduled_every_minute(prefect_api):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.server.services.scheduler import schedule_deployments

    deployment_id = nightly_deployment(cron="* * * * *", name="every-minute").apply()
    asyncio.run(schedule_deployments())  # one pass of the server's scheduler service

    async def scheduled_runs():
        async with get_client() as client:
            return await client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
            )

    runs = asyncio.run(scheduled_runs())
    starts = sorted(run.expected_start_time for run in runs)
    assert len(starts) >= 3
    assert all(run.state_name == "Scheduled" for run in runs)
    assert all(t.second == 0 and t.microsecond == 0 for t in starts)  # on minute boundaries
    assert {(b - a).total_seconds() for a, b in zip(starts, starts[1:], strict=False)} == {60.0}
    assert runs[0].parameters == {"push": True, "params_path": "params.yaml"}
