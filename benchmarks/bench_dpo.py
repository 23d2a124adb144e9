"""Training throughput of our DPO loop (`models.dpo.train_dpo`) against TRL's ``DPOTrainer`` (trl 1.16.0).

Same work on both sides, one process, CPU, float32:

- the same randomly initialised Llama as benchmarks/bench_sft.py (hidden 256, 4 layers, vocabulary `VOCAB_SIZE` =
  2880, so that the LM head is 21.1% of the weight matmuls per token, as in SmolLM2-135M; printed first) with the
  tiny project tokenizer;
- the same fresh LoRA adapters (r 16, alpha 32, dropout 0: TRL's ``disable_dropout`` defaults to on, all attention +
  MLP projections); the reference is the model with the adapter disabled on both sides;
- the same pairs: the chat prompt of a generated data-cleaning problem, chosen = the reference answer in the project
  format (`models.sft.render_answer`), rejected = the bare code with a bug and no explanation;
- the same tokens in the same batches: `models.dpo.build_pair_examples` / `collate_pairs`, one (2·B, T) batch a step,
  the B chosen rows then the B rejected ones, padded on the right to the longest; log-probs summed over the answer
  tokens up to and including ``<|im_end|>``. TRL gets the same text as a standard (not conversational) preference
  dataset (`bench_sft.prompt_completion_text`: its conversational format would add the template's newline after
  ``<|im_end|>`` to each answer) and the rows in the order our loop draws them, read with
  ``train_sampling_strategy="sequential"``;
- the sigmoid loss, β 0.1; reference log-probs computed once before training on both sides (TRL:
  ``precompute_ref_log_probs=True``), so a step is one policy forward + backward over the 2·B sequences;
- the same positions through the LM head, the answer positions only: ours with a boolean ``logits_to_keep``
  (`models.dpo.sequence_logps`); TRL's fused LM head (trl/trainer/utils.py, ``add_fused_lm_head._fused_forward``)
  does so only on CUDA/XPU (``compact = _use_triton(hidden_states.device)``, line 1642) and scores every position
  of the padded batch elsewhere; `bench_sft.compact_trl_lm_head_on_cpu` switches its compaction on for CPU (no
  DPOConfig field does; see that function);
- no gradient checkpointing and no bf16 (TRL's defaults switched off), AdamW (``adamw_torch``), cosine schedule,
  clipping at 1.0, max length 512, batch 4 pairs, no evaluation, no saving.

What only TRL does: for its metrics it computes the entropy, the mean logit and the top-1 accuracy of every scored
position (``outputs = ("log_probs", "entropy", "mean_logits", "is_top1")`` in ``DPOTrainer.__init__``,
dpo_trainer.py line 957, logged in ``_compute_loss`` from line 1536). No setting switches them off, so they stay in
TRL's time: elementwise work on each logit tile, no matmul, no backward (bench_sft.py's docstring has the
measurement: about one extra LM-head matmul a step).

Before timing, `check_same_work` takes the first batch both ways: the same base weights, the same seeded non-zero
adapters (`bench_sft.same_adapters`, so policy and reference differ), dropout off. TRL's collated batch must have our
``input_ids`` and ``attention_mask``, and its ``completion_mask`` must be our labelled positions. Then two
comparisons, each with its tolerance:

- TRL's precomputed reference log-probs of the 2·B sequences against ours (`models.dpo.reference_logps`): sums of
  ≈ 100-320 float32 terms, -830 to -2560 nats, within `bench_sft.CHECK_RTOL` = 1e-5 relative (measured 6e-7: the
  two sides add the same terms in a different order). A token more or less is ≈ 8 nats, 3e-3 or more;
- the DPO loss from ours (`models.dpo.sequence_logps` + `models.dpo.preference_losses`, the loop's code) against
  TRL's ``DPOTrainer.compute_loss``, within `LOSS_RTOL` = 1e-3 relative. The loss depends on β·Δ, Δ a difference of
  four such sums that is ≈ 10³ times smaller than each of them, so their float32 rounding (≈ 1e-3 nats a sum) is
  amplified: measured 3.1e-5, and up to ≈ 1.5e-4 by the estimate √(terms)·ulp(sum) per sum, so 1e-4 would be
  within reach of rounding alone. What it guards against is far above 1e-3 (measured on this batch): β
  doubled 0.13, adapter scaling halved 0.28, one answer token fewer per sequence in the policy 1.7e-3 (tokens are
  also compared exactly).

It also counts the positions each side projects through the LM head: both must be the answer tokens. One line:
``CHECK same_work=ok ...`` or ``CHECK same_work=FAIL ...`` (then exit status 1).

Timing: steps/s = timed optimizer steps / their wall time, measured from the end of the last of `--warmup` untimed
steps to the end of the last step. The sides run alternately `--repeats` times, who goes first alternating per repeat
(ABBA); each repeat's figures are printed, then the median and range (min-max) of each side. Last line:
``RESULT ours=<median steps/s> trl=<median steps/s> ratio=<ours/trl>``.

Run: ``.venv/bin/python benchmarks/bench_dpo.py [--steps 10 --warmup 2 --repeats 3 --threads N]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import repeats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sft import (  # noqa: E402  (the same model, problems and TRL set-up as the SFT benchmark)
    CHECK_RTOL,
    SMOLLM2_135M,
    VOCAB_SIZE,
    build_model,
    compact_trl_lm_head_on_cpu,
    count_our_scored_positions,
    count_trl_scored_positions,
    lm_head_share,
    make_problems,
    our_stream,
    prompt_completion_text,
    relative_difference,
    report,
    same_adapters,
    time_alternately,
)

# Relative tolerance of the loss comparison of the same-work check (see the module docstring)
LOSS_RTOL = 1e-3


def make_pairs(n: int) -> list[dict]:
    """`n` pairs: the user message, the formatted reference answer (chosen), buggy bare code (rejected)."""
    from models.prompts import reference_code
    from models.sft import render_answer, render_user_message

    pairs = []
    for problem in make_problems(n):
        buggy = reference_code(problem).replace("return items", "return items[1:]")
        pairs.append({"prompt": render_user_message(problem), "chosen": render_answer(problem), "rejected": buggy})
    return pairs


def our_config(args):
    from models.dpo import DPOConfig

    return DPOConfig(
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


def run_ours(pairs, args) -> float:
    """Our loop's optimizer steps/s over the timed steps."""
    from models.dpo import train_dpo

    cfg = our_config(args)
    marks: dict[int, float] = {}

    def emit(metrics, step):
        if "dpo/loss" in metrics:  # emitted right after optimizer step `step`
            marks[step] = time.perf_counter()

    model, tokenizer = build_model(vocab_size=VOCAB_SIZE)
    with tempfile.TemporaryDirectory() as out:
        result = train_dpo(model, tokenizer, pairs, [], cfg, Path(out), emit=emit)
    assert result.global_step == cfg.max_steps
    return args.steps / (marks[cfg.max_steps] - marks[args.warmup])


