"""Generation throughput: OpenVINO GenAI (`models.openvino_engine`) vs our torch sampler (`models.sampling.sample`).

    .venv/bin/python benchmarks/bench_generation.py [--model data/checkpoints/base --prompts 4 --repeats 3]

Needs the converted base model (``dvc repro base_model``) and the export environment (``make export-env``); the
checkpoint is exported once (cached under .cache/openvino by its weights' digest; the export time is printed, not
timed). Same work on both sides, one process, CPU, 2 threads each (``--threads``), fp32 weights: the first
``--prompts`` HumanEval problems as chat requests (`models.prompts.user_message`), ``--n`` answers per prompt at
temperature 0.8, top-p 0.95, up to ``--max-new-tokens`` tokens, stopping at eos only (the code-block stop is off on
both sides, so neither stops earlier than the other could). Both decode the 4 × 16 rows together (the default
batch of 64 rows; the engine in one left-padded call).

Same work is checked first: greedy answers (temperature 0, all prompts in one batch) from the engine at f32 must equal
ours token for token (``CHECK same_work=ok``; otherwise ``same_work=FAIL`` and exit 1). Throughput = generated tokens
(eos included) / wall time, counted the same way on both sides (completion ids). The three arms alternate
(`repeats.alternate`: A B C, C B A, A B C, ...), ``--repeats`` times each; the median and the range are printed. The
engine also runs with the bf16 inference hint, reported beside, not in the RESULT (without native bf16 in the CPU,
AVX512-BF16 or AMX, the hint runs emulated). Last line:
``RESULT engine=openvino-f32 tokens_per_s=<median> ratio=<engine/ours median>``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from repeats import alternate, check_same_work, spread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="data/checkpoints/base")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if not (Path(args.model) / "config.json").exists():
        sys.exit(f"{args.model} has no config.json: run `dvc repro base_model` first, or pass --model <HF model dir>")

    import torch

    from models import openvino_engine as engine
    from models.policy import load_policy
    from models.prompts import user_message
    from models.sampling import SamplingConfig, build_chat_prompt, sample
    from tasks.prepare import humaneval_problems

    reason = engine.engine_available()
    if reason:
        sys.exit(f"the OpenVINO engine is not available: {reason}")
    torch.set_num_threads(args.threads)
    model, tokenizer = load_policy(Path(args.model), dtype="float32")
    model.eval()
    prompts = [build_chat_prompt(tokenizer, user_message(p)) for p in humaneval_problems.fn()[: args.prompts]]
    t0 = time.perf_counter()
    ir = engine.export(Path(args.model), Path(".cache/openvino"))
    print(f"export (or cache hit): {time.perf_counter() - t0:.1f} s → {ir}")
    samplers = {p: engine.OpenVINOSampler(ir, tokenizer, precision=p, threads=args.threads) for p in ("f32", "bf16")}

    greedy = SamplingConfig(n=1, temperature=0.0, max_new_tokens=args.max_new_tokens, stop_on_code_block=False)
    ours_greedy = sample(model, tokenizer, prompts, greedy, progress=False)
    theirs_greedy = samplers["f32"].sample(prompts, greedy)
    same = [a[0].completion_ids == b[0].completion_ids for a, b in zip(ours_greedy, theirs_greedy, strict=True)]
    tokens = sum(len(g[0].completion_ids) for g in ours_greedy)
    check_same_work(
        all(same),
        f"greedy answers of {len(prompts)} prompts equal token for token ({tokens} tokens; {same.count(False)} differ)",
    )

    config = SamplingConfig(
        n=args.n, temperature=0.8, top_p=0.95, max_new_tokens=args.max_new_tokens, stop_on_code_block=False
    )

    def timed(run) -> Callable[[], float]:
        def rate() -> float:
            t0 = time.perf_counter()
            n_tokens = sum(len(c.completion_ids) for g in run() for c in g)
            return n_tokens / (time.perf_counter() - t0)

        return rate

    ours_name = "ours (torch, 64 rows)"
    rates = alternate(
        {
            ours_name: timed(lambda: sample(model, tokenizer, prompts, config, progress=False)),
            "openvino f32": timed(lambda: samplers["f32"].sample(prompts, config)),
            "openvino bf16": timed(lambda: samplers["bf16"].sample(prompts, config)),
        },
        args.repeats,
    )
    medians = {name: spread(name, values, "tok/s") for name, values in rates.items()}
    ours = medians[ours_name]
    print(f"openvino bf16 hint: {medians['openvino bf16']:.1f} tok/s, ratio {medians['openvino bf16'] / ours:.2f}")
    print(
        f"RESULT engine=openvino-f32 tokens_per_s={medians['openvino f32']:.1f} "
        f"ratio={medians['openvino f32'] / ours:.2f}"
    )


if __name__ == "__main__":
    main()
