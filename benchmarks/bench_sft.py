"""Training throughput of our SFT loop (`models.sft.train_sft`) against TRL's ``SFTTrainer`` (trl 1.16.0).

Same work on both sides, one process, CPU, float32:

- the same randomly initialised Llama (hidden 256, 4 layers, 4 heads / 2 kv heads, MLP 640, vocabulary 8192 so
  that the LM head weighs what it does in a real model; the tiny project tokenizer uses the first 384 ids);
- the same LoRA adapters (r 16, alpha 32, dropout 0.05, all attention + MLP projections);
- the same chats (``models.sft.render_messages`` of generated data-cleaning problems with 1-4 steps), loss on
  the completion only (TRL: a conversational prompt-completion dataset, ``completion_only_loss`` defaults to on),
  dynamic padding to the longest example of the batch, no packing, no padding-free, no gradient checkpointing
  (TRL's default is on: switched off here), no bf16 (TRL's default is on: switched off here), AdamW
  (``adamw_torch``), cosine schedule, clipping at 1.0, max length 512, batch 8, no evaluation, no saving;
- the first `--warmup` steps are excluded; throughput = real (non-padding) input tokens of the timed steps /
  their wall time, measured from the end of the last warm-up step to the end of the last step.

The two are run alternately `--repeats` times and the best repeat of each is reported, which damps the noise of
a shared machine. Last line: ``RESULT ours=<tok/s> trl=<tok/s> ratio=<ours/trl>``.

Run: ``.venv/bin/python benchmarks/bench_sft.py [--steps 10 --warmup 2 --repeats 3 --threads N]``
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

STEP_TEMPLATES = [
    ("handle a missing input", "if items is None:\n        return []"),
    ("strip each string", "items = [s.strip() if isinstance(s, str) else s for s in items]"),
    ("drop the empty values", "items = [s for s in items if s not in ('', None)]"),
    ("normalise the case", "items = [s.lower() if isinstance(s, str) else s for s in items]"),
]


def make_problems(n: int) -> list[dict]:
    """`n` data-cleaning problems in the data/README.md schema, with 1 to 4 steps (varied lengths)."""
    problems = []
    for i in range(n):
        k = 1 + i % len(STEP_TEMPLATES)
        name = f"clean_items_{i}"
        chosen = STEP_TEMPLATES[:k]
        doc = ", then ".join(s for s, _ in chosen)
        prompt = f'def {name}(items: list) -> list:\n    """Clean a list of values: {doc}."""\n'
        body = (
            "".join(f"    # Step {j + 1}: {s}\n    {code}\n" for j, (s, code) in enumerate(chosen))
            + "    return items\n"
        )
        problems.append(
            {
                "task_id": f"Bench/{i}",
                "prompt": prompt,
                "entry_point": name,
                "canonical_solution": body,
                "test": "def check(candidate):\n    assert candidate([]) == []\n",
                "steps": [f"Step {j + 1}: {s}" for j, (s, _) in enumerate(chosen)],
                "instruction": f"Write a Python function `{name}` that cleans a list: {doc}.",
                "split": "train",
            }
        )
    return problems


def build_model(seed: int = 0):
    """The benchmark Llama (random weights from `seed`) and the tiny project tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from models.policy import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=8192,
        hidden_size=256,
        intermediate_size=640,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config), tokenizer


def run_ours(problems, args) -> float:
    from models.sft import SFTConfig, train_sft

    cfg = SFTConfig(
        batch_size=args.batch_size,
        max_steps=args.warmup + args.steps,
        max_seq_len=args.max_len,
        learning_rate=2e-4,
        warmup_ratio=0.0,
        eval_every=0,
        checkpoint_every=0,
        device="cpu",
    )
    marks: dict[int, float] = {}

    def emit(metrics, step):
        if "sft/loss" in metrics:  # emitted right after optimizer step `step`
            marks[step] = time.perf_counter()

    model, tokenizer = build_model()
    with tempfile.TemporaryDirectory() as out:
        result = train_sft(model, tokenizer, problems, [], cfg, Path(out), emit=emit)
    assert result.global_step == args.warmup + args.steps
    elapsed = marks[args.warmup + args.steps] - marks[args.warmup]
    return count_our_tokens(problems, tokenizer, cfg, args) / elapsed


def count_our_tokens(problems, tokenizer, cfg, args) -> int:
    """Real input tokens of our timed steps (the same seeded order `train_sft` draws)."""
    from models.sft import DataOrder, build_sft_examples

    examples = build_sft_examples(tokenizer, problems, max_seq_len=cfg.max_seq_len)
    order = DataOrder(len(examples), cfg.seed)
    counts = [sum(len(examples[i]["input_ids"]) for i in order.take(cfg.batch_size)) for _ in range(cfg.max_steps)]
    return sum(counts[args.warmup :])


def run_trl(problems, args) -> float:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from models.sft import render_messages

    rows = []
    for p in problems:
        user, assistant = render_messages(p)
        rows.append({"prompt": [user], "completion": [assistant]})
    marks: dict[int, tuple[float, int]] = {}

    class Clock(TrainerCallback):
        def on_step_end(self, _args, state, control, **kwargs):
            marks[state.global_step] = (time.perf_counter(), state.num_input_tokens_seen)

    model, tokenizer = build_model()
    with tempfile.TemporaryDirectory() as out:
        config = SFTConfig(
            output_dir=out,
            per_device_train_batch_size=args.batch_size,
            gradient_accumulation_steps=1,
            max_steps=args.warmup + args.steps,
            learning_rate=2e-4,
            lr_scheduler_type="cosine",
            warmup_steps=0,
            max_grad_norm=1.0,
            optim="adamw_torch",
            weight_decay=0.0,
            max_length=args.max_len,
            packing=False,
            padding_free=False,
            completion_only_loss=True,
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
            include_num_input_tokens_seen="non_padding",
            seed=0,
        )
        peft_config = LoraConfig(
            r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear", bias="none", task_type="CAUSAL_LM"
        )
        trainer = SFTTrainer(
            model=model,
            args=config,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            peft_config=peft_config,
            callbacks=[Clock()],
        )
        trainer.train()
    (start, seen_start), (end, seen_end) = marks[args.warmup], marks[args.warmup + args.steps]
    return (seen_end - seen_start) / (end - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--problems", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs per side; the best counts")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: all CPUs)")
    args = parser.parse_args()

    from models.policy import configure_threads

    threads = configure_threads(args.threads)
    problems = make_problems(args.problems)
    _, tokenizer = build_model()
    from models.sft import build_sft_examples

    lengths = [len(e["input_ids"]) for e in build_sft_examples(tokenizer, problems, max_seq_len=args.max_len)]
    print(
        f"model: Llama h256 L4 V8192 + LoRA r16 (all linear), fp32 CPU, {threads} thread(s); batch {args.batch_size}, "
        f"{args.problems} chats of {min(lengths)}-{max(lengths)} tokens (mean {sum(lengths) / len(lengths):.0f}); "
        f"{args.warmup} warm-up + {args.steps} timed steps, {args.repeats} repeats"
    )
    ours, trl = [], []
    for repeat in range(args.repeats):
        ours.append(run_ours(problems, args))
        trl.append(run_trl(problems, args))
        print(f"repeat {repeat}: ours {ours[-1]:.0f} tok/s, trl {trl[-1]:.0f} tok/s")
    best_ours, best_trl = max(ours), max(trl)
    print(f"RESULT ours={best_ours:.0f} trl={best_trl:.0f} ratio={best_ours / best_trl:.3f}")


if __name__ == "__main__":
    main()
