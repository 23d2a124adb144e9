"""RL on the coding problems: DiDPO version 2 (DIDPO.md), with GRPO, DAPO and RFT as baselines in one loop.

DiDPO here is the project's algorithm (docs/DIDPO.md, version 2): the return of a rollout is its outcome R_i = V1 +
w_partial·V2 (+ a bounded format term; 0 for an answer with no code); the process signal is the DiD gap
G_{i,j} = Φ_i(j) − C_x(u_j) of each code line's prefix score against a control curve (the frozen start policy's
screening rollouts on the prompt by default), used through potential-based shaping with terminal potential 0
(Σ_j F = 0: it moves credit between steps and never changes which programs are optimal). The default advantage is
critic-free, A_{i,t} = [(R_i − mean_k R_k) − w_did·G_{i,j(t)−1}] / (std_k R_k + ε); a value head with GAE (γ = λ = 1)
is an option. It is *not* the critic-free "DiDPO: Diff-in-Diff Policy Optimization for Coding Agent Training"
(arXiv 2608.07147), which adds a snippet-level advantage over code edits aligned across rollouts to GRPO's episode
advantage (and so changes the optimum; ours is a baseline).

Baselines in the same loop, with the same sampler, verifier, prompt pool, optimizer and budget (DIDPO.md,
"Baselines"):

- ``grpo`` (Shao et al. 2024, DeepSeekMath §4.1): outcome reward only, advantage (r − mean_group)/(std_group + ε)
  on every token, symmetric clip ε_low = ε_high, loss averaged per sequence then over sequences (TRL's
  ``loss_type="grpo"``), no critic;
- ``dapo`` (Yu et al. 2025, DAPO §3): GRPO + clip-higher (ε_high > ε_low), dynamic sampling on accuracy (groups
  whose rollouts all pass or all fail are dropped and the step draws more prompts, at most ``max_refill`` extra
  draws), token-level loss (TRL's ``loss_type="dapo"``) and soft overlong shaping;
- ``rft`` (rejection-sampling fine-tuning; RAFT, Dong et al. 2023): the token-level NLL of the step's passing
  rollouts, the cheap control any RL must beat;
- ``didpo``: token-level loss and clip-higher as DAPO, the group baseline with the process term above (or the critic).

One step of `train_rl`, top to bottom (before the first: the screen, `screen_prompt_pool`):

1. prompts: the next ``prompts_per_step`` problems of the pool, in a seeded, checkpointed order
   (`models.training.DataOrder`);
2. rollouts: ``group_size`` samples per prompt with `models.sampling.sample`, seeded from (seed, step, draw) so
   every step draws new samples; the sampler records the old per-token log-probs at the sampling temperature;
3. verification: `models.measure.assemble_program` + the verifier → the outcome R_i; didpo: Φ of every prefix,
   the gaps against the control and the shaped rewards (`assign_process_rewards`);
4. advantages: didpo = `didpo_token_advantages` (or, with a critic, per-token rewards w_did·F on step ends + the
   sequence reward on the last token, GAE, whitening); grpo/dapo = group-normalised sequence rewards on every
   token; rft = the passing rollouts only;
5. PPO epochs over shuffled minibatches (one optimizer step each) with target-KL early stop; during the first
   ``critic_warmup_steps`` steps (critic) only the value head learns;
6. an exact-resume checkpoint (LoRA + value head + optimizer + RNGs + prompt order + pool + reward normaliser),
   the step's rollouts appended to a JSONL, metrics through ``emit(metrics, step)``.

Metrics, through ``emit(metrics, step)`` after every step, under ``didpo/`` whatever the algorithm (runs compare):
``reward/outcome`` (mean R_i), ``reward/sequence`` (the algorithm's sequence reward), ``pass_rate``,
``no_code_rate``, ``truncated_rate``, ``response_length`` (tokens), ``frac_zero_std_groups`` (groups whose
sequence rewards are all equal, among all sampled), ``groups_sampled``, ``groups_trained``, ``kl_start`` (k3
KL(π_θ ‖ π_start) per token on the step's own samples, before its update), ``logprob_diff`` (mean |logπ_sampler −
logπ_forward|), ``rollouts_per_s``, ``tokens_per_s``, ``time/rollout_s``, ``time/update_s``, ``step_time_s``;
didpo: ``reward/process`` (Φ(final) − Φ(empty)), ``reward/did`` (Σ_j d_j), ``reward/gap_final`` (G_N); when an
update ran: ``pg_loss``, ``entropy`` (nats, at T), ``approx_kl``, ``clip_frac/low``, ``clip_frac/high``,
``ratio_mean``, ``grad_norm``, ``updates``, with a critic ``vf_loss``, ``vf_clip_frac``, ``explained_variance``,
with β > 0 ``kl_ref``. Update stats are means over the step's minibatches (rft: ``pg_loss`` = NLL, ``entropy``).

Choices where the algorithm leaves room (docs/DIDPO.md, "Choices the algorithm leaves open", lists them all):

- old log-probs are the sampler's, at the sampling temperature (logits / T, TRL's convention), and
  `policy_forward` divides by the same T; LoRA dropout must be 0 (the default) for the first ratio to be 1;
- the KL to the start policy is always measured (adapters disabled, or a frozen copy in full fine-tuning); β > 0
  adds β·k3 to the loss (critic-free) or −β·k3 to the per-token rewards (critic);
- the value head reads detached hidden states (its loss never moves the adapters);
- reward normalisation (critic) divides by the running std of *sequence* returns and does nothing while it is 0.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from models.advantages import (
    RunningMeanStd,
    adaptive_lambda,
    clip_rewards,
    didpo_group_advantages,
    gae,
    group_advantages,
    whiten,
)
from models.checkpoint import (
    atomic_directory,
    load_trainable_state_dict,
    set_seed,
    trainable_state_dict,
    weights_digest,
)
from models.code_steps import code_line_ends
from models.config import RLConfig
from models.distributed import clip_grad_norm, data_parallel
from models.lora import apply_lora, count_parameters
from models.measure import assemble_program
from models.policy import resolve_device
from models.process_reward import (
    Control,
    did_rewards,
    mean_control,
    outcome_reward,
    overlong_penalty,
    prefix_scores,
    reference_curve,
    terminal_reward,
    token_gaps,
    token_rewards,
)
from models.prompts import reference_code, user_message
from models.rl_losses import entropy_from_logits, grpo_loss, kl_k3, masked_mean, value_loss
from models.sampling import SamplingConfig, build_chat_prompt, collate_completions, pad_token_id, sample
from models.sft import render_answer
from models.training import DataOrder, autocast_factory, export, open_checkpoints, restore_loop_state, save_loop_state
from models.value_head import ValueHead

if TYPE_CHECKING:
    import torch


@dataclass
class RLResult:
    """What `train_rl` returns.

    Attributes:
        global_step: RL steps done.
        history: every emitted record, ``{"step": int, <metric>: float, ...}``, in order (resumed runs included).
        adapter_path: the LoRA adapter directory, None without LoRA.
        merged_path: full checkpoint + tokenizer, loadable with ``from_pretrained``.
        rollouts_path: the JSONL of every rollout with its rewards (one line per completion).
        value_head: the trained value head (didpo with a critic), None otherwise.
        trainable_params: policy parameters updated by the optimizer (the value head excluded).
        pool: the screened `PromptPool` (None without a screen); pool_path: where it was written (JSON);
            pool_from_cache: it was read from ``pool_cache`` (no screening sampled).
    """

    global_step: int
    history: list[dict] = field(repr=False)
    adapter_path: Path | None
    merged_path: Path
    rollouts_path: Path
    value_head: Any = field(repr=False)
    trainable_params: int
    pool: Any = field(default=None, repr=False)
    pool_path: Path | None = None
    pool_from_cache: bool = False


@dataclass
class Rollout:
    """One sampled completion with its verdict and rewards.

    Attributes:
        problem: the problem row; draw: the step's sampling round (0, then dapo refills); sample: index in its group.
        completion: the `models.sampling.Completion` (ids, text, old per-token log-probs at the sampling T).
        n_passed / n_tests / reason: the verifier's verdict.
        outcome: R, the outcome reward V1 + w_partial·V2 (0 for ``no_code``).
        reward: the sequence-level scalar the algorithm uses: outcome for grpo and rft; + overlong penalty for
            dapo; + w_format·format for didpo (its return in potential shaping).
        phi: Φ of the code's prefixes with 0..N lines (didpo and the screen; empty otherwise).
        step_ends: the token completing each of the N steps.
        gap: G_0..G_N against the control; did: d_1..d_N; shaped: F_1..F_N (didpo; empty otherwise).
        process: Φ(final) − Φ(empty), the trajectory's process-score gain (didpo).
    """

    problem: dict
    draw: int
    sample: int
    completion: Any
    n_passed: int
    n_tests: int
    reason: str
    outcome: float
    reward: float
    phi: list[float] = field(default_factory=list)
    step_ends: list[int] = field(default_factory=list)
    gap: list[float] = field(default_factory=list)
    did: list[float] = field(default_factory=list)
    shaped: list[float] = field(default_factory=list)
    process: float = 0.0

    @property
    def passed(self) -> bool:
        """Every test passed (V1 = 1)."""
        return self.n_tests > 0 and self.n_passed == self.n_tests


# ------------------------------------------------------------------------------------------------- seeds


def sampling_seed(seed: int, step: int, draw: int) -> int:
    """The sampler's base seed for draw `draw` of step `step` (steps count from 0): a different, reproducible
    stream of samples at every step and refill, independent of how the run was split by resumes."""
    import numpy as np

    return int(np.random.SeedSequence([seed, step, draw]).generate_state(1, np.uint64)[0] >> 1)


def _generator_seed(seed: int, purpose: int) -> int:
    import numpy as np

    return int(np.random.SeedSequence([seed, 0xD1D, purpose]).generate_state(1, np.uint64)[0] >> 1)


# ----------------------------------------------------------------------------------------------- rollouts


def _reference_lines(problem: dict) -> list[str]:
    """The reference solution's steps: the non-blank lines of the complete reference program (signature + the
    canonical body with its step comments, exactly what SFT teaches the model to write)."""
    return [line for line in reference_code(problem).splitlines() if line.strip()]


def collect_rollouts(
    model,
    tokenizer,
    problems: Sequence[dict],
    cfg: RLConfig,
    verifier,
    seed: int,
    draw: int = 0,
    n: int | None = None,
    with_phi: bool | None = None,
    engine=None,
) -> list[list[Rollout]]:
    """Sample `n` (default ``cfg.group_size``) completions per problem, verify them and score their outcomes.

    Process terms (gaps, DiD and shaped rewards) need the control: `assign_process_rewards` adds them.

    Args:
        problems: the step's problems (one group each).
        verifier: an object with ``check_many(jobs) -> verdicts`` (`sandbox.verifier.Verifier`); each job is
            ``(program, test, entry_point)``, each verdict has ``n_passed``, ``n_tests`` and ``reason``.
        seed: the sampler's base seed (`sampling_seed`).
        draw: recorded in each rollout.
        n: samples per problem.
        with_phi: compute Φ of every prefix and the steps' end tokens (default: for didpo).
        engine: a generation engine with `models.vllm_engine.VLLMSampler`'s ``sample(prompts, config, progress)``
            (its weights already synced), or None: `models.sampling.sample` with `model`.

    Returns:
        one group (list of `Rollout`) per problem, in order.
    """
    n = cfg.group_size if n is None else n
    with_phi = cfg.algo == "didpo" if with_phi is None else with_phi
    sampling = SamplingConfig(
        n=n,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        max_new_tokens=cfg.max_new_tokens,
        batch_size=len(problems) * n,
        seed=seed,
    )
    prompts = [build_chat_prompt(tokenizer, user_message(p)) for p in problems]
    if engine is not None:
        completions = engine.sample(prompts, sampling, progress=False)
    else:
        completions = sample(model, tokenizer, prompts, sampling, progress=False)
    jobs = [
        (assemble_program(p, c.code), p["test"], p["entry_point"])
        for p, group in zip(problems, completions, strict=True)
        for c in group
    ]
    verdicts = iter(verifier.check_many(jobs))
    groups = []
    for problem, group in zip(problems, completions, strict=True):
        reference = _reference_lines(problem) if with_phi else []
        rollouts = []
        for j, c in enumerate(group):
            v = next(verdicts)
            outcome = outcome_reward(v.n_passed, v.n_tests, cfg.reward, v.reason)
            if cfg.algo == "dapo":
                reward = outcome + overlong_penalty(len(c.completion_ids), cfg.reward)
            elif cfg.algo == "didpo":
                reward = terminal_reward(v.n_passed, v.n_tests, c.text, cfg.reward, v.reason)
            else:
                reward = outcome
            rollout = Rollout(problem, draw, j, c, v.n_passed, v.n_tests, v.reason, float(outcome), float(reward))
            if with_phi:
                lines, ends = code_line_ends(tokenizer, c.completion_ids)
                rollout.phi = [float(x) for x in prefix_scores(lines, problem, reference, cfg.reward)]
                rollout.step_ends = list(ends)
                rollout.process = rollout.phi[-1] - rollout.phi[0]
            rollouts.append(rollout)
        groups.append(rollouts)
    return groups


def group_controls(group: Sequence[Rollout]) -> list:
    """The ``group`` control of each rollout: the leave-one-out `mean_control` of the other rollouts' Φ curves
    (DIDPO.md, "Objects"). Needs ≥ 2 rollouts with Φ."""
    return [mean_control([other.phi for k, other in enumerate(group) if k != i]) for i in range(len(group))]


def reference_control(problem: dict, cfg: RLConfig):
    """The ``reference`` control (version 1's, for the ablation): the reference solution's own Φ curve, L_x = M."""
    return mean_control([reference_curve(_reference_lines(problem), problem, cfg.reward)])


def assign_process_rewards(groups: Sequence[Sequence[Rollout]], cfg: RLConfig, controls: dict | None) -> None:
    """Set each didpo rollout's gaps G, DiD rewards d and shaped rewards F (`models.process_reward.did_rewards`)
    against its control (``cfg.reward.control``), in place.

    Args:
        groups: `collect_rollouts` groups with Φ.
        controls: task_id → `models.process_reward.Control` of the start policy (the screen's; ``start_policy``).

    Raises:
        KeyError: ``start_policy`` and a problem outside `controls` (the pool).
    """
    for group in groups:
        if cfg.reward.control == "group":
            per_rollout = group_controls(group)
        elif cfg.reward.control == "reference":
            per_rollout = [reference_control(group[0].problem, cfg)] * len(group)
        else:
            per_rollout = [controls[group[0].problem["task_id"]]] * len(group)
        for rollout, control in zip(group, per_rollout, strict=True):
            scores = did_rewards(rollout.phi, control, cfg.reward.shaping)
            rollout.gap = [float(x) for x in scores.gap]
            rollout.did = [float(x) for x in scores.d]
            rollout.shaped = [float(x) for x in scores.shaped]


def zero_std(group: Sequence[Rollout]) -> bool:
    """True when every rollout of the group has the same sequence reward (no learning signal for a group baseline)."""
    return max(r.reward for r in group) - min(r.reward for r in group) == 0.0


def same_accuracy(group: Sequence[Rollout]) -> bool:
    """True when every rollout of the group passes, or none does: DAPO's dynamic-sampling filter (§3.2), on
    accuracy, not on the shaped reward."""
    return len({r.passed for r in group}) == 1


# ---------------------------------------------------------------------------------------------- prompt pool


@dataclass
class PromptPool:
    """The screened prompt pool (DIDPO.md v2, "Prompt pool"), a stage output and part of the resume checkpoint.

    Attributes:
        samples: K_s, answers per screened problem.
        entries: one dict per screened problem, in screening order: ``task_id``, ``passes`` (of K_s),
            ``pass_rate``, ``informative`` (0 < passes < K_s), ``lines`` (L_x: the answers' mean code lines),
            ``knots`` and ``curve`` (C_x, piecewise linear: `models.process_reward.Control`).
    """

    samples: int
    entries: list[dict]

    @property
    def task_ids(self) -> list[str]:
        """The pool: the informative problems, in screening order."""
        return [e["task_id"] for e in self.entries if e["informative"]]

    def controls(self) -> dict:
        """task_id → `models.process_reward.Control` of the start policy, for the pool's problems."""
        import numpy as np

        return {
            e["task_id"]: Control(
                knots=np.asarray(e["knots"], dtype=np.float64),
                curve=np.asarray(e["curve"], dtype=np.float64),
                lines=float(e["lines"]),
            )
            for e in self.entries
            if e["informative"]
        }

    def state_dict(self) -> dict:
        return {"samples": self.samples, "entries": self.entries}

    @classmethod
    def from_state(cls, state: dict) -> PromptPool:
        return cls(samples=int(state["samples"]), entries=list(state["entries"]))

    def summary(self) -> dict:
        """``{"screened", "pool_size", "screen_pass_rate", "pool_pass_rate"}`` (pass rates: mean over problems)."""
        pool = [e for e in self.entries if e["informative"]]
        return {
            "screened": len(self.entries),
            "pool_size": len(pool),
            "screen_pass_rate": _mean([e["pass_rate"] for e in self.entries]),
            "pool_pass_rate": _mean([e["pass_rate"] for e in pool]),
        }


class EmptyPoolError(ValueError):
    """The screen found no informative problem: each screened one passed 0 or all K_s times (its data, not a
    defect: the stage reports it as a one-line input error)."""


def screen_prompt_pool(model, tokenizer, problems: Sequence[dict], cfg: RLConfig, verifier, engine=None) -> PromptPool:
    """The start policy answers the first ``cfg.screen_problems`` problems of a seeded order (all when 0)
    ``cfg.screen_samples`` times each at the rollout temperature; problems with 0 < passes < K_s are the pool
    (DAPO's dynamic sampling, done once), and each one's answers give its ``start_policy`` control: the mean Φ
    curve on relative progress and the mean number of lines L_x (`models.process_reward.mean_control`).

    The caller passes train problems only (the pool never selects on val or test) and the start policy (with
    LoRA: adapters disabled or still zero). Problems are sampled ``prompts_per_step × group_size / K_s`` at a time
    (a rollout batch's rows), with the seed `_generator_seed` (seed, 3), by `engine` when given (the rollout engine
    while it still holds the start weights: ≈ 4× the torch sampler's speed on a CPU), else by the torch sampler.

    Raises:
        EmptyPoolError: no screened problem is informative (the message says what to change).
    """
    import numpy as np

    order = np.random.default_rng(_generator_seed(cfg.seed, 3)).permutation(len(problems))
    count = cfg.screen_problems or len(problems)
    chosen = [problems[int(i)] for i in order[:count]]
    per_call = max(1, cfg.prompts_per_step * cfg.group_size // cfg.screen_samples)
    entries = []
    for start in range(0, len(chosen), per_call):
        part = chosen[start : start + per_call]
        seed = sampling_seed(_generator_seed(cfg.seed, 3), start, 0)
        groups = collect_rollouts(
            model, tokenizer, part, cfg, verifier, seed, n=cfg.screen_samples, with_phi=True, engine=engine
        )
        for problem, group in zip(part, groups, strict=True):
            passes = sum(r.passed for r in group)
            control = mean_control([r.phi for r in group])
            entries.append(
                {
                    "task_id": problem["task_id"],
                    "passes": passes,
                    "pass_rate": passes / cfg.screen_samples,
                    "informative": 0 < passes < cfg.screen_samples,
                    "lines": control.lines,
                    "knots": [float(x) for x in control.knots],
                    "curve": [float(x) for x in control.curve],
                }
            )
    pool = PromptPool(samples=cfg.screen_samples, entries=entries)
    if not pool.task_ids:
        raise EmptyPoolError(
            f"no informative problem: each of the {len(entries)} screened train problems passed 0 or all "
            f"{cfg.screen_samples} times; raise didpo.screen_problems (or set 0 to screen every train problem)"
        )
    return pool


def pool_cache_key(cfg: RLConfig, problems: Sequence[dict], initial_weights: str, engine: str) -> str:
    """The digest that names a cached screen: what decides its samples and scores, namely the start weights
    (`models.checkpoint.weights_digest`), the candidate problems (their full rows, in order), K_s, how many are
    screened, the seed, the temperature and token budget, the rollout engine that samples, the screen's batch
    (``prompts_per_step × group_size``, which sets its sampling seeds) and the reward settings (Φ's weights, for
    the controls). Two arms that differ only in the algorithm, the learning rate or the number of steps share it.
    Hex sha256."""
    fields = (
        initial_weights,
        [json.dumps(p, sort_keys=True, default=str) for p in problems],
        cfg.screen_samples,
        cfg.screen_problems,
        cfg.seed,
        cfg.temperature,
        cfg.max_new_tokens,
        cfg.prompts_per_step * cfg.group_size,
        engine,
        dataclasses.asdict(cfg.reward),
    )
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


# -------------------------------------------------------------------------------------------- batch tensors


def build_batch(rollouts: Sequence[Rollout], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Tensors of a flat list of B rollouts, each distinct prompt once (a group's answers share their prompt).

    Returns:
        ``prompt_ids``/``prompt_mask`` (U, P) long: the U distinct prompts, left-padded to the longest (P);
        ``prompt_index`` (B,) long: row b's prompt; ``completion_ids`` (B, T) long, right-padded to the longest
        completion; ``completion_mask`` (B, T) float32 (1 on real tokens); ``old_per_token_logps`` (B, T)
        float32 (the sampler's; 0 on padding); ``weights`` (B,) float32, each row's multiplicity (1 here;
        `merge_duplicates` sums them).
    """
    import torch

    completions = [r.completion for r in rollouts]
    packed = collate_completions(completions, pad_token_id)
    distinct: dict[tuple[int, ...], int] = {}
    index = [distinct.setdefault(tuple(c.prompt_ids), len(distinct)) for c in completions]
    width = max(len(p) for p in distinct)
    prompt = torch.full((len(distinct), width), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(distinct), width), dtype=torch.long)
    for ids, u in distinct.items():
        prompt[u, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        prompt_mask[u, width - len(ids) :] = 1
    return {
        "prompt_ids": prompt,
        "prompt_mask": prompt_mask,
        "prompt_index": torch.tensor(index, dtype=torch.long),
        "completion_ids": packed["completion_ids"],
        "completion_mask": packed["completion_mask"].float(),
        "old_per_token_logps": packed["per_token_logps"],
        "weights": torch.ones(len(completions), dtype=torch.float32),
    }


_PROMPT_KEYS = ("prompt_ids", "prompt_mask")


def select_rows(batch: dict[str, torch.Tensor], rows) -> dict[str, torch.Tensor]:
    """The `build_batch` tensors of rows `rows` (a (b,) long tensor or a list; repeats allowed), keeping only the
    prompts they use (``prompt_index`` renumbered)."""
    import torch

    rows = torch.as_tensor(rows, dtype=torch.long, device=batch["completion_ids"].device)
    out = {k: v[rows] for k, v in batch.items() if k not in _PROMPT_KEYS}
    used, out["prompt_index"] = torch.unique(out["prompt_index"], return_inverse=True)
    out.update({k: batch[k][used] for k in _PROMPT_KEYS})
    return out


def merge_duplicates(batch: dict[str, torch.Tensor], keys: Sequence[str] | None = None):
    """Rows that are equal in every per-row tensor of `keys` (default: all but ``weights``) merged into one whose
    ``weights`` is the sum of theirs (identical answers to the same prompt are computed once; the losses weigh
    each row by its multiplicity, which gives the loss and gradient of the rows side by side).

    Returns:
        ``(merged batch, inverse)``: inverse (B,) long maps each original row to its merged row, so a per-row
        result r of the merged batch is ``r[inverse]`` for the original rows.
    """
    import torch

    keys = [k for k in (keys or batch) if k not in (*_PROMPT_KEYS, "weights")]
    first: dict[tuple, int] = {}
    inverse, keep = [], []
    columns = [batch[k].detach().cpu() for k in keys]
    for b in range(batch["completion_ids"].shape[0]):
        key = tuple(c[b].numpy().tobytes() for c in columns)
        if key not in first:
            first[key] = len(keep)
            keep.append(b)
        inverse.append(first[key])
    inverse_t = torch.tensor(inverse, dtype=torch.long, device=batch["completion_ids"].device)
    merged = select_rows(batch, keep)
    merged["weights"] = torch.zeros(len(keep), dtype=batch["weights"].dtype, device=inverse_t.device).index_add_(
        0, inverse_t, batch["weights"]
    )
    return merged, inverse_t


def policy_forward(
    model, batch: dict, value_head=None, autocast=None, backbone_grad: bool = True, temperature: float = 1.0
):
    """Per-token log-probs and logits at temperature T of each row's completion, and (with a head) values; each
    distinct prompt of the batch is run once and its key/value cache shared by the rows that answer it.

    Two passes of the model: the U prompts (left-padded, position ids counting real tokens only, as in the
    sampler) with ``use_cache``, then the B completions (but their last token, which predicts nothing that is
    scored) on the prompts' cache indexed by ``prompt_index`` (gradients flow back through the shared cache into
    the prompt pass, summed over the answers as in one pass per row; the shared-prefix forward of "Prefix
    Grouper", Liu et al. 2025). The logit that predicts completion token 0 is the prompt's last; token t ≥ 1 is
    predicted by completion position t − 1. The logits are divided by `temperature` (the sampling T, as TRL's
    GRPO), so the log-probs are those the sampler recorded and the first PPO ratio is 1 at any T. The value of
    completion token t is the head applied to the hidden state that predicts it (the state before a_t), detached:
    the value loss trains the head's own parameters and never moves the policy (docs/DIDPO.md, "Advantage").

    Args:
        model: the causal LM (a peft wrapper or a plain model).
        batch: `build_batch` tensors (or `select_rows` of them) on the model's device.
        value_head: a `models.value_head.ValueHead`, or None (no values).
        autocast: a context-manager factory (bf16 autocast) or None.
        backbone_grad: False runs the LM without gradients (critic warm-up: only the head learns).
        temperature: T > 0.

    Returns:
        ``(per_token_logps (B, T) float32, logits / T (B, T, V) float32, values (B, T) float32 or None)``.
    """
    import torch

    prompt_mask, index = batch["prompt_mask"], batch["prompt_index"]
    completion_ids = batch["completion_ids"]
    hidden = value_head is not None
    grad = contextlib.nullcontext() if backbone_grad else torch.no_grad()
    with grad, autocast() if autocast else contextlib.nullcontext():
        head = model(
            input_ids=batch["prompt_ids"],
            attention_mask=prompt_mask,
            position_ids=(prompt_mask.cumsum(-1) - 1).clamp(min=0),
            use_cache=True,
            logits_to_keep=1,
            output_hidden_states=hidden,
        )
        logits, states = [head.logits[index]], [head.hidden_states[-1][index, -1:]] if hidden else []
        if completion_ids.shape[1] > 1:
            cache = head.cache
            cache.reorder_cache(index)  # (U, ...) -> (B, ...): each row reads its prompt's keys and values
            inputs = completion_ids[:, :-1]
            lengths = prompt_mask.sum(-1)[index]  # (B,) real prompt tokens
            positions = lengths.unsqueeze(1) + torch.arange(inputs.shape[1], device=inputs.device)
            mask = torch.cat([prompt_mask[index], batch["completion_mask"][:, :-1].to(prompt_mask.dtype)], dim=1)
            tail = model(
                input_ids=inputs,
                attention_mask=mask,
                position_ids=positions,
                cache=cache,
                use_cache=True,
                output_hidden_states=hidden,
            )
            logits.append(tail.logits)
            if hidden:
                states.append(tail.hidden_states[-1])
    logits = torch.cat(logits, dim=1).float() / temperature  # (B, T, V): position t predicts completion token t
    picked = logits.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)  # (B, T)
    per_token_logps = picked - torch.logsumexp(logits, dim=-1)  # (B, T)
    values = value_head(torch.cat(states, dim=1).detach()) if hidden else None  # (B, T), post final norm
    return per_token_logps, logits, values


def no_grad_logps(model, batch: dict, value_head, autocast, chunk: int, temperature: float):
    """`policy_forward` without gradients in eval mode, `chunk` rows at a time, identical rows once
    (`merge_duplicates` on prompt and completion). Returns ``(values (B, T) or None, per_token_logps (B, T))``."""
    import torch

    merged, inverse = merge_duplicates(batch, ["prompt_index", "completion_ids"])
    values, logps = [], []
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            rows = merged["completion_ids"].shape[0]
            for start in range(0, rows, chunk):
                part = select_rows(merged, torch.arange(start, min(start + chunk, rows)))
                lp, _, v = policy_forward(model, part, value_head, autocast, temperature=temperature)
                logps.append(lp)
                if v is not None:
                    values.append(v)
    finally:
        model.train(was_training)
    return (torch.cat(values)[inverse] if values else None), torch.cat(logps)[inverse]


def kl_sample_rows(n: int, cfg: RLConfig, step: int) -> torch.Tensor:
    """The rows of a step's batch of `n` on which the start policy's log-probs are computed: every row when the
    objective needs them (β = ``kl_coef`` > 0) or ``kl_start_rows`` is 0 or ≥ n; else ``kl_start_rows`` rows drawn
    without replacement from a generator seeded by (seed, step), in increasing order: the logged ``kl_start`` is
    then the k3 estimate on that subsample (its only reader). Returns a (k,) long tensor (CPU)."""
    import torch

    k = cfg.kl_start_rows
    if cfg.kl_coef or k == 0 or k >= n:
        return torch.arange(n)
    generator = torch.Generator().manual_seed(_generator_seed(cfg.seed, 3) + step)
    return torch.randperm(n, generator=generator)[:k].sort().values


# ------------------------------------------------------------------------------------------------ advantages


def truncated_is_weights(trainer_logps, sampler_logps, cap: float):
    """Truncated importance weights for rollouts sampled by another engine than the trainer: per token
    w = min(exp(logπ_trainer − logπ_sampler), cap) (TIS; TRL's ``vllm_importance_sampling_correction`` with
    ``vllm_importance_sampling_cap``; Yao et al. 2025). A NaN sampler log-prob (an engine that does not report
    them, `models.openvino_engine`) gives weight 1, as TRL treats a NaN sampling log-prob. Returns
    ``(weights, capped)``, both (B, T), capped the tokens where the cap applied; padding positions hold whatever the
    inputs give (mask them)."""
    import torch

    ratio = torch.exp((trainer_logps - sampler_logps).nan_to_num(0.0))
    return ratio.clamp(max=cap), ratio > cap


def token_reward_matrix(rollouts: Sequence[Rollout], width: int, w_did: float = 1.0) -> torch.Tensor:
    """The critic's per-token rewards (B, width) float32: w_did·F_j on each step's end token, the sequence reward on
    the last token, 0 elsewhere and on padding (`process_reward.token_rewards`)."""
    import torch

    out = torch.zeros((len(rollouts), width), dtype=torch.float32)
    for i, r in enumerate(rollouts):
        length = len(r.completion.completion_ids)
        shaped = [w_did * f for f in r.shaped]
        out[i, :length] = token_rewards(shaped, r.step_ends, r.reward, length)
    return out


def didpo_token_advantages(rollouts: Sequence[Rollout], completion_mask: torch.Tensor, cfg: RLConfig) -> torch.Tensor:
    """didpo's critic-free advantages (B, T) (DIDPO.md v2, "Advantage"): potential shaping =
    `models.advantages.didpo_group_advantages` of the returns R_i with the per-token gaps G_{i,j(t)−1}; bonus
    shaping (version 1's reading) = GRPO's group advantage of R_i + w_did·Σ_j d_j on every token.

    `rollouts` holds whole groups of ``cfg.group_size`` in order, with their process rewards assigned."""
    import numpy as np
    import torch

    w_did = cfg.reward.w_did
    if cfg.reward.shaping == "bonus":
        rewards = torch.tensor([r.reward + w_did * sum(r.did) for r in rollouts], dtype=torch.float32)
        per_sequence = group_advantages(rewards, cfg.group_size, cfg.group_eps, True)  # (B,)
        return per_sequence.unsqueeze(-1) * completion_mask
    width = completion_mask.shape[1]
    gaps = np.zeros((len(rollouts), width))
    for i, r in enumerate(rollouts):
        length = len(r.completion.completion_ids)
        gaps[i, :length] = token_gaps(r.gap, r.step_ends, length) if r.gap else 0.0
    returns = torch.tensor([r.reward for r in rollouts], dtype=torch.float32)
    gaps = torch.from_numpy(gaps).to(torch.float32)
    return didpo_group_advantages(returns, gaps, completion_mask, cfg.group_size, w_did, cfg.group_eps)


def gae_advantages(
    rewards: torch.Tensor,
    old_values: torch.Tensor,
    completion_mask: torch.Tensor,
    cfg: RLConfig,
    critic_trusted: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE advantages and value targets of didpo with a critic (DIDPO.md v2, "Advantage": γ = λ = 1 by default).

    Args:
        rewards: (B, T) per-token rewards (already KL-penalised, normalised and clipped as configured).
        old_values: (B, T) the value head's predictions at rollout time.
        completion_mask: (B, T) 1 on real tokens.
        cfg: γ, λ, λ_critic, adaptive α, whitening.
        critic_trusted: False until the critic has explained enough of the return variance (`critic_trusted`):
            then λ = 1 for both advantages and returns, whatever `lam`, `lam_critic` and the adaptive α say.

    Returns:
        ``(advantages (B, T), returns (B, T))``: advantages with λ_policy (fixed `lam`, or 1 − 1/(α·T_i) per
        sequence when `adaptive_lambda_alpha` > 0), whitened over the batch's real tokens when configured; returns
        (value targets) with λ_critic (`lam_critic`, else the same λ as the advantages), never whitened.
    """
    lam_policy = cfg.lam if critic_trusted else 1.0
    if cfg.adaptive_lambda_alpha > 0 and critic_trusted:
        lam_policy = adaptive_lambda(completion_mask.sum(-1), cfg.adaptive_lambda_alpha)
    advantages, returns = gae(rewards, old_values, completion_mask, cfg.gamma, lam_policy)
    if cfg.lam_critic is not None and critic_trusted:
        _, returns = gae(rewards, old_values, completion_mask, cfg.gamma, cfg.lam_critic)
    if cfg.whiten_advantages and completion_mask.sum() >= 2:
        advantages = whiten(advantages, completion_mask)
    return advantages * completion_mask, returns * completion_mask


def critic_trusted(history: Sequence[dict], cfg: RLConfig) -> bool:
    """Whether GAE may use λ < 1 (DIDPO.md v2, "Advantage"): some earlier step's critic explained more than
    ``cfg.critic_trust_ev`` of the return variance (``didpo/explained_variance`` in `history`, the emitted rows,
    which an exact resume restores), or the threshold is 0."""
    if cfg.critic_trust_ev <= 0:
        return True
    return any(row.get("didpo/explained_variance", float("-inf")) > cfg.critic_trust_ev for row in history)


def group_token_advantages(rollouts: Sequence[Rollout], completion_mask: torch.Tensor, cfg: RLConfig) -> torch.Tensor:
    """grpo/dapo: (r − mean_group)/(std_group + ε) of the sequence rewards, the same on every token (B, T).

    `rollouts` holds whole groups of ``cfg.group_size`` in order."""
    import torch

    rewards = torch.tensor([r.reward for r in rollouts], dtype=torch.float32)
    per_sequence = group_advantages(rewards, cfg.group_size, cfg.group_eps, True)  # (B,)
    return per_sequence.unsqueeze(-1) * completion_mask


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float | None:
    """1 − Var[R − V]/Var[R] over the real tokens (population variances, as cleanrl logs it after collecting a
    batch: how much of the return's variance the critic's rollout-time values explain); None when Var[R] = 0."""
    valid = mask.bool()
    target, residual = returns[valid].double(), (returns - values)[valid].double()
    var = float(target.var(unbiased=False)) if target.numel() else 0.0
    return 1.0 - float(residual.var(unbiased=False)) / var if var > 0 else None


# ---------------------------------------------------------------------------------------------- PPO update


def ppo_losses(
    per_token_logps: torch.Tensor,
    logits: torch.Tensor,
    values: torch.Tensor | None,
    minibatch: dict[str, torch.Tensor],
    cfg: RLConfig,
    policy: bool = True,
    scale: tuple[float, float] | None = None,
    share: tuple[float, float] = (1.0, 1.0),
) -> tuple[torch.Tensor, dict[str, float]]:
    """The total loss of one minibatch, L = L_PG + c_vf·L_VF − c_ent·H [+ β·KL] (DIDPO.md, "Loss"); rft: the NLL.

    L_PG is `models.rl_losses.grpo_loss`: per-sequence means averaged over sequences for grpo (TRL's
    ``loss_type="grpo"``), token-level for dapo and didpo (``"dapo"``); the critic-free KL term is aggregated the
    same way (TRL adds β·k3 to the per-token loss before aggregating).

    Args:
        per_token_logps: (B, T) log π_θ of the completion tokens (with gradient).
        logits: (B, T, V) float32 logits / T of the completion positions (for the entropy).
        values: (B, T) the value head's predictions (critic) or None.
        minibatch: `build_batch` tensors plus ``advantages`` (B, T), and with a critic ``old_values`` and
            ``returns`` (B, T), and with a critic-free KL term ``ref_per_token_logps`` (B, T), and for rollouts of
            another engine ``is_weights`` (B, T), the truncated importance weights (`models.rl_losses.grpo_loss`).
        cfg: coefficients, clip ranges and the algorithm.
        policy: False = critic warm-up: the value loss alone.
        scale: data parallelism: ``(token_weight, sequence_weight)`` = this process's share of the global
            minibatch's valid tokens and of its sequences. Each term (and its stat) is multiplied by the weight of
            its aggregation (token means by the first; grpo's per-sequence means by the second), so that the sum
            over processes of the scaled losses (and stats) is the loss (and stats) of the whole minibatch. None
            (one process) = (1, 1).
        share: ``(token_share, sequence_share)`` of the minibatch that these rows are, when rows whose every
            advantage is 0 were left out of the forward (`ppo_update`): their per-token loss is exactly 0, so the
            loss of the whole minibatch is the kept rows' scaled by their share of its (weighted) tokens and
            sequences. Multiplies the loss only; the stats stay means over the rows given.

    Each row counts ``minibatch["weights"]`` times (its multiplicity after `merge_duplicates`; 1 when absent):
    token means are taken over ``completion_mask × weight``, grpo's per-sequence means averaged with the weights.

    Returns:
        ``(loss, stats)``: stats ``pg_loss``, ``entropy``, ``approx_kl``, ``clip_frac/low``, ``clip_frac/high``,
        ``ratio_mean``, ``kl_ref`` (critic-free, β > 0), ``vf_loss``, ``vf_clip_frac`` (with a critic), as floats;
        rft: ``pg_loss`` (the NLL) and ``entropy``.
    """
    import torch

    weights = minibatch.get("weights")
    mask = minibatch["completion_mask"]
    if weights is not None:
        mask = mask * weights.unsqueeze(1)  # token means over multiplicity-weighted tokens
    if cfg.algo == "rft":
        return _rft_loss(per_token_logps, logits, mask, scale, share[0])
    loss_type = "grpo" if cfg.algo == "grpo" else "dapo"
    token_w, sequence_w = scale if scale is not None else (1.0, 1.0)
    agg_w = sequence_w if loss_type == "grpo" else token_w  # the policy loss's (and grpo/dapo KL's) aggregation
    loss_share = share[1] if loss_type == "grpo" else share[0]
    stats: dict[str, float] = {}
    loss = per_token_logps.new_zeros(())
    if policy:
        pg_loss, pg_stats = grpo_loss(
            per_token_logps,
            minibatch["old_per_token_logps"],
            minibatch["advantages"],
            minibatch["completion_mask"],
            cfg.eps_low,
            cfg.clip_high,
            loss_type,
            minibatch.get("is_weights"),
            weights,
        )
        if scale is not None:
            pg_loss = agg_w * pg_loss
            pg_stats = {k: token_w * v for k, v in pg_stats.items()}  # token means whatever the loss type
        stats["pg_loss"] = pg_loss.item()
        pg_loss = loss_share * pg_loss
        loss = loss + pg_loss
        stats.update(pg_stats)
        # the entropy bonus needs its gradient; the logged entropy alone does not (no backward through (B, T, V))
        entropy = entropy_from_logits(logits if cfg.ent_coef else logits.detach(), mask)
        if scale is not None:
            entropy = token_w * entropy
        stats["entropy"] = entropy.item()
        if cfg.ent_coef:
            loss = loss - cfg.ent_coef * share[0] * entropy
        if cfg.kl_coef and not cfg.uses_critic:
            per_token_kl = kl_k3(per_token_logps, minibatch["ref_per_token_logps"]) * mask  # (B, T)
            if loss_type == "grpo":
                per_sequence = per_token_kl.sum(-1) / mask.sum(-1).clamp(min=1e-12)  # weights cancel
                w = weights if weights is not None else torch.ones_like(per_sequence)
                kl = (per_sequence * w).sum() / w.sum().clamp(min=1e-12)
            else:
                kl = masked_mean(per_token_kl, mask)
            if scale is not None:
                kl = agg_w * kl
            loss = loss + cfg.kl_coef * loss_share * kl
            stats["kl_ref"] = kl.item()
    if values is not None:
        clip = cfg.vf_clip or None
        vf_loss, vf_stats = value_loss(values, minibatch["old_values"], minibatch["returns"], mask, clip)
        if scale is not None:
            vf_loss, vf_stats = token_w * vf_loss, {"vf_clip_frac": token_w * vf_stats["vf_clip_frac"]}
        loss = loss + cfg.vf_coef * share[0] * vf_loss
        stats["vf_loss"] = vf_loss.item()
        stats["vf_clip_frac"] = vf_stats["vf_clip_frac"]
    return loss, stats


def _rft_loss(per_token_logps, logits, mask, scale, token_share: float = 1.0):
    """rft's loss: the token-level negative log-likelihood of the kept (passing) completions, as SFT (RAFT, Dong et
    al. 2023; ReST-style rejection-sampling fine-tuning), scaled like the token means of `ppo_losses`; `mask` is
    weighted by the rows' multiplicities."""
    token_w = scale[0] if scale is not None else 1.0
    loss = -token_w * masked_mean(per_token_logps, mask)
    entropy = token_w * entropy_from_logits(logits.detach(), mask)  # logged only
    return token_share * loss, {"pg_loss": loss.item(), "entropy": entropy.item()}


def ppo_update(
    model,
    value_head,
    optimizer,
    params: Sequence,
    batch: dict[str, torch.Tensor],
    cfg: RLConfig,
    generator: torch.Generator,
    autocast=None,
    policy: bool = True,
    dp=None,
    trainer=None,
    first_minibatch: list | None = None,
) -> dict[str, float]:
    """``cfg.ppo_epochs`` passes over `batch` in shuffled minibatches of ``cfg.minibatch_size`` rollouts, one
    optimizer step each; stops as soon as a minibatch's approx_kl exceeds ``cfg.target_kl`` (> 0).

    Data parallel (`dp` with world_size N > 1): every process holds the whole `batch` and the same generator, so
    all draw the same order; a global minibatch is N × ``cfg.minibatch_size`` rollouts (minibatch_size is per
    process), each process runs forward/backward on its slice with `ppo_losses`'s ``scale`` (its share of the
    minibatch's tokens and sequences) through `trainer` (the DDP-wrapped `policy_and_value`), DDP averages the
    gradients (the loss is scaled by ``dp.loss_scale``, so the average is their sum) and the stats are summed over
    the processes before clipping and the optimizer step: the gradient, the update and the target-KL decision are
    the single-process ones over the global minibatch.

    Args:
        model: the policy (train mode is set for the call and restored).
        value_head: the critic or None.
        optimizer: over `params` (policy adapters and the head).
        params: every trainable parameter (gradient clipping).
        batch: `ppo_losses`'s minibatch tensors for the whole batch, on the model's device.
        generator: a CPU ``torch.Generator`` for the minibatch order (checkpointed by the loop).
        autocast: a bf16 autocast factory or None.
        policy: False = critic warm-up (value loss only, the backbone without gradients).
        dp: a `models.distributed.DataParallel`, or None (one process).
        trainer: with ``dp.world_size`` > 1, the trainer ``dp.prepare`` made of ``policy_and_value(model, value_head)``.
        first_minibatch: a list (one process) that receives ``(rows, per_token_logps)`` of the first minibatch: its
            rows of `batch` (b,) and their log-probs (b, T), detached, from the forward before any optimizer step.

    Returns:
        the minibatch-mean of every `ppo_losses` stat, plus ``updates`` (optimizer steps done) and
        ``grad_norm`` (mean pre-clip norm).
    """
    import torch

    n = batch["completion_ids"].shape[0]
    world = dp.world_size if dp is not None else 1
    global_size = cfg.minibatch_size * world
    sums: dict[str, float] = {}
    updates, stop, dropped = 0, False, 0.0
    was_training = model.training
    model.train()
    try:
        for _ in range(cfg.ppo_epochs):
            order = torch.randperm(n, generator=generator)
            for start in range(0, n, global_size):
                index = order[start : start + global_size].to(batch["completion_ids"].device)
                optimizer.zero_grad(set_to_none=True)
                if world == 1:
                    keep = first_minibatch is not None and not first_minibatch
                    stats = _minibatch_backward(
                        model, value_head, params, select_rows(batch, index), cfg, autocast, policy, keep
                    )
                    dropped += stats.pop("rows_dropped")
                    if keep:
                        first_minibatch.append((index, stats.pop("per_token_logps")))
                else:
                    stats = _data_parallel_backward(trainer, value_head, batch, index, cfg, autocast, policy, dp)
                stats["grad_norm"] = clip_grad_norm(params, cfg.max_grad_norm or math.inf)
                optimizer.step()
                updates += 1
                for key, value in stats.items():
                    sums[key] = sums.get(key, 0.0) + value
                if policy and cfg.target_kl and stats.get("approx_kl", 0.0) > cfg.target_kl:
                    stop = True
                    break
            if stop:
                break
    finally:
        optimizer.zero_grad(set_to_none=True)
        model.train(was_training)
    return {**{k: v / updates for k, v in sums.items()}, "updates": float(updates), "rows_zero_advantage": dropped}


def _minibatch_backward(
    model, value_head, params, minibatch: dict, cfg: RLConfig, autocast, policy: bool, keep_logps: bool = False
):
    """Forward and backward of one minibatch (one process), computing only what changes the loss: identical rows
    once with their multiplicity (`merge_duplicates`), and, when the loss is the clipped surrogate alone
    (critic-free grpo/dapo/didpo, β = 0, no entropy bonus), without the rows whose every advantage is 0 (a group
    whose rewards are all equal): their per-token loss is exactly 0, so the kept rows' loss scaled by their
    share of the minibatch's tokens (sequences for grpo) is the minibatch's loss, and the gradient is the same.
    When no row is left, the gradient is exactly 0 (set as zeros, so that AdamW steps as it would on it) and the
    stats are ``pg_loss`` and ``loss`` 0 alone. Returns `ppo_losses`'s stats (means over the rows computed), ``loss``
    (the minibatch's total loss) and ``rows_dropped`` (the zero-advantage rows, with multiplicity); with
    `keep_logps` (rft, which drops nothing) also ``per_token_logps``, (B, T) detached, for the given rows."""
    import torch

    minibatch, inverse = merge_duplicates(minibatch)
    share, dropped = (1.0, 1.0), 0.0
    droppable = policy and cfg.algo != "rft" and not cfg.uses_critic and not cfg.kl_coef and not cfg.ent_coef
    if droppable:
        weights, mask = minibatch["weights"], minibatch["completion_mask"]
        live = (minibatch["advantages"] * mask).abs().sum(-1) > 0  # (B,)
        if not bool(live.all()):
            tokens = mask.sum(-1) * weights
            share = (float(tokens[live].sum() / tokens.sum()), float(weights[live].sum() / weights.sum()))
            dropped = float(weights[~live].sum())
            if not bool(live.any()):
                for p in params:
                    p.grad = torch.zeros_like(p)
                return {"pg_loss": 0.0, "loss": 0.0, "rows_dropped": dropped}  # the loss is exactly 0
            minibatch = select_rows(minibatch, live.nonzero().squeeze(1))
    logps, logits, values = policy_forward(
        model, minibatch, value_head, autocast, backbone_grad=policy, temperature=cfg.temperature
    )
    loss, stats = ppo_losses(logps, logits, values, minibatch, cfg, policy, share=share)
    loss.backward()
    if keep_logps:
        stats["per_token_logps"] = logps.detach()[inverse]
    return {**stats, "loss": loss.item(), "rows_dropped": dropped}


def policy_and_value(model, value_head):
    """The policy and its value head (or None) as one ``torch.nn.Module`` whose forward is `policy_forward`, so that
    one DDP (or FSDP2) wrapper averages the gradients of both (`models.distributed.DataParallel.prepare`)."""
    import torch

    class PolicyAndValue(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model, self.value_head = model, value_head
            # FSDP's transformer-layer wrap policy looks for the model's layer class names here
            self._no_split_modules = getattr(model, "_no_split_modules", None)

        def forward(self, minibatch, autocast, backbone_grad: bool, temperature: float):
            return policy_forward(
                self.model, minibatch, self.value_head, autocast, backbone_grad=backbone_grad, temperature=temperature
            )

    return PolicyAndValue()


def _data_parallel_backward(trainer, value_head, batch, index, cfg: RLConfig, autocast, policy: bool, dp):
    """Backward of this process's slice of the global minibatch `index` (rows of `batch`) through `trainer` (the
    DDP-wrapped `policy_and_value`), scaled by its share of the minibatch's tokens and sequences and by
    ``dp.loss_scale`` (DDP averages over the processes); returns the minibatch's stats summed over the processes
    (= the global ones). A process whose slice is empty runs the first row with its loss × 0: DDP needs every
    process in every backward, and its gradients then count as zeros."""
    mine = dp.shard(index)
    empty = len(mine) == 0
    if empty:
        mine = index[:1]
    minibatch = select_rows(batch, mine)
    tokens = batch["completion_mask"].sum(-1) * batch["weights"]  # (B,) multiplicity-weighted
    share_tokens = float(tokens[mine].sum() / tokens[index].sum().clamp(min=1.0))
    scale = (share_tokens, float(batch["weights"][mine].sum() / batch["weights"][index].sum()))
    logps, logits, values = trainer(minibatch, autocast, policy, cfg.temperature)
    loss, stats = ppo_losses(logps, logits, values, minibatch, cfg, policy, scale)
    (loss * (0.0 if empty else dp.loss_scale)).backward()
    if empty:
        stats = {}
    keys = ["pg_loss", "entropy", "approx_kl", "clip_frac/low", "clip_frac/high", "ratio_mean"] if policy else []
    if cfg.algo == "rft":
        keys = ["pg_loss", "entropy"]
    elif policy and cfg.kl_coef and not cfg.uses_critic:
        keys.append("kl_ref")
    if value_head is not None:
        keys += ["vf_loss", "vf_clip_frac"]
    return dp.sum_dict({k: stats.get(k, 0.0) for k in keys})


def update_policy(
    model,
    rollouts: Sequence[Rollout],
    cfg: RLConfig,
    step: int,
    optimizer,
    params: Sequence,
    generator: torch.Generator,
    start_policy: Callable,
    pad_id: int,
    autocast=None,
    engine_sampled: bool = False,
    value_head=None,
    normaliser=None,
    history: Sequence[dict] = (),
    dp=None,
    trainer=None,
) -> dict[str, float]:
    """The update phase of one RL step on its trained rollouts (whole groups in order; rft: the passing ones):
    the no-gradient passes that something reads, the advantages, then `ppo_update`.

    Passes: the current policy's log-probs (the ratio's old side, the engine's importance weights, the critic's
    values) for every row but in rft, whose loss reads none; the start policy's (`start_policy`, a context
    factory) on every row where β·KL enters the loss or the rewards, else on `kl_sample_rows` for the logged
    ``kl_start``. Health metrics (``logprob_diff``, ``seq_logprob_diff``, ``is_weight_mean``) are taken on the rows
    the current policy scored.

    Args:
        model, optimizer, params, generator, autocast, value_head, dp, trainer: as `ppo_update`.
        rollouts: the step's trained rollouts (non-empty).
        step: the step's index (0-based; seeds `kl_sample_rows`, and the critic's warm-up).
        pad_id: the tokenizer's pad (or eos) id.
        engine_sampled: the rollouts came from another engine than the trainer (their old log-probs are then the
            trainer's and the loss carries truncated importance weights, `truncated_is_weights`).
        normaliser: the critic's `models.advantages.RunningMeanStd` of returns, or None.
        history: the emitted records so far (`critic_trusted`).

    Returns:
        ``didpo/``-prefixed metrics: ``kl_start``, ``kl_start_rows``, ``duplicate_rows``, the health figures and
        every `ppo_update` stat.
    """
    import torch

    device = params[0].device
    dp = dp if dp is not None else data_parallel(str(device))
    metrics: dict[str, float] = {}
    batch = build_batch(rollouts, pad_id)
    batch = {k: v.to(device) for k, v in batch.items()}
    mask = batch["completion_mask"]
    n = mask.shape[0]
    chunk = cfg.minibatch_size * dp.world_size
    metrics["didpo/duplicate_rows"] = float(
        n - len(merge_duplicates(batch, ["prompt_index", "completion_ids"])[1].unique())
    )
    # Only the passes whose results something reads. The current policy's log-probs: for every row before the update
    # (the ratio's old side, the engine's importance weights, the critic's values), except in rft, whose loss reads
    # none: its first minibatch's forward (before any optimizer step) gives them for the drift metrics. The start
    # policy's: on every row where β·KL enters the loss or the rewards, else on a few rows for the logged KL.
    first_forward = cfg.algo == "rft" and dp.world_size == 1
    old_values, logps, ref_logps = None, None, None
    if not first_forward:
        kl_rows = kl_sample_rows(n, cfg, step).to(device)
        old_rows = kl_rows if cfg.algo == "rft" else torch.arange(n, device=device)
        with dp.full_params(trainer):
            old_values, logps = no_grad_logps(
                model, select_rows(batch, old_rows), value_head, autocast, chunk, cfg.temperature
            )
            with start_policy() as start_model:
                _, ref_logps = no_grad_logps(
                    start_model, select_rows(batch, kl_rows), None, autocast, chunk, cfg.temperature
                )
        drift, is_weights = _drift_metrics(batch, rollouts, old_rows, logps, kl_rows, ref_logps, engine_sampled, cfg)
        metrics.update(drift)
        if engine_sampled and cfg.algo != "rft":  # the engine's log-probs are not the trainer's: TIS (TRL, verl)
            batch.update(old_per_token_logps=logps, is_weights=is_weights * mask)
    if cfg.uses_critic:
        rewards = token_reward_matrix(rollouts, mask.shape[1], cfg.reward.w_did).to(device)
        if cfg.kl_coef:
            rewards = rewards - cfg.kl_coef * kl_k3(batch["old_per_token_logps"], ref_logps) * mask
        rewards = _normalise_and_clip(rewards, mask, normaliser, cfg)
        trusted = critic_trusted(history, cfg)
        metrics["didpo/critic_trusted"] = float(trusted)
        advantages, returns = gae_advantages(rewards, old_values, mask, cfg, trusted)
        batch.update(advantages=advantages, returns=returns, old_values=old_values)
        explained = explained_variance(old_values, returns, mask)
        if explained is not None:
            metrics["didpo/explained_variance"] = explained
    else:
        if cfg.algo == "didpo":
            batch["advantages"] = didpo_token_advantages(rollouts, mask.cpu(), cfg).to(device)
        elif cfg.algo == "rft":
            batch["advantages"] = mask.clone()  # unused by the loss: every kept token weighs 1
        else:
            batch["advantages"] = group_token_advantages(rollouts, mask.cpu(), cfg).to(device)
        if cfg.kl_coef and cfg.algo != "rft":
            batch["ref_per_token_logps"] = ref_logps  # every row (`kl_sample_rows`)
    warmup = cfg.uses_critic and step < cfg.critic_warmup_steps
    first: list = []
    stats = ppo_update(
        model, value_head, optimizer, params, batch, cfg, generator, autocast, not warmup, dp, trainer,
        first_minibatch=first if first_forward else None,
    )  # fmt: skip
    metrics.update({f"didpo/{k}": v for k, v in stats.items()})
    if first_forward:  # the start policy's weights did not move: its pass may follow the update
        rows, logps = first[0]
        with start_policy() as start_model:
            _, ref_logps = no_grad_logps(start_model, select_rows(batch, rows), None, autocast, chunk, cfg.temperature)
        metrics.update(_drift_metrics(batch, rollouts, rows, logps, rows, ref_logps, engine_sampled, cfg)[0])
    return metrics


def _drift_metrics(batch, rollouts, old_rows, logps, kl_rows, ref_logps, engine_sampled: bool, cfg: RLConfig):
    """Drift and health on the step's own samples before its update (docs/DIDPO.md, "Loss": always logged):
    ``kl_start`` (k3 on `kl_rows`, whose start-policy log-probs are `ref_logps`), ``kl_start_rows``,
    ``logprob_diff`` / ``seq_logprob_diff`` (sampler against trainer) and, for engine rollouts, the truncated
    importance weights' mean and capped fraction, on `old_rows` (whose current-policy log-probs are `logps`;
    `kl_rows` ⊆ `old_rows`). Returns ``(metrics, is_weights (len(old_rows), T) or None)``."""
    import torch

    mask = batch["completion_mask"]
    metrics: dict[str, float] = {}
    position = torch.full((mask.shape[0],), -1, dtype=torch.long, device=mask.device)
    position[old_rows] = torch.arange(len(old_rows), device=mask.device)
    metrics["didpo/kl_start"] = float(masked_mean(kl_k3(logps[position[kl_rows]], ref_logps), mask[kl_rows]))
    metrics["didpo/kl_start_rows"] = float(len(kl_rows))
    sampler_logps, old_mask = batch["old_per_token_logps"][old_rows], mask[old_rows]
    known = old_mask * torch.isfinite(sampler_logps)  # an engine may not report log-probs (NaN)
    if known.sum() > 0:
        gap = (logps - sampler_logps).abs().nan_to_num(0.0)
        metrics["didpo/logprob_diff"] = float(masked_mean(gap, known))
    scored = [rollouts[int(i)] for i in old_rows]
    totals = [r.completion.sequence_logp for r in scored]
    if all(t is not None for t in totals):  # only the engine's sum is known: the per-token mean of its gap
        ours = (logps * old_mask).sum(-1)
        per_token = [abs(float(a) - b) / max(len(r.completion.completion_ids), 1)
                     for a, b, r in zip(ours, totals, scored, strict=True)]  # fmt: skip
        metrics["didpo/seq_logprob_diff"] = _mean(per_token)
    is_weights = None
    if engine_sampled:
        is_weights, capped = truncated_is_weights(logps, sampler_logps, cfg.is_cap)
        metrics["didpo/is_weight_mean"] = float(masked_mean(is_weights, old_mask))
        metrics["didpo/is_capped_frac"] = float(masked_mean(capped.to(mask.dtype), old_mask))
    return metrics, is_weights


# --------------------------------------------------------------------------------------------- the loop


class _RolloutLog:
    """The rollouts JSONL, appended after each step; on resume, lines of steps after the checkpoint (and a torn
    last line) are dropped so the file matches the restored run.

    A run that starts over while a previous run's checkpoints exist (``set_aside``) moves the previous file to
    ``<name>.previous`` instead of emptying it; its first checkpoint drops that file (`drop_previous`), like the
    checkpoints it supersedes. If it dies before, resuming the previous run puts the previous file back."""

    def __init__(self, path: Path, keep_through_step: int, set_aside: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.previous = self.path.with_name(self.path.name + ".previous")
        if keep_through_step > 0 and self.previous.exists():
            self.previous.replace(self.path)  # a newer run started over and died before its first checkpoint
        elif set_aside and self.path.exists():
            self.path.replace(self.previous)
        kept = []
        if keep_through_step > 0 and self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    break
                if record["step"] <= keep_through_step:
                    kept.append(line)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        tmp.replace(self.path)

    def drop_previous(self) -> None:
        """This run saved its first checkpoint: the superseded run's rollouts go with its checkpoints."""
        self.previous.unlink(missing_ok=True)

    def append(
        self, step: int, groups: Sequence[Sequence[Rollout]], kept: Sequence[bool], passing_only: bool = False
    ) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            for group, keep in zip(groups, kept, strict=True):
                for r in group:
                    record = {
                        "step": step,
                        "task_id": r.problem["task_id"],
                        "draw": r.draw,
                        "sample": r.sample,
                        "completion": r.completion.text,
                        "finish_reason": r.completion.finish_reason,
                        "length": len(r.completion.completion_ids),
                        "passed": r.n_passed,
                        "total": r.n_tests,
                        "reason": r.reason,
                        "outcome": r.outcome,
                        "reward": r.reward,
                        "process": r.process,
                        "gap": r.gap,
                        "d": r.did,
                        "shaped": r.shaped,
                        "trained": keep and (r.passed or not passing_only),
                    }
                    f.write(json.dumps(record, ensure_ascii=False) + "\n")


def _fingerprint(cfg: RLConfig, problems: Sequence[dict], initial_weights: str) -> str:
    """Hash of the config, the problems and the initial weights' digest: a checkpoint only resumes the run that
    wrote it (not a run of the same config from another starting policy)."""
    payload = json.dumps(
        [dataclasses.asdict(cfg), [[p["task_id"], p["prompt"], p["test"]] for p in problems], initial_weights],
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def available_memory(device: torch.device | str) -> int:
    """Bytes a new allocation can take on `device`: CUDA's free memory (``torch.cuda.mem_get_info``), else the
    host's ``MemAvailable`` (/proc/meminfo; free physical pages where there is none)."""
    import os

    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def rollout_kv_cache_bytes(model_config, rows: int, tokens: int, bytes_per_value: int) -> int:
    """The KV cache of one rollout batch: rows × tokens × layers × 2 (keys and values) × the key/value width
    (``num_key_value_heads × head_dim``, which is the hidden size without grouped-query attention) × bytes.

    A rough lower bound of what sampling needs (the weights, activations and logits come on top); enough to refuse a
    setting that cannot fit. `tokens` is the longest prompt plus ``max_new_tokens`` (every row is padded to it).
    """
    heads = model_config.num_attention_heads
    head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // heads
    width = (getattr(model_config, "num_key_value_heads", None) or heads) * head_dim
    return rows * tokens * model_config.num_hidden_layers * 2 * width * bytes_per_value


def check_rollout_fits(model, tokenizer, problems: Sequence[dict], cfg: RLConfig, device) -> None:
    """Refuse, before anything is trained or written, an RL budget this model and machine cannot run: the longest
    prompt + ``max_new_tokens`` beyond the model's context (``max_position_embeddings``), or a rollout batch
    (``prompts_per_step × group_size`` rows, decoded together) whose KV cache (`rollout_kv_cache_bytes`, at the
    weights' dtype) exceeds `available_memory` on `device`.

    Raises:
        ValueError: naming ``didpo.max_new_tokens`` (context), or ``didpo.prompts_per_step``, ``didpo.group_size``
            and ``didpo.max_new_tokens`` with the estimate (memory).
    """
    prompts = [build_chat_prompt(tokenizer, user_message(p)) for p in problems]
    longest = max(len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts)
    context = getattr(model.config, "max_position_embeddings", None)
    if context and longest + cfg.max_new_tokens > context:
        raise ValueError(
            f"didpo.max_new_tokens ({cfg.max_new_tokens}) + the longest prompt ({longest} tokens) exceed the model's "
            f"context ({context} tokens): set didpo.max_new_tokens <= {context - longest}"
        )
    rows, tokens = cfg.prompts_per_step * cfg.group_size, longest + cfg.max_new_tokens
    itemsize = next(model.parameters()).element_size()
    need, free = rollout_kv_cache_bytes(model.config, rows, tokens, itemsize), available_memory(device)
    if need > free:
        raise ValueError(
            f"a rollout batch of didpo.prompts_per_step × didpo.group_size = {cfg.prompts_per_step} × "
            f"{cfg.group_size} rows of {longest} prompt + didpo.max_new_tokens {cfg.max_new_tokens} tokens needs "
            f"≈ {need / 2**30:.2f} GiB of KV cache alone, more than the {free / 2**30:.2f} GiB available on "
            f"{device}: lower didpo.group_size, didpo.prompts_per_step or didpo.max_new_tokens"
        )


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


# ----------------------------------------------------------------------------- the loop's phases (train_rl)


def keeps_group(algo: str, group: Sequence[Rollout]) -> bool:
    """Whether a sampled group is trained on: dapo drops a group whose accuracy is all 0 or all 1 (dynamic sampling,
    DAPO, Yu et al. 2025, §3.2), rft one with no passing answer (nothing to fine-tune on); grpo and didpo keep every
    group (an all-equal group's advantages are 0)."""
    if algo == "dapo":
        return not same_accuracy(group)
    if algo == "rft":
        return any(r.passed for r in group)
    return True


def trained_rollouts(algo: str, kept: Sequence[Sequence[Rollout]]) -> list[Rollout]:
    """The rows the update trains on: rft's passing answers (rejection-sampling fine-tuning), every other
    algorithm's every answer of the kept groups."""
    return [r for g in kept for r in g if algo != "rft" or r.passed]


@dataclass
class StepSamples:
    """One step's rollouts: every group sampled (refills included), whether each is trained on (`keeps_group`), and
    the seconds spent sampling and syncing the engine's weights."""

    sampled: list[list[Rollout]]
    kept_flags: list[bool]
    sample_time: float
    sync_time: float
    passing_only: bool  # rft: only the passing answers are trained on (and logged as trained)

    @property
    def kept(self) -> list[list[Rollout]]:
        return [g for g, keep in zip(self.sampled, self.kept_flags, strict=True) if keep]


def sample_step(model, tokenizer, train_problems, order, cfg, verifier, controls, step, engine, dp, trainer):
    """The rollout phase of `step`: sync the engine to the policy, draw ``cfg.prompts_per_step`` prompts from
    `order`, sample and score ``cfg.group_size`` answers each (`collect_rollouts`; didpo: `assign_process_rewards`
    with `controls`), and for dapo draw again for the dropped groups, up to ``cfg.max_refill`` times. Returns a
    `StepSamples`."""
    sync_time = 0.0
    if engine is not None:  # the engine samples from this step's policy
        t0 = time.perf_counter()
        with dp.full_params(trainer):
            engine.load_weights(model)
        sync_time = time.perf_counter() - t0
    sampled, kept_flags, sample_time, draw, want = [], [], 0.0, 0, cfg.prompts_per_step
    refills = cfg.max_refill if cfg.algo == "dapo" else 0
    while True:
        chosen = [train_problems[i] for i in order.take(want)]
        t0 = time.perf_counter()
        seed = sampling_seed(cfg.seed, step, draw)
        with dp.full_params(trainer):
            new = collect_rollouts(model, tokenizer, chosen, cfg, verifier, seed, draw, engine=engine)
        if cfg.algo == "didpo":
            assign_process_rewards(new, cfg, controls)
        sample_time += time.perf_counter() - t0
        for group in new:
            sampled.append(group)
            kept_flags.append(keeps_group(cfg.algo, group))
        missing = cfg.prompts_per_step - sum(kept_flags)
        if missing == 0 or draw == refills:
            break
        draw, want = draw + 1, missing
    return StepSamples(sampled, kept_flags, sample_time, sync_time, passing_only=cfg.algo == "rft")


def rollout_metrics(samples: StepSamples, algo: str) -> dict[str, float]:
    """The step's ``didpo/`` figures of what was sampled (rewards, pass rate, lengths, throughput); didpo adds its
    process reward, DiD sum and final gap."""
    everything = [r for g in samples.sampled for r in g]
    metrics = {
        "didpo/reward/outcome": _mean([r.outcome for r in everything]),
        "didpo/reward/sequence": _mean([r.reward for r in everything]),
        "didpo/pass_rate": _mean([float(r.passed) for r in everything]),
        "didpo/no_code_rate": _mean([float(r.reason == "no_code") for r in everything]),
        "didpo/frac_zero_std_groups": _mean([float(zero_std(g)) for g in samples.sampled]),
        "didpo/groups_sampled": float(len(samples.sampled)),
        "didpo/groups_trained": float(len(samples.kept)),
        "didpo/response_length": _mean([float(len(r.completion.completion_ids)) for r in everything]),
        "didpo/truncated_rate": _mean([float(r.completion.finish_reason == "length") for r in everything]),
        "didpo/rollouts_per_s": len(everything) / samples.sample_time,
        "didpo/tokens_per_s": sum(len(r.completion.completion_ids) for r in everything) / samples.sample_time,
    }
    if algo == "didpo":
        metrics["didpo/reward/process"] = _mean([r.process for r in everything])
        metrics["didpo/reward/did"] = _mean([sum(r.did) for r in everything])
        metrics["didpo/reward/gap_final"] = _mean([r.gap[-1] for r in everything if r.gap])
    return metrics


@dataclass
class _Trainer:
    """What the loop trains: the policy (LoRA-wrapped), its start (a frozen copy in full fine-tuning, else None: the
    adapters disabled), the critic (or None), AdamW over both, the DDP/FSDP2 wrapper (None in one process), rank
    0's export copy, and the optimizer's parameters."""

    model: object
    start_copy: object
    value_head: object
    optimizer: object
    trainer: object
    export_copy: object
    params: list

    def start_policy(self):
        """The start policy: the starting weights (adapters disabled), or the frozen copy in full fine-tuning."""
        if self.start_copy is not None:
            return contextlib.nullcontext(self.start_copy)
        return _adapters_disabled(self.model)


def _build_trainer(model, cfg: RLConfig, device, dp) -> _Trainer:
    """Seed, wrap the policy in LoRA adapters (or keep a frozen start copy), add the critic, make AdamW, and wrap
    for data parallelism, in this order (the RNG draws of LoRA's and the head's initialisation follow the seed).
    Raises ValueError when nothing is trainable."""
    import torch

    set_seed(cfg.seed)
    start_copy = None
    if not cfg.lora:
        start_copy = copy.deepcopy(model).to(device).eval().requires_grad_(False)
    if cfg.lora:
        model = apply_lora(
            model, cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_target_modules, cfg.lora_layers
        )
    model.to(device)
    model.train()
    policy_params = [p for p in model.parameters() if p.requires_grad]
    if not policy_params:
        raise ValueError("the model has no trainable parameters")
    groups = [{"params": policy_params, "lr": cfg.learning_rate, "weight_decay": 0.0}]
    value_head = None
    if cfg.uses_critic:
        value_head = ValueHead(model.config.hidden_size).to(device)
        groups.append({"params": list(value_head.parameters()), "lr": cfg.value_learning_rate, "weight_decay": 0.0})
    optimizer = torch.optim.AdamW(groups)
    export_copy = dp.export_copy(model)  # rank 0's copy to export from when FSDP2 shards the model in place
    trainer = None  # one process: the loop calls the policy and the head itself
    if dp.world_size > 1:  # DDP or FSDP2 over the processes, one wrapper around the policy and the head
        trainer, optimizer = dp.prepare(policy_and_value(model, value_head), optimizer)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    return _Trainer(model, start_copy, value_head, optimizer, trainer, export_copy, params)


def _prompt_pool(ckpt, cfg, problems, initial_weights, engine, pool_cache, dp, t: _Trainer, tokenizer, verifier):
    """The prompt pool: a resumed run's (its checkpoint carries it), else the screen of the start policy (read from
    `pool_cache` when an arm from the same start already screened), else None (no screen). Returns ``(pool, read
    from the cache)``."""
    if ckpt is not None and ckpt.state.get("pool") is not None:
        return PromptPool.from_state(ckpt.state["pool"]), False
    if not cfg.screen_samples:
        return None, False
    key = pool_cache_key(cfg, problems, initial_weights, type(engine).__name__ if engine is not None else "torch")
    cached = Path(pool_cache) / f"{key}.json" if pool_cache is not None else None
    if cached is not None and cached.is_file():
        return PromptPool.from_state(json.loads(cached.read_text())), True
    screen_engine = engine if dp.world_size == 1 else None
    if screen_engine is not None:  # no step has run yet: the adapters are new (LoRA B = 0), the start policy
        screen_engine.load_weights(t.model)  # (a run that started over may have left another's weights there)
    with dp.full_params(t.trainer), t.start_policy() as screener:
        pool = screen_prompt_pool(screener, tokenizer, problems, cfg, verifier, screen_engine)
    if cached is not None and dp.is_main:
        _write_json(cached, pool.state_dict())
    return pool, False


def train_rl(
    model,
    tokenizer,
    problems: Sequence[dict],
    cfg: RLConfig,
    verifier,
    out_dir: Path,
    emit: Callable[[dict, int], None] = lambda m, s: None,
    resume: bool = True,
    rollouts_path: Path | None = None,
    engine=None,
    pool_cache: Path | None = None,
) -> RLResult:
    """Train `model` with ``cfg.algo`` on `problems` (see the module docstring for one step).

    Args:
        model: a causal LM (``PreTrainedModel``), e.g. the DPO checkpoint from `models.policy.load_policy`; moved
            to ``cfg.device`` and modified in place (with LoRA: wrapped, trained, then merged).
        tokenizer: its tokenizer (chat template, pad or eos token).
        problems: train-split problem rows (data/README.md schema: task_id, prompt, entry_point, test, ...); with a
            screen (``cfg.screen_samples`` > 0) the pool is chosen among them.
        cfg: the configuration.
        verifier: ``check_many(jobs) -> verdicts`` (`sandbox.verifier.Verifier`).
        out_dir: receives ``checkpoints/`` (the last exact-resume checkpoint), ``pool.json`` (the screen),
            ``adapter/`` (LoRA) and ``merged/``.
        emit: metrics callback ``emit(metrics, step)``, keys under ``didpo/`` for every algorithm; an exception
            raised there aborts training (the last checkpoint stays valid).
        resume: continue from the latest checkpoint in ``out_dir/checkpoints`` (its pool included: no new
            screen); False starts over: existing checkpoints are deleted once this run has saved its first one.
        rollouts_path: the rollouts JSONL (default ``out_dir/rollouts.jsonl``).
        engine: the rollout engine of the starting checkpoint (``cfg.rollout_engine``: a
            `models.openvino_engine.OpenVINOSampler` or `models.vllm_engine.VLLMSampler`, `tasks.didpo.rollout_engine`),
            or None (the torch sampler). Before each step's rollouts the policy's weights are loaded into it
            (``load_weights``); the update then takes the trainer's forward as the old
            log-probs and weighs each token by min(exp(logπ_trainer − logπ_engine), ``cfg.is_cap``). The screen
            samples with it too, its weights synced from the new (start) policy first.
        pool_cache: a folder of screens by `pool_cache_key` (``<key>.json``): a screen found there is read, not
            sampled again (an arm from the same start, on the same problems, with the same screen settings); a new
            one is written there. None = screen every run.

    Returns:
        an `RLResult`.

    Raises:
        ValueError: no problems, a problem of another split than train, a tokenizer without pad/eos token, a
            budget the model's context or the memory cannot hold (`check_rollout_fits`, naming the settings; checked
            before anything is trained or written), a screen without an informative problem (`screen_prompt_pool`).
        models.checkpoint.CheckpointMismatchError: ``resume=True`` found a checkpoint of another config, other
            problems or other initial weights.
    """
    import torch
    from tqdm.auto import tqdm

    if not problems:
        raise ValueError("no problems to train on")
    held_out = sorted({p["split"] for p in problems if p.get("split", "train") != "train"})
    if held_out:
        raise ValueError(f"RL trains (and screens) on train problems only, got {held_out} problems too")
    pad_id = pad_token_id(tokenizer)
    out_dir, ckpt_root, pool_path = Path(out_dir), Path(out_dir) / "checkpoints", Path(out_dir) / "pool.json"
    rollouts_path = Path(rollouts_path) if rollouts_path is not None else out_dir / "rollouts.jsonl"
    dp = data_parallel(resolve_device(cfg.device))
    check_rollout_fits(model, tokenizer, problems, cfg, dp.device)
    if dp.world_size > 1:
        verifier = _ShardedVerifier(verifier, dp)
    autocast = autocast_factory(cfg.mixed_precision, dp.device, auto_on_cpu=True)
    initial_weights = weights_digest(model)  # before LoRA: the starting policy itself
    t = _build_trainer(model, cfg, dp.device, dp)
    model, value_head = t.model, t.value_head
    minibatch_generator = torch.Generator().manual_seed(_generator_seed(cfg.seed, 2))
    normaliser = RunningMeanStd() if cfg.normalize_rewards else None
    fingerprint = _fingerprint(cfg, problems, initial_weights)
    step, history = 0, []
    ckpt, superseded = open_checkpoints(
        ckpt_root, resume, fingerprint, "another didpo config, other problems or another starting policy"
    )
    pool, pool_from_cache = _prompt_pool(ckpt, cfg, problems, initial_weights, engine, pool_cache, dp, t, tokenizer,
                                         verifier)  # fmt: skip
    train_problems, controls = list(problems), None
    if pool is not None:
        by_id = {p["task_id"]: p for p in problems}
        train_problems, controls = [by_id[i] for i in pool.task_ids], pool.controls()
        if dp.is_main:
            _write_json(pool_path, {**pool.summary(), **pool.state_dict()})
    order = DataOrder(len(train_problems), _generator_seed(cfg.seed, 1))
    generators = {"data": order.generator, "minibatch": minibatch_generator}
    if ckpt is not None:
        restore_loop_state(ckpt, model, t.optimizer, order, generators)
        if value_head is not None:
            load_trainable_state_dict(value_head, ckpt.tensors["value_head"])
        if normaliser is not None:
            normaliser.load_state_dict(ckpt.state["reward_normaliser"])
        step, history = ckpt.step, ckpt.state["history"]
    rollout_log = _RolloutLog(rollouts_path, step, set_aside=bool(superseded)) if dp.is_main else None

    # Data parallel: every process samples the whole step (same weights, same seeds: the same rollouts), the
    # verifier splits the programs between the processes and shares the verdicts, so rewards and advantages
    # (group statistics, whitening, normalisation) are computed on the global batch everywhere; only the PPO
    # update is split (`ppo_update`).
    bar = tqdm(total=cfg.steps, initial=step, desc=f"rl ({cfg.algo})", mininterval=5.0, disable=not dp.is_main)
    while step < cfg.steps:
        started = time.perf_counter()
        samples = sample_step(model, tokenizer, train_problems, order, cfg, verifier, controls, step, engine, dp,
                              t.trainer)  # fmt: skip
        metrics = rollout_metrics(samples, cfg.algo)
        update_started = time.perf_counter()
        rollouts = trained_rollouts(cfg.algo, samples.kept)
        if rollouts:
            metrics.update(
                update_policy(model, rollouts, cfg, step, t.optimizer, t.params, minibatch_generator,
                              t.start_policy, pad_id, autocast, engine is not None, value_head, normaliser, history,
                              dp, t.trainer)
            )  # fmt: skip
        step += 1
        metrics["didpo/time/rollout_s"] = samples.sample_time
        if engine is not None:
            metrics["didpo/time/weight_sync_s"] = samples.sync_time
        metrics["didpo/time/update_s"] = time.perf_counter() - update_started
        metrics["didpo/step_time_s"] = time.perf_counter() - started
        history.append({"step": step, **metrics})
        if dp.is_main:
            rollout_log.append(step, samples.sampled, samples.kept_flags, passing_only=samples.passing_only)
            emit(metrics, step)
        if cfg.checkpoint_every and (step % cfg.checkpoint_every == 0 or step == cfg.steps):
            state = {"pool": pool.state_dict() if pool is not None else None, "history": history}
            state["reward_normaliser"] = normaliser.state_dict() if normaliser is not None else None
            _save_checkpoint(ckpt_root, step, t, order, generators, fingerprint, superseded, state, rollout_log, dp)
        if step in cfg.keep_steps:  # a budget point: the policy as it is after this step's update
            keep_point(dp.exportable(model, t.export_copy), tokenizer, out_dir, step, dp.is_main)
        bar.update(1)
        bar.set_postfix(reward=f"{metrics['didpo/reward/outcome']:.3f}", pass_rate=f"{metrics['didpo/pass_rate']:.2f}")
    bar.close()

    return _export_result(t, value_head, tokenizer, cfg, out_dir, step, history, rollouts_path, pool, pool_path,
                          pool_from_cache, dp)  # fmt: skip


def _save_checkpoint(ckpt_root, step, t: _Trainer, order, generators, fingerprint, superseded, state, rollout_log, dp):
    """The exact-resume checkpoint after `step`: on every rank (sharded states are gathered), written by rank 0; the
    critic's weights beside the policy's; a previous run's rollouts set aside once this run's first checkpoint
    exists."""
    tensors = {"value_head": trainable_state_dict(t.value_head)} if t.value_head is not None else {}
    replaced_previous_run = bool(superseded)
    save_loop_state(ckpt_root, step, t.model, t.optimizer, order, generators, fingerprint, superseded,
                    tensors=tensors, state=state, write=dp.is_main)  # fmt: skip
    if replaced_previous_run and rollout_log is not None:
        rollout_log.drop_previous()


def _export_result(t: _Trainer, value_head, tokenizer, cfg, out_dir, step, history, rollouts_path, pool, pool_path,
                   pool_from_cache, dp) -> RLResult:  # fmt: skip
    """Export the trained policy (rank 0: ``adapter/`` with LoRA, ``merged/``), gather a sharded critic, and return
    the run's `RLResult` once every rank is there."""
    model = t.model
    model.eval()
    trainable, _ = count_parameters(model)
    adapter_path, merged_path = (out_dir / "adapter" if cfg.lora else None), out_dir / "merged"
    to_export = dp.exportable(model, t.export_copy)
    if dp.sharded and value_head is not None:  # the critic whole, as one process returns it
        value_head = _whole_value_head(value_head, model.config.hidden_size)
    if dp.is_main:
        adapter_path, merged_path = export(to_export, tokenizer, out_dir, cfg.lora)
    dp.barrier()  # every rank returns once the exports exist
    return RLResult(
        global_step=step,
        history=history,
        adapter_path=adapter_path,
        merged_path=merged_path,
        rollouts_path=rollouts_path,
        value_head=value_head,
        trainable_params=trainable,
        pool=pool,
        pool_path=pool_path if pool is not None else None,
        pool_from_cache=pool_from_cache,
    )


def keep_point(model, tokenizer, out_dir: Path, step: int, write: bool) -> Path:
    """Write the policy after `step` to ``out_dir/points/step_<step:04d>/`` (atomically): the LoRA adapter (peft's
    ``save_pretrained``; merge it onto the start checkpoint to evaluate) or, in full fine-tuning, the whole model,
    with the tokenizer. Only where `write` (rank 0). Returns the folder."""
    point = Path(out_dir) / "points" / f"step_{step:04d}"
    if write:
        with atomic_directory(point) as tmp:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
    return point


def _whole_value_head(value_head, hidden_size: int):
    """A plain CPU `ValueHead` with the trained (FSDP2-sharded) head's weights gathered into it (a collective)."""
    whole = ValueHead(hidden_size)
    load_trainable_state_dict(whole, trainable_state_dict(value_head))
    return whole


def _write_json(path: Path, payload: dict) -> None:
    """Write `payload` to `path` atomically (a temporary sibling, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)


class _ShardedVerifier:
    """Data parallel: each process verifies its slice of the programs; the verdicts are gathered in order, so every
    process scores the same rollouts with the same verdicts (no sandbox timing can make them diverge)."""

    def __init__(self, verifier, dp):
        self.verifier, self.dp = verifier, dp

    def check_many(self, jobs):
        mine = list(self.dp.shard(list(jobs)))
        return self.dp.gather(list(self.verifier.check_many(mine)) if mine else [])


@contextlib.contextmanager
def _adapters_disabled(model):
    with model.disable_adapter():
        yield model


def _normalise_and_clip(rewards, mask, normaliser, cfg: RLConfig):
    """Scale token rewards by the running std of sequence returns and clip them, as configured (seed §4.3).

    No mean shift: a constant per-token offset would reward length. The statistic is the sequence return, not
    the token reward (token rewards are mostly zeros). While the returns seen so far have no spread (std 0),
    rewards are left unscaled rather than multiplied by 1/sqrt(eps); `reward_clip` bounds what a small std does.
    """
    if normaliser is not None:
        normaliser.update((rewards * mask).sum(-1))
        if normaliser.var > 0:
            rewards = normaliser.normalize(rewards)
    if cfg.reward_clip:
        rewards = clip_rewards(rewards, cfg.reward_clip)
    return rewards * mask


def sft_answer_p90_tokens(tokenizer, problems: Sequence[dict]) -> int:
    """The 90th percentile (nearest rank, rounded up) of the SFT answers' lengths in tokens: each problem's reference
    answer in the answer format SFT teaches (`models.sft.render_answer`), tokenized without special tokens, + 1
    for the eos that ends it."""
    lengths = sorted(len(tokenizer(render_answer(p), add_special_tokens=False)["input_ids"]) + 1 for p in problems)
    return lengths[math.ceil(0.9 * len(lengths)) - 1]


def check_budget_fits_answers(tokenizer, problems: Sequence[dict], cfg: RLConfig) -> None:
    """Refuse, at stage start, a token budget below the p90 length of the answers SFT taught (`sft_answer_p90_tokens`):
    RL would otherwise cut off most correct answers and train another task (issue 18: 70% cut at 192 tokens).

    Raises:
        ValueError: naming ``didpo.max_new_tokens``, the p90 and how many problems it was measured on.
    """
    if not problems:
        return
    p90 = sft_answer_p90_tokens(tokenizer, problems)
    if cfg.max_new_tokens < p90:
        raise ValueError(
            f"didpo.max_new_tokens ({cfg.max_new_tokens}) is below the p90 length of the SFT answers ({p90} tokens "
            f"over {len(problems)} train problems): set didpo.max_new_tokens >= {p90}"
        )
