"""A person's own data is checked before any work and fails loud (issue 44, item 3): every file params.yaml names
exists and parses before the first stage starts, the error naming the key and the path; a split with no problem and
an empty RL prompt pool stop their stage with one line naming the knob."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from flows.cli import app
from tasks.config import InputError, parse_params
from tasks.inputs import check_inputs, configured_inputs

runner = CliRunner()
PRODUCED = {"data/simulated/feedback_logs.jsonl": "simulate_logs"}


def params_with(tmp_path, **sections):
    """Params whose validate paths are existing empty files under `tmp_path`, with `sections` on top."""
    (tmp_path / "logs.jsonl").write_text("")
    (tmp_path / "pairs.jsonl").write_text("")
    raw = {"validate": {"feedback_logs": str(tmp_path / "logs.jsonl"), "human_pairs": str(tmp_path / "pairs.jsonl")}}
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    return parse_params(raw)


def test_every_configurable_input_is_listed_with_its_key_and_stage(tmp_path):
    params = params_with(
        tmp_path,
        base_model={"name_or_path": str(tmp_path / "model")},
        prepare={"user_problems": ["a.jsonl", "b.jsonl"]},
    )
    listed = [(i.key, i.path, i.stage, i.kind) for i in configured_inputs(params)]
    assert listed == [
        ("base_model.name_or_path", str(tmp_path / "model"), "base_model", "model"),
        ("prepare.user_problems[0]", "a.jsonl", "prepare", "jsonl"),
        ("prepare.user_problems[1]", "b.jsonl", "prepare", "jsonl"),
        ("validate.feedback_logs", str(tmp_path / "logs.jsonl"), "validate", "jsonl"),
        ("validate.human_pairs", str(tmp_path / "pairs.jsonl"), "validate", "jsonl"),
    ]


def test_a_missing_file_is_one_line_naming_the_key_and_the_path(tmp_path):
    params = params_with(tmp_path, validate={"feedback_logs": str(tmp_path / "my_logs.jsonl")})
    with pytest.raises(InputError) as info:
        check_inputs(params, ["validate"], PRODUCED)
    assert str(info.value) == f"params.yaml: validate.feedback_logs: {tmp_path / 'my_logs.jsonl'} does not exist"
    # only the stages asked about: prepare reads no feedback logs
    assert [i.key for i in check_inputs(params, ["prepare"], PRODUCED)] == []


def test_every_problem_is_reported_at_once(tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "table.csv").write_text("event_id,rating\ne1,up\n")
    (tmp_path / "array.json").write_text('[{"event_id": "e1"}]\n')
    params = params_with(
        tmp_path,
        prepare={"user_problems": [str(tmp_path / "folder"), str(tmp_path / "array.json")]},
        validate={"feedback_logs": str(tmp_path / "table.csv"), "human_pairs": str(tmp_path / "none.jsonl")},
    )
    with pytest.raises(InputError) as info:
        check_inputs(params, None, PRODUCED)
    assert str(info.value).splitlines() == [
        f"params.yaml: prepare.user_problems[0]: {tmp_path / 'folder'} is a folder, not a file",
        f"params.yaml: prepare.user_problems[1]: {tmp_path / 'array.json'} is not JSON Lines (no line is a JSON "
        "object; line 1: not a JSON object (got a JSON array))",
        f"params.yaml: validate.feedback_logs: {tmp_path / 'table.csv'} is not JSON Lines (no line is a JSON object; "
        "line 1: invalid JSON: Expecting value at column 1)",
        f"params.yaml: validate.human_pairs: {tmp_path / 'none.jsonl'} does not exist",
    ]


def test_bad_rows_and_empty_files_are_the_quarantines_business_not_an_input_error(tmp_path):
    """A file that parses as JSON Lines passes even with bad rows (validate quarantines them one by one), and so
    does an empty one (the optional human pairs are empty by default)."""
    logs = tmp_path / "logs.jsonl"
    logs.write_text('{broken\n\n{"event_id": "e1"}\n[1]\n')
    params = params_with(tmp_path, validate={"feedback_logs": str(logs)})
    checked = check_inputs(params, ["validate"], PRODUCED)
    assert [(i.key, i.path) for i in checked] == [
        ("validate.feedback_logs", str(logs)),
        ("validate.human_pairs", str(tmp_path / "pairs.jsonl")),
    ]


def test_a_path_an_earlier_stage_writes(tmp_path):
    """The simulated logs are not checked when simulate_logs runs before validate; run alone, validate names the
    stage that writes them."""
    params = params_with(tmp_path, validate={"feedback_logs": "data/simulated/feedback_logs.jsonl"})
    produced = {"data/simulated/feedback_logs.jsonl": "simulate_logs"}
    assert [i.key for i in check_inputs(params, ["simulate_logs", "validate"], produced)] == ["validate.human_pairs"]
    assert [i.key for i in check_inputs(params, None, produced)] == ["validate.human_pairs"]


def test_a_path_an_earlier_stage_writes_run_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    params = params_with(tmp_path, validate={"feedback_logs": "data/simulated/feedback_logs.jsonl"})
    with pytest.raises(InputError) as info:
        check_inputs(params, ["validate"], {"data/simulated/feedback_logs.jsonl": "simulate_logs"})
    assert str(info.value) == (
        "params.yaml: validate.feedback_logs: data/simulated/feedback_logs.jsonl does not exist (the simulate_logs "
        "stage writes it: run that stage first)"
    )


def test_base_model_folder_and_hub_id(tmp_path, monkeypatch):
    model = tmp_path / "model"
    for value, expected in [
        (str(tmp_path / "nope"), "does not exist (a local Hugging Face model folder, or a hub id such as owner/name)"),
        ("./my-model", "does not exist (a local Hugging Face model folder, or a hub id such as owner/name)"),
        (str(tmp_path / "logs.jsonl"), "is a file, not a Hugging Face model folder"),
        (str(tmp_path), "is a folder without config.json (not a Hugging Face model folder)"),
    ]:
        params = params_with(tmp_path, base_model={"name_or_path": value})
        with pytest.raises(InputError) as info:
            check_inputs(params, ["base_model"])
        assert str(info.value) == f"params.yaml: base_model.name_or_path: {value} {expected}", value
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"')
    params = params_with(tmp_path, base_model={"name_or_path": str(model)})
    with pytest.raises(InputError, match=r"base_model.name_or_path: .*/model has a config.json that is not JSON"):
        check_inputs(params, ["base_model"])
    (model / "config.json").write_text('{"model_type": "llama"}')
    assert [i.key for i in check_inputs(params, ["base_model"])] == ["base_model.name_or_path"]
    # a hub id is looked up in the local cache only while the hub is offline (no network here)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    params = params_with(tmp_path, base_model={"name_or_path": "someone/some-model"})
    with pytest.raises(InputError, match=r"someone/some-model is neither a local folder nor a model in the Hugging"):
        check_inputs(params, ["base_model"])
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert [i.key for i in check_inputs(params, ["base_model"])] == ["base_model.name_or_path"]


def test_launch_config_file_must_be_yaml_once_for_the_three_training_stages(tmp_path):
    config = tmp_path / "accelerate.yaml"
    config.write_text("distributed_type: [FSDP\n")
    params = params_with(tmp_path, launch={"config_file": str(config)})
    with pytest.raises(InputError) as info:
        check_inputs(params, ["sft", "dpo", "didpo"])
    assert str(info.value).startswith(f"params.yaml: launch.config_file: {config} is not valid YAML (")
    assert len(str(info.value).splitlines()) == 1


# --------------------------------------------------------------------------------------------- the command line


def test_didpo_stage_and_run_stop_before_any_work_naming_the_key(tmp_path):
    """`didpo stage validate` and `didpo run` with a feedback-log path that does not exist: exit 2 with one line
    naming the key and the path, before any flow, server or solution check starts (the issue's trial: 46 s, 93
    lines, two tracebacks)."""
    params = tmp_path / "params.yaml"
    params.write_text(f"validate:\n  feedback_logs: {tmp_path / 'my_logs.jsonl'}\n")
    result = runner.invoke(app, ["stage", "validate", "--params", str(params)])
    assert result.exit_code == 2
    assert result.output.strip() == f"{params}: validate.feedback_logs: {tmp_path / 'my_logs.jsonl'} does not exist"


def test_didpo_run_checks_the_params_yaml_of_the_project(tmp_path, monkeypatch):
    """`didpo run` reads ./params.yaml (what DVC tracks), checked for every stage it will run."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    shutil.copy(root / "dvc.yaml", tmp_path / "dvc.yaml")
    subprocess.run([sys.executable, "-m", "flows.dvc_cli", "init", "-q", "--no-scm"], cwd=tmp_path, check=True)
    params = (root / "params.yaml").read_text()
    assert "human_pairs: data/raw/human_pairs.jsonl" in params
    (tmp_path / "params.yaml").write_text(params.replace("data/raw/human_pairs.jsonl", "data/raw/gone.jsonl"))
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["run", "--no-push"])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == "params.yaml: validate.human_pairs: data/raw/gone.jsonl does not exist"


