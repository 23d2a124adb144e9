"""The ``selfplay`` stage's work: K answers per training prompt, verified, best vs worst (models.selfplay)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from models.answer_format import check_format
from models.config import SelfplayConfig
from models.measure import sample_and_verify
from models.sampling import SamplingConfig
from models.selfplay import merge_pairs, score_answer, selfplay_pairs
from tasks.config import Params
from tasks.io import atomic_write_lines, headline, read_pairs, read_problems, write_json
from tasks.measure import load_checkpoint
from tasks.sandbox import make_verifier

HEADLINE = {"pairs": "n_pairs"}  # the DVC metric (tasks.io.headline): the training pairs DPO gets, every source


@task(retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def write_pairs(pairs: list[dict], path: Path) -> None:
    """Pairs as JSONL, written atomically."""
    atomic_write_lines(path, (json.dumps(p, ensure_ascii=False) for p in pairs))


def merge_sources(selfplay: list[dict], mined: list[dict], human: list[dict]) -> list[dict]:
    """The DPO training pairs of the three sources (`models.selfplay.merge_pairs`: human first, then mined, then
    self-play); pairs of ``mined`` tagged ``source: human`` (the mine stage may carry human pairs along) count as
    human."""
    human = human + [p for p in mined if p.get("source") == "human"]
    return merge_pairs(human, [p for p in mined if p.get("source") != "human"], selfplay)


@task(cache_policy=NO_CACHE)
def generate_selfplay_pairs(model, tokenizer, problems: list[dict], cfg: SelfplayConfig, verifier) -> tuple[list, dict]:
    """K sampled answers per problem, verified in the sandbox, turned into pairs by `models.selfplay.selfplay_pairs`.

    Returns:
        ``(pairs, stats)``; stats: ``n_prompts``, ``n_answers``, ``n_selfplay_pairs``, ``answer_test_pass_rate`` (mean
        fraction of tests passed), ``answer_format_compliance`` (fraction of answers in the answer format).
    """
    sampling = SamplingConfig(
        n=cfg.k, temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed
    )
    results = sample_and_verify(model, tokenizer, problems, sampling, verifier) if problems else []
    pairs, no_pair = [], Counter()
    for problem, result in zip(problems, results, strict=True):
        found = selfplay_pairs(problem, result.answers, result.fractions)
        pairs += found
        if not found:
            no_pair[no_pair_reason(result.answers, result.fractions)] += 1
    answers = [a for r in results for a in r.answers]
    fractions = [f for r in results for f in r.fractions]
    stats = {
        "n_prompts": len(problems),
        "n_answers": len(answers),
        "n_selfplay_pairs": len(pairs),
        "answer_test_pass_rate": sum(fractions) / len(fractions) if fractions else 0.0,
        "answer_format_compliance": sum(check_format(a).compliant for a in answers) / len(answers) if answers else 0.0,
        **{f"no_pair/{reason}": no_pair.get(reason, 0) for reason in NO_PAIR_REASONS},
    }
    return pairs, stats


# Why a prompt gave no self-play pair (`no_pair_reason`), as counted in the stage's metrics (``no_pair/<reason>``).
NO_PAIR_REASONS = ("no_usable_answer", "all_passed", "all_failed", "equal_scores", "same_text")


def no_pair_reason(answers: Sequence[str], fractions: Sequence[float]) -> str:
    """Why `models.selfplay.selfplay_pairs` made no pair of these answers: ``no_usable_answer`` (none has code that
    parses and is safe: nothing may be chosen), ``all_passed`` / ``all_failed`` (every answer scored the same, all
    passing every test / none passing any), ``equal_scores`` (every answer scored the same otherwise), or
    ``same_text`` (the best and the worst answer are the same text)."""
    scores = [score_answer(text, fraction) for text, fraction in zip(answers, fractions, strict=True)]
    if not any(score.eligible for score in scores):
        return "no_usable_answer"
    if len({score.rank for score in scores}) > 1:
        return "same_text"
    fraction = scores[0].test_fraction  # every answer's
    return "all_passed" if fraction == 1.0 else "all_failed" if fraction == 0.0 else "equal_scores"


def no_selfplay_pairs_warning(stats: dict, cfg: SelfplayConfig, n_pairs: int) -> str | None:
    """What the console says when self-play made no pair (None when it made some): the prompts per reason
    (`no_pair_reason`) and the ``selfplay`` keys to turn; `n_pairs` is every source's total (0: DPO gets nothing)."""
    if stats.get("n_selfplay_pairs"):
        return None
    if not stats.get("n_prompts"):
        return "self-play made 0 pairs: it had no train problem to answer (selfplay.n_prompts, the train split)"
    counts = {reason: stats.get(f"no_pair/{reason}", 0) for reason in NO_PAIR_REASONS}
    shown = ", ".join(f"{reason} {n}" for reason, n in counts.items() if n)
    knobs = [f"more prompts (selfplay.n_prompts = {cfg.n_prompts}; 0 = every train problem)"]
    if counts["all_passed"] + counts["all_failed"] + counts["equal_scores"] + counts["same_text"]:
        knobs.append(
            f"more answers per prompt (selfplay.k = {cfg.k}) or more varied ones (selfplay.temperature = "
            f"{cfg.temperature})"
        )
    if counts["no_usable_answer"]:
        knobs.append(f"a longer answer budget (selfplay.max_new_tokens = {cfg.max_new_tokens}) if answers are cut off")
    total = "DPO gets no pair from any source" if not n_pairs else f"DPO gets the {n_pairs} mined and human pairs"
    return f"self-play made 0 pairs from {stats['n_prompts']} prompts ({shown}); {total}; to get pairs: " + "; ".join(
        knobs
    )


def selfplay(
    params: Params,
    problems_path: Path,
    sft_merged: Path,
    mined_pairs: Path,
    human_pairs: Path,
    pairs_out: Path,
    metrics_out: Path,
    headline_out: Path,
) -> tuple[dict, str | None]:
    """The stage's work: the SFT model (`sft_merged`) answers ``selfplay.n_prompts`` train prompts K times, best vs
    worst become pairs, merged with the mined and human pairs (as ``selfplay`` includes them) into `pairs_out`; counts
    per source to `metrics_out` and their headline to `headline_out`. Returns ``(metrics, warning)``: the warning of
    `no_selfplay_pairs_warning` when self-play made no pair, else None."""
    cfg = params.selfplay
    model, tokenizer = load_checkpoint(sft_merged, params.base_model.dtype)
    problems = read_problems(problems_path, "train", cfg.n_prompts, required=True)
    with make_verifier(params.verifier) as verifier:
        pairs_selfplay, stats = generate_selfplay_pairs(model, tokenizer, problems, cfg, verifier)
    mined = read_pairs(mined_pairs) if cfg.include_mined else []
    human = read_pairs(human_pairs) if cfg.include_human else []
    pairs = merge_sources(pairs_selfplay, mined, human)
    counts = Counter(p["source"] for p in pairs)
    metrics = {
        **stats,
        "n_pairs": len(pairs),
        **{f"n_{s}_pairs_kept": counts.get(s, 0) for s in ("human", "mined", "selfplay")},
    }
    write_pairs(pairs, pairs_out)
    write_json(metrics, metrics_out)
    write_json(headline(metrics, HEADLINE), headline_out)
    return metrics, no_selfplay_pairs_warning(stats, cfg, len(pairs))
