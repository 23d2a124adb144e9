"""The umbrella ``pipeline`` flow: reproduce the DVC graph stage by stage, then push the outputs.

dvc.yaml is the only stage graph and DVC its only reader: this flow takes DVC's own order of the stages
(`stage_order`) and runs ``dvc repro --single-item NAME`` for each, so ``dvc repro`` and ``didpo run`` execute the
same graph and DVC decides what is up to date. A failing stage (a failed gate included) stops the flow; nothing
downstream runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from prefect import flow, get_run_logger, task

from flows.dispatch import DispatchError, dispatch_stage
from tasks.config import load_params
from tasks.io import atomic_write_lines
from tasks.tracking import log_run_summary, pipeline_run


class StageFailed(RuntimeError):
    """A DVC stage exited non-zero; the message names it and its exit status."""


def stage_order(root: str | Path = ".") -> list[str]:
    """The stage names of the DVC project at `root` in the order ``dvc repro`` runs them: DVC's own graph
    (``Repo.index.graph``: outs to deps, ``${...}`` templating from params.yaml resolved by DVC) and its own plan
    (``dvc.repo.reproduce.plan_repro``, a post-order of that graph), so no second reader of dvc.yaml exists.

    Raises:
        dvc.exceptions.CyclicGraphError: the graph has a cycle (DVC's message names it).
    """
    from dvc.repo import Repo
    from dvc.repo.reproduce import plan_repro

    with Repo(str(root)) as repo:
        return [stage.name for stage in plan_repro(repo.index.graph)]


# How long an interrupted stage gets to stop by itself (its flow and MLflow runs marked, DVC's lock released) before
# it is terminated, then killed.
STOP_GRACE_S = 60.0


def stop_process_group(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> int:
    """Stop `proc` and its process group as a Ctrl-C would: SIGINT (DVC ignores it while a stage runs and the stage's
    command receives it), then SIGTERM after `grace_s`, then SIGKILL after 10 s more. A second Ctrl-C while waiting
    kills the group at once. Returns the exit status."""
    for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGTERM, 10.0), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            return proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        except KeyboardInterrupt:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    return proc.wait()


# Set by `repro_stage` for the stage command DVC starts: the id of the pipeline's task run, so the stage's flow run
# is created as its subflow (`flows.cli.run_stage_flow`) and the Prefect UI nests every stage under the pipeline.
PARENT_TASK_RUN_ENV = "DIDPO_PARENT_TASK_RUN"


# DVC's advice after a stage that does not apply to a run of this pipeline, which pushes the outputs itself and leaves
# committing to the person: "To track the changes with git, run: …" and "To enable auto staging, run: …"
# (dvc.repo.scm_context, each a heading then blank and tab-indented command lines) and "Use `dvc push` to send your
# updates to remote storage." (dvc.commands.repro). DVC has no switch for them short of ``--quiet``, which also hides
# "Running stage" and "didn't change, skipping".
DVC_HINT_HEADINGS = ("To track the changes with git, run:", "To enable auto staging, run:")
DVC_PUSH_HINT = "Use `dvc push` to send your updates to remote storage."
# What DVC adds after "Stage '<name>' didn't change, skipping" for a single stage: the same fact again.
DVC_UP_TO_DATE = "Data and pipelines are up to date."


def without_dvc_hints(lines: Iterable[str]) -> Iterator[str]:
    """`lines` (DVC's standard output, each with its newline) without DVC's git and push hints and its "Data and
    pipelines are up to date." after a skipped stage: a hint block is its heading, the blank lines just before it and
    the blank and tab-indented lines after it; everything else passes unchanged and in order."""
    blanks: list[str] = []  # blank lines held back until the next line says whether a hint follows them
    in_hint = False
    for line in lines:
        text = line.strip()
        if not text:
            blanks.append(line)
            continue
        if text in DVC_HINT_HEADINGS or text in (DVC_PUSH_HINT, DVC_UP_TO_DATE):
            blanks, in_hint = [], text in DVC_HINT_HEADINGS
            continue
        if in_hint and line.startswith("\t"):
            blanks = []
            continue
        in_hint = False
        yield from blanks
        blanks = []
        yield line
    if not in_hint:
        yield from blanks


def _echo_without_hints(stream, ran: list[bool]) -> None:
    """Echo `without_dvc_hints`; ``ran`` gets True when DVC says it runs the stage's command ("Running stage")."""
    for line in without_dvc_hints(stream):
        if line.startswith("Running stage '"):
            ran.append(True)
        sys.stdout.write(line)
        sys.stdout.flush()


def _sigint_default() -> None:
    """In DVC's process, before it starts: SIGINT handled by default even when this run inherited it ignored (started
    as a background job of a script, e.g. ``make run &``), so that `stop_process_group`'s SIGINT stops the stage
    gracefully instead of waiting out the grace period. DVC runs in its own session: no terminal's Ctrl-C reaches
    it, only the signals this run sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@task(task_run_name="repro-{name}")
def repro_stage(name: str) -> tuple[int, bool]:
    """``dvc repro --single-item NAME`` (`flows.dvc_cli`: dvc less its warning that the optional human pairs are
    empty), in its own process group, with this task run's id in
    ``DIDPO_PARENT_TASK_RUN`` (the stage's flow run is its subflow). Its standard output streams to the console as it
    comes, less DVC's git and push hints (`without_dvc_hints`); its standard error (logs, progress bars) is the
    console's. A Ctrl-C (KeyboardInterrupt here) or a SIGTERM (Prefect's ``TerminationSignal`` inside a flow run) is
    passed on to it with `stop_process_group`, and this returns only once it has stopped: the stage marks its own flow
    run and its MLflow run while the Prefect API still answers. Returns ``(exit status, whether the stage's command
    ran)`` (False: DVC found it up to date and skipped it). A failed stage is not raised here: the stage has printed
    why, and `pipeline` ends its run Failed without another traceback.

    Raises:
        KeyboardInterrupt: interrupted (after the stage stopped).
    """
    from prefect.runtime import task_run

    # The stage's own flow run (created in its process, only when DVC runs it) becomes a subflow of this task run.
    # Unbuffered: the stage's own prints reach the console when made although its standard output is a pipe.
    env = {**os.environ, PARENT_TASK_RUN_ENV: str(task_run.id), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.dvc_cli", "repro", "--single-item", name],  # dvc, less one warning
        start_new_session=True,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=_sigint_default,
    )
    # A thread pumps the pipe so that this thread can wait, and pass on a Ctrl-C, exactly as before.
    ran: list[bool] = []
    echo = threading.Thread(target=_echo_without_hints, args=(proc.stdout, ran), daemon=True)
    echo.start()
    try:
        returncode = proc.wait()
    except BaseException:  # a Ctrl-C, or a SIGTERM (Prefect's flow engine raises its TerminationSignal for it)
        stop_process_group(proc)
        echo.join(timeout=5.0)
        raise
    echo.join(timeout=5.0)
    return returncode, bool(ran)


@task(retries=3, retry_delay_seconds=[2, 10, 30])
def dvc_push() -> None:
    """Push every DVC-tracked output to the default remote (retried: it is I/O)."""
    subprocess.run(["dvc", "push", "--quiet"], check=True)


# Each stage's wall-clock seconds the last time its command ran (`record_stage_seconds`; local to a clone, next to
# .cache/openvino): the pipeline's ETA.
TIMINGS = Path(".cache/stage_seconds.json")


# The committed default run's stage seconds (saved with its snapshot by scripts/restore_run.py; 2 cores with
# AVX512-BF16): the ETA's figure for a stage never run in this clone, and the ETA line says so.
REFERENCE_TIMINGS = Path("docs/results/default_run/stage_seconds.json")


def read_stage_seconds(path: Path | None = None) -> dict[str, float]:
    """`path` (default `TIMINGS`) as ``{stage: seconds}`` ({} before any stage has run here or when the file is
    unreadable)."""
    try:
        return {str(k): float(v) for k, v in json.loads((path or TIMINGS).read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def record_stage_seconds(name: str, seconds: float) -> None:
    """Record a finished stage command's wall-clock seconds in `TIMINGS` (DVC runs the command only when the stage
    is out of date, so a skipped stage keeps the figure of the last time it did work)."""
    timings = read_stage_seconds() | {name: round(seconds, 1)}
    atomic_write_lines(TIMINGS, [json.dumps(timings, indent=1, sort_keys=True)])


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min {secs:02d} s"


def out_of_date(order: list[str], root: str | Path = ".") -> set[str]:
    """Those of the stages `order` that DVC's own status (``Repo.status``, as `dvc status`) finds changed against
    dvc.lock (a changed dependency, parameter or command, or an output missing from the working tree or the cache),
    and every stage that depends on one of them in DVC's graph (``Repo.index.graph``: they run after it). Every stage
    when DVC cannot tell (an error is not a reason to stop a run over its ETA)."""
    import networkx as nx
    from dvc.repo import Repo

    try:
        with Repo(str(root)) as repo:
            dvc_yaml = Path(repo.root_dir) / "dvc.yaml"  # a bare stage name is looked up in the working directory
            changed = {key.rsplit(":", 1)[-1] for key in repo.status(targets=[f"{dvc_yaml}:{s}" for s in order])}
            graph = repo.index.graph  # an edge runs from a stage to the stage it depends on
            stages = [node for node in graph.nodes if getattr(node, "name", None) in changed]
            downstream = {node.name for stage in stages for node in nx.ancestors(graph, stage)}
            return (changed | downstream) & set(order)
    except Exception:  # noqa: BLE001 - only the ETA depends on it
        return set(order)


def progress_line(
    i: int,
    order: list[str],
    elapsed_s: float,
    timings: dict[str, float],
    to_run: set[str] | None = None,
    reference: dict[str, float] | None = None,
) -> str:
    """``stage i/N: name (elapsed …, ETA …)`` before stage ``order[i - 1]`` starts: the ETA is the seconds, in the
    last run that ran each (`TIMINGS`), of the remaining stages in `to_run` (`out_of_date` at the start: the changed
    ones and every stage after them in the graph; None: all of them). A restored clone's ETA was 3 h 17 min for the
    46 min of evaluate and register when every stage after the first changed one was counted, and 1 h 17 min for the
    quick path's 12 min when restored SFT and gate were. A stage never run here takes its figure from `reference`
    (`REFERENCE_TIMINGS`), and the line then says ``ETA …, committed run's timings`` (another CPU or other params
    take another time); ``?`` when a stage has no figure in either."""
    remaining = [s for s in order[i - 1 :] if to_run is None or s in to_run]
    known = (reference or {}) | timings
    eta = sum(known[s] for s in remaining) if all(s in known for s in remaining) else None
    source = ", committed run's timings" if eta is not None and any(s not in timings for s in remaining) else ""
    return f"stage {i}/{len(order)}: {order[i - 1]} (elapsed {_duration(elapsed_s)}, ETA {_duration(eta)}{source})"


def headline_metrics(order: list[str], root: str | Path = ".") -> dict[str, float]:
    """The run's result as MLflow metrics of its parent run: every figure of the `order` stages' DVC metrics (their
    headline files, what ``dvc metrics show`` prints), as ``<stage>/<key>``, evaluate's one file a checkpoint as
    ``evaluate/<checkpoint>/<key>``; booleans as 0/1, text left out, names made MLflow-legal (``pass@1`` →
    ``pass_at_1``). A stage whose headline is missing (never run) has none."""
    import yaml

    from tasks.tracking import metric_name

    stages = yaml.safe_load((Path(root) / "dvc.yaml").read_text())["stages"]
    metrics = {}
    for stage in order:
        for entry in stages.get(stage, {}).get("metrics", []):
            path = Path(root) / (next(iter(entry)) if isinstance(entry, dict) else entry)
            files = sorted(path.glob("*.json")) if path.is_dir() else [path] if path.is_file() else []
            for file in files:
                prefix = f"{stage}/{file.stem}" if path.is_dir() else stage
                for key, value in json.loads(file.read_text()).items():
                    if isinstance(value, (bool, int, float)):
                        metrics[metric_name(f"{prefix}/{key}")] = float(value)
    return metrics


@flow(name="pipeline")
def pipeline(stages: list[str] | None = None, push: bool = True, params_path: str = "params.yaml") -> dict[str, bool]:
    """Run the DVC graph stage by stage (all of it, or ``stages`` in graph order), then ``dvc push``.

    One MLflow parent run covers the whole run; each stage process opens its child run under it. Before each stage
    a `progress_line` says where the run is and how long the rest took the last time each ran here (an ETA that
    counts the stages from the first one DVC found out of date at the start). Returns ``{stage: whether its command
    ran}`` in graph order (False: up to date, skipped).

    Raises:
        StageFailed: a stage failed; the flow run ends Failed with its message (a returned Failed state, so Prefect
            prints no traceback: the stage printed its own reason, once).
    """
    order = [s for s in stage_order() if stages is None or s in stages]
    started = time.monotonic()
    try:
        params = load_params(params_path)
        algo = params.didpo.algo if {"didpo", "evaluate"} & set(order) else None  # in the run's name
        with pipeline_run(params.tracking, algo=algo) as run_id:  # a raised StageFailed marks it FAILED
            logger = get_run_logger()
            logger.info("MLflow parent run %s; stages: %s", run_id, ", ".join(order))
            pools = params.dispatch.pools
            unknown = sorted(set(pools) - set(stage_order()))
            if unknown:
                raise StageFailed(f"dispatch.pools: {unknown} are not stages of dvc.yaml")
            ran = {}
            to_run = out_of_date(order)
            reference = read_stage_seconds(REFERENCE_TIMINGS)
            for i, name in enumerate(order, 1):
                elapsed = time.monotonic() - started
                # to_run holds every stage downstream of a changed one: all that can run after a stage has run
                logger.info(progress_line(i, order, elapsed, read_stage_seconds(), to_run, reference))
                if name in pools and name in out_of_date([name]):  # its inputs and outputs through the DVC remote
                    try:
                        returncode, ran[name] = dispatch_stage(name, pools[name])
                    except DispatchError as error:
                        raise StageFailed(f"stage '{name}' failed on work pool {pools[name]!r}: {error}") from None
                else:
                    returncode, ran[name] = repro_stage(name)
                if returncode != 0:
                    raise StageFailed(f"stage '{name}' failed (exit {returncode}); later stages were not run")
            ran_names = ",".join(s for s in order if ran[s])
            log_run_summary({"stages": ",".join(order), "ran": ran_names or "none"}, headline_metrics(order))
            if push:
                dvc_push()
    except StageFailed as failed:
        from prefect.states import Failed

        return Failed(message=str(failed), data=failed)
    return ran
