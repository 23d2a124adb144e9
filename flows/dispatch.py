"""A stage sent to another Prefect work pool (a GPU machine, a Kubernetes job), its inputs and outputs through the DVC
remote (``dispatch.pools`` in params.yaml; nothing on a shared disk).

The pipeline (`dispatch_stage`, in place of `flows.pipeline.repro_stage`):

1. refuses a workspace whose code or params differ from its git commit (the job runs that commit);
2. ``dvc push``: the stage's inputs (every upstream output) reach the remote;
3. runs deployment ``stage-job/<pool>`` (`stage_job`, registered by ``didpo deploy --stage-pool <pool>`` from the
   clone the pool's worker runs in) with the stage's name and the commit, and waits for it;
4. writes the stage's git-tracked outputs (metrics, histories, plots: ``cache: false`` in dvc.yaml) and the job's
   dvc.lock (this run's, with the stage's new entry) from the job's Prefect artifact, then pulls the outputs that
   entry names from the remote, so that the next stage and ``dvc status`` see the stage as if it had run here.

The job (`stage_job`, in the worker's clone): checks out the commit (fetching it when missing), takes the pipeline's
dvc.lock (the input versions its earlier stages just wrote), ``dvc pull`` of the inputs, ``dvc repro --single-item
<stage>``, ``dvc push`` of the outputs, and its git-tracked outputs with its dvc.lock as one Prefect artifact of the
flow run (base64, in the Prefect server's database).

On this machine a second process work pool with its own clone stands in for the GPU pool (tests/test_team.py); a
Kubernetes work pool takes deploy/k8s-gpu-job-template.json (one ``nvidia.com/gpu`` per job; validated against
prefect-kubernetes' own job configuration in the tests).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

from prefect import flow, get_run_logger, task

JOB_FLOW = "stage-job"
ARTIFACT_PREFIX = "stage-outputs-"


class DispatchError(RuntimeError):
    """A stage could not be dispatched or its outputs could not be brought back; the message says what to do."""


def _run(args: list[str], cwd: Path | None = None) -> str:
    """Run a command; its standard output. Raises DispatchError with its output when it fails."""
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise DispatchError(
            f"{' '.join(args)} failed ({result.returncode}): {(result.stderr or result.stdout)[-2000:]}"
        )
    return result.stdout


def _dvc(*args: str) -> list[str]:
    return [sys.executable, "-m", "flows.dvc_cli", *args]


def git_tracked_outputs(name: str, root: Path = Path(".")) -> list[Path]:
    """The files of stage `name`'s outputs that DVC does not cache (``cache: false``: metrics, histories, plots),
    as DVC's own index reads dvc.yaml; folders walked. Paths relative to `root`."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        stage = next(s for s in repo.index.stages if getattr(s, "name", None) == name)
        paths = [Path(out.def_path) for out in stage.outs if not out.use_cache]
    files = []
    for path in paths:
        full = Path(root) / path
        files += sorted(p.relative_to(root) for p in full.rglob("*") if p.is_file()) if full.is_dir() else [path]
    return [f for f in files if (Path(root) / f).is_file()]


def pack(files: list[Path], root: Path = Path(".")) -> str:
    """`files` (relative to `root`) as one JSON text: ``{path: base64 of the bytes}``."""
    return json.dumps({str(f): base64.b64encode((Path(root) / f).read_bytes()).decode() for f in files})


def unpack(text: str, root: Path = Path(".")) -> list[Path]:
    """Write the files of a `pack` text under `root`; returns their paths."""
    written = []
    for name, data in json.loads(text).items():
        path = Path(root) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        written.append(Path(name))
    return written


