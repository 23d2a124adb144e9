"""The ``selfplay`` stage's work: K answers per training prompt, verified, best vs worst (models.selfplay)."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from models.config import SelfplayConfig
from tasks.io import atomic_write_lines


def read_pairs(path: str | Path) -> list[dict]:
    """The rows of a pairs JSONL file; [] when the file is missing or empty."""
    path = Path(path)
    if not path.is_file():
        return []
    with path.open(encoding="utf-8", errors="surrogateescape") as f:
        return [json.loads(line) for line in f if line.strip()]


@task(retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def write_pairs(pairs: list[dict], path: Path) -> None:
    """Pairs as JSONL, written atomically."""
    atomic_write_lines(path, (json.dumps(p, ensure_ascii=False) for p in pairs))


def merge_sources(selfplay: list[dict], mined: list[dict], human: list[dict]) -> list[dict]:
    """The DPO training pairs of the three sources (`models.selfplay.merge_pairs`: human first, then mined, then
    self-play); pairs of ``mined`` tagged ``source: human`` (the mine stage may carry human pairs along) count as
    human."""
    from models.selfplay import merge_pairs

    human = human + [p for p in mined if p.get("source") == "human"]
    return merge_pairs(human, [p for p in mined if p.get("source") != "human"], selfplay)


@task(cache_policy=NO_CACHE)
def generate_selfplay_pairs(model, tokenizer, problems: list[dict], cfg: SelfplayConfig, verifier) -> tuple[list, dict]:
    """K sampled answers per problem, verified in the sandbox, turned into pairs by `models.selfplay.selfplay_pairs`.

    Returns:
        ``(pairs, stats)``; stats: ``n_prompts``, ``n_answers``, ``n_selfplay_pairs``, ``answer_test_pass_rate`` (mean
        fraction of tests passed), ``answer_format_compliance`` (fraction of answers in the answer format).
    """
    from models.answer_format import check_format
    from models.measure import sample_and_verify
    from models.sampling import SamplingConfig
    from models.selfplay import selfplay_pairs

    sampling = SamplingConfig(
        n=cfg.k, temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed
    )
    results = sample_and_verify(model, tokenizer, problems, sampling, verifier) if problems else []
    pairs = [
        pair
        for problem, result in zip(problems, results, strict=True)
        for pair in selfplay_pairs(problem, result.answers, result.fractions)
    ]
    answers = [a for r in results for a in r.answers]
    fractions = [f for r in results for f in r.fractions]
    stats = {
        "n_prompts": len(problems),
        "n_answers": len(answers),
        "n_selfplay_pairs": len(pairs),
        "answer_test_pass_rate": sum(fractions) / len(fractions) if fractions else 0.0,
        "answer_format_compliance": sum(check_format(a).compliant for a in answers) / len(answers) if answers else 0.0,
    }
    return pairs, stats
