"""The ``evaluate`` stage's work: every checkpoint on val, test and HumanEval — pass@k, process metrics, format and
safety — then the comparison table, the pass@k plots (DVC JSON + PNG) and the training curves.

Metric keys of one (checkpoint, split), in data/evaluate/metrics.json as ``{checkpoint: {split: {key: value}}}``:

- ``pass@1``, ``pass@2``, ``pass@5``, ``pass@10``, ``pass@16``: unbiased pass@k (Chen et al. 2021 §2.1) from
  ``n_samples`` answers per problem, reported only where ``n_samples >= 2k`` (with fewer answers the estimate of a
  problem is 0 or 1 and its spread is not worth a figure); ``test_pass_rate``: mean fraction of tests passed
  (reward V2);
- ``format_compliance``, ``unsafe_rate``, ``explanation_rate``: `models.process_metrics.format_rates` of every
  answer;
- ``valid_prefix_rate``: mean over answers with code of `models.process_metrics.valid_prefix_rate`;
- ``lines_ratio``, ``complexity_ratio``: `models.process_metrics.trajectory_complexity` against the reference;
- ``consistency``, ``recovery`` (+ ``recovery_clean_pass_rate``, ``recovery_corrupted_pass_rate``): on the first
  ``process_problems`` problems (`models.process_metrics.decision_consistency`, `error_recovery`);
- ``n_problems``, ``n_samples``.

A value that cannot be measured (e.g. recovery when no clean continuation passes) is ``null``.

**What is drawn and tabled**: a split of fewer than `MIN_PROBLEMS` problems is measured and kept in metrics.json,
deltas.json and per_problem.json, but neither drawn (the pass@k plot data, the PNG) nor tabled (report.md, the
MLflow table and metrics): the stage says so once, naming the key that sizes the split (`SPLIT_SIZE_KEYS`). The
RL checkpoint is shown as ``RL (<algo>)`` (`checkpoint_label`): the stage is "didpo" whatever ``didpo.algo`` is.

**The evaluation protocol is data** (:func:`protocol_record`): which problems of each split (val: ``val_per_family``
problems of every family, from the val problems after the ones the gate, SFT's held-out loss, DPO's smoke check and
the baseline use), answers per problem, temperature, top-p, token budget and seed, with an id (a digest of all of it).
Every checkpoint of one run, the registry's champion included, is measured under one protocol with the same seeds
(common random numbers); the promotion rule refuses to compare figures of two protocols.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from models.checkpoint import checkpoint_hash
from models.measure import assemble_program, sample_and_verify, summarise
from models.policy import load_policy
from models.process_metrics import (
    decision_consistency,
    error_recovery,
    format_rates,
    make_continuer,
    trajectory_complexity,
    valid_prefix_rate,
)
from models.prompts import reference_code
from models.sampling import SamplingConfig, extract_code
from models.significance import paired_test
from tasks.config import CHECKPOINT_NAMES, KS, EvaluateConfig, Params
from tasks.io import read_problems, write_json, write_lines
from tasks.measure import make_sampler, write_results
from tasks.measure import resolve_engine as resolve
from tasks.register import download_champion
from tasks.sandbox import make_verifier

SPLITS = ("val", "test", "heldout", "humaneval")
# The fewest problems a split's figures are drawn or tabled with. With n problems a pass@1 moves in steps of
# 1 / (n × answers), and when none passes its 95% upper bound (Clopper–Pearson, 1 − 0.025^(1/n)) is 0.975 at
# n = 1 and still 0.369 at n = 8: below 8 a figure says nothing, whatever it is (the registry's non-inferiority
# test has the same floor, tasks.register.NI_MIN_PROBLEMS).
MIN_PROBLEMS = 8
SPLIT_SIZE_KEYS = {  # the params.yaml key that sets how many problems of each split are measured
    "val": "evaluate.val_per_family",
    "test": "evaluate.test_problems",
    "heldout": "evaluate.heldout_per_family",
    "humaneval": "evaluate.humaneval_problems",
}
CHECKPOINT_LABELS = {"base": "base", "sft": "SFT", "dpo": "DPO", "champion": "champion"}
TABLE_COLUMNS = (
    "pass@1",
    "pass@2",
    "pass@5",
    "pass@10",
    "pass@16",
    "test_pass_rate",
    "format_compliance",
    "unsafe_rate",
    "valid_prefix_rate",
    "lines_ratio",
    "complexity_ratio",
    "consistency",
    "recovery",
)


def split_sampling(cfg: EvaluateConfig, split: str):
    """The `models.sampling.SamplingConfig` of `split`'s answers under protocol `cfg`: one greedy answer for a
    greedy split (`EvaluateConfig.greedy`), else ``n_samples`` at the protocol's temperature and top-p."""
    if cfg.greedy(split):
        return SamplingConfig(n=1, temperature=0.0, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed)
    return SamplingConfig(
        n=cfg.n_samples, temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed
    )


