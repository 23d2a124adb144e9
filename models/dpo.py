"""Direct preference optimisation (DPO) of a LoRA policy against the SFT checkpoint as the reference.

The policy is the merged SFT weights plus a fresh LoRA adapter (`models.lora.apply_lora`); with the adapter disabled
(peft ``disable_adapter()``) the same module *is* the reference, so no second copy of the model is kept. The
reference is verified by content hash (`checkpoint_hash`, `load_reference`) before anything else: a reference from
another distribution destabilises the implicit KL term.

The loop, top to bottom (`train_dpo`):

1. tokenise each pair twice with the chat template, [user, chosen] and [user, rejected]; the log-probs are summed over
   the assistant tokens only (`build_pair_examples`, `sequence_logps`);
2. reference log-probs of every train and held-out pair, computed ONCE with the adapter disabled, kept in memory and
   in every checkpoint (a resumed run reads them back instead of recomputing them);
3. optionally drop the pairs with the highest CHES score (`ches_scores`, Razin et al. 2024), the ones most likely to
   displace the chosen answer's likelihood;
4. a seeded, checkpointed data order; each optimizer step takes ``grad_accum_steps`` micro-batches of ``batch_size``
   pairs (chosen and rejected stacked into one forward of 2·B rows); the per-pair losses are averaged over the whole
   accumulated batch, so accumulation equals one big batch;
5. AdamW, gradient clipping, cosine schedule with linear warm-up, at most `MAX_EPOCHS` passes over the pairs;
6. the held-out loss every ``eval_every`` steps, early stopping on it, the weights with the lowest held-out loss
   restored at the end (`models.training.EarlyStopping`). The reference itself (step 0, before any update: ln 2 for
   sigmoid, the loss type's own value for the others, SimPO and ORPO included) is a candidate, so when no update beats
   it the exported weights are the reference's (``DPOResult.kept_reference``). Issue 17: selecting on held-out reward
   accuracy, which is 0 at step 0 because every pair ties, let any update win; the recorded run kept a checkpoint
   whose held-out loss was worse than the reference's (0.693 → 0.726);
7. the likelihood-displacement monitor (Razin et al. 2024, "Unintentional Unalignment: Likelihood Displacement in
   Direct Preference Optimization"): at each evaluation the mean held-out chosen log-prob is compared with its value
   before training; when it has fallen by more than ``displacement_threshold`` nats while the margin grew, the run
   warns (`LikelihoodDisplacementWarning`, the ``dpo/eval_displaced`` metric, ``DPOResult.displacement``) and stops;
8. exact-resume checkpoints; exports ``adapter/`` and ``merged/`` like SFT.

Metrics (TRL's meanings, `emit(metrics, step)`), every step: ``dpo/loss``, ``dpo/rewards_chosen``,
``dpo/rewards_rejected``, ``dpo/rewards_margin``, ``dpo/rewards_accuracy``, ``dpo/logps_chosen``,
``dpo/logps_rejected``, ``dpo/learning_rate``, ``dpo/grad_norm``, ``dpo/epoch``; at each evaluation (and at step 0,
before any update) the same with ``dpo/eval_`` in front plus ``dpo/eval_chosen_logp_drop`` and
``dpo/eval_displaced``. Rewards are β·(log π_θ − log π_ref) summed over the answer tokens for the reference-based
losses, β·(average log π_θ per token) for SimPO and ORPO (TRL's CPO/ORPO trainers); log-probs are sums in nats.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from models.checkpoint import checkpoint_hash, load_trainable_state_dict, set_seed, trainable_state_dict
from models.config import MAX_EPOCHS, DPOConfig
from models.distributed import clip_grad_norm, data_parallel
from models.lora import apply_lora, count_parameters
from models.policy import load_policy, resolve_device
from models.sampling import pad_token_id
from models.sft import IGNORE_INDEX, build_sft_examples, collate
from models.sft import _supports_logits_mask as supports
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

# DPOConfig fields the loop does not read (the stage does)
_STAGE_ONLY = ("held_out_frac", "val_problems", "max_new_tokens", "max_pairs")


class LikelihoodDisplacementWarning(UserWarning):
    """The held-out chosen log-prob fell by more than the threshold while the margin grew (Razin et al. 2024)."""


class ReferenceMismatchError(ValueError):
    """The reference checkpoint's content hash is not the one the caller expects."""


