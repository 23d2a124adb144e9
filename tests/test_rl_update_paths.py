"""The RL update computes only what changes the loss, and changes nothing else: each saving is checked against the
previous path (every row scored as its own prompt + completion sequence, duplicates and zero-advantage rows kept)
on a tiny LoRA model, loss and adapter gradients within 1e-4 relative in float32.

- the prompt shared by a group's answers runs once (`policy_forward`: the prompts' key/value cache indexed per row);
- identical rows merge into one with their multiplicity as weight (`merge_duplicates`, every loss type);
- rows whose advantages are all 0 leave the forward, the loss keeping their tokens' share (`_minibatch_backward`);
- the start policy is scored on `kl_start_rows` rows unless β > 0 (`kl_sample_rows`);
- bf16 autocast (the default where the CPU runs bf16 natively): the log-probs and gradient agree with float32 within
  the tolerance stated in `test_bf16_autocast_agrees_with_float32_within_the_stated_tolerance`.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from models.config import ProcessRewardConfig, RLConfig
from models.lora import apply_lora
from models.policy import build_tiny_causal_lm
from models.rl import (
    Rollout,
    _minibatch_backward,
    build_batch,
    kl_sample_rows,
    merge_duplicates,
    policy_forward,
    ppo_losses,
    select_rows,
)
from models.sampling import Completion
from models.training import native_bf16
from tests.test_rl_loop import one_thread  # noqa: F401 (autouse: 1 thread)

CFG = dict(
    group_size=4,
    minibatch_size=4,
    device="cpu",
    rollout_engine="torch",
    reward=ProcessRewardConfig(overlong_max=0, overlong_cache=0),
)


def lora_model(seed: int = 0):
    model, tok = build_tiny_causal_lm(seed)
    torch.manual_seed(seed)
    model = apply_lora(model, 4, 8.0, 0.0)
    # LoRA B starts at 0; move it so the adapters change the prompt's keys and values (their gradient flows back
    # through the shared cache)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)
    return model, tok


def rollouts_of(prompts: list[list[int]], answers: list[list[list[int]]]) -> list[Rollout]:
    """Rollouts from token ids: answers[g] are group g's completions (duplicates allowed), old log-probs −1.5."""
    out = []
    for g, (prompt, group) in enumerate(zip(prompts, answers, strict=True)):
        for j, ids in enumerate(group):
            c = Completion("x", "x", prompt, ids, [-1.5] * len(ids), "eos")
            out.append(Rollout({"task_id": f"t{g}"}, 0, j, c, 0, 1, "x", 0.0, 0.0))
    return out


# two prompts of different lengths (left padding), groups of 4 with duplicates and different lengths
PROMPTS = [[5, 17, 33, 40, 41, 90], [7, 8, 9, 11]]
ANSWERS = [
    [[20, 21, 22, 2], [20, 21, 22, 2], [30, 31, 2], [40, 41, 42, 43, 44, 2]],
    [[50, 51, 2], [60, 2], [50, 51, 2], [50, 51, 2]],
]


def full_sequence_forward(model, batch, temperature: float, autocast=None):
    """The previous path: every row its own left-padded prompt | right-padded completion sequence, position ids
    counting real tokens, logits / T at the completion positions. Returns (per_token_logps, logits) (B, T)."""
    rows = batch["completion_ids"].shape[0]
    prompts = batch["prompt_ids"][batch["prompt_index"]]
    prompt_mask = batch["prompt_mask"][batch["prompt_index"]]
    ids = torch.cat([prompts, batch["completion_ids"]], dim=1)
    mask = torch.cat([prompt_mask, batch["completion_mask"].long()], dim=1)
    width = batch["completion_ids"].shape[1]
    with autocast() if autocast else contextlib.nullcontext():
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
            use_cache=False,
            logits_to_keep=width + 1,
        )
    logits = out.logits[:, :-1].float() / temperature
    picked = logits.gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)
    assert picked.shape[0] == rows
    return picked - torch.logsumexp(logits, dim=-1), logits


def adapter_grads(model) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for n, p in model.named_parameters() if "lora_" in n])


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def batch_with_advantages(advantages_per_row: list[float]) -> dict:
    batch = build_batch(rollouts_of(PROMPTS, ANSWERS), pad_token_id=0)
    batch["advantages"] = torch.tensor(advantages_per_row).unsqueeze(1) * batch["completion_mask"]
    return batch


