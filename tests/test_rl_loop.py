"""The RL loop (models/rl.py): forward/sampler agreement, the PPO step's direction, loss aggregation per algorithm,
didpo's advantages, rollout scoring through the real sandbox, exact resume, and one loop for didpo/grpo/dapo.

All on the tiny random Llama of `models.policy.build_tiny_causal_lm` (CPU, seconds).
"""

from __future__ import annotations

import dataclasses
import json
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import models.rl
import models.sampling
from models.checkpoint import CheckpointMismatchError, latest_checkpoint, list_checkpoints, load_checkpoint
from models.config import ProcessRewardConfig
from models.policy import build_tiny_causal_lm
from models.process_reward import did_rewards, prefix_scores
from models.prompts import reference_code, user_message
from models.rl import (
    RLConfig,
    Rollout,
    assign_process_rewards,
    available_memory,
    build_batch,
    check_rollout_fits,
    collect_rollouts,
    gae_advantages,
    policy_forward,
    ppo_losses,
    ppo_update,
    reference_control,
    rollout_kv_cache_bytes,
    sampling_seed,
    select_rows,
    token_reward_matrix,
    train_rl,
)
from models.sampling import Completion, SamplingConfig, build_chat_prompt, sample
from models.value_head import ValueHead
from sandbox.verifier import Verifier, VerifierConfig
from tasks.didpo import summarise_history

# Small and quick; every test states what it changes.
BASE = dict(
    algo="didpo",  # the loop under test is DiDPO's (the stage's default is rft since the 2026-12-03 ablation, ee2a173)
    steps=2,
    prompts_per_step=2,
    group_size=4,
    max_new_tokens=12,
    learning_rate=1e-3,
    value_learning_rate=1e-2,
    lora_r=4,
    lora_alpha=8.0,
    minibatch_size=4,
    device="cpu",
    checkpoint_every=0,
    target_kl=0.0,
    temperature=0.7,  # T ≠ 1: log-probs are scored at the sampling temperature on both sides
    screen_problems=0,  # screen every problem (6 × 4 answers: IndexVerifier makes each group informative)
    # dapo's overlong penalty (params.yaml: 320 → 384 tokens) off: 12-token answers
    reward=ProcessRewardConfig(overlong_max=0, overlong_cache=0),
    rollout_engine="torch",  # the loop's own sampler (tests/test_rollout_engine.py passes engines in)
    # float32: these tests hold the sampler and the trainer to float noise (bf16 autocast, the default where the
    # CPU runs it natively, is held to its own tolerance in tests/test_rl_update_paths.py)
    mixed_precision="no",
)


def problem(i: int) -> dict:
    """A data-cleaning problem in the data/README.md schema (two tests)."""
    name = f"clean_{i}"
    return {
        "task_id": f"DataClean/strip/{i:04d}",
        "prompt": f'def {name}(items):\n    """Strip each string (variant {i})."""\n',
        "entry_point": name,
        "canonical_solution": "    # Step 1: strip each string\n    out = [s.strip() for s in items]\n    return out\n",
        "test": "def check(candidate):\n    assert candidate([' a ']) == ['a']\n    assert candidate([]) == []\n",
        "steps": ["Step 1: strip each string"],
        "instruction": f"Write a Python function `{name}` that strips each string.",
        "key_patterns": [".strip()"],
        "family": "strip",
        "split": "train",
        "source": "generated:v1",
    }


PROBLEMS = [problem(i) for i in range(6)]


class IndexVerifier:
    """A deterministic stand-in for the sandbox: job k of a call passes k % 3 of its 2 tests, so the rewards of a
    group vary (a random tiny model writes no code the real sandbox would pass); problems whose entry point is in
    `constant` pass nothing (a group whose rewards are all equal)."""

    def __init__(self, constant: frozenset[str] = frozenset()):
        self.constant = constant

    def check_many(self, jobs, progress=False):
        return [
            SimpleNamespace(n_passed=0 if entry in self.constant else k % 3, n_tests=2, reason="stub")
            for k, (_, _, entry) in enumerate(jobs)
        ]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny matrices: one intra-op thread is fastest and avoids spinning threads on a shared box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def verifier():
    with Verifier(VerifierConfig(workers=2, timeout_s=5.0, cpu_s=5)) as v:
        yield v


def lora_params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters() if "lora_" in k}


def read_rollouts(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def timeless(history):
    """History without wall-clock figures (throughputs and timings)."""
    timing = ("didpo/rollouts_per_s", "didpo/tokens_per_s", "didpo/step_time_s")
    return [{k: v for k, v in h.items() if k not in timing and not k.startswith("didpo/time/")} for h in history]


# ------------------------------------------------------------------------------------ forward and update


def sampled_batch(model, tok, n=3, seed=0, temperature=0.7):
    prompt = build_chat_prompt(tok, "Write a function that strips strings.")
    sampling = SamplingConfig(n=n, temperature=temperature, top_p=1.0, max_new_tokens=10, seed=seed)
    completions = sample(model, tok, [prompt], sampling, progress=False)[0]
    rollouts = [Rollout(PROBLEMS[0], 0, j, c, 0, 2, "x", 0.0, 0.0) for j, c in enumerate(completions)]
    return build_batch(rollouts, tok.pad_token_id)


def test_policy_forward_reproduces_the_samplers_log_probs_and_zero_values():
    """Sampled at T = 0.7, the training forward (left-padded prompt | right-padded completion, logits / T) gives the
    sampler's recorded old log-probs token for token, so the first PPO ratio is 1 at T ≠ 1 (DIDPO.md, "Loss");
    scoring at T = 1 (version 1) would not. A fresh value head predicts 0."""
    model, tok = build_tiny_causal_lm(0)
    batch = sampled_batch(model, tok, temperature=0.7)
    mask = batch["completion_mask"]
    assert mask.sum(-1).min() >= 1 and batch["prompt_ids"].shape == batch["prompt_mask"].shape
    assert batch["prompt_ids"].shape[0] == 1 and batch["prompt_index"].tolist() == [0, 0, 0]  # one prompt, shared
    head = ValueHead(model.config.hidden_size)
    with torch.no_grad():
        logps, logits, values = policy_forward(model, batch, head, temperature=0.7)
        untempered = policy_forward(model, batch)[0]
    assert logps.shape == mask.shape and logits.shape == (*mask.shape, model.config.vocab_size)
    ratio = torch.exp(logps - batch["old_per_token_logps"])[mask.bool()]
    assert (ratio - 1).abs().max().item() < 1e-4
    assert ((untempered - batch["old_per_token_logps"]) * mask).abs().max().item() > 1e-2
    assert values.dtype == torch.float32 and torch.equal(values, torch.zeros_like(values))
    # the values are the head applied to the hidden state that predicts each completion token
    torch.nn.init.normal_(head.summary.weight)
    with torch.no_grad():
        row = select_rows(batch, [0])
        length = int(row["completion_mask"].sum())
        ids = torch.cat([row["prompt_ids"][0], row["completion_ids"][0, :length]]).unsqueeze(0)
        hidden = model(input_ids=ids, output_hidden_states=True).hidden_states[-1]
        _, _, values = policy_forward(model, row, head)
    torch.testing.assert_close(values[0, :length], head(hidden[0, -(length + 1) : -1]))


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_ppo_update_moves_the_log_prob_of_a_token_with_the_sign_of_its_advantage(sign):
    """One real AdamW step with advantage ±1 on one token (0 elsewhere) raises (lowers) that token's log-prob."""
    from models.lora import apply_lora

    model, tok = build_tiny_causal_lm(0)
    batch = select_rows(sampled_batch(model, tok, n=1), [0])
    torch.manual_seed(0)
    model = apply_lora(model, 4, 8.0, 0.0)
    t = int(batch["completion_mask"].sum()) // 2
    advantages = torch.zeros_like(batch["completion_mask"])
    advantages[0, t] = sign
    batch["advantages"] = advantages
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)
    cfg = RLConfig(**dict(BASE, algo="dapo", minibatch_size=1))
    with torch.no_grad():
        before = policy_forward(model, batch)[0][0, t].item()
    stats = ppo_update(model, None, optimizer, params, batch, cfg, torch.Generator().manual_seed(0))
    with torch.no_grad():
        after = policy_forward(model, batch)[0][0, t].item()
    assert stats["updates"] == 1.0 and abs(stats["ratio_mean"] - 1.0) < 1e-4
    assert sign * (after - before) > 1e-4


