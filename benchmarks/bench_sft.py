"""Training throughput of our SFT loop (`models.sft.train_sft`) against TRL's ``SFTTrainer`` (trl 1.16.0).

Same work on both sides, one process, CPU, float32:

- the same randomly initialised Llama (hidden 256, 4 layers, 4 heads / 2 kv heads, MLP 640, tied embeddings) with a
  vocabulary of `VOCAB_SIZE` = 2880 (the tiny project tokenizer uses the first 384 ids; the rest only sizes the LM
  head), chosen so that the LM head is 21.1% of the weight matmuls per token, as in SmolLM2-135M (21.13% and 21.05%;
  `lm_head_share`, printed first). With the vocabulary of 8192 used before, the head was 43%, twice a real model's
  share, which inflated whatever a side saves on the head;
- the same LoRA adapters (r 16, alpha 32, dropout 0.05, all attention + MLP projections);
- the same tokens in the same batches: the chats of generated data-cleaning problems with 1-4 steps
  (``models.sft.render_messages``) tokenised by `models.sft.build_sft_examples`: ``input_ids`` (B, T) padded on the
  right to the longest example of the batch, the loss on the answer tokens only, up to and including ``<|im_end|>``.
  TRL gets the same text as a standard prompt-completion dataset (`prompt_completion_text`: TRL's conversational
  format would also train on the template's newline after ``<|im_end|>``, one more token per example), and the rows
  in the order our loop draws them (`our_stream`) with ``train_sampling_strategy="sequential"``, so step k of both
  sides sees the same (B, T) batch;
- the same loss, mean negative log-likelihood per answer token (nats), and the same positions through the LM head:
  the answer positions only (N ≈ half of B·T here). Ours: a boolean ``logits_to_keep`` (`models.sft.answer_nll`).
  TRL: its fused LM head (trl/trainer/utils.py, ``add_fused_lm_head._fused_forward``) keeps the labelled positions
  only where ``compact = _use_triton(hidden_states.device)`` (line 1642) is true, i.e. on CUDA/XPU with Triton
  (trl/kernels/chunked_logprob.py, ``_use_triton``, line 48). Elsewhere it scores every position of the padded
  batch, prompt and padding included (first batch: 4,088 positions for 2,101 answer tokens), because on Neuron a
  varying number of positions recompiles the graph (the comment at line 1640). No SFTConfig field sets this, so
  `compact_trl_lm_head_on_cpu` makes that one check true on CPU too (a patch of the module attribute in this
  process; TRL's torch fallback kernels still do the maths);
- no packing, no padding-free, no gradient checkpointing (TRL's default is on: switched off here), no bf16 (TRL's
  default is on: switched off here), AdamW (``adamw_torch``), cosine schedule, clipping at 1.0, max length 512,
  batch 8, no evaluation, no saving.

What only TRL does: it computes the entropy and the top-1 token accuracy of every scored position for its metrics
(``add_fused_lm_head(..., outputs=("log_probs", "entropy", "is_top1"))`` in ``SFTTrainer.__init__``, sft_trainer.py
line 1146, logged in ``compute_loss``, lines 1639-1644). No setting switches them off, so they stay in TRL's time.
They add no matmul and no backward (the entropy is detached), only elementwise work on each logit tile
(``_forward_tile``, trl/kernels/chunked_logprob.py line 211). Measured once on 2,101 positions × V 2880, 1 thread
(minimum of 40): TRL's fused head forward 175 ms with them, 120 ms with the log-probs alone, backward ≈ 240-275 ms
either way; so about one extra head matmul (54 ms) a step.

Before timing, `check_same_work` computes the loss of the first batch both ways: the same base weights, the same
seeded non-zero adapters (so the adapters take part), dropout off; ours with `models.sft.answer_nll`, TRL's with
``SFTTrainer.compute_loss`` on its own collated batch, whose ``input_ids``, ``attention_mask`` and ``labels`` must
equal ours. The losses must agree within `CHECK_RTOL` = 1e-5 relative. Both are float32 means over ≈ 2,000 tokens
summed in a different order (ours: the kept rows' logits and ``F.cross_entropy``; TRL: vocabulary tiles and an
online log-sum-exp): measured 1.1e-7 apart. A random model's next-token distribution is nearly uniform (NLL ≈ ln V),
so real mismatches move the mean little; measured on this batch: adapter scaling halved 6e-3, dropout left on 8e-5,
one answer token fewer per example 2e-5 (that one the label comparison catches anyway). 1e-4 would let dropout
through, hence 1e-5. It also counts the positions each side projects through the LM head
(`count_our_scored_positions`, `count_trl_scored_positions`): both must be the answer tokens. It prints one line,
``CHECK same_work=ok ...`` or ``CHECK same_work=FAIL ...`` (then exits with status 1).

Timing: throughput = real (non-padding) input tokens of the timed steps / their wall time, measured from the end of
the last of `--warmup` untimed steps to the end of the last step (both sides count the same tokens: the same
batches). The sides run alternately `--repeats` times, who goes first alternating per repeat (ABBA); each repeat's
figures are printed, then the median and range (min-max) of each side. Last line:
``RESULT ours=<median tok/s> trl=<median tok/s> ratio=<ours/trl>``.

Run: ``.venv/bin/python benchmarks/bench_sft.py [--steps 10 --warmup 2 --repeats 3 --threads N]``
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import repeats

# Vocabulary of the benchmark model: the LM head is then 21.1% of the weight matmuls per token, SmolLM2-135M's share
VOCAB_SIZE = 2880
# SmolLM2-135M (HuggingFaceTB/SmolLM2-135M config.json): the share the benchmark model is sized to
SMOLLM2_135M = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
}
# Relative tolerance of the same-work check (see the module docstring)
CHECK_RTOL = 1e-5
# Standard deviation of the seeded adapter weights of the check: ΔW = (alpha / r)·B·A is then about as large as the
# base weights (std 0.02), so a mismatch in the adapters shows in the loss
CHECK_ADAPTER_STD = 0.05

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


def build_model(seed: int = 0, vocab_size: int = VOCAB_SIZE):
    """The benchmark Llama (random weights from `seed`) and the tiny project tokenizer; the SFT, DPO and RL
    benchmarks all use it, with the vocabulary that gives SmolLM2-135M's LM-head share of the matmul work."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from models.policy import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=vocab_size,
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


