"""Sample answers, run them in the sandbox, estimate pass@k: the measurement shared by baseline, gate and evaluate.

One name for one concept: measuring a checkpoint on problems is ``measure`` in both layers (this module, and
`tasks.measure` for the stages' side: loading, the engine, writing results); ``evaluate`` is the stage that
measures every checkpoint under the evaluation protocol (`tasks.evaluate`).

Source: Chen et al. 2021, "Evaluating Large Language Models Trained on Code", §2.1 (unbiased pass@k from n ≥ k
samples with c correct).
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass

from models.passk import pass_at_k
from models.prompts import user_message
from models.sampling import SamplingConfig, build_chat_prompt, sample


@dataclass(frozen=True)
class ProblemResult:
    """One problem's samples and verdicts.

    n: samples drawn; c: samples passing every test; fractions: per sample, the fraction of tests passed (reward V2);
    reasons: per sample, the verifier's verdict reason; answers: the raw answers (for people to read).
    """

    task_id: str
    split: str
    n: int
    c: int
    fractions: tuple[float, ...]
    reasons: tuple[str, ...]
    answers: tuple[str, ...]

    def pass_at(self, k: int) -> float:
        """Unbiased pass@k of this problem (raises ValueError when n < k)."""
        return pass_at_k(self.n, self.c, k)


def _defines(code: str, name: str) -> bool:
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return any(isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name for node in tree.body)


def _import_lines(prompt: str) -> str:
    return "".join(
        line + "\n" for line in prompt.splitlines() if line.startswith("import ") or line.startswith("from ")
    )


def assemble_program(problem: dict, code: str) -> str:
    """The program to verify: the answer's code when it defines the entry point (with the prompt's imports
    prepended, since answers often omit them), else the prompt followed by the code as the function body."""
    if _defines(code, problem["entry_point"]):
        return _import_lines(problem["prompt"]) + code
    body = "".join(("    " + line if line.strip() else line) + "\n" for line in code.splitlines())
    return problem["prompt"] + (body if not code.startswith("    ") else code)


def sample_and_verify(
    model,
    tokenizer,
    problems: Sequence[dict],
    sampling: SamplingConfig,
    verifier,
    progress: bool = True,
    sampler=None,
) -> list[ProblemResult]:
    """Draw ``sampling.n`` answers per problem and verify each in the sandbox.

    Args:
        problems: rows in the problem schema (data/README.md).
        verifier: a ``sandbox.verifier.Verifier`` (its ``check_many`` runs the programs in parallel).
        sampler: an engine with ``sample(prompts, sampling)`` returning what `models.sampling.sample` returns (e.g.
            `models.openvino_engine.OpenVINOSampler` of the same checkpoint); None: the torch sampler on ``model``.
    Returns:
        one :class:`ProblemResult` per problem, in input order.
    """
    prompts = [build_chat_prompt(tokenizer, user_message(p)) for p in problems]
    if sampler is None:
        completions = sample(model, tokenizer, prompts, sampling, progress=progress)
    else:
        completions = sampler.sample(prompts, sampling, progress=progress)
    jobs = [
        (assemble_program(p, c.code), p["test"], p["entry_point"])
        for p, samples in zip(problems, completions, strict=True)
        for c in samples
    ]
    verdicts = verifier.check_many(jobs, progress=progress)
    results, i = [], 0
    for p, samples in zip(problems, completions, strict=True):
        vs = verdicts[i : i + len(samples)]
        i += len(samples)
        results.append(
            ProblemResult(
                task_id=p["task_id"],
                split=p["split"],
                n=len(samples),
                c=sum(v.passed for v in vs),
                fractions=tuple(v.fraction for v in vs),
                reasons=tuple(v.reason for v in vs),
                answers=tuple(c.text for c in samples),
            )
        )
    return results


def summarise(results: Sequence[ProblemResult], ks: Sequence[int]) -> dict[str, float]:
    """Mean pass@k over problems for each k ≤ n, and the mean fraction of tests passed.

    Returns keys ``pass@{k}`` and ``test_pass_rate``; an empty ``results`` gives ``{}``.
    """
    if not results:
        return {}
    out = {}
    for k in ks:
        if all(r.n >= k for r in results):
            out[f"pass@{k}"] = sum(r.pass_at(k) for r in results) / len(results)
    fractions = [f for r in results for f in r.fractions]
    out["test_pass_rate"] = sum(fractions) / len(fractions)
    return out
