"""RL iteration throughput (rollouts + verification + update) of our loop (`models.rl.train_rl`, algo ``grpo``)
against TRL's ``GRPOTrainer`` (trl 1.16.0).

Same work on both sides, one process, CPU, float32:

- the same randomly initialised Llama as benchmarks/bench_sft.py's `build_model` (hidden 256, 4 layers, 4 heads /
  2 kv heads, MLP 640, vocabulary 2880 so that the LM head is 21% of the matmul work per token, as in SmolLM2-135M;
  the tiny project tokenizer uses the first 384 ids), the same LoRA adapters (r 16, alpha 32, dropout 0, every
  linear layer but the LM head);
- the same prompts (the chat-rendered user messages of generated data-cleaning problems, `models.prompts`),
  `--prompts` prompts × `--group-size` samples per iteration, sampled at temperature 1, top-p 1, no top-k (TRL's
  ``GRPOConfig.top_k`` defaults to 0), every completion exactly `--max-new-tokens` tokens long on both sides (TRL:
  ``generation_kwargs={"min_new_tokens": ...}``, eos masked out; ours: `full_budget_rollouts`, no stop token): with
  stopping at eos, each side's random model drew eos at its own random times, and the recorded token totals
  differed by 5.04% (ours 7,293 vs TRL's 7,680) with no way to tell work from luck;
- the same reward: the fraction of unit tests passed, from the same sandboxed verifier (`sandbox.verifier`);
- the same update: group-normalised advantages (std + 1e-4), clipped surrogate ε = 0.2 with per-sequence
  aggregation (TRL ``loss_type="grpo"``), no KL term (β = 0, no reference forward), one optimizer step per
  iteration over the whole batch (TRL: batch = prompts × group size, gradient accumulation 1, one iteration per
  generation), AdamW, clipping at 1.0; no gradient checkpointing, no bf16 (TRL defaults switched off here).
  The random model passes no test, so every advantage is 0 on both sides: the update's forward, backward and
  optimizer step are timed, the weights do not move.

Same work is checked (one ``CHECK same_work=ok ...`` line, or ``CHECK same_work=FAIL ...`` and exit 1, before the
RESULT):

1. before timing, the first update on the same batch (`check_first_loss`): a one-step TRL run whose
   ``compute_loss`` (GRPOTrainer.compute_loss → ``_compute_loss``, .venv/lib/python3.11/site-packages/trl/trainer/
   grpo_trainer.py) also hands its inputs to ours. Our advantages from the same rewards of TRL's completions
   (`models.advantages.group_advantages`) must equal TRL's (``_generate_and_score_completions``) within
   `CHECK_ADV_ATOL`. Then, on TRL's model and the same completions and advantages, TRL's loss and our surrogate
   (`models.rl.policy_forward` + `models.rl.ppo_losses`; old log-probs = the current ones detached, ratio 1, as
   TRL's ``old_per_token_logps = per_token_logps.detach()`` when ``num_iterations`` is 1) must agree within
   `CHECK_LOSS_ATOL`, and their gradients w.r.t. the adapters within `CHECK_GRAD_RTOL` (relative L2). At ratio 1
   the per-sequence loss is −mean(advantages) = 0 up to rounding on both sides, so the gradient is the figure that
   shows a difference; float32, TRL scoring the completions with its chunked fused LM head (``add_fused_lm_head``,
   trl/trainer/utils.py) and without position ids (a constant shift per left-padded row, which RoPE ignores) leave
   differences of order 1e-7. Two stand-ins make the check able to fail: the reward is `even_id_fraction`, a
   deterministic function of the completion ids that varies within a group (test rewards are all 0 here, hence
   advantages and gradient 0 on both sides), and the completion masks are cut to varying lengths
   (`varied_lengths`) before both losses (a random model runs every completion to the limit, and with equal
   lengths a per-sequence and a token-level mean coincide);
2. in the timed runs, the completions and the generated tokens (our ``completion_ids``, TRL's ``completion_ids``
   handed to the reward function) of every iteration: the completion counts must be equal, both sides' token totals
   equal to the whole budget (completions × max new tokens), and the trainable parameters equal.

Throughput = completions of the timed iterations / their wall time (samples/s), measured from the end of the last
warm-up iteration to the end of the last one. `--repeats` rounds each run both sides, the first side alternating
(ours first in round 1); each round's figure, the median and the range (min–max) per side are printed. Last line:
``RESULT ours=<median samples/s> trl=<median samples/s> ratio=<ours/trl>``.

Run: ``.venv/bin/python benchmarks/bench_rl.py [--steps 4 --warmup 1 --repeats 3 --threads 1]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_sft import build_model, make_problems  # noqa: E402  (the same model and problems as the SFT bench)
from repeats import check_same_work  # noqa: E402

# Tolerances of the first-update check (see the module docstring)
CHECK_ADV_ATOL = 1e-5
CHECK_LOSS_ATOL = 1e-6
CHECK_GRAD_RTOL = 1e-4


@dataclass
class Run:
    """One side's run: samples/s over the timed iterations, and per iteration the completions and tokens generated."""

    rate: float
    completions: list[int]
    tokens: list[int]
    trainable_params: int