def test_build_batch_holds_each_prompt_once_and_select_rows_keeps_the_used_ones():
    batch = build_batch(rollouts_of(PROMPTS, ANSWERS), pad_token_id=0)
    assert batch["prompt_ids"].tolist() == [PROMPTS[0], [0, 0, *PROMPTS[1]]]  # left-padded to 6
    assert batch["prompt_mask"].tolist() == [[1] * 6, [0, 0, 1, 1, 1, 1]]
    assert batch["prompt_index"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert batch["completion_ids"].shape == (8, 6) and batch["weights"].tolist() == [1.0] * 8
    part = select_rows(batch, [5, 6])
    assert part["prompt_ids"].tolist() == [[0, 0, *PROMPTS[1]]] and part["prompt_index"].tolist() == [0, 0]
    assert part["completion_ids"][:, :2].tolist() == [[60, 2], [50, 51]]


def test_merge_duplicates_counts_multiplicities_and_maps_rows_back():
    batch = build_batch(rollouts_of(PROMPTS, ANSWERS), pad_token_id=0)
    merged, inverse = merge_duplicates(batch)
    # group 0: rows 0 and 1 equal; group 1: rows 4, 6 and 7 equal (same ids, same prompt)
    assert inverse.tolist() == [0, 0, 1, 2, 3, 4, 3, 3]
    assert merged["weights"].tolist() == [2.0, 1.0, 1.0, 3.0, 1.0]
    assert torch.equal(merged["completion_ids"][inverse], batch["completion_ids"])
    # a row that differs in any per-row tensor (here its old log-probs) is not merged
    batch["old_per_token_logps"][1, 0] = -1.25
    assert merge_duplicates(batch)[0]["weights"].tolist() == [1.0, 1.0, 1.0, 1.0, 3.0, 1.0]


def test_the_shared_prompt_forward_equals_one_sequence_per_row():
    """Log-probs, logits, values and the adapters' gradient of a loss on them, against the previous path."""
    from models.value_head import ValueHead

    model, _ = lora_model()
    batch = build_batch(rollouts_of(PROMPTS, ANSWERS), pad_token_id=0)
    mask = batch["completion_mask"]
    weights = torch.linspace(-1.0, 1.0, mask.numel()).reshape(mask.shape) * mask
    logps, logits, values = policy_forward(model, batch, ValueHead(model.config.hidden_size), temperature=0.7)
    (logps * weights).sum().backward()
    shared = adapter_grads(model)
    model.zero_grad(set_to_none=True)
    ref_logps, ref_logits = full_sequence_forward(model, batch, 0.7)
    (ref_logps * weights).sum().backward()
    full = adapter_grads(model)
    assert values.shape == mask.shape
    assert ((logps - ref_logps) * mask).abs().max().item() < 1e-5
    assert ((logits - ref_logits) * mask.unsqueeze(-1)).abs().max().item() < 1e-4
    assert full.norm() > 0 and relative(shared, full) < 1e-4


@pytest.mark.parametrize("algo", ["dapo", "grpo", "didpo", "rft"])
def test_merged_duplicates_give_the_loss_and_gradient_of_the_rows_side_by_side(algo):
    model, _ = lora_model()
    cfg = RLConfig(**CFG, algo=algo)
    batch = batch_with_advantages([1.0, 1.0, -0.5, 0.3, 0.7, -1.2, 0.7, 0.7])
    results = []
    for minibatch in (batch, merge_duplicates(batch)[0]):
        model.zero_grad(set_to_none=True)
        logps, logits, _ = policy_forward(model, minibatch, temperature=1.0)
        minibatch = dict(minibatch, old_per_token_logps=logps.detach() + 0.05 * minibatch["completion_mask"])
        loss, stats = ppo_losses(logps, logits, None, minibatch, cfg)
        loss.backward()
        results.append((loss.item(), adapter_grads(model), stats))
    (loss_all, grad_all, stats_all), (loss_merged, grad_merged, stats_merged) = results
    assert abs(loss_merged - loss_all) <= 1e-4 * abs(loss_all) and relative(grad_merged, grad_all) < 1e-4
    assert stats_merged["entropy"] == pytest.approx(stats_all["entropy"], rel=1e-4)


@pytest.mark.parametrize("algo", ["dapo", "grpo", "didpo"])
def test_zero_advantage_rows_leave_the_forward_and_the_gradient_is_unchanged(algo):
    """Group 1's advantages are all 0 (equal rewards): the minibatch's gradient without it equals the gradient with
    it (its tokens still count in the token mean, its sequences in grpo's sequence mean); a minibatch of
    zero-advantage rows only gives an exactly-zero gradient (AdamW still steps on it, as on the full one)."""
    model, _ = lora_model()
    params = [p for p in model.parameters() if p.requires_grad]
    cfg = RLConfig(**CFG, algo=algo)
    batch = batch_with_advantages([1.0, 1.0, -0.5, 0.3, 0.0, 0.0, 0.0, 0.0])
    batch["old_per_token_logps"] = full_sequence_forward(model, batch, 1.0)[0].detach() - 0.1
    model.zero_grad(set_to_none=True)
    logps, logits = full_sequence_forward(model, batch, 1.0)
    ppo_losses(logps, logits, None, dict(batch, weights=None), cfg)[0].backward()
    expected = adapter_grads(model)
    model.zero_grad(set_to_none=True)
    stats = _minibatch_backward(model, None, params, batch, cfg, None, True)
    assert stats["rows_dropped"] == 4.0 and relative(adapter_grads(model), expected) < 1e-4
    model.zero_grad(set_to_none=True)
    stats = _minibatch_backward(model, None, params, select_rows(batch, [4, 5, 6, 7]), cfg, None, True)
    assert stats == {"pg_loss": 0.0, "loss": 0.0, "rows_dropped": 4.0} and all(
        p.grad is not None and not p.grad.any() for p in params
    )
    # with an entropy bonus a zero-advantage row still has a gradient: nothing is dropped
    ent = RLConfig(**CFG, algo=algo, ent_coef=0.01)
    model.zero_grad(set_to_none=True)
    assert _minibatch_backward(model, None, params, batch, ent, None, True)["rows_dropped"] == 0.0


def test_kl_sample_rows():
    cfg = RLConfig(**CFG, algo="grpo", kl_start_rows=4)
    rows = kl_sample_rows(16, cfg, step=0)
    assert len(rows) == 4 and rows.tolist() == sorted(set(rows.tolist())) and max(rows) < 16
    assert torch.equal(rows, kl_sample_rows(16, cfg, step=0))  # seeded by (seed, step)
    assert any(not torch.equal(rows, kl_sample_rows(16, cfg, step=s)) for s in range(1, 4))
    assert kl_sample_rows(3, cfg, 0).tolist() == [0, 1, 2]  # k ≥ n: every row
    assert kl_sample_rows(16, RLConfig(**CFG, algo="grpo", kl_start_rows=0), 0).tolist() == list(range(16))
    assert kl_sample_rows(16, RLConfig(**CFG, algo="grpo", kl_coef=0.1), 0).tolist() == list(range(16))
    with pytest.raises(ValueError, match="didpo.kl_start_rows"):
        RLConfig(**CFG, kl_start_rows=-1)


@pytest.mark.skipif(not native_bf16("cpu"), reason="this CPU emulates bf16 (no AVX512-BF16 or AMX)")
def test_bf16_autocast_agrees_with_float32_within_the_stated_tolerance():
    """bf16 autocast (weights and gradients stay float32) against float32 on the same batch: log-probs within
    0.05 nats per token and the adapters' gradient within 5% relative (bf16 keeps 8 bits of mantissa: a relative
    rounding of 2⁻⁸ ≈ 0.4% per product, accumulated over the layers); the first PPO ratio of a batch scored twice
    with the same shapes is exactly 1."""
    model, _ = lora_model()
    batch = batch_with_advantages([1.0, 1.0, -0.5, 0.3, 0.7, -1.2, 0.7, 0.7])
    mask = batch["completion_mask"]
    bf16 = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    grads, logps = [], []
    for autocast in (None, bf16):
        model.zero_grad(set_to_none=True)
        lp, _, _ = policy_forward(model, batch, autocast=autocast, temperature=0.7)
        (lp * batch["advantages"]).sum().backward()
        grads.append(adapter_grads(model))
        logps.append(lp.detach())
    assert ((logps[1] - logps[0]) * mask).abs().max().item() < 0.05
    assert relative(grads[1], grads[0]) < 0.05
    with torch.no_grad():
        again = policy_forward(model, batch, autocast=bf16, temperature=0.7)[0]
    assert torch.equal(again * mask, logps[1] * mask)
