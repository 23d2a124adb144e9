"""Supervised fine-tuning (SFT) on the reference solutions, with the loss on the answer tokens only.

One training example is a chat: the user asks for a function (instruction + signature/docstring in a fenced
block, exactly the prompt the sampler and the pass@16 gate use), the assistant answers in the project's answer
format: one short explanation sentence, then one fenced python block with the step-wise commented solution.

The loop, top to bottom (`train_sft`):

1. tokenise: chat template over [user, assistant]; labels are -100 on the prompt (system + user + the
   assistant header) and on padding, so the loss is the mean negative log-likelihood of the answer tokens
   only;
2. a seeded, checkpointed data order (a fresh ``torch.Generator`` permutation per epoch);
3. each optimizer step takes ``grad_accum_steps`` micro-batches of ``batch_size`` examples, dynamically padded
   (or packed without padding); the loss of every micro-batch is divided by the number of answer tokens of the
   *whole* accumulated batch, so accumulation is exactly equivalent to one big batch even with unequal lengths
   (the normalisation HF transformers/TRL adopted in late 2024 with ``num_items_in_batch``);
4. AdamW, gradient clipping, cosine schedule with linear warm-up;
5. held-out loss every ``eval_every`` steps, early stopping after ``early_stopping_patience`` evaluations
   without improvement, the best weights restored at the end;
6. exact-resume checkpoints (weights, optimizer, scheduler, every RNG, data-order position), written
   atomically;
7. outputs: the LoRA adapter (``adapter/``) and a merged full checkpoint with the tokenizer (``merged/``).

Metrics go through ``emit(metrics, step)``: ``sft/loss``, ``sft/learning_rate``, ``sft/grad_norm``,
``sft/tokens_per_s``, ``sft/epoch`` every step; ``sft/eval_loss`` at every evaluation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from models.checkpoint import load_trainable_state_dict, set_seed, trainable_state_dict
from models.config import SFTConfig
from models.distributed import clip_grad_norm, data_parallel
from models.lora import apply_lora, count_parameters, targeted_module_names
from models.policy import resolve_device
from models.prompts import fenced, reference_code, user_message
from models.sampling import pad_token_id
from models.training import (
    DataOrder,
    EarlyStopping,
    adamw,
    autocast_factory,
    cosine_schedule,
    export,
    open_checkpoints,
    restore_loop_state,
    save_loop_state,
)

if TYPE_CHECKING:
    import torch

IGNORE_INDEX = -100


@dataclass
class SFTResult:
    """What `train_sft` returns.

    Attributes:
        global_step: optimizer steps done.
        best_eval_loss: lowest held-out loss (nats per answer token), None without evaluation.
        best_step: the step of `best_eval_loss` (its weights are the ones exported), None without evaluation.
        stopped_early: training ended by early stopping.
        history: every emitted record, ``{"step": int, <metric>: float, ...}``, in order (resumed runs
            included).
        adapter_path: the LoRA adapter directory (peft ``save_pretrained``), None in full fine-tuning.
        merged_path: full checkpoint + tokenizer directory, loadable with ``from_pretrained``.
        n_train_examples: training examples.
        n_truncated: training examples whose answer was cut at `max_seq_len`.
        trainable_params: parameters updated by the optimizer.
        target_modules: the layer names carrying LoRA adapters (e.g. ``["down_proj", ..., "v_proj"]``), empty
            in full fine-tuning.
    """

    global_step: int
    best_eval_loss: float | None
    best_step: int | None
    stopped_early: bool
    history: list[dict] = field(repr=False)
    adapter_path: Path | None
    merged_path: Path
    n_train_examples: int
    n_truncated: int
    trainable_params: int
    target_modules: list[str]


# ----------------------------------------------------------------------------------------------- rendering

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`])|\n")
_REQUEST = re.compile(
    r"^(?:please\s+)?(?:write|implement|create|define|build|complete)\s+(?:a|an|the)\s+(?:\w+\s+)?"
    r"(?:python\s+)?function(?:\s+`[^`]+`|\s+\w+\([^)]*\))?,?\s+(?:that|which)\s+(?P<what>\S.*)$",
    re.IGNORECASE,
)


def render_user_message(problem: dict) -> str:
    """The user turn (`models.prompts.user_message`), identical to what sampling, the gate and RL ask, so SFT
    trains on exactly the prompts the model is later asked."""
    return user_message(problem)


def explanation_sentence(problem: dict) -> str:
    """One short sentence introducing the solution, derived from the instruction's first sentence.

    "Write a function `clean` that strips each string and drops empty ones." gives "The function `clean` below
    strips each string and drops empty ones; each step is commented." (the clause is kept verbatim). An
    instruction of another shape gives "Here is the completed `<entry_point>` function." (plus the step note
    when the solution has step comments).
    """
    first = _SENTENCE_END.split(problem["instruction"].strip(), maxsplit=1)[0].strip().rstrip(".!?:; ")
    steps = "; each step is commented" if problem.get("steps") else ""
    match = _REQUEST.match(first)
    if match:
        return f"The function `{problem['entry_point']}` below {match['what']}{steps}."
    return f"Here is the completed `{problem['entry_point']}` function{steps}."


def render_answer(problem: dict) -> str:
    """The assistant turn: `explanation_sentence`, a blank line, then the complete reference program
    (`models.prompts.reference_code`, with its ``# Step k:`` comments) in one fenced python block, which
    `models.sampling.extract_code` reads back."""
    return f"{explanation_sentence(problem)}\n\n{fenced(reference_code(problem))}"


def render_messages(problem: dict) -> list[dict[str, str]]:
    """``[user, assistant]`` chat messages of one problem (`render_user_message`, `render_answer`)."""
    return [
        {"role": "user", "content": render_user_message(problem)},
        {"role": "assistant", "content": render_answer(problem)},
    ]


# ------------------------------------------------------------------------------------------- tokenisation


def _template_ids(tokenizer, messages: list[dict], add_generation_prompt: bool) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def build_sft_examples(
    tokenizer,
    rows: Sequence[dict],
    render: Callable[[dict], list[dict[str, str]]] = render_messages,
    max_seq_len: int | None = None,
    setting: str = "sft.max_seq_len",
) -> list[dict[str, Any]]:
    """Tokenise problems into SFT examples with the loss on the answer tokens only.

    For each row, ``messages = render(row)`` (the last message is the assistant's answer). The full sequence
    is the chat template over all messages; the prompt is the template over the other messages with
    ``add_generation_prompt=True`` (the context the model sees at inference), and must be a token prefix of
    the full sequence. The answer runs to the tokenizer's eos token (the template's end-of-turn, e.g.
    ``<|im_end|>``) inclusive: whatever the template adds after it (a newline in ChatML) is never generated
    and is dropped.

    `setting` names `max_seq_len` in the error for prompts that leave no room for an answer (DPO passes
    ``dpo.max_seq_len``); every row is checked first, so the message gives the longest prompt's token count.

    Returns:
        one dict per row: ``input_ids`` (list[int], length L ≤ max_seq_len), ``labels`` (list[int], length L,
        -100 on the ``n_prompt_tokens`` prompt tokens, the token ids on the answer), ``n_prompt_tokens``
        (int), ``truncated`` (bool: the answer was cut at `max_seq_len`).

    Raises:
        ValueError: the last message is not the assistant's; the rendered prompt is not a token prefix of the
            rendered conversation (a chat template that renders the prompt differently, or tokens merging
            across the boundary); an empty answer; prompts of `max_seq_len` tokens or more (the message names
            `setting`, how many rows, and the longest prompt's row and token count).
    """
    examples, too_long = [], []
    for index, row in enumerate(rows):
        name = row.get("pair_id", row.get("task_id", f"row {index}"))  # a preference pair, else a problem
        messages = render(row)
        if not messages or messages[-1].get("role") != "assistant":
            raise ValueError(f"{name}: render() must end with the assistant's message")
        prompt_ids = _template_ids(tokenizer, messages[:-1], add_generation_prompt=True)
        full_ids = _template_ids(tokenizer, messages, add_generation_prompt=False)
        n_prompt = len(prompt_ids)
        if full_ids[:n_prompt] != prompt_ids:
            at = next((i for i, (a, b) in enumerate(zip(prompt_ids, full_ids, strict=False)) if a != b), n_prompt)
            raise ValueError(
                f"{name}: the tokenised prompt (chat template with add_generation_prompt=True) is not a "
                f"prefix of the tokenised conversation; they diverge at token {at}: prompt has "
                f"{tokenizer.decode(prompt_ids[at : at + 8])!r}, conversation has "
                f"{tokenizer.decode(full_ids[at : at + 8])!r}. Use a chat template whose generation prompt "
                "is exactly the start of the rendered assistant turn."
            )
        answer = full_ids[n_prompt:]
        eos = tokenizer.eos_token_id
        if eos is not None and eos in answer:
            answer = answer[: len(answer) - answer[::-1].index(eos)]
        if not answer:
            raise ValueError(f"{name}: the rendered answer is empty")
        if max_seq_len is not None and n_prompt >= max_seq_len:
            too_long.append((n_prompt, name))
            continue
        input_ids = prompt_ids + answer
        truncated = max_seq_len is not None and len(input_ids) > max_seq_len
        if truncated:
            input_ids = input_ids[:max_seq_len]
        labels = [IGNORE_INDEX] * n_prompt + input_ids[n_prompt:]
        examples.append({"input_ids": input_ids, "labels": labels, "n_prompt_tokens": n_prompt, "truncated": truncated})
    if too_long:
        n_prompt, name = max(too_long)
        raise ValueError(
            f"{setting}={max_seq_len} leaves no room for the answer of {len(too_long)} of {len(rows)} rows: the "
            f"longest prompt ({name}) has {n_prompt} tokens; set {setting} > {n_prompt} or shorten those prompts"
        )
    return examples


def collate(examples: Sequence[dict], pad_token_id: int, packing: bool = False) -> dict[str, torch.Tensor]:
    """Batch examples for a forward pass.

    Dynamic padding (``packing=False``): right-pad to the longest example: ``input_ids`` (B, T) padded with
    `pad_token_id`, ``labels`` (B, T) padded with -100, ``attention_mask`` (B, T) 1 on real tokens.

    Packing (``packing=True``): one row of all examples back to back, no padding: ``input_ids``/``labels``
    (1, ΣL), ``position_ids`` (1, ΣL) restarting at 0 for each example. Without an attention mask,
    transformers reads the restarts as sequence boundaries and keeps attention within each example
    (``masking_utils.find_packed_sequence_indices``; the model must be called with ``use_cache=False``). Each
    example's first label is a prompt token (-100), so no loss crosses a boundary.
    """
    import torch

    if packing:
        ids = [t for ex in examples for t in ex["input_ids"]]
        labels = [t for ex in examples for t in ex["labels"]]
        positions = [p for ex in examples for p in range(len(ex["input_ids"]))]
        return {
            "input_ids": torch.tensor([ids]),
            "labels": torch.tensor([labels]),
            "position_ids": torch.tensor([positions]),
        }
    width = max(len(ex["input_ids"]) for ex in examples)
    input_ids = torch.full((len(examples), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, ex in enumerate(examples):
        n = len(ex["input_ids"])
        input_ids[row, :n] = torch.tensor(ex["input_ids"])
        labels[row, :n] = torch.tensor(ex["labels"])
        attention_mask[row, :n] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}


def _supports_logits_mask(model) -> bool:
    """Whether the model's forward accepts a boolean (B, T) ``logits_to_keep`` (transformers models built on
    ``slice_logits_to_keep``), so the LM head runs on the answer positions only."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    module = sys.modules.get(type(base).__module__)
    return getattr(module, "slice_logits_to_keep", None) is not None


def answer_nll(model, batch: dict[str, torch.Tensor], logits_mask: bool | None = None) -> tuple[torch.Tensor, int]:
    """Summed negative log-likelihood of the answer tokens of a batch, and how many there are.

    Position t predicts token t+1; the positions whose next label is -100 (prompt, padding) are skipped. When
    the model supports it the LM head is applied to the kept positions only (``logits_to_keep`` mask), which
    saves the (B, T, V) logits of the prompt and padding. The cross-entropy is taken in float32.

    Args:
        model: a causal LM (or a peft wrapper of one).
        batch: `collate` output on the model's device.
        logits_mask: use the ``logits_to_keep`` mask; None decides with `_supports_logits_mask`.

    Returns:
        ``(nll_sum, n_tokens)``: a scalar tensor (nats, differentiable) and the number of answer tokens.
    """
    import torch.nn.functional as F

    labels = batch["labels"]  # (B, T)
    targets = labels[:, 1:]  # (B, T-1): the token each position predicts
    keep = targets != IGNORE_INDEX  # (B, T-1)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    if logits_mask is None:
        logits_mask = _supports_logits_mask(model)
    if logits_mask:
        keep_full = F.pad(keep, (0, 1), value=False)  # (B, T): the last position predicts nothing
        logits = model(**inputs, use_cache=False, logits_to_keep=keep_full).logits  # (N, V)
    else:
        logits = model(**inputs, use_cache=False).logits[:, :-1][keep]  # (N, V)
    nll = F.cross_entropy(logits.float(), targets[keep], reduction="sum")
    return nll, int(keep.sum())


def evaluate_loss(
    model, examples: Sequence[dict], batch_size: int, pad_token_id: int, packing: bool = False, autocast=None
) -> float:
    """Mean held-out negative log-likelihood per answer token (nats), over all of `examples`.

    Runs in eval mode without gradients and restores the model's previous mode. `autocast` is a
    context-manager factory (e.g. ``lambda: torch.autocast("cuda", torch.bfloat16)``) or None.

    Raises:
        ValueError: `examples` has no answer token.
    """
    import torch

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        with torch.no_grad():
            for start in range(0, len(examples), batch_size):
                batch = collate(examples[start : start + batch_size], pad_token_id, packing)
                with autocast() if autocast else contextlib.nullcontext():
                    nll, n = answer_nll(model, {k: v.to(device) for k, v in batch.items()})
                total += nll.item()
                count += n
    finally:
        model.train(was_training)
    if count == 0:
        raise ValueError("no answer tokens to evaluate")
    return total / count


# ------------------------------------------------------------------------------------------- training loop


def _fingerprint(cfg: SFTConfig, train: Sequence[dict], evals: Sequence[dict]) -> str:
    """Hash of the config and the tokenised data: a checkpoint only resumes the run that wrote it."""
    payload = json.dumps(
        [
            dataclasses.asdict(cfg),
            [(e["input_ids"], e["labels"]) for e in train],
            [e["input_ids"] for e in evals],
        ]
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def train_sft(
    model,
    tokenizer,
    train_rows: Sequence[dict],
    eval_rows: Sequence[dict],
    cfg: SFTConfig,
    out_dir: Path,
    emit: Callable[[dict, int], None] = lambda m, s: None,
    resume: bool = True,
) -> SFTResult:
    """Fine-tune `model` on the reference answers of `train_rows` (see the module docstring for the loop).

    Args:
        model: a causal LM (``PreTrainedModel``), e.g. from `models.policy.load_policy`; it is moved to
            ``cfg.device`` and modified in place: with LoRA it is wrapped, trained, then merged, so on return
            it holds the merged weights (the best evaluated ones when evaluation ran).
        tokenizer: its tokenizer, with a chat template and a pad (or eos) token.
        train_rows, eval_rows: problems in the data/README.md schema; `eval_rows` may be empty (no
            evaluation).
        cfg: the configuration.
        out_dir: receives ``checkpoints/`` (the last exact-resume checkpoint), ``adapter/`` (LoRA only) and
            ``merged/``.
        emit: metrics callback ``emit(metrics, step)``; an exception raised there aborts training (the last
            checkpoint stays valid).
        resume: continue from the latest checkpoint in ``out_dir/checkpoints`` when there is one; False
            starts over: existing checkpoints are deleted once this run has saved its first one (a run that fails
            before that leaves them in place).

    Returns:
        an `SFTResult`.

    Raises:
        ValueError: no training examples, a tokenizer without pad/eos token, rendering errors (see
            `build_sft_examples`).
        models.checkpoint.CheckpointMismatchError (a ValueError): ``resume=True`` found a checkpoint written
            with another config or other data.
    """
    from tqdm.auto import tqdm

    out_dir = Path(out_dir)
    ckpt_root = out_dir / "checkpoints"
    pad_id = pad_token_id(tokenizer)
    train = build_sft_examples(tokenizer, train_rows, max_seq_len=cfg.max_seq_len)
    evals = build_sft_examples(tokenizer, eval_rows, max_seq_len=cfg.max_seq_len) if eval_rows else []
    if not train:
        raise ValueError("no training examples")
    dp = data_parallel(resolve_device(cfg.device))
    per_step = cfg.batch_size * cfg.grad_accum_steps * dp.world_size  # the global batch (batch_size is per process)
    total_steps = cfg.max_steps or math.ceil(cfg.epochs * len(train) / per_step)
    device = dp.device
    autocast = autocast_factory(cfg.mixed_precision, device, auto_on_cpu=True)

    set_seed(cfg.seed)
    if cfg.lora:
        model = apply_lora(
            model, cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_target_modules, cfg.lora_layers
        )
    model.to(device)
    model.train()
    optimizer, _ = adamw(model, cfg.learning_rate, cfg.weight_decay)
    export_copy = dp.export_copy(model)  # rank 0's copy to export from when FSDP2 shards the model in place
    # DDP or FSDP2 over the processes (the model itself in one): the training forward goes through the trainer
    trainer, optimizer = dp.prepare(model, optimizer)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    scheduler = cosine_schedule(optimizer, cfg.warmup_ratio, total_steps)
    order = DataOrder(len(train), cfg.seed)
    generators = {"data": order.generator}
    stopper = EarlyStopping(cfg.early_stopping_patience)
    logits_mask = _supports_logits_mask(model)
    fingerprint = _fingerprint(cfg, train, evals)
    step, stopped_early, history, best_weights = 0, False, [], None

    ckpt, superseded = open_checkpoints(ckpt_root, resume, fingerprint, "another sft config or other data")
    if ckpt is not None:
        restore_loop_state(ckpt, model, optimizer, order, generators, scheduler, stopper)
        step, stopped_early, history = ckpt.step, ckpt.state["stopped_early"], ckpt.state["history"]
        best_weights = ckpt.tensors.get("best")
        if dp.is_main:
            tqdm.write(f"sft: resumed from {ckpt.path} (step {step} of {total_steps})")

    def record(metrics: dict, at: int) -> None:
        history.append({"step": at, **metrics})
        if dp.is_main:
            emit(metrics, at)

    def write_checkpoint() -> None:  # every rank (sharded states are gathered), rank 0 writes
        save_loop_state(
            ckpt_root,
            step,
            model,
            optimizer,
            order,
            generators,
            fingerprint,
            superseded,
            scheduler,
            stopper,
            tensors={"best": best_weights} if best_weights is not None else None,
            state={"stopped_early": stopped_early, "history": history},
            write=dp.is_main,
        )

    bar = tqdm(total=total_steps, initial=step, desc="sft", mininterval=5.0, disable=not dp.is_main)  # also in logs
    while step < total_steps and not stopped_early:
        started = time.perf_counter()
        # Every rank draws the same global micro-batches and keeps its slice of each (all of it in one process).
        chunks = [
            [train[i] for i in dp.shard(order.take(cfg.batch_size * dp.world_size))]
            for _ in range(cfg.grad_accum_steps)
        ]
        micro = [collate(chunk, pad_id, cfg.packing) for chunk in chunks]
        # One normaliser for the whole accumulated batch: every answer token weighs the same, whichever
        # micro-batch (or process) it is in (a per-micro-batch mean would overweight the tokens of short ones).
        n_answer = int(dp.sum(sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in micro)))
        n_input = int(dp.sum(sum(len(ex["input_ids"]) for chunk in chunks for ex in chunk)))  # padding excluded
        total_nll = 0.0
        for i, batch in enumerate(micro):
            batch = {k: v.to(device) for k, v in batch.items()}
            with dp.no_sync(trainer, last=i == len(micro) - 1):
                with autocast() if autocast else contextlib.nullcontext():
                    nll, _ = answer_nll(trainer, batch, logits_mask)
                # DDP averages over ranks: × loss_scale makes it Σ over ranks of nll_local / n_answer_global, the
                # single-process gradient
                (nll / n_answer * dp.loss_scale).backward()
            total_nll += nll.item()
        total_nll = dp.sum(total_nll)
        grad_norm = clip_grad_norm(params, cfg.max_grad_norm or math.inf)
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        elapsed = time.perf_counter() - started
        loss = total_nll / n_answer
        record(
            {
                "sft/loss": loss,
                "sft/learning_rate": lr,
                "sft/grad_norm": float(grad_norm),
                "sft/tokens_per_s": n_input / elapsed,
                "sft/epoch": order.epochs_done,
            },
            step,
        )
        if evals and cfg.eval_every and (step % cfg.eval_every == 0 or step == total_steps):
            eval_loss = evaluate_loss(model, evals, cfg.batch_size, pad_id, cfg.packing, autocast)
            if stopper.update(eval_loss, step):
                best_weights = trainable_state_dict(model)
            stopped_early = stopper.should_stop
            record({"sft/eval_loss": eval_loss}, step)
        if cfg.checkpoint_every and (step % cfg.checkpoint_every == 0 or step == total_steps or stopped_early):
            write_checkpoint()
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.4f}")
    bar.close()

    if best_weights is not None and stopper.best_step != step:
        load_trainable_state_dict(model, best_weights)
    model.eval()
    trainable, _ = count_parameters(model)
    target_modules = targeted_module_names(model) if cfg.lora else []
    adapter_path, merged_path = (out_dir / "adapter" if cfg.lora else None), out_dir / "merged"
    to_export = dp.exportable(model, export_copy)
    if dp.is_main:
        adapter_path, merged_path = export(to_export, tokenizer, out_dir, cfg.lora)
    dp.barrier()  # every rank returns once the exports exist
    return SFTResult(
        global_step=step,
        best_eval_loss=stopper.best,
        best_step=stopper.best_step,
        stopped_early=stopped_early,
        history=history,
        adapter_path=adapter_path,
        merged_path=merged_path,
        n_train_examples=len(train),
        n_truncated=sum(e["truncated"] for e in train),
        trainable_params=trainable,
        target_modules=target_modules,
    )