# ----------------------------------------------------------------------------- nothing to work on, at stage time


def test_an_empty_split_names_what_fills_it(tmp_path):
    from tasks.io import read_problems

    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps({"task_id": f"t{i}", "split": "train"}) + "\n" for i in range(3)))
    assert read_problems(path, "val") == []  # not required: an empty list, as before
    assert len(read_problems(path, "train", required=True)) == 3
    with pytest.raises(InputError) as info:
        read_problems(path, "val", 30, required=True)
    assert str(info.value) == (
        f"{path} has no 'val' problem: the split is filled by prepare.val_frac (and user problems with split val); "
        "rows the validate stage quarantined are in data/validated/report.md"
    )


def test_an_empty_prompt_pool_is_an_input_error_with_the_screens_message(tmp_path, monkeypatch):
    """models.rl's screen raises ValueError for an empty pool (its message names didpo.screen_problems); the RL
    stage's task turns exactly that one into an InputError (one line, no traceback) and lets others through."""
    import tasks.didpo
    from models.config import RLConfig
    from models.rl import screen_prompt_pool

    def empty_screen(attempt):
        return screen_prompt_pool(None, None, [], RLConfig(), None)  # no problem screened: none informative

    monkeypatch.setattr(tasks.didpo, "resume_or_start_over", empty_screen)
    args = (tmp_path, "float32", [], RLConfig(), None, tmp_path / "out", tmp_path / "r.jsonl", tmp_path / "p.json")
    with pytest.raises(InputError) as info:
        tasks.didpo.run_didpo.fn(*args)
    assert str(info.value).startswith("the RL prompt pool is empty: no informative problem: each of the 0 screened")
    assert "didpo.screen_problems" in str(info.value)

    def other_error(attempt):
        raise ValueError("didpo.max_new_tokens 10 is below the SFT answers' p90")

    monkeypatch.setattr(tasks.didpo, "resume_or_start_over", other_error)
    with pytest.raises(ValueError, match="max_new_tokens") as info:
        tasks.didpo.run_didpo.fn(*args)
    assert not isinstance(info.value, InputError)


