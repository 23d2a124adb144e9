"""Generator v1 of the bundled data-cleaning problems: determinism, distinctness, self-checking tests, clean splits."""

from __future__ import annotations

import ast
import hashlib
import json
import math
import os
import random
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from datalib.generate import (
    FIELDS,
    GENERATOR_VERSION,
    SOURCE,
    assign_splits,
    capacity,
    generate_problems,
    leakage_report,
    prompt_hash,
    render_problem,
    split_key,
)
from datalib.problem_families import FAMILIES, catalogue

ROOT = Path(__file__).resolve().parents[1]
N = 1600
STEP = re.compile(r"^\s*# Step (\d+): (.*)$")


@pytest.fixture(scope="module")
def problems() -> list[dict]:
    return generate_problems(N, seed=0)


@pytest.fixture(scope="module")
def split(problems) -> list[dict]:
    return assign_splits(problems, seed=0, val_frac=0.1, test_frac=0.1)


def _digest(problems: list[dict]) -> str:
    return hashlib.sha256("\n".join(json.dumps(p, sort_keys=True) for p in problems).encode()).hexdigest()


def _function(problem: dict, body: str):
    namespace: dict = {}
    exec(compile(problem["prompt"] + body, problem["task_id"], "exec"), namespace)
    return namespace[problem["entry_point"]]


def _check(problem: dict):
    namespace: dict = {}
    exec(compile(problem["test"], problem["task_id"] + "/test", "exec"), namespace)
    return namespace["check"]


def _passes(check, fn) -> bool:
    try:
        check(fn)
    except Exception:  # a failed assert or a crash of the candidate: both are a failed check
        return False
    return True