def trl_trainer(pairs, args, out: str, callbacks=()):
    """TRL's DPOTrainer on the benchmark model, fed the pairs in our loop's order (see the module docstring); it
    computes the reference log-probs of its rows when built."""
    from datasets import Dataset
    from peft import LoraConfig
    from trl import DPOConfig, DPOTrainer

    model, tokenizer = build_model(vocab_size=VOCAB_SIZE)
    rows = []
    for i in our_stream(len(pairs), our_config(args)):
        user = {"role": "user", "content": pairs[i]["prompt"]}
        prompt, chosen = prompt_completion_text(tokenizer, [user, {"role": "assistant", "content": pairs[i]["chosen"]}])
        _, rejected = prompt_completion_text(tokenizer, [user, {"role": "assistant", "content": pairs[i]["rejected"]}])
        rows.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
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
        train_sampling_strategy="sequential",  # the rows are already in our loop's order
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
    return DPOTrainer(
        model=model,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=list(callbacks),
    )


def run_trl(pairs, args) -> float:
    """TRL's optimizer steps/s over the timed steps."""
    from transformers import TrainerCallback

    marks: dict[int, float] = {}

    class Clock(TrainerCallback):
        def on_step_end(self, _args, state, control, **kwargs):
            marks[state.global_step] = time.perf_counter()

    with tempfile.TemporaryDirectory() as out:
        trl_trainer(pairs, args, out, callbacks=[Clock()]).train()
    return args.steps / (marks[args.warmup + args.steps] - marks[args.warmup])


