"""The umbrella ``pipeline`` flow: reproduce the DVC graph stage by stage, then push the outputs.

dvc.yaml is the only stage graph: this flow reads its stages, orders them by their deps/outs, and runs
``dvc repro --single-item NAME`` for each, so ``dvc repro`` and ``didpo run`` execute the same graph and DVC decides
what is up to date. A failing stage (a failed gate included) stops the flow; nothing downstream runs.
"""

from __future__ import annotations

import contextlib
import graphlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import yaml
from prefect import flow, get_run_logger, task

from tasks.config import load_params
from tasks.io import atomic_write_lines
from tasks.tracking import pipeline_run


class StageFailed(RuntimeError):
    """A DVC stage exited non-zero; the message names it and its exit status."""


def _covers(out: str, dep: str) -> bool:
    out_p, dep_p = Path(out), Path(dep)
    return out_p == dep_p or out_p in dep_p.parents or dep_p in out_p.parents


def stage_order(dvc_yaml: str | Path = "dvc.yaml") -> list[str]:
    """Stage names of dvc.yaml in dependency order (a stage after every stage whose outs it depends on).

    Ties keep the file's order. Raises ``graphlib.CycleError`` on a cyclic graph.
    """
    dvc_yaml = Path(dvc_yaml)
    stages: dict = (yaml.safe_load(dvc_yaml.read_text()) or {}).get("stages", {})
    params_file = dvc_yaml.with_name("params.yaml")
    params = (yaml.safe_load(params_file.read_text()) or {}) if params_file.exists() else {}

    def interpolate(text: str) -> str:  # dvc.yaml's ${section.key} templating, from params.yaml
        def value(match: re.Match) -> str:
            node = params
            for part in match[1].split("."):
                node = node[part]
            return str(node)

        return re.sub(r"\$\{\s*([\w.]+)\s*\}", value, text)

    def paths(spec: dict, key: str) -> list[str]:
        return [interpolate(next(iter(x)) if isinstance(x, dict) else x) for x in spec.get(key, [])]

    outs = {name: paths(spec, "outs") + paths(spec, "metrics") + paths(spec, "plots") for name, spec in stages.items()}
    sorter: graphlib.TopologicalSorter = graphlib.TopologicalSorter()
    for name, spec in stages.items():
        upstream = [
            other
            for other in stages
            if other != name and any(_covers(o, d) for o in outs[other] for d in paths(spec, "deps"))
        ]
        sorter.add(name, *upstream)
    sorter.prepare()
    position = {name: i for i, name in enumerate(stages)}
    order: list[str] = []
    while sorter.is_active():
        ready = sorted(sorter.get_ready(), key=position.__getitem__)
        order.extend(ready)
        sorter.done(*ready)
    return order


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


@task(task_run_name="repro-{name}")
def repro_stage(name: str) -> None:
    """``dvc repro --single-item NAME`` (its output streams to the console), in its own process group: a Ctrl-C
    (KeyboardInterrupt here) is passed on to it with `stop_process_group`, and this returns only once it has stopped.

    Raises:
        StageFailed: the stage's command exited non-zero.
        KeyboardInterrupt: interrupted (after the stage stopped).
    """
    proc = subprocess.Popen(["dvc", "repro", "--single-item", name], start_new_session=True)
    try:
        returncode = proc.wait()
    except KeyboardInterrupt:
        stop_process_group(proc)
        raise
    if returncode != 0:
        raise StageFailed(f"stage '{name}' failed (exit {returncode}); later stages were not run")


@task(retries=3, retry_delay_seconds=[2, 10, 30])
def dvc_push() -> None:
    """Push every DVC-tracked output to the default remote (retried: it is I/O)."""
    subprocess.run(["dvc", "push", "--quiet"], check=True)


# Each stage's wall-clock seconds the last time its command ran (`record_stage_seconds`; local to a clone, next to
# .cache/openvino): the pipeline's ETA.
TIMINGS = Path(".cache/stage_seconds.json")


def read_stage_seconds() -> dict[str, float]:
    """`TIMINGS` as ``{stage: seconds}`` ({} before any stage has run here or when the file is unreadable)."""
    try:
        return {str(k): float(v) for k, v in json.loads(TIMINGS.read_text()).items()}
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


def progress_line(i: int, order: list[str], elapsed_s: float, timings: dict[str, float]) -> str:
    """``stage i/N: name (elapsed …, ETA …)`` before stage ``order[i - 1]`` starts: the ETA is the remaining
    stages' seconds in the last run that ran each (`TIMINGS`), ``?`` while one of them has never run here."""
    remaining = order[i - 1 :]
    eta = sum(timings[s] for s in remaining) if all(s in timings for s in remaining) else None
    return f"stage {i}/{len(order)}: {order[i - 1]} (elapsed {_duration(elapsed_s)}, ETA {_duration(eta)})"


@flow(name="pipeline")
def pipeline(stages: list[str] | None = None, push: bool = True, params_path: str = "params.yaml") -> list[str]:
    """Run the DVC graph stage by stage (all of it, or ``stages`` in graph order), then ``dvc push``.

    One MLflow parent run covers the whole run; each stage process opens its child run under it. Before each stage
    a `progress_line` says where the run is and how long the rest took the last time each ran here (an ETA that
    assumes every remaining stage is out of date). Returns the stage names run. Raises :class:`StageFailed` when one
    fails.
    """
    order = [s for s in stage_order() if stages is None or s in stages]
    started = time.monotonic()
    with pipeline_run(load_params(params_path).tracking) as run_id:
        logger = get_run_logger()
        logger.info("MLflow parent run %s; stages: %s", run_id, ", ".join(order))
        for i, name in enumerate(order, 1):
            logger.info(progress_line(i, order, time.monotonic() - started, read_stage_seconds()))
            repro_stage(name)
        if push:
            dvc_push()
    return order
