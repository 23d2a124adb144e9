"""RL iteration throughput (rollouts + verification + update) of our loop (`models.rl.train_rl`, algo ``grpo``)
against TRL's ``GRPOTrainer`` (trl 1.16.0).

Same work on both sides, one process, CPU, float32:

- the same randomly initialised Llama as benchmarks/bench_sft.py (hidden 256, 4 layers, 4 heads / 2 kv heads,
  MLP 640, vocabulary 8192; the tiny project tokenizer uses the first 384 ids), the same LoRA adapters (r 16,
  alpha 32, dropout 0, all linear layers);
- the same prompts (the chat-rendered user messages of generated data-cleaning problems, `models.prompts`),
  `--prompts` prompts × `--group-size` samples per iteration, sampled at temperature 1, top-p 1, up to
  `--max-new-tokens` tokens (a random model rarely stops early, so completions run to the limit on both sides);
- the same reward: the fraction of unit tests passed, from the same sandboxed verifier (`models.verifier`);
- the same update: group-normalised advantages (std + 1e-4), clipped surrogate ε = 0.2 with per-sequence
  aggregation (TRL ``loss_type="grpo"``), no KL term (β = 0, no reference forward), one optimizer step per
  iteration over the whole batch (TRL: batch = prompts × group size, gradient accumulation 1, one iteration per
  generation), AdamW, clipping at 1.0; no gradient checkpointing, no bf16 (TRL defaults switched off here).

Throughput = completions of the timed iterations / their wall time, measured from the end of the last warm-up
iteration to the end of the last one. The two are run alternately `--repeats` times; the best repeat of each
counts (damps the noise of a shared machine). Last line: ``RESULT ours=<samples/s> trl=<samples/s> ratio=<ours/trl>``.

Run: ``.venv/bin/python benchmarks/bench_rl.py [--steps 4 --warmup 1 --repeats 2 --threads 1]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_sft import build_model, make_problems  # noqa: E402  (the same model and problems as the SFT bench)


def run_ours(problems, verifier, args) -> float:
    from models.rl import RLConfig, train_rl

    cfg = RLConfig(
        algo="grpo",
        steps=args.warmup + args.steps,
        prompts_per_step=args.prompts,
        group_size=args.group_size,
        max_new_tokens=args.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        learning_rate=1e-5,
        ppo_epochs=1,
        minibatch_size=args.prompts * args.group_size,
        eps_low=0.2,
        kl_coef=0.0,
        target_kl=0.0,
        lora_r=16,
        lora_alpha=32.0,
        lora_dropout=0.0,
        checkpoint_every=0,
        device="cpu",
        screen_samples=0,  # TRL's GRPOTrainer has no prompt screen: time the same loop
    )
    marks: dict[int, float] = {}

    def emit(metrics, step):
        marks[step] = time.perf_counter()

    model, tokenizer = build_model()
    with tempfile.TemporaryDirectory() as out:
        result = train_rl(model, tokenizer, problems, cfg, verifier, Path(out), emit=emit)
    assert result.global_step == cfg.steps
    elapsed = marks[cfg.steps] - marks[args.warmup]
    return args.steps * args.prompts * args.group_size / elapsed


def run_trl(problems, verifier, args) -> float:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from models.evaluation import assemble_program
    from models.prompts import user_message
    from models.sampling import extract_code

    by_id = {p["task_id"]: p for p in problems}
    rows = [{"prompt": [{"role": "user", "content": user_message(p)}], "task_id": p["task_id"]} for p in problems]

    def tests_passed(prompts, completions, task_id, **kwargs):
        jobs = []
        for completion, tid in zip(completions, task_id, strict=True):
            p = by_id[tid]
            jobs.append((assemble_program(p, extract_code(completion[0]["content"])), p["test"], p["entry_point"]))
        return [v.fraction for v in verifier.check_many(jobs)]

    marks: dict[int, float] = {}

    class Clock(TrainerCallback):
        def on_step_end(self, _args, state, control, **kwargs):
            marks[state.global_step] = time.perf_counter()

    model, tokenizer = build_model()
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=args.prompts * args.group_size,
            gradient_accumulation_steps=1,
            num_generations=args.group_size,
            max_completion_length=args.max_new_tokens,
            temperature=1.0,
            top_p=1.0,
            num_iterations=1,
            beta=0.0,
            epsilon=0.2,
            loss_type="grpo",
            scale_rewards="group",
            max_steps=args.warmup + args.steps,
            learning_rate=1e-5,
            lr_scheduler_type="constant",
            max_grad_norm=1.0,
            optim="adamw_torch",
            weight_decay=0.0,
            gradient_checkpointing=False,
            bf16=False,
            fp16=False,
            use_cpu=True,
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
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=tests_passed,
            args=config,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            peft_config=peft_config,
            callbacks=[Clock()],
        )
        trainer.train()
    elapsed = marks[args.warmup + args.steps] - marks[args.warmup]
    return args.steps * args.prompts * args.group_size / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="timed RL iterations per run")
    parser.add_argument("--warmup", type=int, default=1, help="untimed iterations first")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per iteration")
    parser.add_argument("--group-size", type=int, default=4, help="samples per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--problems", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs per side; the best counts")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: all CPUs)")
    args = parser.parse_args()

    from models.policy import configure_threads
    from models.sampling import build_chat_prompt
    from models.verifier import Verifier, VerifierConfig

    threads = configure_threads(args.threads)
    problems = make_problems(args.problems)
    _, tokenizer = build_model()
    from models.prompts import user_message

    lengths = [len(tokenizer(build_chat_prompt(tokenizer, user_message(p)))["input_ids"]) for p in problems]
    print(
        f"model: Llama h256 L4 V8192 + LoRA r16 (all linear), fp32 CPU, {threads} thread(s); {args.prompts} prompts "
        f"({min(lengths)}-{max(lengths)} tokens) x {args.group_size} samples of <= {args.max_new_tokens} tokens per "
        f"iteration; {args.warmup} warm-up + {args.steps} timed iterations, {args.repeats} repeats"
    )
    ours, trl = [], []
    with Verifier(VerifierConfig(workers=2)) as verifier:
        for repeat in range(args.repeats):
            ours.append(run_ours(problems, verifier, args))
            trl.append(run_trl(problems, verifier, args))
            print(f"repeat {repeat}: ours {ours[-1]:.2f} samples/s, trl {trl[-1]:.2f} samples/s")
    best_ours, best_trl = max(ours), max(trl)
    print(f"RESULT ours={best_ours:.2f} trl={best_trl:.2f} ratio={best_ours / best_trl:.3f}")


if __name__ == "__main__":
    main()