def even_id_fraction(ids: list[int]) -> float:
    """The check's stand-in reward: the share of even token ids in a completion (varies within a group)."""
    return sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1)


def rl_config(args):
    from models.rl import RLConfig

    return RLConfig(
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


def grpo_config(out: str, args, steps: int):
    from trl import GRPOConfig

    return GRPOConfig(
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
        max_steps=steps,
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
        # eos masked out until the budget is spent (transformers' MinNewTokensLengthLogitsProcessor): every completion
        # is max_completion_length tokens, as ours (`full_budget_rollouts`)
        generation_kwargs={"min_new_tokens": args.max_new_tokens},
    )


def lora_config():
    from peft import LoraConfig

    return LoraConfig(
        r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", bias="none", task_type="CAUSAL_LM"
    )


def trl_dataset(problems):
    from datasets import Dataset

    from models.prompts import user_message

    rows = [{"prompt": [{"role": "user", "content": user_message(p)}], "task_id": p["task_id"]} for p in problems]
    return Dataset.from_list(rows)


def full_budget_rollouts() -> None:
    """Every rollout of ours runs to `max_new_tokens`, as TRL's with ``min_new_tokens`` (`grpo_config`): in this
    process only, `models.sampling.sample` stops at no token (`models.sampling.eos_ids` returns none; an eos drawn is
    kept as an ordinary token) and not at a closed code block (``stop_on_code_block``, on in the pipeline: nothing
    after a closed block is graded; TRL has no such stop). TRL masks eos instead of keeping it: one vocabulary entry
    of 2880 on a random model, the same number of forward passes and tokens on both sides."""
    import dataclasses

    import models.sampling

    @dataclasses.dataclass(frozen=True)
    class FullBudget(models.sampling.SamplingConfig):
        stop_on_code_block: bool = False

    models.sampling.SamplingConfig = FullBudget
    models.sampling.eos_ids = lambda model, tokenizer: set()


def run_ours(problems, verifier, args) -> Run:
    from models.rl import train_rl

    full_budget_rollouts()

    cfg = rl_config(args)
    marks: dict[int, float] = {}
    completions, tokens = [], []

    def emit(metrics, step):
        marks[step] = time.perf_counter()
        n = int(metrics["didpo/groups_sampled"]) * cfg.group_size
        completions.append(n)
        tokens.append(round(metrics["didpo/response_length"] * n))  # mean len(completion_ids)

    model, tokenizer = build_model()
    with tempfile.TemporaryDirectory() as out:
        result = train_rl(model, tokenizer, problems, cfg, verifier, Path(out), emit=emit)
    assert result.global_step == cfg.steps
    elapsed = marks[cfg.steps] - marks[args.warmup]
    return Run(args.steps * args.prompts * args.group_size / elapsed, completions, tokens, result.trainable_params)


def run_trl(problems, verifier, args) -> Run:
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from models.measure import assemble_program
    from models.sampling import extract_code

    by_id = {p["task_id"]: p for p in problems}
    counts, tokens = [], []

    def tests_passed(prompts, completions, task_id, completion_ids, **kwargs):
        counts.append(len(completion_ids))  # called once per generation batch = once per iteration here
        tokens.append(sum(len(ids) for ids in completion_ids))
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
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=tests_passed,
            args=grpo_config(out, args, args.warmup + args.steps),
            train_dataset=trl_dataset(problems),
            processing_class=tokenizer,
            peft_config=lora_config(),
            callbacks=[Clock()],
        )
        trainer.train()
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    elapsed = marks[args.warmup + args.steps] - marks[args.warmup]
    return Run(args.steps * args.prompts * args.group_size / elapsed, counts, tokens, trainable)