@dataclass
class DPOResult:
    """What `train_dpo` returns.

    Attributes:
        global_step: optimizer steps done.
        best_step: the step whose weights are exported: the lowest held-out loss, step 0 (the reference) included;
            None without evaluation (the last weights are exported).
        best_eval: the held-out metrics at `best_step` (``dpo/eval_*`` keys), {} without evaluation.
        kept_reference: no update beat the reference's held-out loss (`best_step` 0): the exported weights are the
            reference's (the untrained adapter, whose merge leaves them unchanged).
        selection: why `best_step` was exported, in words (losses included).
        start_eval: the held-out metrics before any update (step 0), {} without evaluation.
        stopped_early: training ended by early stopping or by the displacement monitor.
        displacement: the likelihood-displacement monitor fired.
        displacement_step: the evaluation step it fired at, None otherwise.
        history: every emitted record ``{"step": int, <metric>: float}`` in order (resumed runs included).
        adapter_path, merged_path: the exported LoRA adapter and merged checkpoint (+ tokenizer).
        n_train_pairs: training pairs used (after the CHES filter).
        n_ches_filtered: training pairs dropped by the CHES filter.
        n_truncated: training pairs with a chosen or rejected answer cut at max_seq_len.
        trainable_params: adapter parameters.
        reference_sha256: the reference hash the caller vouched for (recorded; part of the resume fingerprint).
    """

    global_step: int
    best_step: int | None
    best_eval: dict[str, float]
    kept_reference: bool
    selection: str
    start_eval: dict[str, float]
    stopped_early: bool
    displacement: bool
    displacement_step: int | None
    history: list[dict] = field(repr=False)
    adapter_path: Path
    merged_path: Path
    n_train_pairs: int
    n_ches_filtered: int
    n_truncated: int
    trainable_params: int
    reference_sha256: str | None


# ------------------------------------------------------------------------------------------------- losses


def sigmoid_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The DPO loss (Rafailov et al. 2023, "Direct Preference Optimization", eq. 7).

    ``losses = −log σ(β·[(log π_θ(y_w) − log π_ref(y_w)) − (log π_θ(y_l) − log π_ref(y_l))])``, TRL's "sigmoid".

    Args:
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps: (B,) log-probs of the chosen
            (y_w) and rejected (y_l) answers under the policy and the reference, summed over answer tokens (nats).
        beta: β > 0.

    Returns:
        ``(losses (B,), chosen_rewards (B,), rejected_rewards (B,))``; rewards are β·(log π_θ − log π_ref), detached.
        At π_θ = π_ref every loss is ln 2 and every reward 0.
    """
    import torch.nn.functional as F

    chosen_logratios = policy_chosen_logps - ref_chosen_logps
    rejected_logratios = policy_rejected_logps - ref_rejected_logps
    losses = -F.logsigmoid(beta * (chosen_logratios - rejected_logratios))
    return losses, beta * chosen_logratios.detach(), beta * rejected_logratios.detach()


def ipo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float,
    chosen_n_tokens: torch.Tensor,
    rejected_n_tokens: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The IPO loss (Azar et al. 2023, "A General Theoretical Paradigm to Understand Learning from Human
    Preferences", eq. 17), with TRL's per-token normalisation of the log-ratios.

    ``h = (log π_θ(y_w) − log π_ref(y_w)) / |y_w| − (log π_θ(y_l) − log π_ref(y_l)) / |y_l|``,
    ``losses = (h − 1/(2β))²`` (β is the paper's τ). TRL divides each summed log-ratio by the answer's token count
    (confirmed with the IPO authors, per TRL's comment); a count of 0 is treated as 1.

    Args:
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps: (B,) summed log-probs (nats).
        beta: τ > 0.
        chosen_n_tokens, rejected_n_tokens: (B,) answer token counts.

    Returns:
        ``(losses (B,), chosen_rewards (B,), rejected_rewards (B,))``; rewards are β·(summed log-ratio), detached.
        At π_θ = π_ref every loss is 1/(4β²).
    """
    chosen_logratios = policy_chosen_logps - ref_chosen_logps
    rejected_logratios = policy_rejected_logps - ref_rejected_logps
    h = chosen_logratios / chosen_n_tokens.clamp(min=1) - rejected_logratios / rejected_n_tokens.clamp(min=1)
    losses = (h - 1 / (2 * beta)) ** 2
    return losses, beta * chosen_logratios.detach(), beta * rejected_logratios.detach()


