"""Tiny end to end of the data half: prepare → simulate_logs → validate → mine, through `dvc repro`, then through the
Prefect umbrella flow (`didpo run`), with the MLflow parent/child runs and the Prefect flow runs asserted.
Runs in a scratch copy of the project."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flows.pipeline import headline_metrics

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
COPY = [
    "flows",
    "tasks",
    "models",
    "sandbox",
    "datalib",
    "data/expectations",
    "data/raw",
    "dvc.yaml",
    "params.yaml",
    "pyproject.toml",
]


def sh(args, cwd, env, check=True):
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"{args} failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result


def run_ids(root: Path) -> set[str]:
    """The ids of the project's MLflow runs so far (none before its experiment exists)."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")
    experiment = client.get_experiment_by_name("didpo-pipeline")
    return {r.info.run_id for r in client.search_runs([experiment.experiment_id])} if experiment else set()


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A scratch git + DVC project with the real code and a tiny params.yaml."""
    root = tmp_path_factory.mktemp("project")
    for name in COPY:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, root / name)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["prepare"].update(n_problems=120, include_humaneval=True)
    params["simulate_logs"].update(n_events=3000, n_users=80, n_prompts=40)
    # the model stages run on a tiny random model saved as a local Hugging Face folder (no download, seconds)
    from models.policy import build_tiny_causal_lm

    model, tokenizer = build_tiny_causal_lm(seed=0)
    model.save_pretrained(root / "tiny-model")
    tokenizer.save_pretrained(root / "tiny-model")
    params["base_model"]["name_or_path"] = str(root / "tiny-model")
    params["baseline"].update(
        n_samples=2, k=2, max_new_tokens=16, val_problems=2, humaneval_problems=2, temperature=1.0, top_p=1.0
    )
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(root),  # the copy's code, not the installed tree's
        "PREFECT_HOME": str(root / ".prefect"),
    }
    env.pop("PREFECT_API_URL", None)
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("DIDPO_PARENT_RUN_ID", None)
    sh(["git", "init", "-q"], root, env)
    sh(["git", "config", "user.email", "t@example.invalid"], root, env)
    sh(["git", "config", "user.name", "t"], root, env)
    sh(["dvc", "init", "-q"], root, env)
    sh(["dvc", "config", "core.analytics", "false"], root, env)
    sh(["dvc", "remote", "add", "-d", "local", str(root / ".dvc-remote")], root, env)
    (root / ".gitignore").write_text("mlflow.db\nmlartifacts/\n.prefect/\n.dvc-remote/\ntiny-model/\n")
    sh(["git", "add", "-A"], root, env)
    sh(["git", "commit", "-qm", "init"], root, env)
    return root, env


def mlflow_runs(root: Path):
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")
    experiment = client.get_experiment_by_name("didpo-pipeline")
    return client, client.search_runs([experiment.experiment_id])


STAGES = ["mine", "prepare", "simulate_logs", "validate"]


def test_dvc_repro_data_stages(project):
    root, env = project
    sh(["dvc", "repro", "mine"], root, env)  # and everything upstream of it

    lines = (root / "data/prepared/problems.jsonl").read_text().splitlines()
    problems = [json.loads(line) for line in lines]
    splits = {p["split"] for p in problems}
    assert splits == {"train", "val", "test", "humaneval", "heldout"}
    assert sum(p["split"] == "humaneval" for p in problems) == 164
    report = json.loads((root / "data/validated/report.json").read_text())
    problems_report = report["datasets"]["problems"]
    assert report["passed"] is True
    assert (
        problems_report["rows_in"] == len(lines) == problems_report["rows_valid"] + problems_report["rows_quarantined"]
    )
    assert problems_report["rows_quarantined"] == 0  # every reference solution passed its tests in the sandbox

    logs_report = report["datasets"]["feedback_logs"]
    assert logs_report["rows_in"] == 3000 == logs_report["rows_valid"] + logs_report["rows_quarantined"]
    mined = json.loads((root / "data/mined/report.json").read_text())
    pairs = (root / "data/mined/pairs.jsonl").read_text().splitlines()
    assert len(pairs) > 0 and all(set(json.loads(p)) >= {"prompt", "chosen", "rejected", "source"} for p in pairs)
    assert mined  # the mining report exists and is non-empty

    status = sh(["dvc", "status", *STAGES], root, env).stdout
    assert "up to date" in status, status
    again = sh(["dvc", "repro", "mine"], root, env).stdout
    assert "didn't change" in again or "up to date" in again.lower(), again

    _, runs = mlflow_runs(root)
    assert sorted(r.data.tags["didpo.stage"] for r in runs) == STAGES


def test_didpo_run_through_prefect(project):
    root, env = project
    from prefect.server.api.server import SubprocessASGIServer

    # change a param so both stages run again, under one Prefect API the test can read afterwards
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["prepare"]["seed"] = 1
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    server = SubprocessASGIServer()
    server.start(timeout=120)
    try:
        run_env = {**env, "PREFECT_API_URL": server.api_url}
        result = sh([str(BIN / "didpo"), "run", "--stages", ",".join(STAGES)], root, run_env)
        output = result.stdout
        flow_runs, nested = asyncio.run(_flow_runs(server.api_url))
    finally:
        server.stop()

    # quiet by default (issue 19): the empty optional human pairs (validate and mine read them), MLflow's
    # system-metrics lines, GX's temporary docs folder (validate), Prefect's docs link are not printed
    assert (root / "data/raw/human_pairs.jsonl").stat().st_size == 0
    for noise in ("is empty", "mlflow.system_metrics", "Created temporary directory", "prefect.io/docs"):
        assert noise not in result.stdout + result.stderr, noise

    assert {"pipeline", *STAGES} <= set(flow_runs.values())
    # DVC's own lines pass, its git and push hints do not (the pipeline pushes; committing is the person's)
    assert all(f"Running stage '{s}'" in output for s in STAGES), output
    assert "To track the changes with git" not in output and "dvc push" not in output, output
    done = re.search(r"pipeline: done; ran: (.*); up to date: (.*)\. See", output)
    ran, skipped = ({s for s in group.split(", ") if s != "none"} for group in done.groups())
    assert ran | skipped == set(STAGES) and not ran & skipped and "prepare" in ran, done.group(0)
    assert nested == {f"repro-{s}": s for s in STAGES}  # every stage's flow run is a subflow of its pipeline task
    client, runs = mlflow_runs(root)
    parents = [r for r in runs if r.data.tags["didpo.stage"] == "pipeline"]
    assert len(parents) == 1
    # the pipeline run holds the run's result: every stage's headline figures, and which stages ran
    prepare = json.loads((root / "data/prepared/headline.json").read_text())
    assert parents[0].data.metrics["prepare/problems"] == prepare["problems"]
    metrics = headline_metrics(STAGES, root)
    assert parents[0].data.metrics == metrics and len(metrics) == 3  # prepare, validate, mine (simulate_logs: none)
    assert sorted(parents[0].data.params["stages"].split(",")) == STAGES and "prepare" in parents[0].data.params["ran"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert sorted(r.data.tags["didpo.stage"] for r in children) == STAGES
    assert all(r.info.status == "FINISHED" for r in children)
    validate_run = next(r for r in children if r.data.tags["didpo.stage"] == "validate")
    assert validate_run.data.params["validate.check_solutions"] == "True"
    assert validate_run.inputs.dataset_inputs, "the input data version is logged as a dataset input"
    assert any(a.path == "validation" for a in client.list_artifacts(validate_run.info.run_id))
    assert (root / ".dvc-remote").is_dir()  # outputs pushed to the default remote
    assert "up to date" in sh(["dvc", "status", *STAGES], root, env).stdout


async def _flow_runs(api_url: str) -> tuple[dict[str, str], dict[str, str]]:
    """``({flow run id: flow name}, {pipeline task run name: the flow name of the subflow run under it})``."""
    from prefect.client.orchestration import PrefectClient

    async with PrefectClient(api_url) as client:
        runs = await client.read_flow_runs()
        flows = {f.id: f.name for f in await client.read_flows()}
        pipeline_run = next(r for r in runs if flows[r.flow_id] == "pipeline")
        tasks = {t.id: t.name for t in await client.read_task_runs() if t.flow_run_id == pipeline_run.id}
    nested = {tasks[r.parent_task_run_id]: flows[r.flow_id] for r in runs if r.parent_task_run_id in tasks}
    return {str(r.id): flows[r.flow_id] for r in runs}, nested


def test_model_stages_on_a_tiny_model(project):
    """base_model → baseline through `dvc repro`: a checkpoint saved, answers sampled, verified, pass@k logged."""
    root, env = project
    sh(["dvc", "repro", "baseline"], root, env)
    assert (root / "data/checkpoints/base/config.json").exists()
    metrics = json.loads((root / "data/baseline/metrics.json").read_text())
    for split in ("val", "humaneval"):
        m = metrics[split]
        assert m["n_problems"] == 2 and m["n_samples"] == 2
        assert 0.0 <= m["pass@1"] <= m["pass@2"] <= 1.0 and 0.0 <= m["test_pass_rate"] <= 1.0
        rows = [json.loads(line) for line in (root / f"data/baseline/{split}_samples.jsonl").read_text().splitlines()]
        assert [len(r["answers"]) for r in rows] == [2, 2] and all(len(r["reasons"]) == 2 for r in rows)
    assert "up to date" in sh(["dvc", "status", "baseline"], root, env).stdout
    _, runs = mlflow_runs(root)
    baseline = [r for r in runs if r.data.tags["didpo.stage"] == "baseline"]
    assert len(baseline) == 1 and baseline[0].info.status == "FINISHED"
    assert "baseline/val/pass_at_2" in baseline[0].data.metrics


def test_impossible_gate_stops_the_pipeline(project):
    """sft → gate on the tiny model with threshold 1.0 (pass@k > 1 is impossible): `didpo run` exits non-zero with
    the gate's message, the gate's metrics say why, MLflow marks the run, and no later stage runs."""
    root, env = project
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["sft"].update(
        max_steps=2, batch_size=2, grad_accum_steps=1, eval_every=1, checkpoint_every=1, max_seq_len=2048
    )
    params["gate"].update(
        n_samples=2,
        k=2,
        val_problems=2,
        max_new_tokens=16,
        temperature=1.0,
        top_p=1.0,
        threshold=1.0,
        external_problems=3,
    )
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    result = sh([str(BIN / "didpo"), "run", "--no-push"], root, env, check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "gate failed: pass@2 = " in result.stderr and "<= threshold 1.00" in result.stderr
    assert "pipeline stopped: stage 'gate' failed" in result.stderr

    sft = json.loads((root / "data/sft/metrics.json").read_text())
    assert sft["global_step"] == 2 and len(sft["merged_sha256"]) == 64
    assert (root / "data/checkpoints/sft/adapter/adapter_config.json").exists()
    gate = json.loads((root / "data/gate/metrics.json").read_text())
    assert gate["passed"] is False and gate["threshold"] == 1.0 and gate["n_problems"] == 2
    external = gate["external"]  # the external guard is reported even when the gate fails
    assert external["n_problems"] == 3 and 0.0 <= external["base_pass@1"] <= 1.0
    assert external["delta"] == pytest.approx(external["pass@1"] - external["base_pass@1"])
    for name in ("base", "sft"):
        rows = [json.loads(line) for line in (root / f"data/gate/external_{name}.jsonl").read_text().splitlines()]
        assert [r["task_id"] for r in rows] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
        assert all(len(r["answers"]) == 1 for r in rows)  # one greedy answer each
    _, runs = mlflow_runs(root)
    gate_runs = [r for r in runs if r.data.tags["didpo.stage"] == "gate"]
    assert [r.data.tags["gate"] for r in gate_runs] == ["failed"]
    later = {"selfplay", "dpo", "didpo", "evaluate", "register"}
    assert not later & {r.data.tags["didpo.stage"] for r in runs}, "no stage after the gate may run"


def test_stages_after_the_gate_on_a_tiny_model(project):
    """selfplay → dpo → didpo → evaluate → register through `didpo run --stages` on the tiny model (its gate failed
    above, so these stages are run by name: the wiring, outputs, MLflow runs and the registry are what is checked)."""
    root, env = project
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["selfplay"].update(n_prompts=2, k=2, max_new_tokens=16, temperature=1.0, top_p=1.0)
    params["dpo"].update(
        max_steps=2,
        batch_size=2,
        max_pairs=8,
        eval_every=1,
        checkpoint_every=1,
        val_problems=2,
        max_new_tokens=16,
        max_seq_len=2048,
    )
    # RL's budget must cover the SFT answers' p90 in the tiny tokenizer's tokens (669, longest 770, on the bundled
    # problems); the random model passes nothing, so no screen (an empty pool) and the group's own control
    params["didpo"].update(
        steps=2, prompts_per_step=2, group_size=2, max_new_tokens=800, minibatch_size=2, screen_samples=0
    )
    params["didpo"]["reward"].update(overlong_max=0, overlong_cache=0, control="group")
    params["evaluate"].update(
        val_per_family=1,
        heldout_per_family=1,
        n_samples=2,
        test_problems=1,
        humaneval_problems=1,
        max_new_tokens=8,
        process_problems=1,
        process_prefixes=1,
        consistency_samples=2,
        recovery_samples=1,
    )
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    later = ["selfplay", "dpo", "didpo", "evaluate", "register"]
    result = sh([str(BIN / "didpo"), "run", "--no-push", "--stages", ",".join(later)], root, env)
    # evaluate says which checkpoint it measures (its sampling bars do not)
    logged = re.findall(r"checkpoint \d/\d: (\w+) \(", result.stdout + result.stderr)
    assert logged[:4] == ["base", "sft", "dpo", "didpo"], logged
    assert "pipeline: done; ran: selfplay, dpo, didpo, evaluate, register; up to date: none." in result.stdout
    # and the run ends with its result and decision (`flows.cli.result_lines`)
    assert re.search(r"result: val pass@1: base \d\.\d{3}, sft \d\.\d{3}, dpo \d\.\d{3}, didpo", result.stdout)
    assert re.search(r"decision: \S+ version \d+ \(\w+ against \w+\): (promoted|not promoted)", result.stdout)

    sft_sha = json.loads((root / "data/sft/metrics.json").read_text())["merged_sha256"]
    dpo = json.loads((root / "data/dpo/metrics.json").read_text())
    assert dpo["reference_sha256"] == sft_sha and dpo["reference_hash_origin"] == "sft_metrics"
    assert dpo["global_step"] == 2 and dpo["n_train_pairs"] >= 2
    rl = json.loads((root / "data/didpo/metrics.json").read_text())
    rollouts = (root / "data/didpo/rollouts.jsonl").read_text().splitlines()
    assert len(rollouts) == 2 * 2 * 2  # steps × prompts × group size
    assert (root / "data/checkpoints/didpo/merged/config.json").exists() and rl
    evaluation = json.loads((root / "data/evaluate/metrics.json").read_text())
    assert {"base", "sft", "dpo", "didpo"} <= set(json.dumps(evaluation).replace('"', " ").split())
    assert (root / "data/evaluate/figures/passk.png").stat().st_size > 0
    protocol = json.loads((root / "data/evaluate/protocol.json").read_text())
    assert protocol["greedy_splits"] == ["humaneval"]
    assert evaluation["base"]["humaneval"]["n_samples"] == 1 and evaluation["base"]["humaneval"]["greedy"]
    val = protocol["splits"]["val"]  # one problem per family, none of the first 2 (gate, dpo, baseline use them)
    first_val = [json.loads(line)["task_id"] for line in (root / "data/validated/problems.jsonl").open()
                 if json.loads(line)["split"] == "val"][:2]  # fmt: skip
    assert val and not set(val) & set(first_val)
    assert len({protocol["families"][t] for t in val}) == len(val)
    heldout = protocol["splits"]["heldout"]  # one problem of each held-out family, none of them trained or in val
    assert sorted(protocol["families"][t] for t in heldout) == sorted(params["prepare"]["heldout_families"])
    assert evaluation["sft"]["heldout"]["n_problems"] == len(heldout) == 2
    per_problem = json.loads((root / "data/evaluate/per_problem.json").read_text())
    assert per_problem["protocol"] == protocol["id"] and per_problem["champion_version"] is None
    assert set(per_problem["checkpoints"]) == {"base", "sft", "dpo", "didpo"}
    claim = json.loads((root / "data/evaluate/rl_claim.json").read_text())  # RL against the DPO checkpoint
    assert (claim["start_checkpoint"], claim["n_problems"], claim["samples_per_problem"]) == ("dpo", len(val), 2)
    assert claim["verdict"] == "no change detected" and claim["protocol"] == protocol["id"]  # both solve nothing
    decision = json.loads((root / "data/register/decision.json").read_text())
    # the tiny random models solve nothing: every candidate ties with the base model, the earliest (sft) is the
    # candidate, the test finds no gain, and no champion is made
    assert (decision["checkpoint"], decision["incumbent"], decision["promoted"]) == ("sft", "base", False)
    assert decision["test"]["p_value"] == 1.0 and decision["test"]["n"] == len(val)
    assert decision["protocol"] == protocol["id"]
    _, runs = mlflow_runs(root)
    finished = {r.data.tags["didpo.stage"] for r in runs if r.info.status == "FINISHED"}
    assert set(later) <= finished
    # `dvc metrics show`: a row per stage's headline and per measured checkpoint, a table a terminal can hold
    # (issue 19: 697 columns; then 115 columns and 4,280 characters a line)
    table = sh(["dvc", "metrics", "show"], root, env).stdout.splitlines()
    rows = {line.split()[0] for line in table[1:]}
    assert {f"data/evaluate/headline/{c}.json" for c in ("base", "sft", "dpo", "didpo")} | {
        "data/sft/headline.json",
        "data/register/headline.json",
    } <= rows, rows
    assert "val.pass@1" in table[0].split() and max(map(len, table)) < 240, table

    # a DPO param changes: dpo is stale (what follows re-runs when its outputs change), nothing before it is
    # (the gate never passed in this project, so DVC keeps it stale too)
    params["dpo"]["beta"] = 0.2
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    stale = set(json.loads(sh(["dvc", "status", "--json"], root, env).stdout))
    assert stale == {"gate", "dpo"}, stale


def _flow_run_states(root: Path, after: set[str] = frozenset()) -> list[tuple[str, str]]:
    """(flow name, state type) of every flow run in the project's Prefect database (`didpo run`'s own server) whose
    id is not in `after` (`_flow_run_ids` taken earlier), in the order they were created."""
    import sqlite3

    with sqlite3.connect(root / ".prefect" / "prefect.db") as db:
        rows = db.execute(
            "SELECT flow_run.id, flow.name, flow_run.state_type FROM flow_run JOIN flow ON flow.id = flow_run.flow_id"
            " ORDER BY flow_run.created"
        )
        return [(name, str(state)) for run_id, name, state in rows if run_id not in after]


def _flow_run_ids(root: Path) -> set[str]:
    import sqlite3

    if not (root / ".prefect" / "prefect.db").is_file():
        return set()
    with sqlite3.connect(root / ".prefect" / "prefect.db") as db:
        return {run_id for (run_id,) in db.execute("SELECT id FROM flow_run")}


@pytest.mark.slow
@pytest.mark.parametrize("interrupt", ["ctrl-c", "sigterm-in-background"])
def test_ctrl_c_stops_the_run_cleanly_and_a_rerun_resumes(project, tmp_path, interrupt):
    """A Ctrl-C (SIGINT to `didpo run`'s process group, as a terminal sends it) during SFT: the run stops within
    seconds with no retry storm against a dead API, the flow runs end crashed (none left Running), DVC's lock is
    released, and the next `didpo run` skips the finished stages and resumes SFT from its last checkpoint.

    The same for a SIGTERM (``kill``, a scheduler) to a run started as a background job of a script, which runs with
    SIGINT ignored and passes that on to its children: the stop it sends the stage must not be ignored."""
    import signal
    import time

    root, env = project
    params = yaml.safe_load((root / "params.yaml").read_text())
    earlier_runs = run_ids(root)
    earlier_flow_runs = _flow_run_ids(root)
    total = 300 if interrupt == "ctrl-c" else 310  # another SFT config: the first case's finished SFT is not reused
    params["sft"].update(
        max_steps=total, batch_size=2, grad_accum_steps=1, eval_every=0, checkpoint_every=10, max_seq_len=2048
    )
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    stages = "base_model,prepare,simulate_logs,validate,sft"
    command = [str(BIN / "didpo"), "run", "--no-push", "--stages", stages]
    log = tmp_path / "interrupted.log"
    background = signal.SIG_IGN
    checkpoints = root / "data/checkpoints/sft/checkpoints"
    shutil.rmtree(checkpoints, ignore_errors=True)  # an earlier test's SFT checkpoint would end the wait below at once
    with log.open("w") as out:
        proc = subprocess.Popen(
            command,
            cwd=root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            # as a terminal's foreground job: a test suite started in the background (`make test &`) runs with
            # SIGINT ignored, which every child inherits and Python then keeps; as a background job: ignored
            preexec_fn=lambda: signal.signal(signal.SIGINT, background if interrupt != "ctrl-c" else signal.SIG_DFL),
        )
        deadline = time.monotonic() + 600
        while not list(checkpoints.glob("checkpoint-*")):  # SFT has trained and saved at least once
            assert proc.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, "SFT never wrote a checkpoint"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT if interrupt == "ctrl-c" else signal.SIGTERM)
        interrupted = time.monotonic()
        returncode = proc.wait(timeout=120)
    stopped_in = time.monotonic() - interrupted
    text = log.read_text()
    assert returncode == 130, text[-4000:]
    assert stopped_in < 60, f"took {stopped_in:.0f} s to stop"
    assert "pipeline interrupted" in text
    assert "ConnectError" not in text and "All connection attempts failed" not in text
    states = _flow_run_states(root, after=earlier_flow_runs)  # this run's: earlier tests' runs finished
    assert not [s for s in _flow_run_states(root) if s[1] in ("RUNNING", "PENDING")], states
    # the log tail says what the stage did when it did not end crashed
    assert ("sft", "CRASHED") in states and ("pipeline", "CRASHED") in states, (states, text[-6000:])
    assert "sft" in sh(["dvc", "status", "sft"], root, env).stdout  # answers at once: no lock left behind
    step = max(int(p.name.split("-")[1]) for p in checkpoints.glob("checkpoint-*"))
    assert 0 < step < total

    rerun = sh(command, root, env)
    output = rerun.stdout + rerun.stderr
    assert "Stage 'prepare' didn't change, skipping" in output
    checkpoint = f"data/checkpoints/sft/checkpoints/checkpoint-{step:08d}"
    assert f"sft: resumed from {checkpoint} (step {step} of {total})" in output
    assert json.loads((root / "data/sft/metrics.json").read_text())["global_step"] == total
    _, runs = mlflow_runs(root)
    resumed = [r for r in runs if r.data.tags.get("didpo.resumed") == "true" and r.info.run_id not in earlier_runs]
    assert [(r.data.tags["didpo.stage"], r.info.status) for r in resumed] == [("sft", "FINISHED")]  # one, continued


@pytest.mark.slow
def test_a_training_stage_under_accelerate_launch_ends_where_one_process_does(project):
    """`didpo stage sft` with ``launch.num_processes: 2`` (two gloo processes under `accelerate launch`, 1 example
    per process and micro-batch) writes the adapter a one-process run with 2 examples per micro-batch writes, within
    float32 summation order (tolerance as tests/test_distributed.py); rank 0 alone writes the outputs and the MLflow
    run."""
    from safetensors.torch import load_file

    root, env = project
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["sft"].update(
        max_steps=2, grad_accum_steps=2, eval_every=1, checkpoint_every=1, max_seq_len=2048, mixed_precision="no"
    )
    adapters = {}
    for processes, batch in ((1, 2), (2, 1)):
        params["sft"]["batch_size"] = batch
        params["launch"] = {"num_processes": processes}
        (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        before = len(mlflow_runs(root)[1])
        result = sh([str(BIN / "didpo"), "stage", "sft"], root, env)
        adapters[processes] = load_file(root / "data/checkpoints/sft/adapter/adapter_model.safetensors")
        runs = mlflow_runs(root)[1]
        assert len(runs) == before + 1, result.stdout + result.stderr  # one MLflow run, rank 0's
        assert json.loads((root / "data/sft/metrics.json").read_text())["global_step"] == 2
    one, two = adapters[1], adapters[2]
    assert one.keys() == two.keys() and max(v.abs().max().item() for k, v in one.items() if "lora_B" in k) > 1e-4
    for key, a in one.items():
        assert (a - two[key]).abs().max().item() <= 1e-5 * a.abs().max().item() + 1e-6, key