def our_advantages(inputs, group_size: int):
    """Our group advantages (B,) of TRL's batch `inputs` (its ``compute_loss`` inputs), from the stand-in rewards of
    its completions. TRL shuffles the generation batch before the loss, so the rows are regrouped by prompt first."""
    import torch

    from models.advantages import group_advantages

    prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
    completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
    keys = [tuple(ids[m.bool()].tolist()) for ids, m in zip(prompt_ids, prompt_mask, strict=True)]
    first = {k: i for i, k in reversed(list(enumerate(keys)))}
    order = sorted(range(len(keys)), key=lambda i: (first[keys[i]], i))  # each group contiguous
    rewards = torch.tensor(
        [even_id_fraction(ids[m.bool()].tolist()) for ids, m in zip(completion_ids, completion_mask, strict=True)]
    )
    advantages = torch.empty_like(rewards)
    advantages[order] = group_advantages(rewards[order], group_size)
    return advantages


def varied_lengths(completion_mask):
    """`completion_mask` (B, T) with row i cut to about T·(i + 1)/B tokens: lengths from T/B to T, so that a
    per-sequence and a token-level loss differ (a random model runs every completion to the limit)."""
    mask = completion_mask.clone()
    rows, width = mask.shape
    for i in range(rows):
        mask[i, max(1, round(width * (i + 1) / rows)) :] = 0
    return mask


def our_loss(model, inputs, advantages, args):
    """Our surrogate (`models.rl.policy_forward` + `models.rl.ppo_losses`) on TRL's batch `inputs` and `model`, at
    ratio 1; returns the loss with its graph."""
    import torch

    from models.rl import policy_forward, ppo_losses

    mask = inputs["completion_mask"].float()  # (B, T)
    batch = {  # `models.rl.build_batch`'s layout: prompts left-padded, completions right-padded
        "input_ids": torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1),
        "attention_mask": torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1),
        "completion_ids": inputs["completion_ids"],
        "completion_mask": mask,
    }
    per_token_logps, logits, _ = policy_forward(model, batch, temperature=1.0)
    batch["old_per_token_logps"] = per_token_logps.detach()  # the policy that sampled is the one scored: ratio 1
    batch["advantages"] = advantages.unsqueeze(-1) * mask  # as `models.rl.group_token_advantages`
    loss, _ = ppo_losses(per_token_logps, logits, None, batch, rl_config(args))
    return loss


