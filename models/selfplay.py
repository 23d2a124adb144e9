"""Self-play preference pairs: the SFT model's own best and worst answers to a training prompt.

The SFT model answers each training problem K times (`models.measure.sample_and_verify`: the sampler + the
sandboxed verifier). Each answer gets a score, compared lexicographically:

1. the fraction of the problem's tests its code passes (the verifier; correctness first),
2. format compliance (`models.answer_format.check_format`: explanation + one python block + nothing unsafe),
3. whether the code parses (a syntax error is the worse of two otherwise equal answers).

A heuristic pre-filter keeps obviously bad answers from ever being *chosen*: no code, code that does not parse, or an
unsafe pattern. The best eligible answer is paired against the worst answer when its score is strictly higher (equal
scores carry no preference) and their texts differ. `merge_pairs` then joins self-play, mined and human pairs,
tagging each with its source and dropping duplicates.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from models.answer_format import check_format
from models.prompts import user_message
from models.sampling import extract_code

SOURCES = ("human", "mined", "selfplay")


@dataclass(frozen=True)
class AnswerScore:
    """One answer's score. `rank` orders answers (higher is better); `eligible` says whether it may be chosen."""

    test_fraction: float
    compliant: bool
    parses: bool
    unsafe: tuple[str, ...]

    @property
    def rank(self) -> tuple[float, int, int]:
        return (self.test_fraction, int(self.compliant), int(self.parses))

    @property
    def eligible(self) -> bool:
        return self.parses and not self.unsafe


def score_answer(text: str, test_fraction: float) -> AnswerScore:
    """Score an answer from its text and the fraction of tests its code passed (in [0, 1]).

    ``parses`` is False when the answer has no code or its code is not valid Python (a syntax error).

    Raises:
        ValueError: `test_fraction` outside [0, 1].
    """
    if not 0.0 <= test_fraction <= 1.0:
        raise ValueError(f"test_fraction must be in [0, 1], got {test_fraction}")
    code = extract_code(text)
    try:
        parses = bool(code.strip()) and ast.parse(code) is not None
    except (SyntaxError, ValueError):
        parses = False
    report = check_format(text)
    return AnswerScore(test_fraction, report.compliant, parses, report.unsafe)


def selfplay_pairs(problem: dict, completions: Sequence[str], test_results: Sequence[float]) -> list[dict]:
    """The self-play pair of one problem: its best eligible answer (chosen) against its worst answer (rejected).

    Args:
        problem: a row in the problem schema (needs ``task_id``, ``instruction``, ``prompt``, ``entry_point``; the
            user turn is `models.prompts.user_message`, the exact prompt the answers were sampled for).
        completions: the K answer texts.
        test_results: for each answer, the fraction of the problem's tests its code passed (the verifier's
            ``Verdict.fraction``), in [0, 1].

    Returns:
        ``[]`` when no answer is eligible, when the best and worst scores are equal, or when their texts are the same;
        otherwise one pair ``{"prompt", "chosen", "rejected", "source": "selfplay", "task_id", "chosen_score",
        "rejected_score"}`` with scores as ``[test_fraction, compliant]``. Among equal scores the earliest answer is
        chosen and the latest rejected (deterministic).

    Raises:
        ValueError: `completions` and `test_results` differ in length, or a fraction is outside [0, 1].
    """
    if len(completions) != len(test_results):
        raise ValueError(f"{len(completions)} completions but {len(test_results)} test results")
    scores = [score_answer(text, fraction) for text, fraction in zip(completions, test_results, strict=True)]
    eligible = [i for i, s in enumerate(scores) if s.eligible]
    if not eligible:
        return []
    best = max(eligible, key=lambda i: (scores[i].rank, -i))
    worst = min(range(len(scores)), key=lambda i: (scores[i].rank, -i))
    if scores[best].rank <= scores[worst].rank or completions[best].strip() == completions[worst].strip():
        return []
    return [
        {
            "prompt": user_message(problem),
            "chosen": completions[best],
            "rejected": completions[worst],
            "source": "selfplay",
            "task_id": problem["task_id"],
            "chosen_score": [scores[best].test_fraction, scores[best].compliant],
            "rejected_score": [scores[worst].test_fraction, scores[worst].compliant],
        }
    ]


_SPACE = re.compile(r"\s+")


def _key(row: dict) -> tuple[str, str, str]:
    return tuple(_SPACE.sub(" ", row[k]).strip() for k in ("prompt", "chosen", "rejected"))


def merge_pairs(human: Iterable[dict], mined: Iterable[dict], selfplay: Iterable[dict]) -> list[dict]:
    """One pair list: human, then mined, then self-play pairs, each tagged ``source`` = "human" | "mined" |
    "selfplay" (a mined row's own ``source``, e.g. "logs", is kept as ``origin``), without duplicates.

    Two pairs are duplicates when prompt, chosen and rejected are equal after collapsing whitespace; the first one
    (in the order above: human annotations win) is kept. Rows whose chosen equals rejected are dropped.
    """
    out, seen = [], set()
    for source, rows in (("human", human), ("mined", mined), ("selfplay", selfplay)):
        for row in rows:
            key = _key(row)
            if key in seen or key[1] == key[2]:
                continue
            seen.add(key)
            tagged = dict(row)
            if row.get("source") not in (None, source):
                tagged["origin"] = row["source"]
            tagged["source"] = source
            out.append(tagged)
    return out