def lm_head_share(config: dict) -> float:
    """The LM head's share of a Llama's weight matmuls per token (multiply-adds; the backward has the same split).

    Per layer: the q, k, v, o projections, h·(2·h + 2·kv_heads·head_dim), and the gated MLP, 3·h·intermediate; the
    head: V·h. The attention scores (which grow with the context) and LoRA adapters are left out.
    """
    h, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    kv_width = config["num_key_value_heads"] * h // config["num_attention_heads"]
    per_layer = h * (2 * h + 2 * kv_width) + 3 * h * config["intermediate_size"]
    return vocab * h / (vocab * h + layers * per_layer)


# ------------------------------------------------------------------------------------------ the TRL side


def compact_trl_lm_head_on_cpu() -> None:
    """Make TRL's fused LM head score the labelled positions only on CPU too, as it does on CUDA/XPU.

    ``add_fused_lm_head._fused_forward`` (trl/trainer/utils.py, line 1642) reads ``compact =
    _use_triton(hidden_states.device)``, the module's own name for trl/kernels/chunked_logprob.py ``_use_triton``
    (line 48: Triton available and a CUDA/XPU device). That line is the only reader of the name in
    trl.trainer.utils, and the kernels keep their own reference, so replacing it here switches on the compaction
    and nothing else: on CPU the tiles are still folded by TRL's torch kernels (``_forward_tile``,
    ``_backward_tile``). No TRL config field controls it. Applies to this process only; idempotent.
    """
    import trl.trainer.utils as trl_utils
    from trl.kernels.chunked_logprob import _use_triton

    trl_utils._use_triton = lambda device: device.type == "cpu" or _use_triton(device)