def protocol_problems(val_rows: Sequence[dict], skip: int, per_family: int) -> list[dict]:
    """The protocol's val problems: ``per_family`` of every family (0 = all), in file order, from ``val_rows[skip:]``.

    ``skip`` is the selection prefix (the first val problems the gate, SFT's held-out loss, DPO's smoke check and the
    baseline use), so no figure that chose a checkpoint is also the figure that judges it. Families are taken from
    the row's ``family`` (``source`` when absent); the result is ordered by family, then file order.
    """
    by_family: dict[str, list[dict]] = {}
    for row in val_rows[skip:]:
        by_family.setdefault(str(row.get("family") or row.get("source") or "unknown"), []).append(row)
    out = []
    for family in sorted(by_family):
        rows = by_family[family]
        out += rows[:per_family] if per_family else rows
    return out


def select_problems(problems_path, cfg: EvaluateConfig, skip: int) -> dict[str, list[dict]]:
    """The protocol's problems of every split from a validated problems file: val by `protocol_problems` after the
    first ``skip`` val problems, the held-out families' ``heldout_per_family`` each, test and HumanEval the first
    ``test_problems`` / ``humaneval_problems`` (a split the data lacks has no problems)."""
    return {
        "val": protocol_problems(read_problems(problems_path, "val"), skip, cfg.val_per_family),
        "test": read_problems(problems_path, "test", cfg.test_problems),
        "heldout": protocol_problems(read_problems(problems_path, "heldout"), 0, cfg.heldout_per_family),
        "humaneval": read_problems(problems_path, "humaneval", cfg.humaneval_problems),
    }


def resolve_engine(cfg: EvaluateConfig) -> tuple[str, str]:
    """The engine this run uses, ``(name, precision)`` (`tasks.measure.resolve_engine` for the evaluate stage)."""
    return resolve(cfg.engine, cfg.precision, "evaluate")


def protocol_record(cfg: EvaluateConfig, problems: dict[str, list[dict]], engine: tuple[str, str]) -> dict:
    """The evaluation protocol as data: the task ids and families of every split, answers per problem, the sampling
    settings, seed and engine (`resolve_engine`), and ``id`` (the first 16 hex digits of the sha256 of the rest)."""
    record = {
        "splits": {split: [p["task_id"] for p in rows] for split, rows in problems.items()},
        "families": {
            p["task_id"]: str(p.get("family") or p.get("source") or "unknown") for r in problems.values() for p in r
        },
        "n_samples": cfg.n_samples,
        "greedy_splits": [split for split in problems if cfg.greedy(split)],
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "max_new_tokens": cfg.max_new_tokens,
        "seed": cfg.seed,
        "engine": engine[0],
        "precision": engine[1],
    }
    digest = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]
    return {"id": digest, **record}


def _mean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def _is_body(code: str) -> bool:
    """The answer's code is a bare function body (its first non-blank line is indented)."""
    first = next((line for line in code.splitlines() if line.strip()), "")
    return first[:1] in (" ", "\t")


def answer_metrics(problems: Sequence[dict], results) -> dict:
    """Format, safety, valid-prefix and complexity figures of the sampled answers of `results` (one
    `models.measure.ProblemResult` per problem, same order)."""
    answers = [a for r in results for a in r.answers]
    rates = format_rates(answers)
    valid, pairs = [], []
    for problem, result in zip(problems, results, strict=True):
        reference = assemble_program(problem, reference_code(problem))
        for answer in result.answers:
            code = extract_code(answer)
            if not code.strip():
                continue
            valid.append(valid_prefix_rate(code, context=problem["prompt"] if _is_body(code) else ""))
            pairs.append((assemble_program(problem, code), reference))
    complexity = trajectory_complexity(pairs)
    return {
        "format_compliance": rates.compliance,
        "unsafe_rate": rates.unsafe_rate,
        "explanation_rate": rates.explanation_rate,
        "valid_prefix_rate": _mean(valid),
        "lines_ratio": complexity.lines_ratio,
        "complexity_ratio": complexity.complexity_ratio,
    }


def sandbox_checker(verifier):
    """A `models.process_metrics.CheckFn` over the sandbox: ``(problem, code)`` passes when
    `models.measure.assemble_program` of it passes every test."""

    def check(jobs):
        verdicts = verifier.check_many([(assemble_program(p, code), p["test"], p["entry_point"]) for p, code in jobs])
        return [v.passed for v in verdicts]

    return check