def check_first_loss(problems, args) -> tuple[bool, str]:
    """The first update's advantages, loss and gradient, TRL's vs ours on the same completions (module docstring, 1).

    Returns ``(same, what was compared)``."""
    import torch
    from trl import GRPOTrainer

    found = {}

    def even_ids(prompts, completions, completion_ids, **kwargs):
        return [even_id_fraction(ids) for ids in completion_ids]

    class FirstLoss(GRPOTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if found:
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            advantages = our_advantages(inputs, args.group_size)  # from the full completions, as TRL's rewards
            inputs = {**inputs, "completion_mask": varied_lengths(inputs["completion_mask"])}
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            params = [p for p in model.parameters() if p.requires_grad]
            trl_grads = torch.autograd.grad(loss, params, retain_graph=True)  # the Trainer's backward follows
            ours = our_loss(model, inputs, inputs["advantages"], args)
            our_grads = torch.autograd.grad(ours, params)
            diff = sum(float((a - b).pow(2).sum()) for a, b in zip(our_grads, trl_grads, strict=True)) ** 0.5
            norm = sum(float(g.pow(2).sum()) for g in trl_grads) ** 0.5
            lengths = inputs["completion_mask"].sum(-1)
            found.update(
                adv_diff=float((advantages - inputs["advantages"]).abs().max()),
                adv_max=float(inputs["advantages"].abs().max()),
                trl_loss=loss.item(),
                our_loss=ours.item(),
                grad_rel=diff / norm if norm > 0 else float("inf"),
                grad_norm=norm,
                rows=len(lengths),
                lengths=f"{int(lengths.min())}-{int(lengths.max())}",
            )
            return loss

    model, tokenizer = build_model()
    with tempfile.TemporaryDirectory() as out:
        FirstLoss(
            model=model,
            reward_funcs=even_ids,
            args=grpo_config(out, args, 1),
            train_dataset=trl_dataset(problems),
            processing_class=tokenizer,
            peft_config=lora_config(),
        ).train()
    f = found
    same = (
        f["adv_diff"] <= CHECK_ADV_ATOL
        and abs(f["our_loss"] - f["trl_loss"]) <= CHECK_LOSS_ATOL
        and f["grad_rel"] <= CHECK_GRAD_RTOL
    )
    what = (
        f"first update on TRL's {f['rows']} completions (stand-in reward even_id_fraction): advantages max |diff| "
        f"{f['adv_diff']:.1e} (|A| up to {f['adv_max']:.2f}, tol {CHECK_ADV_ATOL:g}); on them cut to {f['lengths']} "
        f"tokens, loss ours {f['our_loss']:.2e} trl {f['trl_loss']:.2e} (tol {CHECK_LOSS_ATOL:g}), adapter "
        f"gradient relative L2 diff {f['grad_rel']:.1e} (norm {f['grad_norm']:.2e}, tol {CHECK_GRAD_RTOL:g})"
    )
    return same, what


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="timed RL iterations per run")
    parser.add_argument("--warmup", type=int, default=1, help="untimed iterations first")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per iteration")
    parser.add_argument("--group-size", type=int, default=4, help="samples per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--problems", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="rounds of both sides, the first side alternating")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: all CPUs)")
    args = parser.parse_args()
    if args.warmup < 1 or args.steps < 1 or args.repeats < 1:
        parser.error("--warmup, --steps and --repeats must be at least 1")

    from models.policy import configure_threads
    from models.prompts import user_message
    from models.sampling import build_chat_prompt
    from sandbox.verifier import Verifier, VerifierConfig

    threads = configure_threads(args.threads)
    problems = make_problems(args.problems)
    _, tokenizer = build_model()
    lengths = [len(tokenizer(build_chat_prompt(tokenizer, user_message(p)))["input_ids"]) for p in problems]
    print(
        f"model: Llama h256 L4 V2880 + LoRA r16 (all linear), fp32 CPU, {threads} thread(s); {args.prompts} prompts "
        f"({min(lengths)}-{max(lengths)} tokens) x {args.group_size} samples of <= {args.max_new_tokens} tokens per "
        f"iteration; {args.warmup} warm-up + {args.steps} timed iterations, {args.repeats} rounds",
        flush=True,
    )

    same, loss_check = check_first_loss(problems, args)
    if not same:
        check_same_work(False, loss_check)

    runs: dict[str, list[Run]] = {"ours": [], "trl": []}
    with Verifier(VerifierConfig(workers=2)) as verifier:
        sides = {"ours": lambda: run_ours(problems, verifier, args), "trl": lambda: run_trl(problems, verifier, args)}
        for r in range(args.repeats):
            for name in list(sides) if r % 2 == 0 else list(sides)[::-1]:
                runs[name].append(sides[name]())
                run = runs[name][-1]
                print(
                    f"round {r + 1} {name}: {run.rate:.2f} samples/s ({sum(run.completions)} completions, "
                    f"{sum(run.tokens)} tokens in {len(run.completions)} iterations)",
                    flush=True,
                )
    medians = {}
    for name, side in runs.items():
        rates = [run.rate for run in side]
        medians[name] = statistics.median(rates)
        each = ", ".join(f"{v:.2f}" for v in rates)
        print(f"{name}: median {medians[name]:.2f} samples/s, range {min(rates):.2f}-{max(rates):.2f} (rounds: {each})")

    # ---- same work in the timed runs: completions and tokens per iteration, trainable parameters
    iterations = args.warmup + args.steps
    budget = args.prompts * args.group_size
    completions = {name: [c for run in side for c in run.completions] for name, side in runs.items()}
    tokens = {name: sum(sum(run.tokens) for run in side) for name, side in runs.items()}
    params = {name: {run.trainable_params for run in side} for name, side in runs.items()}
    problems_found = []
    for name, counts in completions.items():
        if counts != [budget] * (iterations * args.repeats):
            problems_found.append(f"{name} completions per iteration {counts}, expected {budget} in each")
    full = budget * args.max_new_tokens * iterations * args.repeats
    if tokens["ours"] != full or tokens["trl"] != full:
        problems_found.append(f"generated tokens ours {tokens['ours']} trl {tokens['trl']}, expected {full} on each")
    if len(params["ours"] | params["trl"]) != 1:
        problems_found.append(f"trainable parameters ours {params['ours']} vs trl {params['trl']}")
    if problems_found:
        check_same_work(False, "; ".join(problems_found))
    check_same_work(
        True,
        f"{loss_check}; timed runs: {budget} completions in each of {iterations} iterations x "
        f"{args.repeats} rounds a side, generated tokens ours {tokens['ours']} trl {tokens['trl']} "
        f"(the whole budget), {params['ours'].pop()} trainable parameters each",
    )
    ours, trl = medians["ours"], medians["trl"]
    print(f"RESULT ours={ours:.2f} trl={trl:.2f} ratio={ours / trl:.3f}")


if __name__ == "__main__":
    main()
