"""The files params.yaml points at, checked before any stage does work: each exists and parses, or the run stops at
once with one line per problem naming the params key and the path.

The paths a person configures: ``base_model.name_or_path`` (a local Hugging Face folder; a hub id is only checked
against the local cache while the hub is offline), ``prepare.user_problems`` and ``validate.feedback_logs`` /
``validate.human_pairs`` (JSON Lines) and ``launch.config_file`` (YAML). "Parses" is the file's format, not its
rows: a JSON Lines file passes when it is empty or one of its lines is a JSON object (the validate stage quarantines
the bad rows one by one, with reasons); a file of which no line is a JSON object (a CSV, a gzip, a JSON array) is
refused. A leaf: no prefect, mlflow, pandas or torch.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from datalib.jsonl import parse_line
from datalib.problem_families import FAMILIES
from tasks.config import EMBEDDED_MODEL, InputError, Params

# A Hugging Face hub id: ``name`` or ``owner/name`` (letters, digits, ``-``, ``_``, ``.``).
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


@dataclass(frozen=True)
class ConfiguredInput:
    """One input file or folder named in params.yaml.

    key: its params key (``validate.feedback_logs``; a list item as ``prepare.user_problems[0]``). path: the value.
    stage: the stage that reads it (dvc.yaml's name). kind: ``jsonl``, ``model`` or ``yaml``.
    """

    key: str
    path: str
    stage: str
    kind: str


def configured_inputs(params: Params) -> list[ConfiguredInput]:
    """Every input path of `params` a person may set, in pipeline order (the embedded model and an unset
    ``launch.config_file`` are not paths)."""
    found = []
    if params.base_model.name_or_path != EMBEDDED_MODEL:
        found.append(ConfiguredInput("base_model.name_or_path", params.base_model.name_or_path, "base_model", "model"))
    for i, path in enumerate(params.prepare.user_problems):
        found.append(ConfiguredInput(f"prepare.user_problems[{i}]", path, "prepare", "jsonl"))
    found.append(ConfiguredInput("validate.feedback_logs", params.validate.feedback_logs, "validate", "jsonl"))
    found.append(ConfiguredInput("validate.human_pairs", params.validate.human_pairs, "validate", "jsonl"))
    if params.launch.config_file:
        for stage in ("sft", "dpo", "didpo"):
            found.append(ConfiguredInput("launch.config_file", params.launch.config_file, stage, "yaml"))
    return found


def _jsonl_problem(path: Path) -> str | None:
    """Why `path` is not a JSON Lines file (None when it is empty or one of its lines is a JSON object)."""
    first_error = None
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            line = parse_line(raw.rstrip(b"\n"), number)
            if line.obj is not None:
                return None
            if first_error is None and line.check != "non_blank_line":
                first_error = f"line {number}: {line.error}"
    return None if first_error is None else f"is not JSON Lines (no line is a JSON object; {first_error})"


def _model_problem(name_or_path: str) -> str | None:
    """Why `name_or_path` cannot be loaded as a Hugging Face model here (None when it can, as far as the files
    tell)."""
    path = Path(name_or_path)  # as the stage reads it: no ~ expansion
    if path.is_dir():
        config = path / "config.json"
        if not config.is_file():
            return "is a folder without config.json (not a Hugging Face model folder)"
        try:
            json.loads(config.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            return f"has a config.json that is not JSON ({exc})"
        return None
    if path.exists():
        return "is a file, not a Hugging Face model folder"
    if not HUB_ID.match(name_or_path):
        return "does not exist (a local Hugging Face model folder, or a hub id such as owner/name)"
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    if offline:
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(name_or_path, "config.json"), str):
            return (
                "is neither a local folder nor a model in the Hugging Face cache, and the hub is offline "
                "(HF_HUB_OFFLINE=1): download it once, or point the key at a local model folder"
            )
    return None


def input_problem(item: ConfiguredInput, produced_by: str | None = None) -> str | None:
    """One line naming `item`'s key and path and what is wrong with it, or None when it exists and parses.
    `produced_by`: the stage that writes this path (the line then says to run it first)."""
    path = Path(item.path)
    if item.kind == "model":
        problem = _model_problem(item.path)
    elif not path.exists():
        problem = "does not exist" + (
            f" (the {produced_by} stage writes it: run that stage first)" if produced_by else ""
        )
    elif path.is_dir():
        problem = "is a folder, not a file"
    elif item.kind == "jsonl":
        try:
            problem = _jsonl_problem(path)
        except OSError as exc:
            problem = f"cannot be read ({exc.strerror})"
    else:
        try:
            yaml.safe_load(path.read_text(encoding="utf-8"))
            problem = None
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            problem = f"is not valid YAML ({str(exc).splitlines()[0]})"
    return None if problem is None else f"{item.key}: {item.path} {problem}"


def check_inputs(
    params: Params,
    stages: Iterable[str] | None = None,
    produced: dict[str, str] | None = None,
    source: str = "params.yaml",
) -> list[ConfiguredInput]:
    """Check every configured input that `stages` read (None: every stage) before any of them starts.

    produced: ``{path: stage}`` for paths an earlier stage of this run writes (``data/simulated/feedback_logs.jsonl``
    when simulate_logs runs first): not checked. A path some stage writes that is missing is reported with that
    stage's name. Returns the inputs checked.

    Raises:
        InputError: one line per input that is missing or does not parse, each naming its key and path.
    """
    wanted = None if stages is None else set(stages)
    produced = {str(Path(k)): v for k, v in (produced or {}).items()}
    checked: list[ConfiguredInput] = []
    problems = []
    for item in configured_inputs(params):
        if wanted is not None and item.stage not in wanted:
            continue
        writer = produced.get(str(Path(item.path)))
        if writer is not None and (wanted is None or writer in wanted):
            continue  # written by a stage of this very run, before the stage that reads it
        if any(c.key == item.key and c.path == item.path for c in checked):
            continue  # launch.config_file: one line, not one per training stage
        checked.append(item)
        problem = input_problem(item, writer)
        if problem:
            problems.append(problem)
    if wanted is None or "prepare" in wanted:
        problems += heldout_family_problems(params.prepare.heldout_families)
    if problems:
        raise InputError("\n".join(f"{source}: {line}" for line in problems))
    return checked


def heldout_family_problems(heldout: Sequence[str]) -> list[str]:
    """What is wrong with ``prepare.heldout_families`` (a name not in the catalogue, or every family held out), one
    line each naming the key; [] when nothing is."""
    known = [family.name for family in FAMILIES]
    unknown = [name for name in heldout if name not in known]
    if unknown:
        return [f"prepare.heldout_families: {unknown} are not generated families; known: {known}"]
    if len(set(heldout)) >= len(known):
        return ["prepare.heldout_families holds out every family: nothing is left to train on"]
    return []