def evaluate_split(
    model, tokenizer, problems: Sequence[dict], cfg: EvaluateConfig, verifier, sampler=None, split: str = "val"
) -> tuple[dict, list]:
    """Every metric of one split (see the module docstring); returns ``(metrics, results)`` with the per-problem
    `models.measure.ProblemResult` list. ``sampler``: the engine for the pass@k answers (None: torch);
    ``split``: its name (`split_sampling`: a greedy split gets one answer per problem, pass@1 only and
    no process metrics)."""
    sampling, greedy = split_sampling(cfg, split), cfg.greedy(split)
    metrics: dict = {"n_problems": len(problems), "n_samples": sampling.n, "greedy": greedy}
    if not problems:
        return metrics, []
    results = sample_and_verify(model, tokenizer, problems, sampling, verifier, sampler=sampler)
    metrics.update(summarise(results, (1,) if greedy else cfg.ks()))
    metrics.update(answer_metrics(problems, results))
    subset = [] if greedy else list(problems[: cfg.process_problems])
    if subset:
        continuer = make_continuer(model, tokenizer, sampling)
        consistency = decision_consistency(subset, continuer, cfg.process_prefixes, cfg.consistency_samples)
        recovery = error_recovery(
            subset, continuer, sandbox_checker(verifier), cfg.process_prefixes, cfg.recovery_samples, cfg.seed
        )
        metrics.update(
            {
                "consistency": consistency.mean,
                "recovery": recovery.recovery,
                "recovery_clean_pass_rate": recovery.clean_pass_rate,
                "recovery_corrupted_pass_rate": recovery.corrupted_pass_rate,
                "process_problems": len(subset),
                "recovery_prefixes": recovery.n_prefixes,
            }
        )
    return metrics, results


@task(cache_policy=NO_CACHE)
def evaluate_checkpoint(
    path: Path,
    dtype: str,
    problems: dict[str, list[dict]],
    cfg: EvaluateConfig,
    verifier,
    samples_dir: Path,
    engine: tuple[str, str] = ("torch", "f32"),
) -> tuple[dict, dict[str, list[float]]]:
    """Load one checkpoint and measure it on every split; writes per-problem answers and verdicts to
    ``samples_dir/<split>.jsonl``. ``engine``: `resolve_engine`'s choice (``openvino``: the checkpoint is exported
    to .cache/openvino once, by its weights' digest). Returns ``({split: metrics} plus "seconds" of wall-clock time
    and "export_seconds", {split: [pass@1 of each problem]})``, the second for the paired comparisons."""
    started = time.perf_counter()
    model, tokenizer = load_policy(path, dtype=dtype)
    out: dict = {}
    sampler = make_sampler(Path(path), tokenizer, engine)
    if sampler is not None:
        out["export_seconds"] = time.perf_counter() - started
    per_problem: dict[str, list[float]] = {}
    for split, rows in problems.items():
        out[split], results = evaluate_split(model, tokenizer, rows, cfg, verifier, sampler, split)
        per_problem[split] = [r.pass_at(1) for r in results]
        write_results(results, samples_dir / f"{split}.jsonl")
    out["seconds"] = time.perf_counter() - started
    return out, per_problem


def evaluation_key(
    checkpoint: Path, dtype: str, cfg: EvaluateConfig, protocol_id: str, verifier_cfg, code_files: Sequence[Path]
) -> str:
    """The identity of one checkpoint's evaluation (64 hex digits): sha256 over the checkpoint's weights digest
    (`models.checkpoint.checkpoint_hash`), the dtype it is loaded in, the protocol id (`protocol_record`: problems,
    answers per problem, sampling settings, seed, engine), every ``evaluate`` setting but ``checkpoints`` (which other
    checkpoints the run measures), every ``verifier`` setting, and the path and bytes of each of ``code_files`` (the
    code that produces answers and verdicts: `flows.evaluate.evaluation_code`). Answers are sampled with per-sample
    seeds, so two evaluations with one key compute the same figures. Raises FileNotFoundError for a missing checkpoint
    or code file."""
    from dataclasses import asdict

    digest = hashlib.sha256()
    settings = {
        "checkpoint": checkpoint_hash(checkpoint),
        "dtype": dtype,
        "protocol": protocol_id,
        "evaluate": {k: v for k, v in asdict(cfg).items() if k != "checkpoints"},  # which others are measured
        "verifier": asdict(verifier_cfg),
    }
    digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
    for path in sorted(map(Path, code_files)):
        digest.update(str(path).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def evaluate_once(key: str, cache_dir: Path, samples_dir: Path, compute) -> tuple[dict, dict, bool]:
    """``compute()`` (`evaluate_checkpoint` of one checkpoint, writing ``samples_dir/<split>.jsonl``) unless
    ``cache_dir/<key>`` holds its result (`evaluation_key`): then that result, its samples copied to ``samples_dir``.
    A fresh result is stored there (written to a temporary folder, then renamed, so an interrupted run leaves no
    partial entry). Returns ``(metrics, per_problem, reused)``; the metrics' ``seconds`` are those of the evaluation
    that computed them. Nothing ever deletes an entry: ``rm -rf`` the folder to measure everything again."""
    import shutil
    import tempfile

    entry = Path(cache_dir) / key
    if (entry / "result.json").is_file():
        result = json.loads((entry / "result.json").read_text())
        Path(samples_dir).mkdir(parents=True, exist_ok=True)
        for sample in sorted((entry / "samples").glob("*.jsonl")):
            shutil.copyfile(sample, Path(samples_dir) / sample.name)
        return result["metrics"], result["per_problem"], True
    metrics, per_problem = compute()
    entry.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=entry.parent) as tmp:
        shutil.copytree(samples_dir, Path(tmp) / "samples")
        (Path(tmp) / "result.json").write_text(json.dumps({"metrics": metrics, "per_problem": per_problem}))
        if not entry.exists():  # another run may have stored the same result meanwhile
            Path(tmp).rename(entry)
            Path(tmp).mkdir()  # for TemporaryDirectory's clean-up
    return metrics, per_problem, False


