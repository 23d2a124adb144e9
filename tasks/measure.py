"""Measuring a checkpoint on problems: loading it, the generation engine, pass@k of a split, greedy
results (the gate, baseline, selfplay, DPO, RL and evaluate stages share these)."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from models import openvino_engine, vllm_engine  # modules: tests patch their engine_available
from models.measure import sample_and_verify, summarise
from models.policy import load_policy
from models.sampling import SamplingConfig
from tasks.config import BaselineConfig, GateConfig
from tasks.io import atomic_write_lines


@task(retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def write_results(results, path: Path) -> None:
    """Per-problem results (n, c, per-sample test fractions, reasons, answers) as JSONL, for people to read."""
    from dataclasses import asdict

    atomic_write_lines(path, (json.dumps(asdict(r), ensure_ascii=False) for r in results))


def resolve_engine(engine: str, precision: str, stage: str) -> tuple[str, str]:
    """The generation engine a stage uses, ``(name, precision)``: ``engine`` when it can run here, else ``("torch",
    "f32")`` with a warning naming ``stage`` and why."""
    import logging

    if engine == "torch":
        return "torch", "f32"
    reason = (vllm_engine if engine == "vllm" else openvino_engine).engine_available()
    if reason:
        logging.getLogger(__name__).warning("%s: the torch sampler is used: %s", stage, reason)
        return "torch", "f32"
    return engine, precision


def load_checkpoint(checkpoint: Path, dtype: str):
    """``(model, tokenizer)`` of a checkpoint folder in eval mode, for the stages that sample from it
    (`models.policy.load_policy`; ``dtype`` is params.yaml's ``base_model.dtype``)."""
    return load_policy(checkpoint, dtype=dtype)


def make_sampler(checkpoint: Path, tokenizer, engine: tuple[str, str]):
    """The engine's sampler for ``checkpoint`` (`resolve_engine`'s choice): an `models.openvino_engine.OpenVINOSampler`
    (the checkpoint exported once to .cache/openvino, by its weights' digest), a `models.vllm_engine.VLLMSampler`
    (dtype float32 or bfloat16 by the precision), or None for the torch sampler."""
    if engine[0] == "vllm":
        return vllm_engine.VLLMSampler(
            Path(checkpoint), tokenizer, dtype={"f32": "float32", "bf16": "bfloat16"}[engine[1]]
        )
    if engine[0] != "openvino":
        return None
    import torch

    ir = openvino_engine.export(Path(checkpoint), Path(".cache/openvino"))
    return openvino_engine.OpenVINOSampler(ir, tokenizer, precision=engine[1], threads=torch.get_num_threads())


@task(cache_policy=NO_CACHE)
def measure_split(
    model,
    tokenizer,
    problems,
    cfg: BaselineConfig | GateConfig,
    verifier,
    out: Path,
    split: str,
    greedy: bool = True,
    sampler=None,
) -> dict:
    """pass@1/pass@k from ``cfg.n_samples`` answers per problem at the configured temperature, and (``greedy``) the
    greedy pass@1 of one answer at temperature 0. Writes per-problem results to ``out/{split}_*.jsonl``.
    ``sampler``: the engine (`make_sampler`), None for the torch sampler."""
    sampled = SamplingConfig(
        n=cfg.n_samples, temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed
    )
    metrics: dict = {"n_problems": len(problems), "n_samples": cfg.n_samples}
    if greedy:
        one = SamplingConfig(n=1, temperature=0.0, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed)
        greedy_results = (
            sample_and_verify(model, tokenizer, problems, one, verifier, sampler=sampler) if problems else []
        )
        write_results(greedy_results, out / f"{split}_greedy.jsonl")
        if greedy_results:
            metrics["greedy_pass@1"] = summarise(greedy_results, ks=[1])["pass@1"]
    results = sample_and_verify(model, tokenizer, problems, sampled, verifier, sampler=sampler) if problems else []
    write_results(results, out / f"{split}_samples.jsonl")
    metrics.update(summarise(results, ks=sorted({1, 5, 10, cfg.k} & set(range(1, cfg.n_samples + 1)))))
    return metrics


def greedy_results(model, tokenizer, problems, max_new_tokens: int, seed: int, verifier, out: Path, sampler=None):
    """One greedy answer per problem (temperature 0, at most `max_new_tokens` tokens), verified; the per-problem
    `models.measure.ProblemResult` list, also written to `out` (JSONL)."""
    one = SamplingConfig(n=1, temperature=0.0, max_new_tokens=max_new_tokens, seed=seed)
    results = sample_and_verify(model, tokenizer, problems, one, verifier, sampler=sampler) if problems else []
    write_results(results, out)
    return results
