"""params.yaml → dataclasses: errors name the key and the allowed values; the repo's params.yaml is valid."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tasks.config import ConfigError, InputError, Params, load_params, parse_params
from tests.test_stage_graph import project_imports, project_modules

ROOT = Path(__file__).resolve().parents[1]


def test_repo_params_yaml_is_valid_and_complete():
    params = load_params(ROOT / "params.yaml")
    assert isinstance(params, Params)
    # every section of the dataclass is written out in params.yaml, so users see every knob
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    for section in dataclasses.fields(Params):
        assert section.name in raw, section.name
        assert set(raw[section.name]) == {f.name for f in dataclasses.fields(getattr(params, section.name))}


def test_sections_are_frozen():
    params = parse_params({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.prepare.seed = 3  # type: ignore[misc]


def test_values_are_loaded():
    params = parse_params({"prepare": {"seed": 7, "n_problems": 200, "user_problems": ["a.jsonl"]}})
    assert params.prepare.seed == 7
    assert params.prepare.n_problems == 200
    assert params.prepare.user_problems == ("a.jsonl",)
    assert params.validate.max_bad_row_rate_problems == 0.01  # untouched sections keep defaults


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"prepare": {"bogus": 1}}, "prepare.bogus: unknown key; allowed keys: seed, n_problems"),
        ({"nosuchsection": {}}, "nosuchsection: unknown key; allowed keys: base_model, prepare"),
        ({"prepare": {"n_problems": 5}}, "prepare.n_problems must be >= 100, got 5"),
        ({"prepare": {"val_frac": "a lot"}}, "prepare.val_frac: Input should be a valid number"),
        (
            {"base_model": {"dtype": "int8"}},
            "base_model.dtype must be one of ('auto', 'float32', 'bfloat16', 'float16'), got 'int8'",
        ),
        ({"verifier": {"timeout_s": 0}}, "verifier.timeout_s must be > 0, got 0"),
        ({"mine": {"alpha": 1.5}}, "mine.alpha must be in (0, 1), got 1.5"),
        ({"gate": {"engine": "ct2"}}, "gate.engine must be one of ('openvino', 'torch', 'vllm'), got 'ct2'"),
        ({"launch": {"config_file": "no/such.yaml"}}, "launch.config_file 'no/such.yaml' is not a file"),
    ],
)
def test_errors_name_the_key_and_allowed_values(raw, expected):
    with pytest.raises(ConfigError) as info:
        parse_params(raw, "params.yaml")
    assert expected in str(info.value)


def test_several_errors_reported_at_once():
    """Every section's error at once (within a section: a type error, else its first failed range check)."""
    with pytest.raises(ConfigError) as info:
        parse_params({"prepare": {"seed": "x"}, "verifier": {"timeout_s": 0}, "sft": {"lora_r": 0}})
    msg = str(info.value)
    assert "prepare.seed: Input should be a valid integer" in msg
    assert "verifier.timeout_s must be > 0" in msg and "sft.lora_r must be >= 1, got 0" in msg