# ----------------------------------------------------------------------------------------------------- reports


def checkpoint_label(name: str, algo: str | None = None) -> str:
    """How a checkpoint is named in plots and tables: ``base``, ``SFT``, ``DPO``, ``champion``, and the RL stage's
    checkpoint (``didpo``, whatever the algorithm) as ``RL (<algo>)`` (``RL`` when the algorithm is not known);
    another name as it is."""
    if name == "didpo":
        return f"RL ({algo})" if algo else "RL"
    return CHECKPOINT_LABELS.get(name, name)


def split_problems(metrics: dict, split: str) -> int:
    """How many problems `split` was measured on (the most any checkpoint of `metrics` has: one protocol, so all
    have the same); 0 when no checkpoint has the split."""
    return max(
        (int(m[split].get("n_problems") or 0) for m in metrics.values() if isinstance(m.get(split), dict)), default=0
    )


def shown(n_problems: int) -> bool:
    """Whether a split of `n_problems` problems is drawn and tabled (at least `MIN_PROBLEMS`)."""
    return n_problems >= MIN_PROBLEMS


def too_small(metrics: dict) -> dict[str, str]:
    """``{split: why it is neither drawn nor tabled}`` for every measured split under `MIN_PROBLEMS` problems
    (e.g. ``"test: 1 problem (fewer than 8): measured, not drawn or tabled; raise evaluate.test_problems"``)."""
    out = {}
    for split in SPLITS:
        n = split_problems(metrics, split)
        if 0 < n < MIN_PROBLEMS:
            out[split] = (
                f"{split}: {n} problem{'s' if n != 1 else ''} (fewer than {MIN_PROBLEMS}): measured, not drawn or "
                f"tabled; raise {SPLIT_SIZE_KEYS[split]}"
            )
    return out


def _fmt(value) -> str:
    return "–" if value is None else f"{value:.3f}"


def comparison_markdown(metrics: dict, algo: str | None = None) -> str:
    """The comparison table: one Markdown table per split of at least `MIN_PROBLEMS` problems, one row per
    checkpoint (`checkpoint_label`, ``algo``: ``didpo.algo``), `TABLE_COLUMNS` columns; a smaller split is named
    with the reason (`too_small`)."""
    out = ["# Evaluation: checkpoints side by side", ""]
    out.append(
        "pass@k: unbiased estimator (Chen et al. 2021) from n samples per problem; format/unsafe: share of answers; "
        "valid prefixes: share of the answers' line prefixes that are valid-so-far Python; lines/complexity: ratio "
        "to the reference (sloc, cyclomatic complexity via radon); consistency: agreement of sampled next lines at "
        "reference prefixes; recovery: pass rate from corrupted prefixes / from clean ones. – = not measurable."
    )
    small = too_small(metrics)
    for split in SPLITS:
        rows = [(name, m[split]) for name, m in metrics.items() if split in m and m[split].get("n_problems")]
        if not rows or split in small:
            continue
        first = rows[0][1]
        out += ["", f"## {split} (problems: {first['n_problems']}, samples per problem: {first['n_samples']})", ""]
        out.append("| checkpoint | " + " | ".join(TABLE_COLUMNS) + " |")
        out.append("|---|" + "---:|" * len(TABLE_COLUMNS))
        for name, m in rows:
            cells = " | ".join(_fmt(m.get(c)) for c in TABLE_COLUMNS)
            out.append(f"| {checkpoint_label(name, algo)} | {cells} |")
    if small:
        out += ["", "Not tabled: " + "; ".join(small.values()) + " (its figures are in metrics.json)."]
    return "\n".join(out) + "\n"


