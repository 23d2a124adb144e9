"""The ``register`` stage's work: log the final model to MLflow, register a version, decide champion/challenger.

What is logged: the final stage's *merged* checkpoint (RL, else DPO, else SFT) in MLflow's ``transformers`` flavour
(task text-generation, explicit pinned pip requirements), not the LoRA adapter. DPO and RL train on top of the
previous stage's merged weights, so an adapter's base would be an intermediate checkpoint that lives only in this
project's DVC cache; a merged checkpoint is self-contained: ``mlflow.transformers.load_model("models:/NAME@champion")``
gives a text-generation pipeline (or the components) anywhere, with no project files. The price is the full weights
per version (≈ 540 MB for the float32 135M embedded default).

Aliases: every new version becomes ``challenger``; it becomes ``champion`` only when `promotion_decision` says so.
Each version carries tags ``didpo.metrics`` (its evaluation metrics as JSON, what later challengers are compared
with), ``didpo.checkpoint``, ``didpo.decision`` and ``didpo.reasons``; a promoted version also carries
``didpo.previous_champion`` (the version it replaced, "" for the first), which `rollback_champion` follows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

CHAMPION = "champion"
CHALLENGER = "challenger"
FINAL_ORDER = ("rl", "dpo", "sft")  # the final model is the first of these present
PIP_PACKAGES = ("torch", "transformers", "accelerate", "tokenizers", "safetensors")
TAG_METRICS = "didpo.metrics"
TAG_PREVIOUS = "didpo.previous_champion"


@dataclass(frozen=True)
class RegisterConfig:
    """The ``register`` section of params.yaml.

    Attributes:
        model_name: the MLflow registered model.
        primary_metric: ``<split>/<key>`` of data/evaluate/metrics.json (e.g. ``val/pass@1``) the challenger must
            beat the champion on.
        margin: the challenger is promoted only when it beats the champion on the primary metric by more than this
            (absolute, in the metric's unit; 0 = any strict improvement; a tie never promotes).
        tolerance: largest allowed regression on each secondary metric (absolute).
        secondary_metrics: metrics that must not regress by more than `tolerance`.
        lower_is_better: the metrics (primary or secondary) where lower is better (e.g. ``val/unsafe_rate``);
            higher is better for all others.
    """

    model_name: str = "didpo-coder"
    primary_metric: str = "val/pass@1"
    margin: float = 0.0
    tolerance: float = 0.02
    secondary_metrics: tuple[str, ...] = ("val/pass@16", "test/pass@1", "val/format_compliance", "val/unsafe_rate")
    lower_is_better: tuple[str, ...] = ("val/unsafe_rate",)

    def __post_init__(self):
        if not self.model_name.strip():
            raise ValueError("register.model_name must not be empty")
        if self.margin < 0 or self.tolerance < 0:
            raise ValueError(f"register.margin and .tolerance must be >= 0 (got {self.margin}, {self.tolerance})")
        for key in (self.primary_metric, *self.secondary_metrics):
            if key.count("/") != 1:
                raise ValueError(f"register metric {key!r} must be '<split>/<key>', e.g. 'val/pass@1'")
        if self.primary_metric in self.secondary_metrics:
            raise ValueError(f"register.primary_metric {self.primary_metric!r} is also a secondary metric")


@dataclass(frozen=True)
class Decision:
    """promote: move ``champion`` to the challenger. reasons: one line per check made, in order."""

    promote: bool
    reasons: list[str]


def promotion_decision(challenger: dict, champion: dict | None, cfg: RegisterConfig) -> Decision:
    """Champion/challenger rule: promote when there is no champion, or when the challenger beats the champion on
    ``cfg.primary_metric`` by more than ``cfg.margin`` and regresses on no secondary metric by more than
    ``cfg.tolerance`` (directions from ``cfg.lower_is_better``).

    Args:
        challenger, champion: flat metrics ``{"<split>/<key>": value}``; champion None when there is none.

    Returns:
        a `Decision` whose reasons state each comparison with its numbers. A champion without a value for the
        primary metric blocks promotion (nothing to compare with: promote by hand); one without a secondary metric
        skips that check (said in the reasons).

    Raises:
        ValueError: the challenger lacks the primary or a secondary metric (or has it as None).
    """
    keys = (cfg.primary_metric, *cfg.secondary_metrics)
    missing = [k for k in keys if challenger.get(k) is None]
    if missing:
        raise ValueError(f"the challenger's metrics lack {missing}; it has {sorted(challenger)}")
    primary = cfg.primary_metric
    if champion is None:
        return Decision(True, [f"no champion yet: the first version is promoted ({primary} {challenger[primary]:.4f})"])

    def gain(key: str) -> float:  # challenger minus champion, positive = better
        sign = -1.0 if key in cfg.lower_is_better else 1.0
        return sign * (challenger[key] - champion[key]) + 0.0  # + 0.0 turns -0.0 into 0.0 for the reasons

    promote, reasons = True, []
    if champion.get(primary) is None:
        promote = False
        reasons.append(f"{primary}: the champion has no recorded value, so the challenger cannot be compared")
    else:
        g = gain(primary)
        beats = g > cfg.margin
        promote = beats
        verdict = "beats the champion" if beats else "does not beat the champion"
        reasons.append(
            f"{primary}: {challenger[primary]:.4f} vs champion {champion[primary]:.4f} ({g:+.4f}): {verdict} "
            f"by more than the margin {cfg.margin:g}"
        )
    for key in cfg.secondary_metrics:
        if champion.get(key) is None:
            reasons.append(f"{key}: the champion has no recorded value; not compared")
            continue
        g = gain(key)
        ok = -g <= cfg.tolerance
        promote = promote and ok
        verdict = "within" if ok else "regression beyond"
        reasons.append(
            f"{key}: {challenger[key]:.4f} vs champion {champion[key]:.4f} ({g:+.4f}): {verdict} the tolerance "
            f"{cfg.tolerance:g}"
        )
    return Decision(promote, reasons)


def final_checkpoint(present: dict[str, Path]) -> tuple[str, Path]:
    """The final model among `present` checkpoints: RL, else DPO, else SFT.

    Raises:
        FileNotFoundError: none of them is present.
    """
    for name in FINAL_ORDER:
        if name in present:
            return name, present[name]
    raise FileNotFoundError(f"no trained checkpoint to register: none of {list(FINAL_ORDER)} is present")


def flatten(per_split: dict) -> dict[str, float | None]:
    """``{split: {key: value}}`` (one checkpoint of data/evaluate/metrics.json) → ``{"split/key": value}``."""
    return {f"{split}/{k}": v for split, m in per_split.items() if isinstance(m, dict) for k, v in m.items()}


def pip_requirements(packages: Sequence[str] = PIP_PACKAGES) -> list[str]:
    """``name==version`` of the installed packages the logged model needs to load and run."""
    from importlib.metadata import version

    return [f"{name}=={version(name)}" for name in packages]


@dataclass
class RegisterResult:
    """What `register_and_decide` did (written to data/register/decision.json)."""

    model_name: str
    version: int
    checkpoint: str
    promoted: bool
    reasons: list[str]
    champion_before: int | None
    champion_after: int | None
    primary_metric: str
    challenger_primary: float | None
    champion_primary: float | None
    challenger_metrics: dict = field(repr=False)

    def as_dict(self) -> dict:
        return asdict(self)


def current_champion(client, name: str):
    """The ``champion`` model version of `name`, or None (no registered model or no alias)."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        return None


def version_metrics(version) -> dict | None:
    """The metrics recorded on a model version (tag ``didpo.metrics``), None when it has none."""
    raw = (version.tags or {}).get(TAG_METRICS)
    return json.loads(raw) if raw else None


@task(cache_policy=NO_CACHE)
def register_and_decide(
    model_dir: Path, checkpoint: str, metrics: dict, cfg: RegisterConfig, dtype: str = "auto"
) -> RegisterResult:
    """Log `model_dir` to the active MLflow run, register it as a new version of ``cfg.model_name`` (alias
    ``challenger``), compare it with the champion (`promotion_decision`) and move ``champion`` when it wins.

    Args:
        model_dir: a merged checkpoint (``from_pretrained`` folder with its tokenizer).
        checkpoint: its stage name (``rl``, ``dpo``, ``sft``), recorded as a tag.
        metrics: the checkpoint's flat metrics ``{"split/key": value}`` (`flatten`).

    Raises:
        ValueError: as `promotion_decision` (nothing is registered then).
    """
    import mlflow

    from models.policy import load_policy

    client = mlflow.MlflowClient()
    champion = current_champion(client, cfg.model_name)
    # a champion registered without metrics (e.g. by hand) is {}: nothing to beat it on, so no promotion
    champion_metrics = (version_metrics(champion) or {}) if champion is not None else None
    decision = promotion_decision(metrics, champion_metrics, cfg)

    model, tokenizer = load_policy(model_dir, dtype=dtype)
    info = mlflow.transformers.log_model(
        {"model": model, "tokenizer": tokenizer},
        name="model",
        task="text-generation",
        pip_requirements=pip_requirements(),
        registered_model_name=cfg.model_name,
    )
    version = str(info.registered_model_version)
    tags = {
        TAG_METRICS: json.dumps({k: v for k, v in metrics.items() if v is not None}, sort_keys=True),
        "didpo.checkpoint": checkpoint,
        "didpo.decision": "promoted" if decision.promote else "rejected",
        "didpo.reasons": "\n".join(decision.reasons)[:4900],
    }
    if decision.promote:
        tags[TAG_PREVIOUS] = str(champion.version) if champion is not None else ""
    for key, value in tags.items():
        client.set_model_version_tag(cfg.model_name, version, key, value)
    client.set_registered_model_alias(cfg.model_name, CHALLENGER, version)
    if decision.promote:
        client.set_registered_model_alias(cfg.model_name, CHAMPION, version)
    before = int(champion.version) if champion is not None else None
    return RegisterResult(
        model_name=cfg.model_name,
        version=int(version),
        checkpoint=checkpoint,
        promoted=decision.promote,
        reasons=decision.reasons,
        champion_before=before,
        champion_after=int(version) if decision.promote else before,
        primary_metric=cfg.primary_metric,
        challenger_primary=metrics.get(cfg.primary_metric),
        champion_primary=(champion_metrics or {}).get(cfg.primary_metric),
        challenger_metrics=metrics,
    )


def rollback_champion(name: str) -> tuple[int, int]:
    """Move ``champion`` of registered model `name` back to the version it replaced (tag
    ``didpo.previous_champion`` of the current champion); the demoted version is tagged ``didpo.rolled_back``.
    Rolling back again continues down the chain. Returns ``(from_version, to_version)``.

    Raises:
        ValueError: no champion, or the champion replaced nobody (the first version).
    """
    import mlflow

    client = mlflow.MlflowClient()
    current = current_champion(client, name)
    if current is None:
        raise ValueError(f"registered model {name!r} has no '{CHAMPION}' alias: nothing to roll back")
    previous = (current.tags or {}).get(TAG_PREVIOUS, "")
    if not previous:
        raise ValueError(f"{name} version {current.version} is the first champion: there is no previous one")
    client.set_registered_model_alias(name, CHAMPION, previous)
    client.set_model_version_tag(name, current.version, "didpo.rolled_back", f"champion moved back to {previous}")
    return int(current.version), int(previous)