# -------------------------------------------------------------------------- what a person sees: the real console


@pytest.fixture(scope="module")
def own_data_project(tmp_path_factory):
    """A scratch DVC project holding a person's own data: 200 simulated feedback events plus 8 malformed rows (208,
    the issue's trial), 20 tiny problems, the repository's dvc.yaml and params.yaml (reference solutions not run: a
    sandbox run per problem is not what is tested here), and one Prefect API shared by the stage runs."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import yaml
    from prefect.server.api.server import SubprocessASGIServer

    from datalib.simulate_logs import simulate_logs
    from tasks.io import write_frame
    from tests.test_simulate_logs import PROBLEMS, exec_check
    from tests.test_validate import log_event, problem

    repo = Path(__file__).resolve().parents[1]
    root = tmp_path_factory.mktemp("own_data")
    shutil.copy(repo / "dvc.yaml", root / "dvc.yaml")
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["validate"]["check_solutions"] = False
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (root / "data/prepared").mkdir(parents=True)
    (root / "data/raw").mkdir()
    (root / "data/raw/human_pairs.jsonl").write_text("")
    rows = [problem(f"P/{i}", "train" if i < 14 else "val") for i in range(20)]
    (root / "data/prepared/problems.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    events, _ = simulate_logs(PROBLEMS, n_events=200, n_users=100, seed=0, check=exec_check)
    logs = root / "data/simulated/feedback_logs.jsonl"
    write_frame.fn(events, logs)
    bad = [json.dumps(log_event(900 + i, rating="meh")) for i in range(4)]
    bad += [json.dumps(log_event(910, ts="yesterday")), json.dumps(log_event(911, ts="2024-02-30T10:00:00"))]
    with logs.open("a") as f:
        f.write("\n".join([*bad, "{not json", "[1, 2]"]) + "\n")
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(repo)}
    env["PREFECT_HOME"] = str(root / ".prefect")
    for key in ("MLFLOW_TRACKING_URI", "DIDPO_PARENT_RUN_ID", "DIDPO_PARENT_TASK_RUN"):
        env.pop(key, None)
    subprocess.run([sys.executable, "-m", "flows.dvc_cli", "init", "-q", "--no-scm"], cwd=root, env=env, check=True)
    server = SubprocessASGIServer()
    server.start(timeout=180)
    env["PREFECT_API_URL"] = server.api_url

    def didpo(*args):
        done = subprocess.run([str(bin_dir / "didpo"), *args], cwd=root, env=env, capture_output=True, text=True)
        return done.returncode, done.stdout + done.stderr

    try:
        yield root, didpo
    finally:
        server.stop()


def test_the_console_summarises_the_quarantine_and_warns_of_zero_pairs(own_data_project):
    """`didpo stage validate` then `didpo stage mine` on the person's 208 rows: the console shows the quarantine
    (8 rows, top reasons with counts, where the rows and the report are), and mining's 0 pairs is a warning with the
    reasons' counts (those of report.json) and the keys to turn; both stages exit 0."""
    root, didpo = own_data_project
    code, output = didpo("stage", "validate")
    assert code == 0, output
    assert (
        "WARNING | Flow run '" in output
        and "feedback_logs: 8 of 208 rows quarantined (3.85%; the stage fails above validate.max_bad_row_rate_logs = "
        "5.00%); top reasons: rating_in_set 4, ts_iso8601 2, valid_json 1 (+1 more); rows with their reasons: "
        "data/validated/quarantine/feedback_logs.jsonl; report: data/validated/report.md"
        in output
    ), output
    assert len((root / "data/validated/quarantine/feedback_logs.jsonl").read_text().splitlines()) == 8

    code, output = didpo("stage", "mine")
    assert code == 0, output
    report = json.loads((root / "data/mined/report.json").read_text())
    users = report["users"]
    assert report["pairs_kept"] == 0 and users["constant"] > 0 and users["too_few_ratings"] > 0
    assert (
        f"mine kept 0 pairs from 200 events ({report['events_used']} used after 0 invalid rows and "
        f"{report['double_clicks_dropped']} double clicks); of {users['total']} users 0 kept, {users['constant']} "
        f"constant raters (always up or always down: no signal), {users['too_few_ratings']} with too few ratings"
    ) in output, output
    assert "to get pairs: lower mine.min_ratings_per_user or mine.min_consensus_raters" in output
    assert "(counts: data/mined/report.json)" in output and "WARNING" in output