def test_malformed_yaml_and_non_mapping(tmp_path):
    bad = tmp_path / "params.yaml"
    bad.write_text("prepare: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_params(bad)
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_params(bad)


def test_unknown_nested_key_names_the_nested_section():
    with pytest.raises(ConfigError, match=r"didpo\.reward\.bogus: unknown key; allowed keys: w_syntax, "):
        parse_params({"didpo": {"reward": {"bogus": 1}}})


# ------------------------------------------------------------ settings that cannot work fail at load (issue 15)


@pytest.mark.parametrize(
    ("didpo", "expected"),
    [
        ({"group_size": 400000}, "didpo.group_size must be <= 256, got 400000"),
        ({"prompts_per_step": 5000}, "didpo.prompts_per_step must be <= 1024, got 5000"),
        ({"max_new_tokens": 100000}, "didpo.max_new_tokens must be <= 32768, got 100000"),
    ],
)
def test_rl_budget_upper_bounds_name_the_key(didpo, expected):
    with pytest.raises(ConfigError) as info:
        parse_params({"didpo": didpo})
    assert expected in str(info.value)


def test_overlong_penalty_must_fit_max_new_tokens():
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    # params.yaml: dapo's penalty ramps from 320 (the evaluation's budget) to 384 = max_new_tokens
    assert (raw["didpo"]["max_new_tokens"], raw["didpo"]["reward"]["overlong_max"]) == (384, 384)
    assert raw["didpo"]["reward"]["overlong_max"] - raw["didpo"]["reward"]["overlong_cache"] == 320
    # `-S didpo.max_new_tokens=352` alone: didpo does not read the penalty, so the setting is not refused ...
    raw["didpo"]["max_new_tokens"] = 352
    assert raw["didpo"]["algo"] != "dapo" and parse_params(raw).didpo.max_new_tokens == 352
    # ... dapo does: no completion can reach 384 tokens, -1 is never given
    raw["didpo"]["algo"] = "dapo"
    with pytest.raises(ConfigError) as info:
        parse_params(raw)
    assert "didpo.reward.overlong_max (384) must be <= didpo.max_new_tokens (352)" in str(info.value)
    raw["didpo"]["reward"].update(overlong_max=352, overlong_cache=32)  # ramp 320 → 352: coherent again
    assert parse_params(raw).didpo.reward.overlong_max == 352
    # a hard cut (cache 0) at max_new_tokens would punish nothing: only lengths > overlong_max are punished
    raw["didpo"]["reward"]["overlong_cache"] = 0
    with pytest.raises(ConfigError, match=r"didpo\.reward\.overlong_max \(352\) with didpo\.reward\.overlong_cache 0"):
        parse_params(raw)
    raw["didpo"]["reward"]["overlong_max"] = 340  # lengths 341..352 get -1
    assert parse_params(raw).didpo.reward.overlong_cache == 0


def test_rl_budget_must_cover_the_evaluations():
    """RL must not cut off answers the evaluation lets finish (issue 18: RL stopped at 192 tokens, evaluation at
    320): a check across the two sections, naming both keys."""
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert raw["didpo"]["max_new_tokens"] >= raw["evaluate"]["max_new_tokens"]
    raw["didpo"]["max_new_tokens"] = raw["evaluate"]["max_new_tokens"] - 1
    raw["didpo"]["reward"].update(overlong_max=0, overlong_cache=0)
    with pytest.raises(ConfigError) as info:
        parse_params(raw)
    expected = f"didpo.max_new_tokens ({raw['evaluate']['max_new_tokens'] - 1}) must be >= evaluate.max_new_tokens"
    assert expected in str(info.value)
    raw["didpo"]["max_new_tokens"] += 1
    assert parse_params(raw).didpo.max_new_tokens == raw["evaluate"]["max_new_tokens"]


def test_heldout_families_are_refused_before_a_run_unless_generated():
    """Checked before any stage starts (`tasks.inputs.check_inputs`), not at load: the configuration does not import
    the family catalogue."""
    from tasks.inputs import check_inputs

    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert parse_params(raw).prepare.heldout_families == ("parse_booleans", "group_records")
    raw["prepare"]["heldout_families"] = ["parse_booleans", "parse_bools"]
    params = parse_params(raw)
    with pytest.raises(InputError, match=r"prepare\.heldout_families: \['parse_bools'\] are not generated families"):
        check_inputs(params, ["prepare"])


# ------------------------------------------------------------ configuration is a leaf (issue 20)


def _leaves(loaded, default, prefix=""):
    """(key, params.yaml value, dataclass default) for every leaf field of two section trees."""
    for f in dataclasses.fields(loaded):
        a, b = getattr(loaded, f.name), getattr(default, f.name)
        if dataclasses.is_dataclass(a):
            yield from _leaves(a, b, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", a, b


def _yaml_keys(raw: dict, prefix: str = ""):
    """Dotted keys of a params mapping's leaves (a nested mapping such as didpo.reward is walked into; an empty one,
    dispatch.pools, is a leaf)."""
    for key, value in raw.items():
        if isinstance(value, dict) and value:
            yield from _yaml_keys(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def test_dataclass_defaults_are_params_yaml_values():
    """A section built in Python with a few fields set runs as the pipeline does: every default is params.yaml's
    (before issue 20, 29 differed, e.g. sft.learning_rate 2e-4 in Python and 6e-4 in params.yaml)."""
    leaves = list(_leaves(load_params(ROOT / "params.yaml"), Params()))
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    # every key params.yaml writes out is compared, the nested didpo.reward's included
    assert {key for key, _, _ in leaves} == set(_yaml_keys(raw)) and len(leaves) == 206
    differ = [f"{key}: params.yaml {a!r}, default {b!r}" for key, a, b in leaves if a != b]
    assert differ == []


def test_reading_params_imports_no_heavy_package():
    """`import tasks.config` (what every CLI call and stage does first) imports neither torch, nor the
    orchestration and tracking stack, nor the dataframe stack: a fresh interpreter, so nothing is cached."""
    code = (
        "import sys, tasks.config; tasks.config.load_params('params.yaml');"
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'torch', 'prefect', 'mlflow', 'pandas', 'pyarrow', 'scipy', 'numpy', 'transformers', 'dvc'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_config_modules_are_leaves_and_the_import_graph_has_no_circle():
    files = project_modules()
    graph = {name: project_imports(path, files) - {name} for name, path in files.items()}
    assert graph["models.config"] == set()
    assert graph["tasks.config"] == {"models.config"}  # family names are checked where they are used
    assert graph["datalib.problem_families"] == set()
    # depth-first search for a back edge; `path` is the chain being explored
    state: dict[str, str] = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            assert state.get(nxt) != "open", f"import circle: {' -> '.join([*path, node, nxt])}"
            if nxt not in state:
                visit(nxt, [*path, node])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
