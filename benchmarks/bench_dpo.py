"""Training throughput of our DPO loop (`models.dpo.train_dpo`) against TRL's ``DPOTrainer`` (trl 1.16.0).

Same work on both sides, one process, CPU, float32:

- the same randomly initialised Llama as benchmarks/bench_sft.py (hidden 256, 4 layers, vocabulary 8192) with the
  tiny project tokenizer;
- the same fresh LoRA adapters (r 16, alpha 32, dropout 0: TRL's ``disable_dropout`` defaults to on, all attention +
  MLP projections); the reference is the model with the adapter disabled on both sides;
- the same pairs: the chat prompt of a generated data-cleaning problem, chosen = the reference answer in the project
  format (`models.sft.render_answer`), rejected = the bare code with a bug and no explanation;
- the sigmoid loss, β 0.1; reference log-probs computed once before training on both sides (TRL:
  ``precompute_ref_log_probs=True``), so a step is one policy forward + backward over 2·batch sequences;
- dynamic padding, no gradient checkpointing and no bf16 (TRL's defaults switched off), AdamW (``adamw_torch``),
  cosine schedule, clipping at 1.0, max length 512, batch 4 pairs, no evaluation, no saving;
- the first `--warmup` steps are excluded; steps/s = timed optimizer steps / their wall time, measured from the end of
  the last warm-up step to the end of the last step.

The two are run alternately `--repeats` times and the best repeat of each is reported. Last line:
``RESULT ours=<steps/s> trl=<steps/s> ratio=<ours/trl>``.

Run: ``.venv/bin/python benchmarks/bench_dpo.py [--steps 10 --warmup 2 --repeats 2 --threads N]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sft import build_model, make_problems  # noqa: E402  (the same model and problems as the SFT benchmark)


def make_pairs(n: int) -> list[dict]:
    """`n` pairs: the user message, the formatted reference answer (chosen), buggy bare code (rejected)."""
    from models.prompts import reference_code
    from models.sft import render_answer, render_user_message

    pairs = []
    for problem in make_problems(n):
        buggy = reference_code(problem).replace("return items", "return items[1:]")
        pairs.append({"prompt": render_user_message(problem), "chosen": render_answer(problem), "rejected": buggy})
    return pairs


def run_ours(pairs, args) -> float:
    from models.dpo import DPOConfig, train_dpo

    cfg = DPOConfig(
        beta=0.1,
        lora_dropout=0.0,
        batch_size=args.batch_size,
        max_steps=args.warmup + args.steps,
        epochs=3.0,
        max_seq_len=args.max_len,
        learning_rate=5e-5,
        warmup_ratio=0.0,
        eval_every=0,
        checkpoint_every=0,
        device="cpu",
    )
    marks: dict[int, float] = {}

    def emit(metrics, step):
        if "dpo/loss" in metrics:  # emitted right after optimizer step `step`
            marks[step] = time.perf_counter()

    model, tokenizer = build_model()
    with tempfile.TemporaryDirectory() as out:
        result = train_dpo(model, tokenizer, pairs, [], cfg, Path(out), emit=emit)
    assert result.global_step == args.warmup + args.steps
    return args.steps / (marks[args.warmup + args.steps] - marks[args.warmup])


def run_trl(pairs, args) -> float:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import DPOConfig, DPOTrainer

    rows = [
        {
            "prompt": [{"role": "user", "content": p["prompt"]}],
            "chosen": [{"role": "assistant", "content": p["chosen"]}],
            "rejected": [{"role": "assistant", "content": p["rejected"]}],
        }
        for p in pairs
    ]
    marks: dict[int, float] = {}

    class Clock(TrainerCallback):
        def on_step_end(self, _args, state, control, **kwargs):
            marks[state.global_step] = time.perf_counter()

    model, tokenizer = build_model()
    with tempfile.TemporaryDirectory() as out:
        config = DPOConfig(
            output_dir=out,
            per_device_train_batch_size=args.batch_size,
            gradient_accumulation_steps=1,
            max_steps=args.warmup + args.steps,
            learning_rate=5e-5,
            lr_scheduler_type="cosine",
            warmup_steps=0,
            max_grad_norm=1.0,
            optim="adamw_torch",
            weight_decay=0.0,
            max_length=args.max_len,
            loss_type=["sigmoid"],
            beta=0.1,
            precompute_ref_log_probs=True,
            gradient_checkpointing=False,
            bf16=False,
            fp16=False,
            use_cpu=True,
            eval_strategy="no",
            save_strategy="no",
            logging_steps=10_000,
            report_to="none",
            disable_tqdm=True,
            dataloader_num_workers=0,
            seed=0,
        )
        peft_config = LoraConfig(
            r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", bias="none", task_type="CAUSAL_LM"
        )
        trainer = DPOTrainer(
            model=model,
            args=config,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            peft_config=peft_config,
            callbacks=[Clock()],
        )
        trainer.train()
    return args.steps / (marks[args.warmup + args.steps] - marks[args.warmup])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--batch-size", type=int, default=4, help="pairs per step")
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--pairs", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs per side; the best counts")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: all CPUs)")
    args = parser.parse_args()

    from models.dpo import build_pair_examples
    from models.policy import configure_threads

    threads = configure_threads(args.threads)
    pairs = make_pairs(args.pairs)
    _, tokenizer = build_model()
    examples = build_pair_examples(tokenizer, pairs, args.max_len)
    lengths = [len(e[side]["input_ids"]) for e in examples for side in ("chosen", "rejected")]
    print(
        f"model: Llama h256 L4 V8192 + LoRA r16 (all linear), fp32 CPU, {threads} thread(s); batch {args.batch_size} "
        f"pairs, {args.pairs} pairs, sequences of {min(lengths)}-{max(lengths)} tokens (mean "
        f"{sum(lengths) / len(lengths):.0f}); {args.warmup} warm-up + {args.steps} timed steps, {args.repeats} repeats"
    )
    ours, trl = [], []
    for repeat in range(args.repeats):
        ours.append(run_ours(pairs, args))
        trl.append(run_trl(pairs, args))
        print(f"repeat {repeat}: ours {ours[-1]:.2f} steps/s, trl {trl[-1]:.2f} steps/s")
    best_ours, best_trl = max(ours), max(trl)
    print(f"RESULT ours={best_ours:.3f} trl={best_trl:.3f} ratio={best_ours / best_trl:.3f}")


if __name__ == "__main__":
    main()