@contextlib.contextmanager
def count_our_scored_positions(model):
    """Within the block, the number of positions each call of `model`'s LM head module projects, appended to the
    yielded list (a forward hook; removed on exit)."""
    scored: list[int] = []

    def hook(_module, inputs, _output):
        scored.append(inputs[0].shape[:-1].numel())  # (..., h): the positions scored

    handle = model.get_output_embeddings().register_forward_hook(hook)
    try:
        yield scored
    finally:
        handle.remove()


@contextlib.contextmanager
def count_trl_scored_positions():
    """Within the block, the number of positions each call of TRL's fused LM head projects through the head,
    appended to the yielded list (it wraps ``trl.trainer.utils._ChunkedLogProbFunction``; restored on exit)."""
    import trl.trainer.utils as trl_utils

    original = trl_utils._ChunkedLogProbFunction
    scored: list[int] = []

    class Counting:
        @staticmethod
        def apply(hidden, *args):
            scored.append(hidden.shape[0])  # (N, h): the positions scored
            return original.apply(hidden, *args)

    trl_utils._ChunkedLogProbFunction = Counting
    try:
        yield scored
    finally:
        trl_utils._ChunkedLogProbFunction = original


def prompt_completion_text(tokenizer, messages: list[dict]) -> tuple[str, str]:
    """The chat-template text of ``messages[:-1]`` with the generation prompt, and the answer's text after it up to
    and including the eos token: as text, the tokens `models.sft.build_sft_examples` builds (prompt labels -100)."""
    prompt = tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    if not full.startswith(prompt):
        raise ValueError("the chat template renders the prompt differently alone and with the answer")
    completion = full[len(prompt) :]
    eos = tokenizer.eos_token
    return prompt, completion[: completion.rindex(eos) + len(eos)]


def same_adapters(ours, theirs, seed: int = 1) -> None:
    """Give two peft models the same seeded non-zero adapter weights, and check that they are then the same model:
    the same parameter names and shapes, the same trainable ones, equal base weights.

    Raises:
        RuntimeError: the models differ (the message says where).
    """
    import torch

    mine, other = dict(ours.named_parameters()), dict(theirs.named_parameters())
    if mine.keys() != other.keys():
        raise RuntimeError(f"different parameters: {sorted(mine.keys() ^ other.keys())[:4]}")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in sorted(mine):
            a, b = mine[name], other[name]
            if a.shape != b.shape or a.requires_grad != b.requires_grad:
                raise RuntimeError(f"{name}: shape or trainability differ ({a.shape}, {b.shape})")
            if "lora_" in name:
                value = torch.randn(a.shape, generator=generator) * CHECK_ADAPTER_STD
                a.copy_(value)
                b.copy_(value)
            elif not torch.equal(a, b):
                raise RuntimeError(f"{name}: different base weights")