def comparison_table(metrics: dict, algo: str | None = None) -> dict[str, list]:
    """The comparison as columns (``checkpoint``: `checkpoint_label`, ``split``, then `TABLE_COLUMNS`), for
    ``mlflow.log_table``; splits of fewer than `MIN_PROBLEMS` problems are left out."""
    table: dict[str, list] = {"checkpoint": [], "split": [], **{c: [] for c in TABLE_COLUMNS}}
    small = too_small(metrics)
    for name, per_split in metrics.items():
        for split in SPLITS:
            m = per_split.get(split)
            if not m or not m.get("n_problems") or split in small:
                continue
            table["checkpoint"].append(checkpoint_label(name, algo))
            table["split"].append(split)
            for c in TABLE_COLUMNS:
                table[c].append(m.get(c))
    return table


def pass1_deltas(
    per_problem: dict[str, dict[str, list[float]]], families: dict[str, list[str]] | None = None, seed: int = 0
) -> dict:
    """pass@1 change between consecutive checkpoints, and of every later checkpoint against the base model (the
    external guard's question: did training cost general ability?), each with the paired test of the promotion rule.

    per_problem: ``{checkpoint: {split: [pass@1 of each problem]}}`` in pipeline order (the same problems for every
    checkpoint; "base" first when present); families: ``{split: [family of each problem]}`` for the cluster check.
    Returns
    ``{"<before>_to_<after>": {split: {"delta", "low", "high", "confidence", "p_value", "method", "mde", "sd",
    "n_problems", "n_discordant", "cluster_p", "n_clusters"}}}`` (`models.significance.paired_test`, one-sided:
    "after is better"); a split with no problems is left out.
    """
    names = list(per_problem)
    pairs = list(itertools.pairwise(names))
    if "base" in names:
        pairs += [("base", name) for name in names[2:] if name != "base"]
    out: dict = {}
    for before, after in pairs:
        pair = {}
        for split, scores in per_problem[before].items():
            if scores and split in per_problem[after]:
                clusters = (families or {}).get(split)
                t = paired_test(scores, per_problem[after][split], clusters=clusters, seed=seed)
                pair[split] = {
                    "delta": t.effect,
                    "low": t.low,
                    "high": t.high,
                    "confidence": t.confidence,
                    "p_value": t.p_value,
                    "method": t.method,
                    "mde": t.mde if t.mde == t.mde else None,  # NaN (below 2 problems) is not JSON
                    "sd": t.sd,
                    "n_problems": t.n,
                    "n_discordant": t.n_discordant,
                    "cluster_p": t.cluster_p,
                    "n_clusters": t.n_clusters,
                }
        out[f"{before}_to_{after}"] = pair
    return out


def rl_claim(
    start_scores: Sequence[float],
    rl_scores: Sequence[float],
    protocol: dict,
    algo: str,
    alpha: float,
    clusters: Sequence[str] | None = None,
    start: str = "dpo",
    commit: str = "",
    rl_config: dict | None = None,
) -> dict:
    """The RL stage's claim (issue 18): the RL checkpoint against the checkpoint RL started from, on the protocol's
    val problems (every val problem the gate, SFT and DPO do not use), same problems and seeds: the one-sided paired
    test of the promotion rule (`models.significance.paired_test`) that RL is better, and the mirrored test that it
    is worse.

    Args:
        start_scores, rl_scores: per-problem val pass@1 of the start and the RL checkpoint (same problems, same order).
        protocol: the `protocol_record` (answers per problem, seed, engine, id).
        algo: ``didpo.algo`` (didpo, grpo, dapo or rft: the stage is "didpo" whatever the algorithm).
        alpha: the pre-registered level (``register.alpha``).
        clusters: the family of each problem (the cluster check).
        start: the name of the checkpoint the RL stage started from (the DPO stage's export).
        commit: the git commit of the code that ran.
        rl_config: the RL settings that tell ablation arms apart (reward control, shaping, steps, learning rate, ...).

    Returns:
        ``{"algo", "rl_config", "start_checkpoint", "split", "n_problems", "samples_per_problem", "seed", "protocol",
        "engine", "delta", "interval", "confidence", "p_value", "p_worse", "method", "mde", "n_discordant",
        "cluster_p", "alpha", "verdict", "commit"}``; verdict "better" (p_value < alpha and delta > 0), "worse"
        (p_worse < alpha and delta < 0) or "no change detected".

    Raises:
        ValueError: the score lists differ in length or are empty (`paired_test`).
    """
    better = paired_test(start_scores, rl_scores, clusters=clusters, seed=protocol["seed"])
    worse = paired_test(rl_scores, start_scores, seed=protocol["seed"])
    if better.p_value < alpha and better.effect > 0:
        verdict = "better"
    elif worse.p_value < alpha and better.effect < 0:
        verdict = "worse"
    else:
        verdict = "no change detected"
    return {
        "algo": algo,
        "rl_config": dict(rl_config or {}),
        "start_checkpoint": start,
        "split": "val",
        "n_problems": better.n,
        "samples_per_problem": protocol["n_samples"],
        "seed": protocol["seed"],
        "protocol": protocol["id"],
        "engine": f"{protocol['engine']}/{protocol['precision']}",
        "delta": better.effect,
        "interval": [better.low, better.high],
        "confidence": better.confidence,
        "p_value": better.p_value,
        "p_worse": worse.p_value,
        "method": better.method,
        "mde": better.mde if better.mde == better.mde else None,  # NaN below 2 problems
        "n_discordant": better.n_discordant,
        "cluster_p": better.cluster_p,
        "alpha": alpha,
        "verdict": verdict,
        "commit": commit,
    }