def test_target_kl_stops_the_updates_of_the_step():
    """The first minibatch sees ratio 1 (approx_kl 0) and updates; the second sees the moved policy, exceeds a tiny
    target_kl, updates, and stops the remaining epochs: 2 optimizer steps of the 3 × 2 planned."""
    from models.lora import apply_lora

    model, tok = build_tiny_causal_lm(0)
    batch = sampled_batch(model, tok, n=2)
    torch.manual_seed(0)
    model = apply_lora(model, 4, 8.0, 0.0)
    batch["advantages"] = torch.tensor([[1.0], [-1.0]]) * batch["completion_mask"]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.0)
    cfg = RLConfig(**dict(BASE, algo="dapo", minibatch_size=1, ppo_epochs=3, target_kl=1e-9))
    stats = ppo_update(model, None, optimizer, params, batch, cfg, torch.Generator().manual_seed(0))
    assert stats["updates"] == 2.0
    cfg = dataclasses.replace(cfg, target_kl=0.0)
    assert ppo_update(model, None, optimizer, params, batch, cfg, torch.Generator().manual_seed(0))["updates"] == 6.0


def test_critic_warmup_trains_the_value_head_only(tmp_path):
    cfg = RLConfig(**dict(BASE, steps=1, critic=True, critic_warmup_steps=1, ppo_epochs=2))
    model, tok = build_tiny_causal_lm(0)
    result = train_rl(model, tok, PROBLEMS, cfg, IndexVerifier(), tmp_path)
    start = build_tiny_causal_lm(0)[0].state_dict()
    assert all(torch.equal(value, start[key]) for key, value in model.state_dict().items())  # merged = unchanged
    assert result.value_head.summary.weight.abs().sum() > 0 and result.history[0]["didpo/updates"] == 4.0


def test_losses_aggregate_per_sequence_for_grpo_and_per_token_for_dapo_as_trl():
    """TRL GRPOTrainer's formulas, written out: per-token −min(ρA, clip(ρ, 1−ε_low, 1+ε_high)A) + β·k3, then
    loss_type "grpo" = mean over sequences of per-sequence token means, "dapo" = mean over all tokens; grpo clips
    symmetrically (ε_high = ε_low)."""
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0, 0.0]])
    logps = -torch.rand(2, 5, generator=g) - 0.5
    old = logps + 0.4 * (torch.rand(2, 5, generator=g) - 0.5)
    ref = logps + 0.3 * (torch.rand(2, 5, generator=g) - 0.5)
    adv = torch.tensor([[1.5], [-0.7]]).expand(2, 5) * mask
    logits = torch.randn(2, 5, 7, generator=g)
    batch = {"completion_mask": mask, "old_per_token_logps": old, "advantages": adv, "ref_per_token_logps": ref}
    beta = 0.05
    for algo, high in (("grpo", 0.2), ("dapo", 0.28)):
        cfg = RLConfig(**dict(BASE, algo=algo, kl_coef=beta, eps_low=0.2, eps_high=0.28))
        loss, stats = ppo_losses(logps, logits, None, batch, cfg)
        ratio = torch.exp(logps - old)
        per_token = -torch.min(ratio * adv, torch.clamp(ratio, 0.8, 1 + high) * adv)
        per_token = per_token + beta * (torch.exp(ref - logps) - (ref - logps) - 1)
        if algo == "grpo":
            expected = ((per_token * mask).sum(-1) / mask.sum(-1)).mean()
        else:
            expected = (per_token * mask).sum() / mask.sum()
        torch.testing.assert_close(loss, expected)
        assert stats["clip_frac/high"] == pytest.approx(
            float((((ratio > 1 + high) & (adv > 0)).float() * mask).sum() / mask.sum())
        )