def _walk(value):
    yield value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(k)
            yield from _walk(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _walk(v)


def _mixed(items) -> bool:
    """Elements of two or more types (None aside), e.g. ints among strings."""
    return isinstance(items, (list, tuple, type({}.keys()), type({}.values()))) and (
        len({type(x) for x in items if x is not None}) >= 2
    )


def _test_inputs(problem: dict) -> list[tuple]:
    """The literal argument tuples of each ``assert candidate(...) == expected`` line."""
    check = ast.parse(problem["test"]).body[0]
    out = []
    for node in check.body:
        assert isinstance(node, ast.Assert) and node.lineno == node.end_lineno, problem["task_id"]
        call = node.test.left
        assert isinstance(call, ast.Call) and call.func.id == "candidate"
        out.append(tuple(ast.literal_eval(a) for a in call.args))
    return out


# ------------------------------------------------------------------------------------------ determinism


def test_version_and_capacity():
    assert GENERATOR_VERSION == "v1" and SOURCE == "generated:v1"
    assert len(FAMILIES) == 20
    for family in FAMILIES:  # a catalogue is the full grid: option combinations x nouns
        assert len(catalogue(family)) == math.prod(len(a.values) for a in family.axes) * len(family.nouns) >= 72
        assert [v.index for v in catalogue(family)] == list(range(len(catalogue(family))))
    # e.g. strip_drop_empty: 2 (non_str) x 2 (case) x 2 (order) x 2 (returns) x 10 nouns = 160
    assert len(catalogue(FAMILIES[0])) == 160
    assert capacity() == 2896


def test_same_seed_same_bytes_and_prefix_stable(problems):
    again = generate_problems(300, seed=0)
    assert _digest(again) == _digest(problems[:300])  # same bytes, and a smaller n is a prefix


def test_same_bytes_in_other_processes(problems):
    # Salted str hashing must not leak into the output: two fresh interpreters with different hash seeds.
    code = (
        "import hashlib, json; from datalib.generate import generate_problems; "
        "ps = generate_problems(300, seed=0); "
        "print(hashlib.sha256('\\n'.join(json.dumps(p, sort_keys=True) for p in ps).encode()).hexdigest())"
    )
    for hash_seed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == _digest(problems[:300])


def test_different_seed_changes_selection_and_order(problems):
    other = generate_problems(300, seed=1)
    ids, other_ids = [p["task_id"] for p in problems[:300]], [p["task_id"] for p in other]
    assert ids != other_ids
    assert set(ids) != set(other_ids)


def test_too_many_or_negative_raises():
    with pytest.raises(ValueError, match="exceeds the 2896 distinct problems"):
        generate_problems(capacity() + 1, seed=0)
    with pytest.raises(ValueError, match=">= 0"):
        generate_problems(-1, seed=0)
    assert generate_problems(0, seed=0) == []


# ---------------------------------------------------------------------------------------- distinctness


def test_schema_and_counts(problems):
    assert len(problems) == N
    for p in problems:
        assert tuple(sorted(p)) == tuple(sorted(FIELDS))
        assert p["split"] == "" and p["source"] == SOURCE
        assert p["task_id"].startswith(f"DataClean/{p['family']}/")
        assert isinstance(p["steps"], list) and isinstance(p["key_patterns"], list)
    per_family = Counter(p["family"] for p in problems)
    assert len(per_family) == len(FAMILIES) >= 15
    assert min(per_family.values()) >= 70  # round-robin: 1600 / 20 families, the smallest has 72


def test_problems_are_distinct(problems):
    def unique(values):
        values = list(values)
        return len(set(values)) == len(values)

    assert unique(p["task_id"] for p in problems)
    assert unique(p["entry_point"] for p in problems)
    assert unique(p["instruction"] for p in problems)
    assert unique(p["test"] for p in problems)
    # Not "the same text with other numbers", and not "the same text under another function name".
    assert unique(re.sub(r"\d", "", p["instruction"]) for p in problems)
    assert unique(re.sub(r"\d", "", p["instruction"].replace(p["entry_point"], "f")) for p in problems)
    assert unique(prompt_hash(p, mask_name=True) for p in problems)


def test_all_catalogue_names_unique():
    names = [v.entry_point for f in FAMILIES for v in catalogue(f)]
    assert len(set(names)) == len(names) == capacity()
    assert all(re.fullmatch(r"[a-z][a-z_]*", n) for n in names)


# ------------------------------------------------------------------------------------------- structure


def test_prompt_solution_and_steps_are_consistent(problems):
    for p in problems:
        assert p["prompt"].endswith('"""\n') and f"def {p['entry_point']}(" in p["prompt"]
        lines = p["canonical_solution"].splitlines()
        comments = [STEP.match(line) for line in lines if STEP.match(line)]
        assert [int(m.group(1)) for m in comments] == list(range(1, len(p["steps"]) + 1))
        assert [m.group(2) for m in comments] == p["steps"] and len(p["steps"]) >= 1
        assert STEP.match(lines[0]), "the body starts with step 1"
        assert all(line.startswith("    ") or not line for line in lines)
        assert 1 <= len(p["key_patterns"]) <= 3
        assert all(k in p["canonical_solution"] for k in p["key_patterns"])
        assert p["entry_point"] in p["instruction"]
        ast.parse(p["prompt"] + p["canonical_solution"])


def test_tests_cover_edge_cases(problems):
    for p in problems:
        inputs = _test_inputs(p)
        assert len(inputs) >= 5, p["task_id"]
        values = [v for args in inputs for v in _walk(args)]
        assert any(v is None for v in values), f"{p['task_id']}: no None case"
        assert any(a in ([], (), {}, "") for args in inputs for a in args), f"{p['task_id']}: no empty input"
        assert any(isinstance(v, str) and v and not v.strip() for v in values), (
            f"{p['task_id']}: no whitespace-only string"
        )
        typical = {type(a) for a in inputs[0]}
        mixed = any(_mixed(c.keys()) or _mixed(c.values()) if isinstance(c, dict) else _mixed(c) for c in values if c)
        odd_top_level = any(type(a) not in typical | {type(None), list, tuple} for args in inputs for a in args)
        assert mixed or odd_top_level, f"{p['task_id']}: no wrong-type case"


def test_reference_passes_and_mutants_fail(problems):
    for p in problems:
        check = _check(p)
        assert _passes(check, _function(p, p["canonical_solution"])), p["task_id"]
        first_arg = re.search(r"def \w+\((\w+)", p["prompt"]).group(1)
        assert not _passes(check, _function(p, "    return None\n")), p["task_id"]
        assert not _passes(check, _function(p, f"    return {first_arg}\n")), p["task_id"]
        # Every step is load-bearing: dropping any one of them (the last included) fails the tests.
        lines = p["canonical_solution"].split("\n")
        starts = [i for i, line in enumerate(lines) if STEP.match(line)] + [len(lines)]
        for k in range(len(starts) - 1):
            mutant = "\n".join(lines[: starts[k]] + lines[starts[k + 1] :]) + "\n    pass\n"
            assert not _passes(check, _function(p, mutant)), f"{p['task_id']}: dropping step {k + 1} still passes"


def test_every_option_changes_the_tests():
    # For one noun per family, each variant's reference must fail every other variant's tests: no two option
    # combinations are behaviourally the same, so an instruction's options matter.
    for family in FAMILIES:
        variants = [v for v in catalogue(family) if v.noun == family.nouns[0]]
        rendered = [render_problem(v) for v in variants]
        fns = [_function(p, p["canonical_solution"]) for p in rendered]
        checks = [_check(p) for p in rendered]
        for i, fn in enumerate(fns):
            for j, check in enumerate(checks):
                assert _passes(check, fn) == (i == j), (rendered[i]["entry_point"], rendered[j]["entry_point"])


# ------------------------------------------------------------------------------------------ splitting


def test_split_key_groups_variants():
    family = next(f for f in FAMILIES if f.name == "strip_drop_empty")
    variants = catalogue(family)
    as_list = next(v for v in variants if dict(v.options)["returns"] == "list")
    same_but_tuple = next(
        v
        for v in variants
        if v.noun == as_list.noun and dict(v.options) == {**dict(as_list.options), "returns": "tuple"}
    )
    other_noun = next(v for v in variants if v.options == as_list.options and v.noun != as_list.noun)
    a, b, c = (render_problem(v) for v in (as_list, same_but_tuple, other_noun))
    assert split_key(a) == split_key(b) == split_key(c) == as_list.group
    assert as_list.group == "strip_drop_empty[non_str=skip,case=keep,order=input]"
    assert split_key({"task_id": "HumanEval/3", "source": "humaneval"}) == "HumanEval/3"
    with pytest.raises(ValueError, match="not in the generated:v1 catalogue"):
        split_key({**a, "entry_point": "renamed"})
    with pytest.raises(ValueError, match="not of the form"):
        split_key({**a, "task_id": "DataClean/strip_drop_empty"})


def test_assign_splits_holds_out_whole_groups(problems, split):
    assert all(p["split"] == "" for p in problems)  # the input is not modified
    assert [p["task_id"] for p in split] == [p["task_id"] for p in problems]
    assert {p["split"] for p in split} == {"train", "val", "test"}
    counts = Counter(p["split"] for p in split)
    assert 0.06 * N <= counts["val"] <= 0.14 * N and 0.06 * N <= counts["test"] <= 0.14 * N
    splits_of_group = defaultdict(set)
    for p in split:
        splits_of_group[split_key(p)].add(p["split"])
    assert all(len(s) == 1 for s in splits_of_group.values())
    for family in FAMILIES:
        assert "train" in {p["split"] for p in split if p["family"] == family.name}
    # Order-independent and deterministic; another seed gives another split.
    shuffled = list(problems)
    random.Random(7).shuffle(shuffled)
    by_id = {p["task_id"]: p["split"] for p in assign_splits(shuffled, seed=0, val_frac=0.1, test_frac=0.1)}
    assert by_id == {p["task_id"]: p["split"] for p in split}
    other = assign_splits(problems, seed=1, val_frac=0.1, test_frac=0.1)
    assert [p["split"] for p in other] != [p["split"] for p in split]
    with pytest.raises(ValueError, match="val_frac"):
        assign_splits(problems, seed=0, val_frac=-0.1, test_frac=0.1)
    with pytest.raises(ValueError, match="< 1"):
        assign_splits(problems, seed=0, val_frac=0.6, test_frac=0.5)


def test_assign_splits_holds_out_whole_families(problems, split):
    held = ("parse_booleans", "group_records")
    out = assign_splits(problems, seed=0, val_frac=0.1, test_frac=0.1, heldout_families=held)
    for p, plain in zip(out, split, strict=True):
        if p["family"] in held:
            assert p["split"] == "heldout"  # every problem of the family, whatever its group
        else:
            assert p["split"] == plain["split"]  # the other families' split does not move
    assert sum(p["split"] == "heldout" for p in out) == sum(p["family"] in held for p in problems) > 0
    with pytest.raises(ValueError, match=r"\['no_such_family'\] are not in the catalogue"):
        assign_splits(problems, seed=0, heldout_families=("no_such_family",))
    one_family = [p for p in problems if p["family"] == "parse_booleans"]
    with pytest.raises(ValueError, match="nothing is left to train on"):
        assign_splits(one_family, seed=0, heldout_families=("parse_booleans",))


def test_leakage_report_is_clean(split):
    report = leakage_report(split)
    assert report["group_overlap"] == 0
    assert report["entry_point_overlap"] == 0
    assert report["prompt_hash_collisions"] == 0
    assert report["masked_prompt_hash_collisions"] == 0
    assert sum(report["n"].values()) == N
    for held_out in ("val", "test"):
        sim = report["similarity"][held_out]
        assert sim["n"] == report["n"][held_out] > 0
        assert 0.0 < sim["mean"] <= sim["max"] < 1.0  # same-family text overlaps, but no copy survives


def test_leakage_report_detects_a_planted_leak(split):
    subset = split[:400]
    train = next(p for p in subset if p["split"] == "train")
    leaked = {**train, "split": "test"}
    report = leakage_report([*subset, leaked])
    assert report["entry_point_overlap"] == 1
    assert report["prompt_hash_collisions"] == 1
    assert report["group_overlap"] == 1
    assert report["similarity"]["test"]["max"] == 1.0
    assert report["most_similar"][0] == {
        "task_id": train["task_id"],
        "train_task_id": train["task_id"],
        "similarity": 1.0,
    }