def robust_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float,
    label_smoothing: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Robust DPO under label noise (Chowdhury et al. 2024, "Provably Robust DPO: Aligning Language Models with Noisy
    Feedback", eq. 8): an unbiased estimate of the clean DPO loss when each label is flipped with probability ε.

    With ``z = β·[(log π_θ(y_w) − log π_ref(y_w)) − (log π_θ(y_l) − log π_ref(y_l))]``:
    ``losses = [−(1 − ε)·log σ(z) + ε·log σ(−z)] / (1 − 2ε)``. ε = 0 gives `sigmoid_loss`.

    Args:
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps: (B,) summed log-probs (nats).
        beta: β > 0.
        label_smoothing: ε in [0, 0.5).

    Returns:
        ``(losses (B,), chosen_rewards (B,), rejected_rewards (B,))``; rewards are β·(summed log-ratio), detached.

    Raises:
        ValueError: ε outside [0, 0.5).
    """
    import torch.nn.functional as F

    if not 0 <= label_smoothing < 0.5:
        raise ValueError(f"robust DPO needs label_smoothing in [0, 0.5), got {label_smoothing}")
    chosen_logratios = policy_chosen_logps - ref_chosen_logps
    rejected_logratios = policy_rejected_logps - ref_rejected_logps
    z = beta * (chosen_logratios - rejected_logratios)
    losses = (-(1 - label_smoothing) * F.logsigmoid(z) + label_smoothing * F.logsigmoid(-z)) / (1 - 2 * label_smoothing)
    return losses, beta * chosen_logratios.detach(), beta * rejected_logratios.detach()


def simpo_loss(
    chosen_avg_logps: torch.Tensor, rejected_avg_logps: torch.Tensor, beta: float, gamma: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SimPO, reference-free (Meng et al. 2024, "SimPO: Simple Preference Optimization with a Reference-Free Reward",
    eq. 6): ``losses = −log σ(β·avg log π_θ(y_w) − β·avg log π_θ(y_l) − γ)``.

    Args:
        chosen_avg_logps, rejected_avg_logps: (B,) log-probs averaged over each answer's tokens (nats per token).
        beta: β > 0.
        gamma: γ, the target reward margin.

    Returns:
        ``(losses (B,), chosen_rewards (B,), rejected_rewards (B,))``; rewards are β·avg log-prob, detached.
    """
    import torch.nn.functional as F

    chosen_rewards = beta * chosen_avg_logps
    rejected_rewards = beta * rejected_avg_logps
    losses = -F.logsigmoid(chosen_rewards - rejected_rewards - gamma)
    return losses, chosen_rewards.detach(), rejected_rewards.detach()


def orpo_loss(
    chosen_avg_logps: torch.Tensor, rejected_avg_logps: torch.Tensor, beta: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ORPO, reference-free (Hong et al. 2024, "ORPO: Monolithic Preference Optimization without Reference Model",
    eqs. 4–7): the chosen answer's NLL plus λ times the odds-ratio term.

    ``odds(y) = P(y)/(1 − P(y))`` with ``log P(y)`` = the average log-prob per token;
    ``losses = −avg log π_θ(y_w) − β·log σ(log odds(y_w) − log odds(y_l))`` (β is the paper's λ). The NLL is each
    pair's per-token mean (TRL's ORPOTrainer averages the NLL over all chosen tokens of the batch instead).

    Args:
        chosen_avg_logps, rejected_avg_logps: (B,) average log-probs per answer token (nats, < 0).
        beta: λ > 0.

    Returns:
        ``(losses (B,), chosen_rewards (B,), rejected_rewards (B,))``; rewards are β·avg log-prob, detached (TRL's).
    """
    import torch
    import torch.nn.functional as F

    def log1mexp(x):  # log(1 − e^x) for x < 0, stable on both sides of −ln 2
        return torch.where(x > -math.log(2), torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))

    log_odds = (chosen_avg_logps - rejected_avg_logps) - (log1mexp(chosen_avg_logps) - log1mexp(rejected_avg_logps))
    losses = -chosen_avg_logps - beta * F.logsigmoid(log_odds)
    return losses, (beta * chosen_avg_logps).detach(), (beta * rejected_avg_logps).detach()


def preference_losses(
    cfg: DPOConfig,
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    chosen_n_tokens: torch.Tensor,
    rejected_n_tokens: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`cfg.loss_type`'s loss on summed log-probs (B,) and answer token counts (B,); see the loss functions.
    The reference log-probs are ignored by the reference-free SimPO and ORPO."""
    if cfg.loss_type == "sigmoid":
        return sigmoid_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, cfg.beta)
    if cfg.loss_type == "ipo":
        return ipo_loss(
            policy_chosen_logps,
            policy_rejected_logps,
            ref_chosen_logps,
            ref_rejected_logps,
            cfg.beta,
            chosen_n_tokens,
            rejected_n_tokens,
        )
    if cfg.loss_type == "robust":
        return robust_loss(
            policy_chosen_logps,
            policy_rejected_logps,
            ref_chosen_logps,
            ref_rejected_logps,
            cfg.beta,
            cfg.label_smoothing,
        )
    chosen_avg = policy_chosen_logps / chosen_n_tokens.clamp(min=1)
    rejected_avg = policy_rejected_logps / rejected_n_tokens.clamp(min=1)
    if cfg.loss_type == "simpo":
        return simpo_loss(chosen_avg, rejected_avg, cfg.beta, cfg.simpo_gamma)
    return orpo_loss(chosen_avg, rejected_avg, cfg.beta)


# --------------------------------------------------------------------------------------- reference model


def verify_reference(path: str | Path, expected_sha256: str) -> str:
    """Check that the checkpoint at `path` is the expected reference; returns its hash.

    Raises:
        ReferenceMismatchError (a ValueError): the hash differs; the message names both hashes.
        FileNotFoundError: `path` is not a checkpoint.
    """
    actual = checkpoint_hash(path)
    if actual != expected_sha256:
        raise ReferenceMismatchError(
            f"refusing {path} as the DPO reference: its content hash is {actual}, but the SFT stage produced "
            f"{expected_sha256}. The reference must be the SFT checkpoint itself (re-run the sft stage, or point "
            "dpo at data/checkpoints/sft/merged)."
        )
    return actual


def load_reference(path: str | Path, expected_sha256: str, dtype: str = "auto", device: str = "auto"):
    """`verify_reference`, then `models.policy.load_policy`: the merged SFT model the policy starts from.

    Returns:
        ``(model, tokenizer)``.

    Raises:
        ReferenceMismatchError: see `verify_reference` (nothing is loaded then).
    """
    verify_reference(path, expected_sha256)
    return load_policy(path, dtype=dtype, device=device)


# ------------------------------------------------------------------------------------------- tokenisation


def _render(role_answer: str):
    def render(row: dict) -> list[dict[str, str]]:
        return [{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": row[role_answer]}]

    return render


def build_pair_examples(
    tokenizer, rows: Sequence[dict], max_seq_len: int, setting: str = "dpo.max_seq_len"
) -> list[dict[str, dict]]:
    """Tokenise preference pairs: ``{"chosen": example, "rejected": example}`` per row, each example as in
    `models.sft.build_sft_examples` over [user = ``row["prompt"]``, assistant = ``row["chosen"|"rejected"]``]
    (labels -100 on the prompt, so log-probs cover the assistant's tokens only).

    Raises:
        ValueError: a row misses prompt/chosen/rejected or has an empty one, or its chosen equals its rejected
            (the message names the row); rendering errors from `build_sft_examples`, among them prompts that
            leave no room for an answer within `max_seq_len` (named `setting`, with the longest prompt's tokens).
    """
    for index, row in enumerate(rows):
        name = row.get("pair_id", row.get("task_id", f"pair {index}"))
        for key in ("prompt", "chosen", "rejected"):
            if not isinstance(row.get(key), str) or not row[key].strip():
                raise ValueError(f"{name}: '{key}' must be a non-empty string")
        if row["chosen"] == row["rejected"]:
            raise ValueError(f"{name}: chosen and rejected are identical")
    chosen = build_sft_examples(tokenizer, rows, _render("chosen"), max_seq_len, setting)
    rejected = build_sft_examples(tokenizer, rows, _render("rejected"), max_seq_len, setting)
    return [{"chosen": c, "rejected": r} for c, r in zip(chosen, rejected, strict=True)]


def collate_pairs(pairs: Sequence[dict], pad_token_id: int) -> dict[str, torch.Tensor]:
    """One batch of 2·B rows: the B chosen examples, then the B rejected ones (`models.sft.collate`)."""
    return collate([p["chosen"] for p in pairs] + [p["rejected"] for p in pairs], pad_token_id)


def _supports_logits_mask(model) -> bool:

    return supports(model)


def sequence_logps(
    model, batch: dict[str, torch.Tensor], logits_mask: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of each row's answer, summed over its answer tokens (the positions whose label is not -100).

    Position t predicts token t+1. When the model supports it the LM head runs on the answer positions only
    (a boolean ``logits_to_keep``), so the (B, T, V) logits of the prompt and padding are never built. Log-softmax
    is taken in float32.

    Args:
        model: a causal LM or a peft wrapper of one.
        batch: ``input_ids`` (B, T), ``attention_mask`` (B, T), ``labels`` (B, T) on the model's device.
        logits_mask: use the ``logits_to_keep`` mask; None decides from the model.

    Returns:
        ``(sum_logps (B,) float32, differentiable, nats; n_tokens (B,) long)``.
    """
    import torch
    import torch.nn.functional as F

    labels = batch["labels"]  # (B, T)
    targets = labels[:, 1:]  # (B, T-1)
    keep = targets != IGNORE_INDEX  # (B, T-1)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    if logits_mask is None:
        logits_mask = _supports_logits_mask(model)
    if logits_mask:
        logits = model(**inputs, use_cache=False, logits_to_keep=F.pad(keep, (0, 1), value=False)).logits  # (N, V)
    else:
        logits = model(**inputs, use_cache=False).logits[:, :-1][keep]  # (N, V)
    token_logps = -F.cross_entropy(logits.float(), targets[keep], reduction="none")  # (N,)
    rows = keep.nonzero()[:, 0]  # (N,): the row of each kept position, in row-major order like the masks
    sums = torch.zeros(labels.shape[0], dtype=torch.float32, device=labels.device).index_add(0, rows, token_logps)
    return sums, keep.sum(dim=1)


def _all_logps(model, pairs: Sequence[dict], batch_size: int, pad_id: int, autocast) -> tuple[torch.Tensor, ...]:
    """``(chosen_logps, rejected_logps, chosen_n, rejected_n)`` (N,) for every pair, no gradients, eval mode."""
    import torch

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out = [], [], [], []
    try:
        with torch.no_grad():
            for start in range(0, len(pairs), batch_size):
                chunk = pairs[start : start + batch_size]
                batch = {k: v.to(device) for k, v in collate_pairs(chunk, pad_id).items()}
                with autocast() if autocast else contextlib.nullcontext():
                    logps, n = sequence_logps(model, batch)
                for acc, value in zip(out, (*logps.split(len(chunk)), *n.split(len(chunk))), strict=True):
                    acc.append(value.cpu())
    finally:
        model.train(was_training)
    return tuple(torch.cat(acc) for acc in out)


def reference_logps(
    model, pairs: Sequence[dict], batch_size: int, pad_id: int, autocast=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference log-probs ``(ref_chosen_logps (N,), ref_rejected_logps (N,))`` (float32, CPU, summed, nats) of every
    pair: the peft model with its adapter disabled, i.e. the merged SFT weights."""
    with model.disable_adapter():
        chosen, rejected, _, _ = _all_logps(model, pairs, batch_size, pad_id, autocast)
    return chosen, rejected


def ches_scores(model, pairs: Sequence[dict], batch_size: int, pad_id: int) -> torch.Tensor:
    """CHES scores (Razin et al. 2024, "Unintentional Unalignment", sec. 5, the centered hidden embedding
    similarity) of each pair, under `model` as given (call it with the adapter disabled for the reference).

    ``CHES = ⟨Σ_k h_w,k, Σ_k h_l,k⟩ − ‖Σ_k h_w,k‖²`` where h_·,k is the last hidden state at the position that
    predicts answer token k (prompt and padding excluded). A high CHES means the rejected answer's hidden states point
    along the chosen one's: DPO's push down on the rejected answer then also pushes the chosen one down.

    Returns:
        (N,) float32 on CPU.
    """
    import torch

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    scores = []
    try:
        with torch.no_grad():
            for start in range(0, len(pairs), batch_size):
                chunk = pairs[start : start + batch_size]
                batch = {k: v.to(device) for k, v in collate_pairs(chunk, pad_id).items()}
                labels = batch.pop("labels")
                hidden = model(**batch, use_cache=False, output_hidden_states=True).hidden_states[-1]  # (2B, T, H)
                keep = (labels[:, 1:] != IGNORE_INDEX).unsqueeze(-1)  # (2B, T-1, 1)
                summed = (hidden[:, :-1].float() * keep).sum(dim=1)  # (2B, H)
                h_chosen, h_rejected = summed.split(len(chunk))  # (B, H) each
                scores.append(((h_chosen * h_rejected).sum(-1) - (h_chosen * h_chosen).sum(-1)).cpu())
    finally:
        model.train(was_training)
    return torch.cat(scores)


# ------------------------------------------------------------------------------------------- training loop


def split_pairs(pairs: Sequence[dict], held_out_frac: float) -> tuple[list[dict], list[dict]]:
    """``(train, held_out)``: a pair is held out when the sha256 of its prompt, read as a number in [0, 1), is below
    `held_out_frac`, so all pairs of a prompt land on the same side (no prompt leaks into evaluation) and the split
    does not depend on the order or number of pairs. Order is kept within each side."""
    train, held_out = [], []
    for row in pairs:
        u = int(hashlib.sha256(row["prompt"].encode("utf-8", "surrogateescape")).hexdigest()[:15], 16) / 16**15
        (held_out if u < held_out_frac else train).append(row)
    return train, held_out


def select_pairs(pairs: Sequence[dict], max_pairs: int, seed: int) -> list[dict]:
    """At most `max_pairs` pairs (0 = all): self-play and human pairs first, then a seeded random sample of the rest.

    Self-play pairs are on-policy (the SFT model's own answers, ranked by the verifier and the format rules) and human
    pairs are the most trusted; mined pairs rate the base model's answers, so they fill what is left. Order within the
    result follows the input.
    """
    import random

    if max_pairs == 0 or len(pairs) <= max_pairs:
        return list(pairs)
    first = [i for i, row in enumerate(pairs) if row.get("source") in ("selfplay", "human")]
    rest = [i for i, row in enumerate(pairs) if row.get("source") not in ("selfplay", "human")]
    random.Random(seed).shuffle(rest)
    keep = set((first + rest)[:max_pairs])
    return [row for i, row in enumerate(pairs) if i in keep]


def pair_metrics(
    cfg: DPOConfig,
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    chosen_n: torch.Tensor,
    rejected_n: torch.Tensor,
    prefix: str = "dpo/",
) -> dict[str, float]:
    """Mean loss, rewards, margin, accuracy and log-probs over pairs (all (N,)), under TRL's meanings, except that a
    tied pair counts 0.5 in the accuracy (half right; TRL counts 0), so the reference at step 0, where every
    reference-based reward is 0, scores 0.5 rather than 0 (issue 17)."""
    losses, chosen_rewards, rejected_rewards = preference_losses(
        cfg, chosen_logps, rejected_logps, ref_chosen, ref_rejected, chosen_n, rejected_n
    )
    right = (chosen_rewards > rejected_rewards).float() + 0.5 * (chosen_rewards == rejected_rewards).float()
    return {
        f"{prefix}loss": losses.mean().item(),
        f"{prefix}rewards_chosen": chosen_rewards.mean().item(),
        f"{prefix}rewards_rejected": rejected_rewards.mean().item(),
        f"{prefix}rewards_margin": (chosen_rewards - rejected_rewards).mean().item(),
        f"{prefix}rewards_accuracy": right.mean().item(),
        f"{prefix}logps_chosen": chosen_logps.detach().mean().item(),
        f"{prefix}logps_rejected": rejected_logps.detach().mean().item(),
    }


def displaced(start: dict[str, float], now: dict[str, float], threshold: float) -> bool:
    """The likelihood-displacement condition on held-out metrics (``dpo/eval_*`` dicts): the mean chosen log-prob
    fell by more than `threshold` nats from `start` while the mean margin grew. A threshold of 0 never fires."""
    drop = start["dpo/eval_logps_chosen"] - now["dpo/eval_logps_chosen"]
    grew = now["dpo/eval_rewards_margin"] > start["dpo/eval_rewards_margin"]
    return threshold > 0 and drop > threshold and grew


def _selection(best_step: int | None, start_eval: dict, best_eval: dict, history: list[dict]) -> str:
    """`DPOResult.selection`: why `best_step` is the exported one."""
    if best_step is None:
        return "no held-out evaluation: the last step's weights are exported"
    start = start_eval["dpo/eval_loss"]
    if best_step > 0:
        return f"step {best_step}: held-out loss {best_eval['dpo/eval_loss']:.4f} < the reference's {start:.4f}"
    updates = [h["dpo/eval_loss"] for h in history if h["step"] > 0 and "dpo/eval_loss" in h]
    best_update = f" (the best update's: {min(updates):.4f})" if updates else ""
    return f"no update beat the reference's held-out loss {start:.4f}{best_update}: the reference is exported"


def _answer_lengths(pairs: Sequence[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """Answer token counts (N,) of the chosen and of the rejected examples (what `sequence_logps` counts)."""
    import torch

    return tuple(
        torch.tensor([len(p[side]["input_ids"]) - p[side]["n_prompt_tokens"] for p in pairs])
        for side in ("chosen", "rejected")
    )


def _fingerprint(cfg: DPOConfig, train: Sequence[dict], evals: Sequence[dict], reference_sha256: str | None) -> str:
    """Hash of the config, the tokenised pairs and the reference: a checkpoint only resumes the run that wrote it."""
    payload = json.dumps(
        [
            {k: v for k, v in dataclasses.asdict(cfg).items() if k not in _STAGE_ONLY},
            [(p["chosen"]["input_ids"], p["chosen"]["labels"], p["rejected"]["input_ids"]) for p in train],
            [(p["chosen"]["input_ids"], p["rejected"]["input_ids"]) for p in evals],
            reference_sha256,
            "best = lowest held-out loss",  # checkpoints selected by another rule (issue 17) are not resumed
        ]
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def train_dpo(
    model,
    tokenizer,
    train_pairs: Sequence[dict],
    eval_pairs: Sequence[dict],
    cfg: DPOConfig,
    out_dir: Path,
    emit: Callable[[dict, int], None] = lambda m, s: None,
    resume: bool = True,
    reference_sha256: str | None = None,
) -> DPOResult:
    """Align `model` on preference pairs with `cfg.loss_type` (see the module docstring for the loop).

    Args:
        model: the merged SFT model (``PreTrainedModel``, e.g. from `load_reference`), which is the reference; it is
            wrapped with a fresh LoRA adapter, moved to ``cfg.device``, trained, then merged: on return `model` is
            unusable (use the exported ``merged/``).
        tokenizer: its tokenizer, with a chat template and a pad (or eos) token.
        train_pairs, eval_pairs: rows ``{"prompt", "chosen", "rejected", ...}`` (user message text and two assistant
            answers); `eval_pairs` may be empty (no evaluation, no early stopping, no displacement monitor).
        cfg: the configuration.
        out_dir: receives ``checkpoints/``, ``adapter/`` and ``merged/``.
        emit: metrics callback ``emit(metrics, step)``; an exception there aborts training (the last checkpoint stays).
        resume: continue from the latest checkpoint in ``out_dir/checkpoints``; False starts over: existing
            checkpoints are deleted once this run has saved its first one (a run that fails before that leaves them).
        reference_sha256: the reference's `checkpoint_hash` as verified by the caller; recorded and part of the resume
            fingerprint (a checkpoint made against another reference is not resumed).

    Returns:
        a `DPOResult`.

    Raises:
        ValueError: no training pairs, a tokenizer without pad/eos, invalid pairs (`build_pair_examples`).
        models.checkpoint.CheckpointMismatchError: ``resume=True`` found a checkpoint of another config, data or
            reference.
    """
    import torch
    from tqdm.auto import tqdm

    out_dir = Path(out_dir)
    ckpt_root = out_dir / "checkpoints"
    pad_id = pad_token_id(tokenizer)
    if not train_pairs:
        raise ValueError("no training pairs")
    all_train = build_pair_examples(tokenizer, train_pairs, cfg.max_seq_len)
    evals = build_pair_examples(tokenizer, eval_pairs, cfg.max_seq_len) if eval_pairs else []
    evaluate = bool(evals) and cfg.eval_every > 0
    dp = data_parallel(resolve_device(cfg.device))
    device = dp.device
    autocast = autocast_factory(cfg.mixed_precision, device)
    fingerprint = _fingerprint(cfg, all_train, evals, reference_sha256)

    set_seed(cfg.seed)
    model = apply_lora(model, cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_target_modules, cfg.lora_layers)
    model.to(device)
    model.train()
    logits_mask = _supports_logits_mask(model)

    ckpt, superseded = open_checkpoints(
        ckpt_root, resume, fingerprint, "another dpo config, other pairs or another reference"
    )
    if ckpt is not None:  # the cached reference log-probs and the CHES selection travel with the checkpoint
        ref = ckpt.tensors["reference"]
        keep = ckpt.state["kept_pairs"]
    else:
        ref = {}
        ref["train_chosen"], ref["train_rejected"] = reference_logps(model, all_train, cfg.batch_size, pad_id, autocast)
        if evaluate:
            ref["eval_chosen"], ref["eval_rejected"] = reference_logps(model, evals, cfg.batch_size, pad_id, autocast)
        keep = list(range(len(all_train)))
        if cfg.ches_filter_quantile > 0:
            with model.disable_adapter():
                scores = ches_scores(model, all_train, cfg.batch_size, pad_id)
            n_drop = min(int(cfg.ches_filter_quantile * len(all_train)), len(all_train) - 1)
            dropped = set(scores.argsort(descending=True)[:n_drop].tolist())
            keep = [i for i in keep if i not in dropped]
    train = [all_train[i] for i in keep]
    train_ref_chosen, train_ref_rejected = ref["train_chosen"][keep], ref["train_rejected"][keep]

    per_step = cfg.batch_size * cfg.grad_accum_steps * dp.world_size  # the global batch (batch_size is per process)
    cap = math.ceil(MAX_EPOCHS * len(train) / per_step)
    total_steps = min(cfg.max_steps or math.ceil(cfg.epochs * len(train) / per_step), cap)
    optimizer, _ = adamw(model, cfg.learning_rate, cfg.weight_decay)
    export_copy = dp.export_copy(model)  # rank 0's copy to export from when FSDP2 shards the model in place
    # DDP or FSDP2 over the processes (the model itself in one): the training forward goes through the trainer
    trainer, optimizer = dp.prepare(model, optimizer)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    scheduler = cosine_schedule(optimizer, cfg.warmup_ratio, total_steps)
    order = DataOrder(len(train), cfg.seed)
    generators = {"data": order.generator}
    stopper = EarlyStopping(cfg.early_stopping_patience)
    step, stopped_early, history, best_weights = 0, False, [], None
    start_eval: dict[str, float] = {}
    best_eval: dict[str, float] = {}
    displacement_step: int | None = None

    if ckpt is not None:
        restore_loop_state(ckpt, model, optimizer, order, generators, scheduler, stopper)
        step, stopped_early, history = ckpt.step, ckpt.state["stopped_early"], ckpt.state["history"]
        start_eval, best_eval = ckpt.state["start_eval"], ckpt.state["best_eval"]
        displacement_step = ckpt.state["displacement_step"]
        best_weights = ckpt.tensors.get("best")

    def record(metrics: dict, at: int) -> None:
        history.append({"step": at, **metrics})
        if dp.is_main:
            emit(metrics, at)

    def eval_metrics() -> dict[str, float]:
        chosen, rejected, n_chosen, n_rejected = _all_logps(model, evals, cfg.batch_size, pad_id, autocast)
        return pair_metrics(
            cfg, chosen, rejected, ref["eval_chosen"], ref["eval_rejected"], n_chosen, n_rejected, "dpo/eval_"
        )

    def write_checkpoint() -> None:  # every rank (sharded states are gathered), rank 0 writes
        tensors = {"reference": ref}
        if best_weights is not None:
            tensors["best"] = best_weights
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
            tensors=tensors,
            state={
                "kept_pairs": keep,
                "stopped_early": stopped_early,
                "start_eval": start_eval,
                "best_eval": best_eval,
                "displacement_step": displacement_step,
                "history": history,
            },
            write=dp.is_main,
        )

    if evaluate and step == 0:
        # Before any update the policy is the reference (LoRA's B is 0): the cached log-probs are its log-probs.
        # The untrained adapter is the first "best": an evaluation must beat doing nothing to be exported.
        ref_eval = ref["eval_chosen"], ref["eval_rejected"]
        start_eval = pair_metrics(cfg, *ref_eval, *ref_eval, *_answer_lengths(evals), prefix="dpo/eval_")
        stopper.update(start_eval["dpo/eval_loss"], 0)
        best_weights, best_eval = trainable_state_dict(model), start_eval
        record({**start_eval, "dpo/eval_chosen_logp_drop": 0.0, "dpo/eval_displaced": 0.0}, 0)

    bar = tqdm(total=total_steps, initial=step, desc="dpo", mininterval=5.0, disable=not dp.is_main)
    while step < total_steps and not stopped_early:
        # Every rank draws the same global micro-batches from the same order and keeps its slice of each.
        index = [list(dp.shard(order.take(cfg.batch_size * dp.world_size))) for _ in range(cfg.grad_accum_steps)]
        stats = [], [], [], [], [], []  # chosen, rejected logps, their token counts, ref chosen, ref rejected
        for m, micro in enumerate(index):
            batch = {k: v.to(device) for k, v in collate_pairs([train[i] for i in micro], pad_id).items()}
            with dp.no_sync(trainer, last=m == len(index) - 1):
                with autocast() if autocast else contextlib.nullcontext():
                    logps, n_tokens = sequence_logps(trainer, batch, logits_mask)
                chosen, rejected = logps.split(len(micro))  # (B,) each
                n_chosen, n_rejected = n_tokens.split(len(micro))
                ref_chosen, ref_rejected = train_ref_chosen[micro].to(device), train_ref_rejected[micro].to(device)
                losses, _, _ = preference_losses(cfg, chosen, rejected, ref_chosen, ref_rejected, n_chosen, n_rejected)
                # the mean over every pair of the accumulated global batch (DDP averages: × loss_scale)
                (losses.sum() / per_step * dp.loss_scale).backward()
            for acc, value in zip(
                stats, (chosen, rejected, n_chosen, n_rejected, ref_chosen, ref_rejected), strict=True
            ):
                acc.append(value.detach().cpu())
        grad_norm = clip_grad_norm(params, cfg.max_grad_norm or math.inf)
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        chosen, rejected, n_chosen, n_rejected, ref_chosen, ref_rejected = (
            torch.cat(dp.gather([torch.cat(s)]))
            for s in stats  # the global batch's pairs (rank order)
        )
        metrics = pair_metrics(cfg, chosen, rejected, ref_chosen, ref_rejected, n_chosen, n_rejected)
        record(
            {**metrics, "dpo/learning_rate": lr, "dpo/grad_norm": float(grad_norm), "dpo/epoch": order.epochs_done},
            step,
        )
        if evaluate and (step % cfg.eval_every == 0 or step == total_steps):
            now = eval_metrics()
            hit = displaced(start_eval, now, cfg.displacement_threshold)
            drop = start_eval["dpo/eval_logps_chosen"] - now["dpo/eval_logps_chosen"]
            record({**now, "dpo/eval_chosen_logp_drop": drop, "dpo/eval_displaced": float(hit)}, step)
            if hit:
                displacement_step, stopped_early = step, True
                warnings.warn(
                    f"likelihood displacement at step {step}: the held-out chosen log-prob fell by {drop:.2f} nats "
                    f"(threshold {cfg.displacement_threshold}) while the margin grew to "
                    f"{now['dpo/eval_rewards_margin']:.3f}; stopping (Razin et al. 2024). Consider "
                    "dpo.ches_filter_quantile > 0, a lower learning rate or a larger beta.",
                    LikelihoodDisplacementWarning,
                    stacklevel=2,
                )
            else:
                if stopper.update(now["dpo/eval_loss"], step):
                    best_weights, best_eval = trainable_state_dict(model), now
                stopped_early = stopper.should_stop
        if cfg.checkpoint_every and (step % cfg.checkpoint_every == 0 or step == total_steps or stopped_early):
            write_checkpoint()
        bar.update(1)
        bar.set_postfix(loss=f"{metrics['dpo/loss']:.4f}", margin=f"{metrics['dpo/rewards_margin']:.3f}")
    bar.close()

    if best_weights is not None and stopper.best_step != step:
        load_trainable_state_dict(model, best_weights)
    model.eval()
    trainable, _ = count_parameters(model)
    adapter_path, merged_path = out_dir / "adapter", out_dir / "merged"
    to_export = dp.exportable(model, export_copy)
    if dp.is_main:
        adapter_path, merged_path = export(to_export, tokenizer, out_dir, lora=True)
    dp.barrier()  # every rank returns once the exports exist
    return DPOResult(
        global_step=step,
        best_step=stopper.best_step,
        best_eval=best_eval,
        kept_reference=stopper.best_step == 0,
        selection=_selection(stopper.best_step, start_eval, best_eval, history),
        start_eval=start_eval,
        stopped_early=stopped_early,
        displacement=displacement_step is not None,
        displacement_step=displacement_step,
        history=history,
        adapter_path=adapter_path,
        merged_path=merged_path,
        n_train_pairs=len(train),
        n_ches_filtered=len(all_train) - len(train),
        n_truncated=sum(p["chosen"]["truncated"] or p["rejected"]["truncated"] for p in train),
        trainable_params=trainable,
        reference_sha256=reference_sha256,
    )