@flow(name=JOB_FLOW)
def stage_job(name: str, commit: str, lock: str) -> None:
    """Run stage `name` of `commit` in this clone (the worker's), its inputs from and its outputs to the DVC remote;
    its git-tracked outputs become the flow run's artifact ``stage-outputs-<name>``. `lock` is the dispatching
    workspace's dvc.lock (the versions of the inputs to pull: the stages before this one ran there, uncommitted).

    Raises:
        DispatchError: the commit is not reachable here, or pull, repro or push failed (their output in the message).
    """
    from prefect.artifacts import create_markdown_artifact

    log = get_run_logger()
    if _run(["git", "rev-parse", "HEAD"]).strip() != commit:
        log.info("checking out %s", commit)
        subprocess.run(["git", "fetch", "--quiet"], capture_output=True)  # the commit may be newer than this clone
        # --force: the worker's clone is the jobs' own; what an earlier job left in its tracked files (dvc.lock, git-
        # tracked outputs) is discarded
        _run(["git", "checkout", "--quiet", "--force", commit])
    Path("dvc.lock").write_text(lock)
    _run(_dvc("pull", "--allow-missing", "--quiet"))
    log.info("running stage %s (commit %s)", name, commit[:8])
    _run(_dvc("repro", "--single-item", name))
    _run(_dvc("push", "--quiet", name))
    files = [*git_tracked_outputs(name), Path("dvc.lock")]  # the lock: the pipeline's, with this stage's new entry
    create_markdown_artifact(markdown=pack(files), key=ARTIFACT_PREFIX + name.replace("_", "-"))
    log.info("stage %s done: outputs pushed, %d git-tracked files in the artifact", name, len(files))


def deploy_stage_jobs(pool: str, root: Path | None = None) -> str:
    """Register deployment ``stage-job/<pool>`` in work pool `pool` (Prefect API: ``PREFECT_API_URL``) from the clone
    at `root` (default the working directory), which that pool's worker runs the jobs in. Returns its id."""
    root = Path(root or Path.cwd()).resolve()
    job = stage_job.from_source(source=str(root), entrypoint="flows/dispatch.py:stage_job")
    return str(job.deploy(name=pool, work_pool_name=pool, build=False, push=False, print_next_steps=False))


def _job_outputs(flow_run_id) -> str:
    """The packed git-tracked outputs the job attached to its flow run."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    async def read():
        async with get_client() as client:
            found = ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
            return await client.read_artifacts(artifact_filter=found)

    artifacts = [a for a in asyncio.run(read()) if (a.key or "").startswith(ARTIFACT_PREFIX)]
    if not artifacts:
        raise DispatchError(f"the job's flow run {flow_run_id} left no {ARTIFACT_PREFIX}* artifact")
    return artifacts[0].data


@task(task_run_name="dispatch-{name}-to-{pool}")
def dispatch_stage(name: str, pool: str) -> tuple[int, bool]:
    """Run stage `name` on work pool `pool`'s worker (steps in the module docstring); returns ``(exit status, True)``
    as `flows.pipeline.repro_stage` does (the stage's command always runs there: DVC on the worker decides nothing
    is skipped only for an up-to-date stage, which the pipeline does not dispatch).

    Raises:
        DispatchError: uncommitted code or params, the job failed (its flow run named), or its outputs are missing.
    """
    from prefect.deployments import run_deployment

    log = get_run_logger()
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no", "--", "."]).splitlines()
    dirty = [line for line in dirty if not line[3:].startswith(("data/", "dvc.lock"))]
    if dirty:
        raise DispatchError(
            f"stage {name} runs on work pool {pool!r} from the committed code and params, and this workspace differs "
            f"from its commit ({', '.join(line[3:] for line in dirty[:5])}): commit first"
        )
    commit = _run(["git", "rev-parse", "HEAD"]).strip()
    _run(_dvc("push", "--quiet"))
    log.info("stage %s: inputs pushed; running on work pool %r (commit %s)", name, pool, commit[:8])
    lock = Path("dvc.lock").read_text() if Path("dvc.lock").is_file() else ""
    parameters = {"name": name, "commit": commit, "lock": lock}
    run = run_deployment(f"{JOB_FLOW}/{pool}", parameters=parameters, timeout=None)
    if not run.state.is_completed():
        raise DispatchError(
            f"flow run {run.name} ({run.id}) of {JOB_FLOW}/{pool} ended {run.state.name}: {run.state.message}"
        )
    written = unpack(_job_outputs(run.id))  # the git-tracked outputs and dvc.lock with the stage's new entry
    _run(_dvc("pull", "--quiet", name))  # the cached outputs of that entry
    log.info("stage %s: outputs pulled, %d git-tracked files written, dvc.lock updated", name, len(written) - 1)
    return 0, True