def deltas_markdown(deltas: dict, algo: str | None = None) -> str:
    """The `pass1_deltas` result as one Markdown table (pair, split, Δ pass@1, interval, p, MDE, problems); a split
    of fewer than `MIN_PROBLEMS` problems is not a row (its interval spans most of [−1, 1]), it is named below.
    Checkpoints by `checkpoint_label` (``algo``: ``didpo.algo``)."""
    out = [
        "## pass@1 change between consecutive checkpoints, and against the base model",
        "",
        "Δ = mean over problems of pass@1(after) − pass@1(before); interval: paired t, never narrower than the "
        'Clopper–Pearson bound for no changed problem; p: one-sided paired sign-flip test of "after is better"; '
        "MDE: the change this many problems detect with power 0.8 at α 0.05 (t formula at the observed spread; "
        "– below 2 problems). An interval that contains 0 is no change detected, not a trend.",
        "",
        "| change | split | Δ pass@1 | 95% interval | p (one-sided) | MDE | problems (changed) |",
        "|---|---|---:|---|---:|---:|---:|",
    ]
    small: dict[str, int] = {}
    for pair, per_split in deltas.items():
        before, after = (checkpoint_label(name, algo) for name in pair.split("_to_", 1))
        for split, d in per_split.items():
            if not shown(d["n_problems"]):
                small[split] = d["n_problems"]
                continue
            mde = "–" if d["mde"] is None else f"{d['mde']:.3f}"
            interval = f"[{d['low']:+.3f}, {d['high']:+.3f}]"
            out.append(
                f"| {before} → {after} | {split} | {d['delta']:+.3f} | {interval} | {d['p_value']:.4f} | "
                f"{mde} | {d['n_problems']} ({d['n_discordant']}) |"
            )
    if small:
        named = "; ".join(f"{split} ({n} problem{'s' if n != 1 else ''})" for split, n in small.items())
        out += ["", f"Not tabled, fewer than {MIN_PROBLEMS} problems: {named} (their changes are in deltas.json)."]
    return "\n".join(out) + "\n"


def passk_rows(metrics: dict, split: str, checkpoints: Sequence[str]) -> list[dict]:
    """DVC plot rows of one split: ``[{"k": k, <checkpoint>: pass@k or None, ..., "n_problems": n}]`` for every k of
    `KS`; every checkpoint of `checkpoints` is a key (None when absent), since DVC refuses a declared y field that is
    missing. A split of fewer than `MIN_PROBLEMS` problems has None everywhere (nothing to draw; ``n_problems`` says
    why)."""
    n = split_problems(metrics, split)

    def value(name: str, k: int):
        return metrics.get(name, {}).get(split, {}).get(f"pass@{k}") if shown(n) else None

    # a k without figures stays, as None: DVC's plot needs the same rows whatever n_samples is
    return [{"k": k, **{name: value(name, k) for name in checkpoints}, "n_problems": n} for k in KS]