def relative_difference(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


# ------------------------------------------------------------------------------------------- the two sides


def our_config(args):
    from models.sft import SFTConfig

    return SFTConfig(
        batch_size=args.batch_size,
        grad_accum_steps=1,  # TRL's gradient_accumulation_steps
        max_steps=args.warmup + args.steps,
        max_seq_len=args.max_len,
        learning_rate=2e-4,
        warmup_ratio=0.0,
        eval_every=0,
        checkpoint_every=0,
        device="cpu",
        mixed_precision="no",  # TRL's side trains in float32 (no bf16 flag): the same precision on both sides
    )


def our_stream(n_examples: int, cfg) -> list[int]:
    """The example indices `train_sft` (or `train_dpo`: the same `DataOrder`) draws, in order, for all its steps
    (one process, no gradient accumulation, no CHES filter)."""
    from models.training import DataOrder

    return DataOrder(n_examples, cfg.seed).take(cfg.batch_size * cfg.max_steps)


def run_ours(problems, args) -> float:
    """Our loop's tokens/s over the timed steps."""
    from models.sft import build_sft_examples, train_sft

    cfg = our_config(args)
    marks: dict[int, float] = {}

    def emit(metrics, step):
        if "sft/loss" in metrics:  # emitted right after optimizer step `step`
            marks[step] = time.perf_counter()

    model, tokenizer = build_model(vocab_size=VOCAB_SIZE)
    with tempfile.TemporaryDirectory() as out:
        result = train_sft(model, tokenizer, problems, [], cfg, Path(out), emit=emit)
    assert result.global_step == cfg.max_steps
    examples = build_sft_examples(tokenizer, problems, max_seq_len=cfg.max_seq_len)
    timed = our_stream(len(examples), cfg)[args.warmup * cfg.batch_size :]
    tokens = sum(len(examples[i]["input_ids"]) for i in timed)  # real tokens, padding excluded
    return tokens / (marks[cfg.max_steps] - marks[args.warmup])


def trl_trainer(problems, args, out: str, callbacks=()):
    """TRL's SFTTrainer on the benchmark model, fed the rows in our loop's order (see the module docstring)."""
    from datasets import Dataset
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    from models.sft import render_messages

    model, tokenizer = build_model(vocab_size=VOCAB_SIZE)
    rows = []
    for i in our_stream(len(problems), our_config(args)):
        prompt, completion = prompt_completion_text(tokenizer, render_messages(problems[i]))
        rows.append({"prompt": prompt, "completion": completion})
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
        train_sampling_strategy="sequential",  # the rows are already in our loop's order
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
    return SFTTrainer(
        model=model,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=list(callbacks),
    )


def run_trl(problems, args) -> float:
    """TRL's tokens/s over the timed steps."""
    from transformers import TrainerCallback

    marks: dict[int, tuple[float, int]] = {}

    class Clock(TrainerCallback):
        def on_step_end(self, _args, state, control, **kwargs):
            marks[state.global_step] = (time.perf_counter(), state.num_input_tokens_seen)

    with tempfile.TemporaryDirectory() as out:
        trl_trainer(problems, args, out, callbacks=[Clock()]).train()
    (start, seen_start), (end, seen_end) = marks[args.warmup], marks[args.warmup + args.steps]
    return (seen_end - seen_start) / (end - start)


# ------------------------------------------------------------------------------------------- same work, timing


def check_same_work(problems, args) -> tuple[bool, str]:
    """The first batch's loss from our `answer_nll` and from TRL's ``compute_loss`` (module docstring):
    ``(passed, what was compared)``."""
    import torch

    from models.lora import apply_lora
    from models.sampling import pad_token_id
    from models.sft import answer_nll, build_sft_examples, collate

    cfg = our_config(args)
    ours, tokenizer = build_model(vocab_size=VOCAB_SIZE)
    ours = apply_lora(ours, cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_target_modules)
    examples = build_sft_examples(tokenizer, problems, max_seq_len=cfg.max_seq_len)
    first = [examples[i] for i in our_stream(len(examples), cfg)[: cfg.batch_size]]
    batch = collate(first, pad_token_id(tokenizer))  # (B, T) each
    with tempfile.TemporaryDirectory() as out:
        trainer = trl_trainer(problems, args, out)
        theirs = trainer.model
        try:
            same_adapters(ours, theirs)
        except RuntimeError as err:
            return False, f"the two models differ: {err}"
        ours.eval()  # dropout off
        theirs.eval()
        trl_batch = next(iter(trainer.get_train_dataloader()))
        for key in ("input_ids", "attention_mask", "labels"):
            if not torch.equal(batch[key], trl_batch[key]):
                shapes = f"ours {tuple(batch[key].shape)}, trl {tuple(trl_batch[key].shape)}"
                return False, f"the first batch differs in {key} ({shapes})"
        with torch.no_grad():
            with count_our_scored_positions(ours) as our_scored:
                nll, n_answer = answer_nll(ours, batch)
            with count_trl_scored_positions() as trl_scored:
                trl_loss = trainer.compute_loss(theirs, dict(trl_batch)).item()
    our_loss = nll.item() / n_answer
    rel = relative_difference(our_loss, trl_loss)
    b, t = batch["input_ids"].shape
    what = (
        f"first batch ({b} x {t} tokens, same ids and labels): mean answer-token NLL ours={our_loss:.6f} "
        f"trl={trl_loss:.6f} (relative difference {rel:.1e}, tolerance {CHECK_RTOL:.0e}); positions through the LM "
        f"head ours={sum(our_scored)} trl={sum(trl_scored)}, answer tokens {n_answer}, padded batch {b * (t - 1)}"
    )
    return rel <= CHECK_RTOL and sum(our_scored) == sum(trl_scored) == n_answer, what


def time_alternately(run_ours: Callable[[], float], run_trl: Callable[[], float], repeats: int, unit: str, digits: int):
    """Each side's figure from `repeats` runs, who runs first alternating per repeat (ABBA); prints each repeat."""
    figures: dict[str, list[float]] = {"ours": [], "trl": []}
    for repeat in range(repeats):
        order = [("ours", run_ours), ("trl", run_trl)]
        if repeat % 2:
            order.reverse()
        for side, run in order:
            figures[side].append(run())
        print(
            f"repeat {repeat} ({order[0][0]} first): ours {figures['ours'][-1]:.{digits}f} {unit}, "
            f"trl {figures['trl'][-1]:.{digits}f} {unit}",
            flush=True,
        )
    return figures["ours"], figures["trl"]


def report(ours: list[float], trl: list[float], unit: str, digits: int) -> None:
    """The median and range of each side, then the RESULT line (last)."""
    mid_ours, mid_trl = statistics.median(ours), statistics.median(trl)
    for side, values, mid in (("ours", ours, mid_ours), ("trl", trl, mid_trl)):
        print(f"{side}: median {mid:.{digits}f} {unit}, range {min(values):.{digits}f}-{max(values):.{digits}f}")
    print(f"RESULT ours={mid_ours:.{digits}f} trl={mid_trl:.{digits}f} ratio={mid_ours / mid_trl:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--problems", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs per side (ABBA); the median counts")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: all CPUs)")
    args = parser.parse_args()
    if args.warmup < 1 or args.steps < 1 or args.repeats < 1:
        parser.error("--warmup, --steps and --repeats must be at least 1")

    from models.policy import configure_threads
    from models.sft import build_sft_examples

    threads = configure_threads(args.threads)
    compact_trl_lm_head_on_cpu()
    problems = make_problems(args.problems)
    model, tokenizer = build_model(vocab_size=VOCAB_SIZE)
    lengths = [len(e["input_ids"]) for e in build_sft_examples(tokenizer, problems, max_seq_len=args.max_len)]
    print(
        f"model: Llama h256 L4 V{VOCAB_SIZE} + LoRA r16 (all linear), fp32 CPU, {threads} thread(s); LM head "
        f"{lm_head_share(model.config.to_dict()):.1%} of the weight matmuls per token (SmolLM2-135M: "
        f"{lm_head_share(SMOLLM2_135M):.1%}); batch {args.batch_size}, {args.problems} chats of "
        f"{min(lengths)}-{max(lengths)} tokens (mean {sum(lengths) / len(lengths):.0f}); {args.warmup} warm-up + "
        f"{args.steps} timed steps, {args.repeats} repeats",
        flush=True,
    )
    passed, what = check_same_work(problems, args)
    repeats.check_same_work(passed, what)
    ours, trl = time_alternately(
        lambda: run_ours(problems, args), lambda: run_trl(problems, args), args.repeats, "tok/s", digits=0
    )
    report(ours, trl, "tok/s", digits=0)


if __name__ == "__main__":
    main()