def check_same_work(pairs, args) -> tuple[bool, str]:
    """The first batch's reference log-probs and DPO loss, ours and TRL's (module docstring):
    ``(passed, what was compared)``."""
    import torch

    from models.dpo import build_pair_examples, collate_pairs, preference_losses, reference_logps, sequence_logps
    from models.lora import apply_lora
    from models.sampling import pad_token_id
    from models.sft import IGNORE_INDEX

    cfg = our_config(args)
    ours, tokenizer = build_model(vocab_size=VOCAB_SIZE)
    ours = apply_lora(ours, cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_target_modules)
    pad_id = pad_token_id(tokenizer)
    examples = build_pair_examples(tokenizer, pairs, cfg.max_seq_len)
    first = [examples[i] for i in our_stream(len(examples), cfg)[: cfg.batch_size]]
    batch = collate_pairs(first, pad_id)  # (2B, T) each: chosen rows, then rejected rows
    ref_chosen, ref_rejected = reference_logps(ours, first, cfg.batch_size, pad_id)  # (B,) each, adapter disabled
    with tempfile.TemporaryDirectory() as out:
        trainer = trl_trainer(pairs, args, out)
        theirs = trainer.model
        try:
            same_adapters(ours, theirs)
        except RuntimeError as err:
            return False, f"the two models differ: {err}"
        ours.eval()
        theirs.eval()
        trl_batch = next(iter(trainer.get_train_dataloader()))
        ours_labelled = batch["labels"] != IGNORE_INDEX  # (2B, T)
        for name, mine, other in (
            ("input_ids", batch["input_ids"], trl_batch["input_ids"]),
            ("attention_mask", batch["attention_mask"], trl_batch["attention_mask"]),
            ("answer positions", ours_labelled, trl_batch["completion_mask"].bool()),
        ):
            if not torch.equal(mine, other):
                return False, f"the first batch differs in {name} (ours {tuple(mine.shape)}, trl {tuple(other.shape)})"
        with torch.no_grad():
            with count_our_scored_positions(ours) as our_scored:
                logps, n_tokens = sequence_logps(ours, batch)  # (2B,) each
            chosen, rejected = logps.split(cfg.batch_size)
            n_chosen, n_rejected = n_tokens.split(cfg.batch_size)
            losses, _, _ = preference_losses(cfg, chosen, rejected, ref_chosen, ref_rejected, n_chosen, n_rejected)
            with count_trl_scored_positions() as trl_scored:
                trl_loss = trainer.compute_loss(theirs, dict(trl_batch)).item()
    our_loss = losses.mean().item()
    ours_ref = torch.cat([ref_chosen, ref_rejected])
    trl_ref = torch.cat([trl_batch["ref_chosen_logps"], trl_batch["ref_rejected_logps"]]).float()
    ref_rel = ((ours_ref - trl_ref).abs() / ours_ref.abs()).max().item()
    loss_rel = relative_difference(our_loss, trl_loss)
    rows, width = batch["input_ids"].shape
    n_answer = int(ours_labelled[:, 1:].sum())
    what = (
        f"first batch ({rows} x {width} tokens, same ids and answer positions): DPO loss ours={our_loss:.6f} "
        f"trl={trl_loss:.6f} (relative difference {loss_rel:.1e}, tolerance {LOSS_RTOL:.0e}); reference log-prob "
        f"sums, first chosen ours={ours_ref[0].item():.3f} trl={trl_ref[0].item():.3f}, largest relative difference "
        f"of the {rows} {ref_rel:.1e} (tolerance {CHECK_RTOL:.0e}); positions through the LM head "
        f"ours={sum(our_scored)} trl={sum(trl_scored)}, answer tokens {n_answer}, padded batch {rows * (width - 1)}"
    )
    passed = loss_rel <= LOSS_RTOL and ref_rel <= CHECK_RTOL and sum(our_scored) == sum(trl_scored) == n_answer
    return passed, what


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--batch-size", type=int, default=4, help="pairs per step")
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--pairs", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs per side (ABBA); the median counts")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: all CPUs)")
    args = parser.parse_args()
    if args.warmup < 1 or args.steps < 1 or args.repeats < 1:
        parser.error("--warmup, --steps and --repeats must be at least 1")

    from models.dpo import build_pair_examples
    from models.policy import configure_threads

    threads = configure_threads(args.threads)
    compact_trl_lm_head_on_cpu()
    pairs = make_pairs(args.pairs)
    model, tokenizer = build_model(vocab_size=VOCAB_SIZE)
    examples = build_pair_examples(tokenizer, pairs, args.max_len)
    lengths = [len(e[side]["input_ids"]) for e in examples for side in ("chosen", "rejected")]
    print(
        f"model: Llama h256 L4 V{VOCAB_SIZE} + LoRA r16 (all linear), fp32 CPU, {threads} thread(s); LM head "
        f"{lm_head_share(model.config.to_dict()):.1%} of the weight matmuls per token (SmolLM2-135M: "
        f"{lm_head_share(SMOLLM2_135M):.1%}); batch {args.batch_size} pairs, {args.pairs} pairs, sequences of "
        f"{min(lengths)}-{max(lengths)} tokens (mean {sum(lengths) / len(lengths):.0f}); {args.warmup} warm-up + "
        f"{args.steps} timed steps, {args.repeats} repeats",
        flush=True,
    )
    passed, what = check_same_work(pairs, args)
    repeats.check_same_work(passed, what)
    ours, trl = time_alternately(
        lambda: run_ours(pairs, args), lambda: run_trl(pairs, args), args.repeats, "steps/s", digits=3
    )
    report(ours, trl, "steps/s", digits=3)


if __name__ == "__main__":
    main()