def test_didpo_advantages_by_hand_with_decoupled_lambdas():
    """Rewards [0, 0.5, 1] (+ a padded row), values [0.2, 0.4, 0.6], γ = 1. λ_policy = 0: A_t = δ_t =
    r_t + V_{t+1} − V_t = [0.2, 0.7, 0.4]; λ_critic = 1: returns = reward-to-go = [1.5, 1.5, 1.0]."""
    rewards = torch.tensor([[0.0, 0.5, 1.0], [2.0, 0.0, 0.0]])
    values = torch.tensor([[0.2, 0.4, 0.6], [0.5, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    cfg = RLConfig(**dict(BASE, gamma=1.0, lam=0.0, lam_critic=1.0, whiten_advantages=False))
    advantages, returns = gae_advantages(rewards, values, mask, cfg)
    torch.testing.assert_close(advantages, torch.tensor([[0.2, 0.7, 0.4], [1.5, 0.0, 0.0]]))
    torch.testing.assert_close(returns, torch.tensor([[1.5, 1.5, 1.0], [2.0, 0.0, 0.0]]))
    # without lam_critic the returns use λ = 0 too: r_t + V_{t+1}
    _, returns = gae_advantages(rewards, values, mask, dataclasses.replace(cfg, lam_critic=None))
    torch.testing.assert_close(returns, torch.tensor([[0.4, 1.1, 1.0], [2.0, 0.0, 0.0]]))
    # whitened: zero mean, unit (unbiased) std over the real tokens
    advantages, _ = gae_advantages(rewards, values, mask, dataclasses.replace(cfg, whiten_advantages=True))
    real = advantages[mask.bool()]
    assert abs(real.mean().item()) < 1e-6 and real.std().item() == pytest.approx(1.0, abs=1e-4)


def test_lambda_stays_1_until_the_critic_explains_enough_of_the_return_variance():
    """DIDPO.md v2: GAE with λ = 1 until the critic explains > 0.5 of the return variance. Untrusted, the same
    inputs as above give Monte-Carlo advantages R_t − V_t = [1.5 − 0.2, 1.5 − 0.4, 1.0 − 0.6] and reward-to-go
    returns, whatever lam / lam_critic say."""
    from models.rl import critic_trusted

    rewards = torch.tensor([[0.0, 0.5, 1.0]])
    values = torch.tensor([[0.2, 0.4, 0.6]])
    mask = torch.ones(1, 3)
    cfg = RLConfig(**dict(BASE, gamma=1.0, lam=0.0, lam_critic=0.0, whiten_advantages=False))
    advantages, returns = gae_advantages(rewards, values, mask, cfg, critic_trusted=False)
    torch.testing.assert_close(advantages, torch.tensor([[1.3, 1.1, 0.4]]))
    torch.testing.assert_close(returns, torch.tensor([[1.5, 1.5, 1.0]]))
    assert not critic_trusted([], cfg)
    assert not critic_trusted([{"step": 1, "didpo/explained_variance": 0.5}, {"step": 2}], cfg)  # not above 0.5
    assert critic_trusted([{"step": 1, "didpo/explained_variance": 0.51}, {"step": 2}], cfg)  # stays trusted
    assert critic_trusted([], dataclasses.replace(cfg, critic_trust_ev=0.0))
    with pytest.raises(ValueError, match="critic_trust_ev"):
        RLConfig(**dict(BASE, critic_trust_ev=1.0))


def test_token_reward_matrix_places_shaped_rewards_on_step_ends_and_the_sequence_reward_last():
    """The critic's rewards: w_did·F_j on step ends (a repeated end token sums its steps), R on the last token."""
    completion = SimpleNamespace(completion_ids=[5, 6, 7, 8, 9])
    r = Rollout(
        PROBLEMS[0], 0, 0, completion, 1, 2, "assertion", 0.5, 0.75, step_ends=[1, 3, 3], shaped=[0.5, -0.2, 0.1]
    )
    short = Rollout(PROBLEMS[0], 0, 1, SimpleNamespace(completion_ids=[5, 6]), 0, 2, "assertion", 0.0, -1.0)
    out = token_reward_matrix([r, short], width=6, w_did=2.0)
    expected = torch.tensor([[0.0, 1.0, 0.0, -0.2, 0.75, 0.0], [0.0, -1.0, 0.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(out, expected)


def test_the_value_loss_never_reaches_the_policys_adapters():
    """The head reads detached hidden states: a loss of the values alone leaves every LoRA gradient empty and
    gives the head one (DIDPO.md, "Advantage": its loss must not move the policy's adapters)."""
    from models.lora import apply_lora

    model, tok = build_tiny_causal_lm(0)
    batch = sampled_batch(model, tok, n=2)
    model = apply_lora(model, 4, 8.0, 0.0)
    head = ValueHead(model.config.hidden_size)
    _, _, values = policy_forward(model, batch, head, temperature=0.7)
    ((values - 1.0) ** 2 * batch["completion_mask"]).sum().backward()
    lora = [p for n, p in model.named_parameters() if "lora_" in n]
    assert lora and all(p.grad is None for p in lora)
    assert head.summary.bias.grad.abs().item() > 0


# --------------------------------------------------------------------------------------- rollout scoring


GOOD = (
    "The function strips each string.\n\n"
    "```python\ndef clean_0(items):\n    out = [s.strip() for s in items]\n    return out\n```"
)
HALF = "```python\ndef clean_0(items):\n    return [s for s in items]\n```"
EXIT = "```python\nimport sys\nsys.exit(0)\n```"


def test_collect_rollouts_scores_code_through_the_real_sandbox(verifier, monkeypatch):
    """Scripted answers through the real verifier, w_partial 0.4 and w_format 0.5: the correct answer earns
    R = V1 + 0.4·V2 = 1.4, the half-right one 0.4·½ = 0.2, the one that exits early 0, the one with no code 0 with
    reason ``no_code`` and no format credit either; didpo's Φ is `prefix_scores` of the answer's code lines, each
    step ending on the token that completes its line, and its gaps and shaped rewards are `did_rewards` against
    the control; grpo's reward is the outcome alone."""
    model, tok = build_tiny_causal_lm(0)
    texts = [GOOD, HALF, EXIT, "no code at all"]

    def scripted(model, tokenizer, prompts, config, progress=True):
        assert config.n == 4 and config.seed == 1234 and config.temperature == 0.7
        return [
            [
                Completion(t, models.sampling.extract_code(t), [1], tok(t)["input_ids"] + [2], [0.0] * 99, "eos")
                for t in texts
            ]
            for _ in prompts
        ]

    monkeypatch.setattr(models.rl, "sample", scripted)
    reward = ProcessRewardConfig(w_format=0.5, w_partial=0.4, control="reference")
    cfg = RLConfig(**dict(BASE, algo="didpo", reward=reward))
    (group,) = collect_rollouts(model, tok, [PROBLEMS[0]], cfg, verifier, seed=1234)
    assert [(r.n_passed, r.n_tests) for r in group] == [(2, 2), (1, 2), (0, 2), (0, 2)]
    assert group[3].reason == "no_code"
    assert [r.outcome for r in group] == pytest.approx([1.4, 0.2, 0.0, 0.0])
    assert [r.reward for r in group] == pytest.approx([1.9, 0.7, 0.5, 0.0])  # + w_format · one fenced python block
    reference = [line for line in reference_code(PROBLEMS[0]).splitlines() if line.strip()]
    lines = ["def clean_0(items):", "    out = [s.strip() for s in items]", "    return out"]
    np.testing.assert_allclose(group[0].phi, prefix_scores(lines, PROBLEMS[0], reference, reward), atol=0)
    assert group[0].process == pytest.approx(group[0].phi[-1] - group[0].phi[0])
    ids = group[0].completion.completion_ids
    for line, end in zip(lines, group[0].step_ends, strict=True):
        # the end token is the one whose text holds the line's newline (it may carry the next indent too)
        assert line + "\n" in tok.decode(ids[: end + 1]) and line + "\n" not in tok.decode(ids[:end])
    assert group[3].phi == [pytest.approx(group[0].phi[0])] and group[3].step_ends == []
    assign_process_rewards([group], cfg, None)
    expected = did_rewards(group[0].phi, reference_control(PROBLEMS[0], cfg), "potential")
    np.testing.assert_allclose(group[0].gap, expected.gap, atol=0)
    np.testing.assert_allclose(group[0].shaped, expected.shaped, atol=0)
    assert sum(group[0].shaped) == pytest.approx(0.0, abs=1e-12) and group[3].shaped == []
    grpo = RLConfig(**dict(BASE, algo="grpo", reward=reward))
    (group,) = collect_rollouts(model, tok, [PROBLEMS[0]], grpo, verifier, seed=1234)
    assert [r.reward for r in group] == pytest.approx([1.4, 0.2, 0.0, 0.0]) and all(r.phi == [] for r in group)


# ------------------------------------------------------------------------------------------ exact resume


class Crash(RuntimeError):
    pass


def rng_snapshot():
    return torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()


CRITIC = dict(critic=True, normalize_rewards=True, reward_clip=5.0, critic_warmup_steps=1)


@pytest.mark.parametrize("critic", [False, True], ids=["group-baseline", "critic"])
def test_exact_resume_after_a_crash(tmp_path, critic):
    """3 steps in one go ≡ 2 steps, a crash, a resume in a fresh model, 1 step: same LoRA weights (and value head),
    optimizer-driven history, RNG stream, prompt order, screened pool and rollouts file (KL term, uneven minibatches
    over 2 epochs; with the critic: reward normaliser and warm-up too). The resumed run takes its pool from the
    checkpoint: it screens nothing."""
    cfg = RLConfig(**dict(BASE, steps=3, checkpoint_every=1, kl_coef=0.1, ppo_epochs=2, minibatch_size=3))
    if critic:
        cfg = dataclasses.replace(cfg, **CRITIC)
    stub = IndexVerifier()
    model, tok = build_tiny_causal_lm(0)
    straight = train_rl(model, tok, PROBLEMS, cfg, stub, tmp_path / "straight")
    straight_rng = rng_snapshot()

    def crash_at_step_3(metrics, step):
        if step == 3:
            raise Crash

    model, tok = build_tiny_causal_lm(0)
    with pytest.raises(Crash):
        train_rl(model, tok, PROBLEMS, cfg, stub, tmp_path / "resumed", emit=crash_at_step_3)
    assert [p.name for p in list_checkpoints(tmp_path / "resumed/checkpoints")] == ["checkpoint-00000002"]
    assert {r["step"] for r in read_rollouts(tmp_path / "resumed/rollouts.jsonl")} == {1, 2, 3}  # step 3 was written
    torch.manual_seed(123)  # the crashed process's RNG state must not matter
    model, tok = build_tiny_causal_lm(0)
    screens = []
    real_screen = models.rl.screen_prompt_pool
    monkeypatch_screen = pytest.MonkeyPatch()
    monkeypatch_screen.setattr(models.rl, "screen_prompt_pool", lambda *a: screens.append(1) or real_screen(*a))
    try:
        resumed = train_rl(model, tok, PROBLEMS, cfg, stub, tmp_path / "resumed")
    finally:
        monkeypatch_screen.undo()
    assert screens == []
    assert resumed.pool.entries == straight.pool.entries and len(straight.pool.task_ids) == len(PROBLEMS)
    pool_file = json.loads((tmp_path / "straight/pool.json").read_text())
    assert pool_file["entries"] == straight.pool.entries and pool_file["pool_size"] == len(PROBLEMS)

    assert resumed.global_step == straight.global_step == 3
    assert timeless(resumed.history) == timeless(straight.history)
    assert [h["step"] for h in resumed.history] == [1, 2, 3]
    if critic:
        for key, value in straight.value_head.state_dict().items():
            torch.testing.assert_close(resumed.value_head.state_dict()[key], value, atol=1e-6, rtol=0)
        assert straight.value_head.summary.weight.abs().sum() > 0  # the critic did learn
    else:
        assert straight.value_head is None and resumed.value_head is None
    ckpts = [load_checkpoint(latest_checkpoint(tmp_path / d / "checkpoints")) for d in ("straight", "resumed")]
    for key, value in ckpts[0].tensors["trainable"].items():
        torch.testing.assert_close(ckpts[1].tensors["trainable"][key], value, atol=1e-6, rtol=0)
    assert ckpts[0].state["data_order"] == ckpts[1].state["data_order"]
    assert ckpts[0].state["reward_normaliser"] == ckpts[1].state["reward_normaliser"]
    assert ckpts[0].state["pool"] == ckpts[1].state["pool"] == straight.pool.state_dict()
    if critic:
        assert ckpts[0].state["reward_normaliser"]["count"] == 3 * 8  # one sequence return per rollout per step
    for name in ("data", "minibatch"):
        assert torch.equal(ckpts[0].objects["rng"]["generators"][name], ckpts[1].objects["rng"]["generators"][name])
    resumed_rng = rng_snapshot()
    assert torch.equal(resumed_rng[0], straight_rng[0])
    assert resumed_rng[1] == straight_rng[1] and np.array_equal(resumed_rng[2], straight_rng[2])
    # the rollouts file holds each step once (the crashed step 3 was dropped and redone identically)
    a, b = read_rollouts(tmp_path / "straight/rollouts.jsonl"), read_rollouts(tmp_path / "resumed/rollouts.jsonl")
    assert a == b and len(a) == 3 * 8
    # the critic warm-up step left the policy untouched; later steps moved it
    assert ("didpo/pg_loss" in straight.history[0]) is not critic and "didpo/pg_loss" in straight.history[1]
    # a checkpoint only resumes the run that wrote it
    with pytest.raises(CheckpointMismatchError, match="another didpo config"):
        train_rl(
            build_tiny_causal_lm(0)[0], tok, PROBLEMS, dataclasses.replace(cfg, lam=0.9), stub, tmp_path / "resumed"
        )
    # ... nor the same config started from other weights (a new DPO export under an old RL checkpoint)
    with pytest.raises(CheckpointMismatchError, match="another starting policy"):
        train_rl(build_tiny_causal_lm(1)[0], tok, PROBLEMS, cfg, stub, tmp_path / "resumed")


def test_a_new_run_deletes_the_previous_checkpoint_only_after_saving_its_own(tmp_path):
    """Issue 15: a run of another config (the stage's resume=False after a mismatch) that dies before its first
    save leaves the previous run's checkpoint in place and resumable; its first save is what deletes it."""
    stub, tok = IndexVerifier(), build_tiny_causal_lm(0)[1]
    ckpts = tmp_path / "checkpoints"
    old_cfg = RLConfig(**dict(BASE, steps=3, checkpoint_every=1))
    train_rl(build_tiny_causal_lm(0)[0], tok, PROBLEMS, old_cfg, stub, tmp_path)
    (old,) = list_checkpoints(ckpts)
    old_state, old_weights = load_checkpoint(old).state, load_checkpoint(old).tensors["trainable"]
    assert old.name == "checkpoint-00000003"
    new_cfg = dataclasses.replace(old_cfg, learning_rate=5e-4, checkpoint_every=2)  # saves at steps 2 and 3
    with pytest.raises(CheckpointMismatchError):  # what makes the stage start over
        train_rl(build_tiny_causal_lm(0)[0], tok, PROBLEMS, new_cfg, stub, tmp_path)

    def crash_at_step_1(metrics, step):
        raise Crash

    old_rollouts = (tmp_path / "rollouts.jsonl").read_text()
    assert {json.loads(line)["step"] for line in old_rollouts.splitlines()} == {1, 2, 3}
    with pytest.raises(Crash):
        train_rl(build_tiny_causal_lm(0)[0], tok, PROBLEMS, new_cfg, stub, tmp_path, crash_at_step_1, resume=False)
    assert list_checkpoints(ckpts) == [old]
    assert (tmp_path / "rollouts.jsonl.previous").read_text() == old_rollouts  # set aside, not emptied
    kept = load_checkpoint(old)
    assert kept.state == old_state and kept.tensors["trainable"].keys() == old_weights.keys()
    for key, value in old_weights.items():
        assert torch.equal(kept.tensors["trainable"][key], value)
    # still the previous run's: resuming it with its own config finds all 3 steps done
    assert train_rl(build_tiny_causal_lm(0)[0], tok, PROBLEMS, old_cfg, stub, tmp_path).global_step == 3
    assert (tmp_path / "rollouts.jsonl").read_text() == old_rollouts  # the previous run's rollouts are back
    assert not (tmp_path / "rollouts.jsonl.previous").exists()

    listings = {}

    def watch(metrics, step):  # emit comes before the step's checkpoint
        listings[step] = [p.name for p in list_checkpoints(ckpts)]

    train_rl(build_tiny_causal_lm(0)[0], tok, PROBLEMS, new_cfg, stub, tmp_path, watch, resume=False)
    assert listings == {1: [old.name], 2: [old.name], 3: ["checkpoint-00000002"]}
    assert not (tmp_path / "rollouts.jsonl.previous").exists()  # gone with the superseded checkpoints
    assert {json.loads(line)["step"] for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()} == {1, 2, 3}
    (new,) = list_checkpoints(ckpts)
    assert new.name == "checkpoint-00000003" and load_checkpoint(new).state["fingerprint"] != old_state["fingerprint"]


# ------------------------------------------------------------------------------- budget checks at start


def test_kv_cache_estimate_by_hand():
    config = build_tiny_causal_lm(0)[0].config  # 2 layers, 4 heads of 32 / 4 = 8 dims, 2 key/value heads
    # 8 rows × 100 tokens × 2 layers × 2 (K, V) × (2 × 8) × 4 bytes
    assert rollout_kv_cache_bytes(config, 8, 100, 4) == 8 * 100 * 2 * 2 * 16 * 4 == 204_800
    config.num_key_value_heads = 4  # no grouped-query attention: the hidden size
    assert rollout_kv_cache_bytes(config, 8, 100, 4) == 8 * 100 * 2 * 2 * 32 * 4


def test_available_memory_reads_the_host():
    total = next(int(line.split()[1]) * 1024 for line in open("/proc/meminfo") if line.startswith("MemTotal:"))
    assert 0 < available_memory("cpu") <= total


def longest_prompt_tokens(tok, problems) -> int:
    return max(len(tok(build_chat_prompt(tok, user_message(p)), add_special_tokens=False).input_ids) for p in problems)


def test_a_rollout_batch_beyond_the_memory_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    model, tok = build_tiny_causal_lm(0)
    cfg = RLConfig(**dict(BASE, prompts_per_step=4, group_size=64, max_new_tokens=64))
    longest = longest_prompt_tokens(tok, PROBLEMS)
    need = rollout_kv_cache_bytes(model.config, 4 * 64, longest + 64, 4)  # float32 weights
    assert need == 256 * (longest + 64) * 2 * 2 * 16 * 4
    monkeypatch.setattr(models.rl, "available_memory", lambda device: need)
    check_rollout_fits(model, tok, PROBLEMS, cfg, "cpu")  # exactly enough
    monkeypatch.setattr(models.rl, "available_memory", lambda device: need - 1)
    with pytest.raises(ValueError) as info:
        train_rl(model, tok, PROBLEMS, cfg, IndexVerifier(), tmp_path)
    message = str(info.value)
    assert "didpo.prompts_per_step × didpo.group_size = 4 × 64 rows" in message
    assert f"{longest} prompt + didpo.max_new_tokens 64 tokens" in message
    assert "lower didpo.group_size, didpo.prompts_per_step or didpo.max_new_tokens" in message
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_max_new_tokens_beyond_the_model_context_is_refused(tmp_path):
    model, tok = build_tiny_causal_lm(0)
    context, longest = model.config.max_position_embeddings, longest_prompt_tokens(tok, PROBLEMS)
    assert (context, longest) == (2048, 56)
    fits = RLConfig(**dict(BASE, max_new_tokens=context - longest))
    check_rollout_fits(model, tok, PROBLEMS, fits, "cpu")
    too_long = dataclasses.replace(fits, max_new_tokens=context - longest + 1)
    with pytest.raises(ValueError) as info:
        train_rl(model, tok, PROBLEMS, too_long, IndexVerifier(), tmp_path)
    assert str(info.value) == (
        "didpo.max_new_tokens (1993) + the longest prompt (56 tokens) exceed the model's context (2048 tokens): "
        "set didpo.max_new_tokens <= 1992"
    )
    assert not (tmp_path / "checkpoints").exists()


# -------------------------------------------------------------------------------- one loop, three algos


def test_sampling_seed_changes_every_step_and_draw():
    seeds = {sampling_seed(0, step, draw) for step in range(50) for draw in range(3)}
    assert len(seeds) == 150 and sampling_seed(0, 7, 1) == sampling_seed(0, 7, 1) != sampling_seed(1, 7, 1)


def test_one_loop_four_algos(tmp_path, verifier):
    """Same seed → the same first-step samples for didpo, grpo, dapo and rft (one sampler, same initial weights,
    no screen); none trains a critic by default; with the real sandbox every answer of the random model fails, so
    every group's outcomes are equal: grpo's and didpo's advantages are all 0 (didpo's process term is a baseline,
    it carries no signal of its own), dapo drops every group and refills up to max_refill times without
    updating, rft has no passing answer to fine-tune on."""
    runs = {}
    for algo in ("didpo", "grpo", "dapo", "rft"):
        model, tok = build_tiny_causal_lm(0)
        reward = ProcessRewardConfig(control="group", overlong_max=0, overlong_cache=0)
        cfg = RLConfig(**dict(BASE, algo=algo, steps=1, max_refill=2, screen_samples=0, reward=reward))
        result = train_rl(model, tok, PROBLEMS, cfg, verifier, tmp_path / algo)
        runs[algo] = (result, read_rollouts(result.rollouts_path), model)

    first = {
        algo: [(r["task_id"], r["completion"]) for r in rows if r["draw"] == 0] for algo, (_, rows, _) in runs.items()
    }
    assert first["didpo"] == first["grpo"] == first["dapo"] == first["rft"] and len(first["grpo"]) == 8
    assert len({text for _, text in first["grpo"]}) > 1  # the samples of a group differ

    didpo, grpo, dapo, rft = (runs[a][0] for a in ("didpo", "grpo", "dapo", "rft"))
    assert all(r.value_head is None and r.pool is None for r in (didpo, grpo, dapo, rft))
    for result in (grpo, didpo):
        assert result.history[0]["didpo/frac_zero_std_groups"] == 1.0
        assert result.history[0]["didpo/pg_loss"] == 0.0  # zero advantages everywhere
        assert result.history[0]["didpo/rows_zero_advantage"] == 8.0  # so no row went through the forward
        assert result.history[0]["didpo/kl_start"] == 0.0  # measured before the step's update
    assert not any(k.startswith("didpo/vf_") for k in didpo.history[0])

    h = dapo.history[0]
    assert h["didpo/frac_zero_std_groups"] == 1.0
    assert h["didpo/groups_sampled"] == 2 * 3 and h["didpo/groups_trained"] == 0
    assert "didpo/pg_loss" not in h  # no update at all
    rows = runs["dapo"][1]
    assert sorted({r["draw"] for r in rows}) == [0, 1, 2] and not any(r["trained"] for r in rows)
    # draws use fresh prompts from the order and fresh sampling seeds
    assert len({r["task_id"] for r in rows}) == len(PROBLEMS)
    assert "didpo/pg_loss" not in rft.history[0] and rft.history[0]["didpo/groups_trained"] == 0


def test_dapo_refills_exactly_the_dropped_groups(tmp_path):
    """Groups of problems whose rewards are all equal are dropped and replaced by new draws until
    prompts_per_step groups carry signal (or max_refill draws are spent)."""
    constant = frozenset({"clean_0", "clean_1", "clean_2"})
    cfg = RLConfig(**dict(BASE, algo="dapo", steps=3, prompts_per_step=2, max_refill=3))
    model, tok = build_tiny_causal_lm(0)
    result = train_rl(model, tok, PROBLEMS, cfg, IndexVerifier(constant), tmp_path)
    rows = read_rollouts(result.rollouts_path)
    for step, h in enumerate(result.history, start=1):
        groups = {}
        for r in rows:
            if r["step"] == step:
                groups.setdefault((r["draw"], r["task_id"]), []).append(r)
        dropped = [key for key, g in groups.items() if len({x["reward"] for x in g}) == 1]
        assert all(not x["trained"] for key in dropped for x in groups[key])
        assert all(x["trained"] for key, g in groups.items() if key not in dropped for x in g)
        assert {k[1] for k in dropped} <= {f"DataClean/strip/{i:04d}" for i in range(3)}
        assert h["didpo/groups_sampled"] == len(groups)
        assert h["didpo/frac_zero_std_groups"] == len(dropped) / len(groups)
        assert h["didpo/groups_trained"] == len(groups) - len(dropped) == 2  # 3 varied problems of 6: enough
        last = max(k[0] for k in groups)
        assert last == 0 or len(groups) - len(dropped) == 2  # refills stop once the step is full


def test_steps_sample_anew_from_the_same_prompt(tmp_path):
    """One problem, no learning (lr 0): the samples still change from step to step (per-step sampling seeds)."""
    cfg = RLConfig(**dict(BASE, algo="grpo", steps=2, prompts_per_step=1, learning_rate=0.0))
    model, tok = build_tiny_causal_lm(0)
    result = train_rl(model, tok, PROBLEMS[:1], cfg, IndexVerifier(), tmp_path)
    rows = read_rollouts(result.rollouts_path)
    step1 = [r["completion"] for r in rows if r["step"] == 1]
    step2 = [r["completion"] for r in rows if r["step"] == 2]
    assert len(step1) == len(step2) == 4 and step1 != step2


@pytest.mark.parametrize("lora", [True, False])
def test_kl_reference_is_the_starting_policy(tmp_path, lora):
    """β > 0: the reference is the starting weights (LoRA: adapters disabled; full fine-tuning: a frozen copy), so
    the k3 KL is 0 on the first step (one minibatch: measured before any update) and grows once the policy moved."""
    cfg = RLConfig(**dict(BASE, algo="grpo", steps=3, kl_coef=0.1, learning_rate=1e-2, lora=lora, minibatch_size=8))
    model, tok = build_tiny_causal_lm(0)
    result = train_rl(model, tok, PROBLEMS, cfg, IndexVerifier(), tmp_path)
    kl = [h["didpo/kl_ref"] for h in result.history]
    assert kl[0] < 1e-7 and kl[2] > 1e-4
    assert (result.adapter_path is None) is (not lora)


def test_export_and_summary(tmp_path):
    cfg = RLConfig(**dict(BASE, algo="grpo", steps=2))
    model, tok = build_tiny_causal_lm(0)
    result = train_rl(model, tok, PROBLEMS, cfg, IndexVerifier(), tmp_path)
    assert (result.adapter_path / "adapter_config.json").is_file()
    assert (result.merged_path / "config.json").is_file()
    summary = summarise_history(result.history, cfg.algo, result.global_step)
    outcomes = [h["didpo/reward/outcome"] for h in result.history]
    assert summary["algo"] == "grpo" and summary["global_step"] == 2
    assert summary["reward/outcome/first"] == outcomes[0] and summary["reward/outcome/last"] == outcomes[-1]
    assert summary["reward/outcome/mean"] == pytest.approx(sum(outcomes) / 2)


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="didpo.algo"):
        RLConfig(algo="ppo")
    with pytest.raises(ValueError, match="group_size must be >= 2 for grpo"):
        RLConfig(algo="grpo", group_size=1)
    with pytest.raises(ValueError, match="lam_critic"):
        RLConfig(lam_critic=1.5)
    assert RLConfig(algo="grpo").clip_high == 0.2 and RLConfig(algo="dapo").clip_high == 0.28


# ------------------------------------------------------------------------------- DiDPO v2 (DIDPO.md "Must hold")


def scripted_group(outcomes, gaps, ends, lengths):
    """Rollouts of one group with given returns, gaps G_0..G_N and step ends (no model needed)."""
    return [
        Rollout(PROBLEMS[0], 0, k, SimpleNamespace(completion_ids=[1] * n), int(o), 1, "x", o, o, gap=g, step_ends=e)
        for k, (o, g, e, n) in enumerate(zip(outcomes, gaps, ends, lengths, strict=True))
    ]


def test_with_w_did_zero_didpo_advantages_are_grpos_exactly():
    rng = np.random.default_rng(0)
    rollouts = []
    for outcomes in ([1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]):
        gaps = [[0.0, *rng.uniform(-1, 1, 3)] for _ in outcomes]
        rollouts += scripted_group(outcomes, gaps, [[1, 3, 4]] * 4, [6, 5, 7, 6])
    mask = build_batch_mask([len(r.completion.completion_ids) for r in rollouts])
    cfg = RLConfig(**dict(BASE, reward=ProcessRewardConfig(w_did=0.0, control="group")))
    didpo = models.rl.didpo_token_advantages(rollouts, mask, cfg)
    grpo = models.rl.group_token_advantages(rollouts, mask, dataclasses.replace(cfg, algo="grpo"))
    assert torch.equal(didpo, grpo) and didpo.abs().sum() > 0
    with_did = models.rl.didpo_token_advantages(rollouts, mask, dataclasses.replace(cfg, reward=ProcessRewardConfig()))
    assert not torch.equal(with_did, grpo)


def build_batch_mask(lengths):
    width = max(lengths)
    return torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths])


def test_all_equal_outcomes_give_zero_advantages_whatever_the_gaps():
    rollouts = scripted_group([1.0] * 4, [[0.0, 0.5, -0.9]] * 4, [[0, 2]] * 4, [3, 4, 5, 3])
    mask = build_batch_mask([3, 4, 5, 3])
    advantages = models.rl.didpo_token_advantages(rollouts, mask, RLConfig(**BASE))
    assert torch.equal(advantages, torch.zeros_like(mask))


@pytest.mark.parametrize("algo", ["didpo", "rft"])
def test_kl_to_the_start_policy_is_zero_at_the_first_step_and_grows_with_a_positive_learning_rate(tmp_path, algo):
    """KL(π_θ ‖ π_start) (k3, on each step's own samples, before its update) is logged every step: 0 before any
    update, > 0 once the policy moved; with learning rate 0 it stays 0. The sampler/forward log-prob gap stays at
    floating-point noise (both at T = 0.7). rft takes the current policy's side from its first minibatch's forward
    (no pass of its own): the same figures hold."""
    kl = {}
    for lr in (1e-2, 0.0):
        cfg = RLConfig(**dict(BASE, algo=algo, steps=3, learning_rate=lr))
        model, tok = build_tiny_causal_lm(0)
        result = train_rl(model, tok, PROBLEMS, cfg, IndexVerifier(), tmp_path / str(lr))
        kl[lr] = [h["didpo/kl_start"] for h in result.history]
        assert max(h["didpo/logprob_diff"] for h in result.history) < 1e-4
        clip = "didpo/clip_frac/high" if algo != "rft" else "didpo/pg_loss"  # rft's loss is the NLL: no clipping
        assert all("didpo/entropy" in h and clip in h for h in result.history)
    assert kl[1e-2][0] == 0.0 and kl[1e-2][2] > 1e-5
    assert kl[0.0] == [0.0, 0.0, 0.0]


def test_the_screen_keeps_informative_train_problems_and_gives_their_controls(tmp_path):
    """Problems whose K_s = 4 screening answers all fail (the stub's `constant` ones) leave the pool; the others
    (1 pass of 4) form it, in screening order, each with its start-policy control: the mean Φ curve (knots from 0
    to 1) and the answers' mean number of lines (the random model writes no code: L_x = 0). Steps draw from the
    pool only. Val or test problems are refused."""
    constant = frozenset({"clean_0", "clean_3"})
    cfg = RLConfig(**dict(BASE, steps=2))
    model, tok = build_tiny_causal_lm(0)
    result = train_rl(model, tok, PROBLEMS, cfg, IndexVerifier(constant), tmp_path)
    entries = {e["task_id"]: e for e in result.pool.entries}
    assert len(entries) == 6 and result.pool.samples == 4
    for task_id, e in entries.items():
        dead = task_id.endswith(("0000", "0003"))
        assert (
            e["passes"] == (0 if dead else 1) and e["informative"] is (not dead) and e["pass_rate"] == e["passes"] / 4
        )
        assert len(e["curve"]) == len(e["knots"]) >= 2 and e["knots"][0] == 0 and e["knots"][-1] == 1
        assert e["lines"] == 0.0
    assert set(result.pool.task_ids) == {p["task_id"] for p in PROBLEMS} - {
        PROBLEMS[0]["task_id"],
        PROBLEMS[3]["task_id"],
    }
    trained = {r["task_id"] for r in read_rollouts(result.rollouts_path)}
    assert trained <= set(result.pool.task_ids)
    assert result.pool.summary() == {"screened": 6, "pool_size": 4, "screen_pass_rate": 1 / 6, "pool_pass_rate": 0.25}
    val = [dict(PROBLEMS[0], split="val"), *PROBLEMS[1:]]
    with pytest.raises(ValueError, match=r"train problems only, got \['val'\]"):
        train_rl(build_tiny_causal_lm(0)[0], tok, val, cfg, IndexVerifier(), tmp_path / "val")
    with pytest.raises(ValueError, match="no informative problem"):
        train_rl(
            build_tiny_causal_lm(0)[0],
            tok,
            PROBLEMS,
            cfg,
            IndexVerifier(frozenset(f"clean_{i}" for i in range(6))),
            tmp_path / "dead",
        )


class CountingVerifier(IndexVerifier):
    """`IndexVerifier` that counts the programs it checks."""

    def __init__(self, constant: frozenset[str] = frozenset()):
        super().__init__(constant)
        self.checked = 0

    def check_many(self, jobs, progress=False):
        self.checked += len(jobs)
        return super().check_many(jobs, progress)


def test_a_second_arm_from_the_same_start_reads_the_screen_from_the_cache(tmp_path):
    """grpo screens 6 problems × 4 answers (24 programs) and writes the screen to the cache; a dapo arm from the
    same start weights and problems, with another learning rate, finds it: it checks only its own step's 8 rollouts
    (1 step × 2 prompts × 4) and trains on the same pool. Another seed or other start weights screen again."""
    cache = tmp_path / "pool_cache"
    runs = {}
    for name, overrides, seed in (("grpo", {}, 0), ("dapo", {"learning_rate": 5e-3}, 0), ("seed1", {}, 1)):
        algo = "dapo" if name == "dapo" else "grpo"
        cfg = RLConfig(**dict(BASE, algo=algo, steps=1, max_refill=0, seed=seed, **overrides))
        model, tok = build_tiny_causal_lm(0)
        verifier = CountingVerifier(frozenset({"clean_0"}))
        result = train_rl(model, tok, PROBLEMS, cfg, verifier, tmp_path / name, pool_cache=cache)
        runs[name] = (result, verifier.checked)
    (first, first_checked), (second, second_checked), (other, other_checked) = runs.values()
    assert (first.pool_from_cache, second.pool_from_cache, other.pool_from_cache) == (False, True, False)
    assert first_checked == 24 + 8 and second_checked == 8 and other_checked == 24 + 8
    assert second.pool.entries == first.pool.entries and len(list(cache.glob("*.json"))) == 2
    # other start weights: another key
    model, tok = build_tiny_causal_lm(1)
    moved = train_rl(model, tok, PROBLEMS, RLConfig(**dict(BASE, algo="grpo", steps=1)), IndexVerifier(),
                        tmp_path / "moved", pool_cache=cache)  # fmt: skip
    assert not moved.pool_from_cache and len(list(cache.glob("*.json"))) == 3


def test_rft_fine_tunes_on_the_passing_rollouts_only(tmp_path):
    cfg = RLConfig(**dict(BASE, algo="rft", steps=2))
    model, tok = build_tiny_causal_lm(0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = train_rl(model, tok, PROBLEMS, cfg, IndexVerifier(), tmp_path)
    rows = read_rollouts(result.rollouts_path)
    assert rows and all(r["trained"] is (r["passed"] == r["total"]) for r in rows)
    assert any(r["trained"] for r in rows) and not all(r["trained"] for r in rows)
    assert result.history[0]["didpo/pg_loss"] > 0  # a negative log-likelihood
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_the_budget_is_refused_below_the_sft_answers_p90(tmp_path):
    from models.sft import render_answer

    tok = build_tiny_causal_lm(0)[1]
    lengths = sorted(len(tok(render_answer(p), add_special_tokens=False)["input_ids"]) + 1 for p in PROBLEMS)
    p90 = lengths[5]  # nearest rank: ⌈0.9 · 6⌉ = 6th of 6
    assert models.rl.sft_answer_p90_tokens(tok, PROBLEMS) == p90
    models.rl.check_budget_fits_answers(tok, PROBLEMS, RLConfig(**dict(BASE, max_new_tokens=p90)))
    with pytest.raises(ValueError, match=rf"didpo.max_new_tokens \({p90 - 1}\) is below the p90 length .*{p90} tokens"):
        models.rl.check_budget_fits_answers(tok, PROBLEMS, RLConfig(**dict(BASE, max_new_tokens=p90 - 1)))


def test_v2_config_checks_name_the_key():
    with pytest.raises(ValueError, match="didpo.top_p must be 1 in RL"):
        RLConfig(top_p=0.95)
    with pytest.raises(ValueError, match=r"didpo.reward.w_partial must be in \[0, 1\)"):
        ProcessRewardConfig(w_partial=1.0)
    with pytest.raises(ValueError, match=r"didpo.reward.w_format \(0.6\) must be < 1 - didpo.reward.w_partial"):
        ProcessRewardConfig(w_partial=0.5, w_format=0.6)
    with pytest.raises(ValueError, match="start_policy needs the screen"):
        RLConfig(algo="didpo", screen_samples=0)
    group = ProcessRewardConfig(control="group")
    assert RLConfig(algo="didpo", screen_samples=0, reward=group).uses_critic is False
    assert RLConfig(algo="didpo", critic=True).uses_critic and not RLConfig(algo="grpo", critic=True).uses_critic


def test_the_stage_task_checks_the_budget_then_writes_the_pool(tmp_path, monkeypatch):
    """`tasks.didpo.run_didpo` (the stage's work, MLflow stubbed): a budget below the SFT answers' p90 is refused before
    anything is trained or written; otherwise the screened pool lands at the stage's pool path and its summary in the
    metrics."""
    import tasks.didpo

    monkeypatch.setattr(tasks.didpo, "mlflow_emit", lambda metrics, step: None)
    model, tok = build_tiny_causal_lm(0)
    model.save_pretrained(tmp_path / "policy")
    tok.save_pretrained(tmp_path / "policy")
    problems = PROBLEMS[:2]
    p90 = models.rl.sft_answer_p90_tokens(tok, problems)
    cfg = RLConfig(**dict(BASE, steps=1, group_size=2, minibatch_size=2, max_new_tokens=p90 - 1))
    out, rollouts, pool = tmp_path / "out", tmp_path / "rl/rollouts.jsonl", tmp_path / "rl/pool.json"
    with pytest.raises(ValueError, match="below the p90 length of the SFT answers"):
        tasks.didpo.run_didpo.fn(tmp_path / "policy", "float32", problems, cfg, IndexVerifier(), out, rollouts, pool)
    assert not out.exists() and not pool.exists()
    cfg = dataclasses.replace(cfg, max_new_tokens=p90)
    metrics, history = tasks.didpo.run_didpo.fn(
        tmp_path / "policy", "float32", problems, cfg, IndexVerifier(), out, rollouts, pool
    )
    written = json.loads(pool.read_text())
    assert written["pool_size"] == metrics["pool/pool_size"] == 2 and len(written["entries"]) == 2
    assert metrics["pool/screened"] == 2 and len(history) == 1 and rollouts.is_file()


def test_keep_steps_keeps_the_policy_at_each_budget_point(tmp_path):
    """keep_steps (1, 3) of a 3-step run: points/step_0001 and step_0003 hold adapters; the last equals the exported
    adapter, the first differs from it (the policy moved in between); a step outside 1 .. steps is refused."""
    from safetensors.torch import load_file

    cfg = RLConfig(**dict(BASE, algo="grpo", steps=3, keep_steps=[1, 3]))
    model, tok = build_tiny_causal_lm(0)
    result = train_rl(model, tok, PROBLEMS, cfg, IndexVerifier(), tmp_path)
    points = sorted(p.name for p in (tmp_path / "points").iterdir())
    assert points == ["step_0001", "step_0003"]
    final = load_file(result.adapter_path / "adapter_model.safetensors")
    first, last = (load_file(tmp_path / "points" / p / "adapter_model.safetensors") for p in points)
    assert final.keys() == last.keys() and all(torch.equal(final[k], last[k]) for k in final)
    assert any(not torch.equal(first[k], last[k]) for k in final)
    with pytest.raises(ValueError, match=r"didpo.keep_steps must lie in 1 .. didpo.steps \(3\), got \[4\]"):
        RLConfig(**dict(BASE, steps=3, keep_steps=[4]))