def test_a_bad_row_rate_over_its_threshold_is_one_message_naming_its_key(own_data_project):
    """The issue's trial printed the failure 4 times (Prefect's exception line, its traceback, its final state,
    the command's error) without naming validate.max_bad_row_rate_logs: now the key once, and no traceback."""
    import yaml

    root, didpo = own_data_project
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["validate"]["max_bad_row_rate_logs"] = 0.01
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    code, output = didpo("stage", "validate")
    assert code == 1, output
    assert "Traceback" not in output and output.count("validate.max_bad_row_rate_logs") == 1, output
    assert output.count("bad-row rate 3.85% (8 of 208 rows quarantined)") == 1
    assert (
        "stage 'validate' failed: validation failed for 1 of 3 dataset(s): feedback_logs\n  feedback_logs "
        "(data/simulated/feedback_logs.jsonl):\n    - bad-row rate 3.85% (8 of 208 rows quarantined) exceeds the "
        "threshold 1.00%: fix the rows, or raise validate.max_bad_row_rate_logs in params.yaml" in output
    )
    assert "Finished in state Failed('validation failed for 1 of 3 dataset(s): feedback_logs')" in output


def test_dpo_without_a_pair_to_train_on_says_where_pairs_come_from(tmp_path):
    from models.config import DPOConfig
    from tasks.dpo import training_pairs

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("")
    with pytest.raises(InputError) as info:
        training_pairs(pairs, DPOConfig())
    assert str(info.value) == (
        f"{pairs} leaves no pair to train DPO on (0 pairs, 0 held out by dpo.held_out_frac): the mine and selfplay "
        "stages' warnings say why each made none (mine.* keys; selfplay.n_prompts, selfplay.k)"
    )
    row = {"prompt": "p", "chosen": "a", "rejected": "b", "source": "selfplay"}
    pairs.write_text(json.dumps(row) + "\n")
    assert training_pairs(pairs, DPOConfig(held_out_frac=0.0)) == ([row], [])