def plot_passk(metrics: dict, path: Path, algo: str | None = None) -> None:
    """PNG: pass@k against k, one panel per split, one line per checkpoint (`checkpoint_label`, ``algo``:
    ``didpo.algo``); a split of fewer than `MIN_PROBLEMS` problems gets an empty panel that says so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(SPLITS), figsize=(4.2 * len(SPLITS), 3.6), sharey=True)
    for ax, split in zip(axes, SPLITS, strict=True):
        n = split_problems(metrics, split)
        if not shown(n):
            ax.text(0.5, 0.5, f"{n} problems\n(fewer than {MIN_PROBLEMS}):\nnot drawn", ha="center", va="center")
            ax.set(title=split, xticks=[])
            continue
        for name, per_split in metrics.items():
            m = per_split.get(split, {})
            ks = [k for k in KS if m.get(f"pass@{k}") is not None]
            if ks:
                ax.plot(ks, [m[f"pass@{k}"] for k in ks], marker="o", label=checkpoint_label(name, algo))
        ax.set(title=f"{split} ({n} problems)", xlabel="k", xscale="log", xticks=list(KS))
        ax.set_xticklabels([str(k) for k in KS])
        ax.minorticks_off()
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    axes[0].set_ylabel("pass@k")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_history(history: Sequence[dict], title: str, path: Path) -> list[str]:
    """PNG: every metric of a training history (``[{"step": s, <key>: value, ...}]``, as the training stages write
    it) against the step, one panel per key; returns the keys plotted ([] and no file when there are none)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, tuple[list, list]] = {}
    for record in history:
        for key, value in record.items():
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                xs, ys = series.setdefault(key, ([], []))
                xs.append(record["step"])
                ys.append(value)
    if not series:
        return []
    cols = min(4, len(series))
    rows = -(-len(series) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.8 * rows), squeeze=False)
    for ax, (key, (xs, ys)) in zip(axes.flat, sorted(series.items()), strict=False):
        ax.plot(xs, ys, marker="." if len(xs) < 30 else None)
        ax.set(title=key, xlabel="step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(series) :]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return sorted(series)


def read_history(path: Path) -> list[dict]:
    """A training stage's history file: ``{"history": [...]}`` (as flows/sft.py writes it) or a bare list."""
    data = json.loads(Path(path).read_text())
    return data["history"] if isinstance(data, dict) else data


def flat_metrics(metrics: dict, prefix: str = "eval") -> dict[str, float]:
    """``{"eval/<checkpoint>/<split>/<key>": value}`` for every numeric value (None dropped), for MLflow; of a split
    of fewer than `MIN_PROBLEMS` problems only ``n_problems`` (MLflow charts every metric it is given)."""
    small = too_small(metrics)
    flat = {}
    for name, per_split in metrics.items():
        for split, m in per_split.items():
            if isinstance(m, dict):
                for key, value in m.items():
                    if split in small and key != "n_problems":
                        continue
                    if isinstance(value, int | float) and not isinstance(value, bool):
                        flat[f"{prefix}/{name}/{split}/{key}"] = float(value)
            elif isinstance(m, int | float):
                flat[f"{prefix}/{name}/{split}"] = float(m)
    return flat


def evaluate_headline(metrics: dict) -> dict[str, dict]:
    """``{checkpoint: {"val.pass@1": value, "humaneval.pass@1": value}}``: the figures a person reads first, one DVC
    metric file per checkpoint (``data/evaluate/headline/<checkpoint>.json``), so ``dvc metrics show`` prints a row
    per checkpoint under the columns the baseline and the gate fill too. Test and held-out pass@1, pass@k, process
    metrics and the changes with their p-values stay in metrics.json and deltas.json, DVC outputs beside it."""
    return {
        name: {
            f"{split}.pass@1": m[split]["pass@1"]
            for split in ("val", "humaneval")
            if isinstance(m.get(split), dict) and "pass@1" in m[split]
        }
        for name, m in metrics.items()
    }


def rl_claim_record(per_problem: dict, families: dict, protocol: dict, params: Params, commit: str) -> dict:
    """`rl_claim` of this run (RL against the DPO checkpoint it started from, on val; `commit` the code's), or
    ``{"verdict": "not measured", "reason": ...}`` when ``evaluate.checkpoints`` leaves one of them out."""
    if not all(per_problem.get(name, {}).get("val") for name in ("dpo", "didpo")):
        return {"verdict": "not measured", "reason": "evaluate.checkpoints does not measure both dpo and didpo on val"}
    rl = params.didpo
    return rl_claim(
        per_problem["dpo"]["val"],
        per_problem["didpo"]["val"],
        protocol,
        rl.algo,
        params.register.alpha,
        clusters=families.get("val"),
        start="dpo",
        commit=commit,
        rl_config={
            "control": rl.reward.control,
            "shaping": rl.reward.shaping,
            "critic": rl.critic,
            "steps": rl.steps,
            "prompts_per_step": rl.prompts_per_step,
            "group_size": rl.group_size,
            "learning_rate": rl.learning_rate,
            "seed": rl.seed,
        },
    )


def selection_prefix(params: Params) -> int:
    """How many val problems (from the first) other stages use to choose or smoke-check a checkpoint: the gate and
    SFT's held-out loss (``gate.val_problems``), DPO's smoke check, the baseline. Raises ValueError when one of them
    uses every val problem (0), since the protocol then has none left."""
    used = {
        "gate.val_problems": params.gate.val_problems,
        "dpo.val_problems": params.dpo.val_problems,
        "baseline.val_problems": params.baseline.val_problems,
    }
    every = [name for name, n in used.items() if n == 0]
    if every:
        raise ValueError(f"{every} = 0 uses every val problem: the evaluation protocol needs val problems of its own")
    return max(used.values())


def evaluate(
    params: Params,
    checkpoints: dict[str, Path],
    problems_path: Path,
    champion_dir: Path,
    code: Sequence[Path],
    cache: Path,
    commit: str,
    histories: dict[str, Path],
    out: dict[str, Path],
    log,
) -> tuple[dict, dict, int | None, list[str]]:
    """The stage's work: measure `checkpoints` (``{name: folder}``) and the registry's champion (downloaded into
    `champion_dir`) on the protocol's problems of `problems_path`; an evaluation whose key (`evaluation_key`: weights,
    protocol, settings, `code`) is in `cache` is reused. `log` (a logger) gets a line per checkpoint and the warnings
    of `too_small`. Writes to `out`'s paths: ``samples`` (a folder: <checkpoint>/<split>.jsonl), ``metrics``,
    ``deltas``, ``rl_claim`` (`commit` recorded in it), ``headline`` (a folder: one file per checkpoint),
    ``protocol``, ``per_problem``, ``report``, ``passk`` (a folder: passk_<split>.json) and ``figures`` (the pass@k PNG
    and a training-curve PNG per existing file of `histories`, ``{stage: path}``).

    Returns ``(metrics, protocol, champion_version, reused)``: ``reused`` the checkpoints whose figures came from
    `cache`."""
    cfg, dtype = params.evaluate, params.base_model.dtype
    problems = select_problems(problems_path, cfg, selection_prefix(params))
    engine = resolve_engine(cfg)
    protocol = protocol_record(cfg, problems, engine)
    champion_version = download_champion(params.register.model_name, champion_dir)
    if champion_version is not None:
        checkpoints = {**checkpoints, "champion": champion_dir}
    metrics, per_problem, reused = {}, {}, []
    splits = ", ".join(f"{split} {len(rows)}" for split, rows in problems.items() if rows)
    with make_verifier(params.verifier) as verifier:
        for i, (name, path) in enumerate(checkpoints.items(), start=1):
            log.info("checkpoint %d/%d: %s (%s problems; %s)", i, len(checkpoints), name, splits, path)
            key = evaluation_key(path, dtype, cfg, protocol["id"], params.verifier, code)
            samples = out["samples"] / name
            metrics[name], per_problem[name], hit = evaluate_once(
                key, cache, samples, partial(evaluate_checkpoint, path, dtype, problems, cfg, verifier, samples, engine)
            )
            if hit:
                reused.append(name)
                log.info("%s: same weights, protocol, settings and code as %s: its figures reused", name, key)
    algo = params.didpo.algo if "didpo" in metrics else None
    families = {split: [protocol["families"][p["task_id"]] for p in rows] for split, rows in problems.items()}
    pipeline = {name: scores for name, scores in per_problem.items() if name != "champion"}
    deltas = pass1_deltas(pipeline, families, seed=cfg.seed)
    scores = {
        name: {split: dict(zip(protocol["splits"][split], values, strict=True)) for split, values in s.items()}
        for name, s in per_problem.items()
    }
    write_json(metrics, out["metrics"])
    write_json(deltas, out["deltas"])
    write_json(rl_claim_record(pipeline, families, protocol, params, commit), out["rl_claim"])
    shutil.rmtree(out["headline"], ignore_errors=True)  # a checkpoint measured last time but not now leaves no row
    for name, figures in evaluate_headline(metrics).items():
        write_json(figures, out["headline"] / f"{name}.json")
    write_json(protocol, out["protocol"])
    write_json(
        {"protocol": protocol["id"], "champion_version": champion_version, "checkpoints": scores}, out["per_problem"]
    )
    for reason in too_small(metrics).values():
        log.warning(reason)
    report = comparison_markdown(metrics, algo) + "\n" + deltas_markdown(deltas, algo).rstrip("\n")
    write_lines([report], out["report"])
    for split in SPLITS:
        write_json({"passk": passk_rows(metrics, split, list(CHECKPOINT_NAMES))}, out["passk"] / f"passk_{split}.json")
    plot_passk(metrics, out["figures"] / "passk.png", algo)
    for stage, path in histories.items():
        if path.is_file():
            plot_history(read_history(path), f"{stage} training", out["figures"] / f"training_{stage}.png")
    return metrics, protocol, champion_version, reused
