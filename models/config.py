"""The learning sections of params.yaml: ``sft``, ``dpo``, ``didpo`` (with ``didpo.reward``) and ``selfplay``.

A leaf: this module imports nothing of the project and no third-party package, so reading params.yaml
(`tasks.config.load_params`, which builds ``Params`` from these and the pipeline's own sections) never imports torch
or a stage. Each dataclass is frozen; its ``__post_init__`` checks ranges and the fields that contradict each other
and raises ``ValueError`` naming ``section.field`` (the project's one validation style: types and unknown keys are
pydantic's, at load). The defaults are params.yaml's values (tests/test_config.py compares them one by one), so a
config built in Python with a few fields set trains as the pipeline does.

Consumers: ``SFTConfig`` → `models.sft.train_sft`; ``DPOConfig`` → `models.dpo.train_dpo` and `tasks.dpo`;
``RLConfig`` and ``ProcessRewardConfig`` → `models.rl.train_rl` and `models.process_reward`;
``SelfplayConfig`` → `tasks.selfplay`.
"""

from __future__ import annotations

from dataclasses import dataclass

_MIXED_PRECISION = ("auto", "bf16", "no")

# dpo
LOSS_TYPES = ("sigmoid", "ipo", "robust", "simpo", "orpo")
MAX_EPOCHS = 3.0

# didpo
ROLLOUT_ENGINES = ("torch", "openvino", "vllm")
ALGOS = ("didpo", "grpo", "dapo", "rft")
CONTROLS = ("start_policy", "group", "reference")
SHAPINGS = ("potential", "bonus")
# Upper bounds checked at load: far above any useful setting, low enough that a typo fails with the key's name
# instead of in the allocator (the model- and machine-dependent limits are `check_rollout_fits`'s, at stage start).
MAX_GROUP_SIZE = 256
MAX_PROMPTS_PER_STEP = 1024
MAX_NEW_TOKENS = 32768


@dataclass(frozen=True)
class SFTConfig:
    """The ``sft`` section of params.yaml.

    Attributes:
        lora: train LoRA adapters (True) or every weight of the model (False).
        lora_r: LoRA rank.
        lora_alpha: LoRA scaling numerator; the update is ``(lora_alpha / lora_r) · B A``.
        lora_dropout: dropout on the adapters' input during training.
        lora_target_modules: ``"auto"`` = every linear layer but the LM head (all attention and MLP
            projections: q/k/v/o_proj, gate/up/down_proj on Llama-like models; peft's ``"all-linear"``),
            or a comma-separated list of module names.
        lora_layers: LoRA on the last N decoder layers only (0 = every layer); the backward pass stops at the
            lowest adapted layer (`models.lora.apply_lora`).
        learning_rate: peak AdamW learning rate.
        weight_decay: AdamW decoupled weight decay, applied to matrices only (not to biases or norm gains).
        batch_size: examples per micro-batch, per process (under ``accelerate launch`` with N processes the global
            batch is N × batch_size; see `models.distributed`).
        grad_accum_steps: micro-batches per optimizer step (examples per step = batch_size ×
            grad_accum_steps × processes).
        max_steps: optimizer steps; 0 means ``ceil(epochs × n_train / (batch_size × grad_accum_steps))``.
        epochs: passes over the training set when `max_steps` is 0 (may be fractional).
        warmup_ratio: fraction of the steps with linear warm-up before the cosine decay to 0.
        max_grad_norm: clip the global gradient L2 norm to this; 0 disables clipping (the norm is still
            logged).
        max_seq_len: longest tokenised example (prompt + answer, tokens); longer answers are truncated on
            the right, a prompt that leaves no room for the answer is an error.
        eval_every: evaluate the held-out loss every this many steps (and after the last step); 0 disables.
        early_stopping_patience: stop after this many evaluations in a row without a lower held-out loss;
            0 disables early stopping.
        seed: seeds Python, NumPy, torch (LoRA initialisation, dropout) and the data order.
        checkpoint_every: write an exact-resume checkpoint every this many steps (and at the end); 0 disables.
        packing: concatenate each micro-batch into one row without padding (position ids restart per example,
            attention stays within each example); same loss as padding, less wasted compute on mixed lengths.
            False pads each micro-batch to its longest example (dynamic padding).
        device: "auto" (CUDA when available, else CPU), or a torch device string.
        mixed_precision: "auto" = bf16 autocast where the device runs bf16 natively (CUDA GPUs that support it,
            CPUs with AVX512-BF16 or AMX: a step ≈ 1.45x cheaper measured), none elsewhere (the model's own dtype,
            float32 by default); "bf16" = bf16 autocast on any device (emulated, > 10x slower, on other CPUs);
            "no" = none (`models.training.autocast_factory`).
            Autocast keeps the weights in the dtype they were loaded in: for full fine-tuning on a GPU load
            the model in float32, so AdamW updates float32 weights (LoRA adapters are float32 anyway).
    """

    lora: bool = True
    lora_r: int = 16
    lora_alpha: float = 32.0
    lora_dropout: float = 0.0
    lora_target_modules: str = "auto"
    lora_layers: int = 0
    learning_rate: float = 6e-4
    weight_decay: float = 0.0
    batch_size: int = 4
    grad_accum_steps: int = 2
    max_steps: int = 240
    epochs: float = 1.0
    warmup_ratio: float = 0.1
    max_grad_norm: float = 1.0
    max_seq_len: int = 640
    eval_every: int = 20
    early_stopping_patience: int = 3
    seed: int = 0
    checkpoint_every: int = 20
    packing: bool = False
    device: str = "auto"
    mixed_precision: str = "auto"

    def __post_init__(self):
        positive = ("lora_r", "batch_size", "grad_accum_steps", "max_seq_len")
        non_negative = (
            "lora_layers",
            "max_steps",
            "eval_every",
            "early_stopping_patience",
            "checkpoint_every",
            "max_grad_norm",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"sft.{name} must be >= 1, got {getattr(self, name)}")
        for name in non_negative:
            if getattr(self, name) < 0:
                raise ValueError(f"sft.{name} must be >= 0, got {getattr(self, name)}")
        if self.max_steps == 0 and self.epochs <= 0:
            raise ValueError("sft.epochs must be > 0 when sft.max_steps is 0")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"sft.warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if not 0 <= self.lora_dropout < 1:
            raise ValueError(f"sft.lora_dropout must be in [0, 1), got {self.lora_dropout}")
        if self.learning_rate < 0 or self.weight_decay < 0:
            raise ValueError("sft.learning_rate and sft.weight_decay must be >= 0")
        if self.mixed_precision not in _MIXED_PRECISION:
            raise ValueError(f"sft.mixed_precision must be one of {_MIXED_PRECISION}, got {self.mixed_precision!r}")


@dataclass(frozen=True)
class DPOConfig:
    """The ``dpo`` section of params.yaml.

    Attributes:
        loss_type: "sigmoid" (DPO, Rafailov et al. 2023), "ipo" (Azar et al. 2023), "robust" (Chowdhury et al. 2024),
            "simpo" (Meng et al. 2024, reference-free), "orpo" (Hong et al. 2024, reference-free).
        beta: β, the inverse temperature of the implicit reward (sigmoid/robust/simpo), IPO's τ, ORPO's λ.
        label_smoothing: ε, the assumed probability that a pair's label is flipped (robust only), in [0, 0.5).
        simpo_gamma: γ, SimPO's target reward margin (nats, in units of β·average log-prob).
        lora_r, lora_alpha, lora_dropout, lora_target_modules, lora_layers: the fresh adapter (see
            `SFTConfig`).
        learning_rate: peak AdamW learning rate.
        weight_decay: AdamW decoupled weight decay on matrices.
        batch_size: pairs per micro-batch per process (one forward of 2·batch_size sequences); with N processes
            (``accelerate launch``, `models.distributed`) the global micro-batch is N × batch_size.
        grad_accum_steps: micro-batches per optimizer step.
        max_steps: optimizer steps; 0 means ``ceil(epochs × n_pairs / (batch_size × grad_accum_steps))``. Either way
            capped at `MAX_EPOCHS` passes over the training pairs.
        epochs: passes over the pairs when `max_steps` is 0, in (0, 3].
        warmup_ratio: fraction of the steps with linear warm-up before the cosine decay to 0.
        max_grad_norm: clip the global gradient norm to this; 0 disables clipping (the norm is still logged).
        max_seq_len: longest tokenised prompt + answer; longer answers are truncated on the right.
        eval_every: held-out evaluation every this many steps (and after the last); 0 disables evaluation, early
            stopping, best-checkpoint selection and the displacement monitor.
        early_stopping_patience: stop after this many evaluations in a row without a lower held-out loss than the
            best so far (the reference's at step 0 included); 0 disables early stopping.
        displacement_threshold: nats; the monitor fires when the mean held-out chosen log-prob is this much below its
            value before training while the held-out margin is above its starting value. 0 disables the monitor.
        ches_filter_quantile: drop this fraction of the training pairs with the highest CHES score before training,
            in [0, 1); 0 keeps every pair.
        seed: seeds Python, NumPy, torch (LoRA initialisation, dropout) and the data order.
        checkpoint_every: exact-resume checkpoint every this many steps (and at the end); 0 disables.
        device: "auto" (CUDA when available, else CPU) or a torch device string.
        mixed_precision: "auto" (bf16 autocast on CUDA with bf16 support), "bf16" or "no".
        held_out_frac: the dpo stage holds out this fraction of the prompts (all their pairs) for evaluation, in
            [0, 0.5]; not read by `train_dpo`.
        val_problems: the dpo stage's smoke check (format compliance, unsafe-code rate, greedy pass) on this many
            val problems before and after DPO (0 = all): not a measurement, n problems cannot show a change below about
            6/n (`tasks.dpo.smoke_check`); not read by `train_dpo`.
        max_new_tokens: generation budget of that check (tokens); not read by `train_dpo`.
        max_pairs: the dpo stage trains on at most this many pairs (0 = all), chosen by `select_pairs`: the reference
            log-probs of every pair are computed up front, so pairs a short run never reaches only cost time.
    """

    loss_type: str = "sigmoid"
    beta: float = 0.1
    label_smoothing: float = 0.0
    simpo_gamma: float = 0.5
    lora_r: int = 16
    lora_alpha: float = 32.0
    lora_dropout: float = 0.05
    lora_target_modules: str = "auto"
    lora_layers: int = 0
    learning_rate: float = 1e-4
    weight_decay: float = 0.0
    batch_size: int = 4
    grad_accum_steps: int = 1
    max_steps: int = 12
    epochs: float = 1.0
    warmup_ratio: float = 0.1
    max_grad_norm: float = 1.0
    max_seq_len: int = 640
    eval_every: int = 10
    early_stopping_patience: int = 3
    displacement_threshold: float = 5.0
    ches_filter_quantile: float = 0.0
    seed: int = 0
    checkpoint_every: int = 10
    device: str = "auto"
    mixed_precision: str = "auto"
    held_out_frac: float = 0.1
    val_problems: int = 10
    max_new_tokens: int = 320
    max_pairs: int = 64

    def __post_init__(self):
        if self.max_pairs < 0:
            raise ValueError(f"dpo.max_pairs must be >= 0 (0 = all), got {self.max_pairs}")
        if not 0 <= self.held_out_frac <= 0.5 or self.val_problems < 0 or self.max_new_tokens < 1:
            raise ValueError("dpo.held_out_frac must be in [0, 0.5], dpo.val_problems >= 0, dpo.max_new_tokens >= 1")
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"dpo.loss_type must be one of {LOSS_TYPES}, got {self.loss_type!r}")
        if self.beta <= 0:
            raise ValueError(f"dpo.beta must be > 0, got {self.beta}")
        if not 0 <= self.label_smoothing < 0.5:
            raise ValueError(f"dpo.label_smoothing must be in [0, 0.5), got {self.label_smoothing}")
        for name in ("lora_r", "batch_size", "grad_accum_steps", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"dpo.{name} must be >= 1, got {getattr(self, name)}")
        non_negative = ("max_steps", "eval_every", "early_stopping_patience", "checkpoint_every", "max_grad_norm")
        for name in (*non_negative, "lora_layers"):
            if getattr(self, name) < 0:
                raise ValueError(f"dpo.{name} must be >= 0, got {getattr(self, name)}")
        if not 0 < self.epochs <= MAX_EPOCHS:
            raise ValueError(f"dpo.epochs must be in (0, {MAX_EPOCHS:g}], got {self.epochs}")
        if not 0 <= self.warmup_ratio < 1 or not 0 <= self.lora_dropout < 1:
            raise ValueError("dpo.warmup_ratio and dpo.lora_dropout must be in [0, 1)")
        if not 0 <= self.ches_filter_quantile < 1:
            raise ValueError(f"dpo.ches_filter_quantile must be in [0, 1), got {self.ches_filter_quantile}")
        if self.displacement_threshold < 0 or self.learning_rate < 0 or self.weight_decay < 0:
            raise ValueError("dpo.displacement_threshold, dpo.learning_rate and dpo.weight_decay must be >= 0")
        if self.mixed_precision not in _MIXED_PRECISION:
            raise ValueError(f"dpo.mixed_precision must be one of {_MIXED_PRECISION}, got {self.mixed_precision!r}")


@dataclass(frozen=True)
class SelfplayConfig:
    """The ``selfplay`` section of params.yaml.

    Attributes:
        n_prompts: training problems answered (the first ones of the train split); 0 = all.
        k: answers sampled per problem (K).
        temperature: sampling temperature (> 0: the K answers must differ).
        top_p: nucleus mass in (0, 1].
        max_new_tokens: generation budget per answer (tokens).
        seed: sampling seed.
        include_mined: add the mined pairs (data/mined/pairs.jsonl) to the output.
        include_human: add the validated human pairs (data/validated/human_pairs.jsonl) when the file has rows.
    """

    n_prompts: int = 16
    k: int = 4
    temperature: float = 0.8
    top_p: float = 0.95
    max_new_tokens: int = 320
    seed: int = 0
    include_mined: bool = True
    include_human: bool = True

    def __post_init__(self):
        if self.n_prompts < 0:
            raise ValueError(f"selfplay.n_prompts must be >= 0, got {self.n_prompts}")
        if self.k < 2:
            raise ValueError(f"selfplay.k must be >= 2 (a pair needs two answers), got {self.k}")
        if self.temperature <= 0:
            raise ValueError(f"selfplay.temperature must be > 0 (the K answers must differ), got {self.temperature}")
        if not 0 < self.top_p <= 1 or self.max_new_tokens < 1:
            raise ValueError("selfplay.top_p must be in (0, 1] and selfplay.max_new_tokens >= 1")


@dataclass(frozen=True)
class ProcessRewardConfig:
    """The ``didpo.reward`` section: how steps and outcomes are scored (DIDPO.md v2, "Objects" to "Advantage").

    Attributes:
        w_syntax, w_style, w_semantic, w_task: weights (≥ 0) of Φ's components; Φ divides by their sum, so Φ ∈ [0, 1]
            (all 0: Φ ≡ 0, no process signal).
        style_scale: the style component is max(0, 1 − style_scale × lint violations of the prefix).
        w_partial: partial credit, R = V1 + w_partial·V2 (V1 = 1 when every test passes, V2 = fraction passed);
            in [0, 1) so that a passing program always out-scores a failing one. 0 = V1 alone (the default).
        w_format: weight of the format term (1 when the answer has exactly one fenced python block), added to the
            return; bounded: w_format < 1 − w_partial (the smallest outcome gap between a passing and a failing
            program), so it can never reorder them. 0 disables.
        w_did: weight of the process term (the DiD gaps) in the advantage / the shaped rewards; 0 = outcome only.
        control: the control curve C_x: "start_policy" (the frozen start policy's screening rollouts on x),
            "group" (leave-one-out mean of the other rollouts of the group) or "reference" (the reference
            solution's curve, version 1's control, for the ablation).
        shaping: "potential" (Σ_j F = 0: the return is the outcome) or "bonus" (Σ_j d added: version 1's reading).
        overlong_max: dapo's soft overlong punishment (Yu et al. 2025, eq. 13): the most completion tokens, L_max;
            0 disables it. didpo, grpo and rft ignore it.
        overlong_cache: the punishment interval L_cache (tokens): the penalty grows linearly from 0 at
            L_max − L_cache to −1 at L_max (and stays −1 beyond); 0 = a hard −1 beyond L_max.

    Raises:
        ValueError: at construction, naming ``didpo.reward.<field>``.
    """

    w_syntax: float = 1.0
    w_style: float = 0.2
    w_semantic: float = 1.0
    w_task: float = 0.5
    style_scale: float = 0.1
    w_partial: float = 0.0
    w_format: float = 0.0
    w_did: float = 1.0
    control: str = "start_policy"
    shaping: str = "potential"
    overlong_max: int = 384
    overlong_cache: int = 64

    def __post_init__(self):
        if self.control not in CONTROLS:
            raise ValueError(f"didpo.reward.control must be one of {CONTROLS}, got {self.control!r}")
        if self.shaping not in SHAPINGS:
            raise ValueError(f"didpo.reward.shaping must be one of {SHAPINGS}, got {self.shaping!r}")
        for name in ("w_syntax", "w_style", "w_semantic", "w_task", "style_scale", "w_format", "w_did"):
            if getattr(self, name) < 0:
                raise ValueError(f"didpo.reward.{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.w_partial < 1:
            raise ValueError(
                f"didpo.reward.w_partial must be in [0, 1), got {self.w_partial}: with w_partial >= 1 a program "
                f"failing one test could score as much as a passing one"
            )
        if self.w_format >= 1 - self.w_partial:
            raise ValueError(
                f"didpo.reward.w_format ({self.w_format}) must be < 1 - didpo.reward.w_partial "
                f"({1 - self.w_partial:g}), the outcome gap between a passing and a failing program: a bounded term "
                f"must never reorder them"
            )
        if self.overlong_max < 0 or self.overlong_cache < 0:
            raise ValueError(
                f"didpo.reward.overlong_max and overlong_cache must be >= 0, got {self.overlong_max} and "
                f"{self.overlong_cache}"
            )
        if self.overlong_cache > self.overlong_max:
            raise ValueError(
                f"didpo.reward.overlong_cache ({self.overlong_cache}) must be <= overlong_max ({self.overlong_max})"
            )

    @property
    def weight_sum(self) -> float:
        """Σ of Φ's component weights (Φ's normaliser)."""
        return self.w_syntax + self.w_style + self.w_semantic + self.w_task


@dataclass(frozen=True)
class RLConfig:
    """The ``didpo`` section of params.yaml (the stage is ``didpo`` whatever the algorithm).

    Attributes:
        algo: "rft" (the default: the winner of the ablation of 2026-12-03 (ee2a173), docs/results/rl_ablation/),
            "didpo" (docs/DIDPO.md), "grpo" or "dapo" (the same loop, pool and budget; module docstring).
        steps: RL steps (one rollout phase + one update phase each).
        prompts_per_step: problems per step (groups in the batch), at most `MAX_PROMPTS_PER_STEP`.
        group_size: samples per problem (K), at most `MAX_GROUP_SIZE`; the batch has prompts_per_step × group_size
            rollouts, decoded together. ≥ 2 except for rft and didpo with a critic (a group's std needs two).
        max_new_tokens: the most tokens generated per sample, at most `MAX_NEW_TOKENS` (and, at stage start, what
            the model's context leaves after the longest prompt: `check_rollout_fits`; no less than the SFT
            answers' p90: `check_budget_fits_answers`; params.yaml: no less than ``evaluate.max_new_tokens``).
        temperature: sampling temperature T; log-probs are scored at T on both sides (logits / T, as TRL).
        top_p: must be 1: a truncated sampling distribution is not the one the loss scores (DIDPO.md, "Loss").
        learning_rate: AdamW learning rate of the policy's trainable weights (LoRA: 1e-4 – 2e-4, DIDPO.md).
        value_learning_rate: AdamW learning rate of the value head (didpo with a critic).
        ppo_epochs: passes over the step's rollouts.
        minibatch_size: rollouts per minibatch (one optimizer step each), per process: with N processes
            (``accelerate launch``, `models.distributed`) a minibatch is N × minibatch_size rollouts, split between
            them; prompts_per_step and group_size stay global (every process samples the whole step).
        eps_low: PPO clip range below 1: the ratio is clipped at 1 − eps_low.
        eps_high: PPO clip range above 1 (clip-higher, DAPO §3.1); grpo ignores it and uses eps_low.
        critic: didpo only: a value head + GAE instead of the group baseline (DIDPO.md, "Advantage"): per-token
            rewards w_did·F on step ends and the outcome on the last token.
        vf_coef: weight c_vf of the value loss in the total loss (critic).
        vf_clip: value clipping ε_v: the clipped prediction is V_old ± ε_v (units of reward); 0 = no clipping.
        ent_coef: weight c_ent of the entropy bonus (the loss subtracts c_ent · mean token entropy, nats).
        kl_coef: β of the KL to the start policy (adapters disabled): β·k3 added to the loss (TRL's GRPO), or
            −β·k3 in the per-token rewards with a critic. KL to the start policy is logged every step either way.
        target_kl: stop the step's PPO updates once a minibatch's approx_kl exceeds this; 0 = never.
        max_grad_norm: clip the global gradient L2 norm to this; 0 = no clipping.
        gamma: discount γ of GAE (critic).
        lam: GAE λ for the advantages (critic), and for the returns unless `lam_critic` is set.
        lam_critic: GAE λ for the value targets (returns), decoupled from the policy's λ (VAPO §3.2: 1.0);
            None = `lam`.
        adaptive_lambda_alpha: > 0 makes the policy's λ length-adaptive, λ = 1 − 1/(α·T) per sequence of T
            tokens (VAPO §3.3, α = 0.05); 0 = the fixed `lam`.
        critic_trust_ev: GAE runs with λ = 1 (Monte-Carlo returns, which a wrong critic cannot bias) until a
            step's critic explains more than this share of the return variance (`explained_variance`); from the
            next step on `lam`, `lam_critic` and `adaptive_lambda_alpha` apply (DIDPO.md v2, "Advantage").
            0 = trust the critic from the first step.
        whiten_advantages: normalise the critic's advantages to zero mean and unit std over the batch's tokens.
        normalize_rewards: divide the critic's token rewards by the running std of sequence returns (seed §4.3).
        reward_clip: clip the critic's (normalised) token rewards to [−reward_clip, reward_clip]; 0 = no clipping.
        group_eps: ε in (r − mean)/(std + ε) of the group baselines (TRL's 1e-4).
        critic_warmup_steps: the first steps train the value head only (value pretraining, VAPO §3.1).
        max_refill: dapo's dynamic sampling: extra prompt draws per step to replace groups whose accuracy is all
            0 or all 1 (each draw asks for as many prompts as groups are missing); 0 = drop without refilling.
        screen_samples: K_s, answers of the start policy per screened problem (DIDPO.md, "Prompt pool"); problems
            with 0 < passes < K_s form the training pool and their rollouts the ``start_policy`` control. 0 = no
            screen: train on every problem given (the control must then be "group" or "reference").
        screen_problems: how many train problems are screened (the first of a seeded order; 0 = all): the screen
            costs screen_samples answers of each.
        reward: the reward settings (`ProcessRewardConfig`): Φ's weights, w_partial,
            w_format, w_did, control, shaping, dapo's overlong shaping. The overlong penalty must be reachable
            within the budget when algo is dapo (the only one that reads it): its start (``overlong_max −
            overlong_cache``) < ``overlong_max`` ≤ `max_new_tokens`, or, for a hard cut (``overlong_cache`` 0),
            ``overlong_max`` < `max_new_tokens`.
        lora: train LoRA adapters (True) or every weight (False; the start policy is then a frozen copy).
        lora_r: LoRA rank.
        lora_alpha: LoRA scaling numerator (update = lora_alpha / lora_r · B A).
        lora_dropout: LoRA dropout; keep 0 for RL (dropout makes the first PPO ratio differ from 1).
        lora_target_modules: "auto" (every linear layer but the LM head) or a comma-separated list.
        lora_layers: adapters on the last N decoder layers only (0 = all; `models.lora.apply_lora`).
        seed: seeds the adapters' initialisation, the screen, the prompt order, the minibatch order and every
            step's sampling.
        checkpoint_every: write an exact-resume checkpoint every this many steps (and at the end); 0 = never.
        device: "auto" (CUDA when available, else CPU) or a torch device string.
        mixed_precision: "auto" = bf16 autocast where the device runs bf16 natively (CUDA GPUs that support it,
            CPUs with AVX512-BF16 or AMX, as SFT); "bf16"; "no" (float32).
        rollout_engine: "torch" (`models.sampling.sample`, the trainer's own weights), "openvino"
            (`models.openvino_engine`, CPU; LoRA only; no sampler log-probs, so the importance weights are 1) or
            "vllm" (`models.vllm_engine`, CUDA, an extra): the trainer's weights are synced into the engine before
            every step's rollouts, the old log-probs are recomputed by the trainer's forward, and the update is
            corrected by truncated importance weights. An engine that cannot run here falls back to torch (said).
        kl_start_rows: rows of each step's batch on which the logged KL to the start policy is estimated when
            ``kl_coef`` is 0 (a seeded draw; the start policy's forward then costs k rows instead of the batch);
            0 = every row. With ``kl_coef`` > 0 every row is scored (the objective needs it). rft (one process)
            measures it on its first minibatch's rows instead, whose current-policy log-probs its forward gives.
        keep_steps: steps after which the policy is also kept as it is (``<out>/points/step_NNNN/``: the LoRA
            adapter, or the whole model), for a budget curve from one run; each in 1 .. ``steps``.
        is_cap: C of the truncated importance weights min(exp(logπ_trainer − logπ_engine), C) (vllm rollouts;
            TRL's ``vllm_importance_sampling_cap``).

    Raises:
        ValueError: at construction, a value out of range or two that contradict each other (the message names
            ``didpo.<field>``; params.yaml's loader reports it as a `tasks.config.ConfigError`).
    """

    algo: str = "rft"
    steps: int = 6
    prompts_per_step: int = 2
    group_size: int = 8
    max_new_tokens: int = 384
    temperature: float = 1.0
    top_p: float = 1.0
    learning_rate: float = 2e-4
    value_learning_rate: float = 1e-3
    ppo_epochs: int = 1
    minibatch_size: int = 4
    eps_low: float = 0.2
    eps_high: float = 0.28
    critic: bool = False
    vf_coef: float = 0.1
    vf_clip: float = 0.0
    ent_coef: float = 0.0
    kl_coef: float = 0.0
    target_kl: float = 0.1
    max_grad_norm: float = 1.0
    gamma: float = 1.0
    lam: float = 1.0
    lam_critic: float | None = None
    adaptive_lambda_alpha: float = 0.0
    critic_trust_ev: float = 0.5
    whiten_advantages: bool = True
    normalize_rewards: bool = False
    reward_clip: float = 0.0
    group_eps: float = 1e-4
    critic_warmup_steps: int = 0
    max_refill: int = 2
    screen_samples: int = 4
    screen_problems: int = 24
    reward: ProcessRewardConfig = ProcessRewardConfig()  # frozen, hence hashable: a safe shared default
    lora: bool = True
    lora_r: int = 16
    lora_alpha: float = 32.0
    lora_dropout: float = 0.0
    lora_target_modules: str = "auto"
    lora_layers: int = 0
    seed: int = 0
    checkpoint_every: int = 1
    device: str = "auto"
    mixed_precision: str = "auto"
    rollout_engine: str = "openvino"
    is_cap: float = 2.0
    kl_start_rows: int = 4
    keep_steps: tuple[int, ...] = ()

    def __post_init__(self):
        if self.algo not in ALGOS:
            raise ValueError(f"didpo.algo must be one of {ALGOS}, got {self.algo!r}")
        for name in ("steps", "prompts_per_step", "group_size", "max_new_tokens", "ppo_epochs", "minibatch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"didpo.{name} must be >= 1, got {getattr(self, name)}")
        for name, bound in (
            ("group_size", MAX_GROUP_SIZE),
            ("prompts_per_step", MAX_PROMPTS_PER_STEP),
            ("max_new_tokens", MAX_NEW_TOKENS),
        ):
            if getattr(self, name) > bound:
                raise ValueError(f"didpo.{name} must be <= {bound}, got {getattr(self, name)}")
        overlong_max, cache = self.reward.overlong_max, self.reward.overlong_cache
        if self.algo != "dapo":
            overlong_max = 0  # only dapo reads the overlong penalty: an unread setting is not refused
        if overlong_max > self.max_new_tokens:
            raise ValueError(
                f"didpo.reward.overlong_max ({overlong_max}) must be <= didpo.max_new_tokens ({self.max_new_tokens}):"
                " no completion is longer than max_new_tokens, so the penalty would never reach -1"
            )
        if overlong_max and cache == 0 and overlong_max == self.max_new_tokens:
            raise ValueError(
                f"didpo.reward.overlong_max ({overlong_max}) with didpo.reward.overlong_cache 0 penalises only "
                f"completions longer than overlong_max, and none is longer than didpo.max_new_tokens "
                f"({self.max_new_tokens}): set overlong_cache > 0 or overlong_max < max_new_tokens"
            )
        if self.lora_r < 1:
            raise ValueError(f"didpo.lora_r must be >= 1, got {self.lora_r}")
        if self.rollout_engine not in ROLLOUT_ENGINES:
            raise ValueError(f"didpo.rollout_engine must be one of {ROLLOUT_ENGINES}, got {self.rollout_engine!r}")
        if self.rollout_engine == "openvino" and not self.lora:
            raise ValueError(
                "didpo.rollout_engine openvino loads LoRA-merged projections into the engine: it needs didpo.lora "
                "true (full fine-tuning: rollout_engine torch)"
            )
        object.__setattr__(self, "keep_steps", tuple(int(s) for s in self.keep_steps))
        outside = [s for s in self.keep_steps if not 1 <= s <= self.steps]
        if outside:
            raise ValueError(f"didpo.keep_steps must lie in 1 .. didpo.steps ({self.steps}), got {outside}")
        if self.is_cap < 1:
            raise ValueError(f"didpo.is_cap must be >= 1 (a cap below 1 shrinks on-policy tokens), got {self.is_cap}")
        if self.group_size < 2 and not (self.algo == "rft" or self.uses_critic):
            raise ValueError(f"didpo.group_size must be >= 2 for {self.algo} (a group's std needs two samples)")
        non_negative = (
            "learning_rate",
            "value_learning_rate",
            "eps_high",
            "vf_coef",
            "vf_clip",
            "ent_coef",
            "kl_coef",
            "target_kl",
            "max_grad_norm",
            "adaptive_lambda_alpha",
            "reward_clip",
            "critic_warmup_steps",
            "max_refill",
            "screen_samples",
            "screen_problems",
            "checkpoint_every",
            "lora_layers",
            "kl_start_rows",
        )
        for name in non_negative:
            if getattr(self, name) < 0:
                raise ValueError(f"didpo.{name} must be >= 0, got {getattr(self, name)}")
        if not 0 < self.eps_low < 1:
            raise ValueError(f"didpo.eps_low must be in (0, 1), got {self.eps_low}")
        if not self.temperature > 0:
            raise ValueError(f"didpo.temperature must be > 0, got {self.temperature}")
        if self.top_p != 1:
            raise ValueError(
                f"didpo.top_p must be 1 in RL, got {self.top_p}: the loss scores the untruncated distribution at "
                f"the sampling temperature, so nucleus sampling would bias the gradient"
            )
        if self.screen_samples == 1:
            raise ValueError("didpo.screen_samples must be 0 (no screen) or >= 2: 0 < passes < 1 is impossible")
        if self.algo == "didpo" and self.reward.control == "start_policy" and self.screen_samples == 0:
            raise ValueError(
                "didpo.reward.control start_policy needs the screen's rollouts: set didpo.screen_samples >= 2 or "
                "control to group or reference"
            )
        if self.algo == "didpo" and self.reward.control == "group" and self.group_size < 2:
            raise ValueError("didpo.reward.control group needs didpo.group_size >= 2 (a leave-one-out mean)")
        for name in ("gamma", "lam"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"didpo.{name} must be in [0, 1], got {getattr(self, name)}")
        if not 0 <= self.critic_trust_ev < 1:
            raise ValueError(f"didpo.critic_trust_ev must be in [0, 1), got {self.critic_trust_ev}")
        if self.lam_critic is not None and not 0 <= self.lam_critic <= 1:
            raise ValueError(f"didpo.lam_critic must be in [0, 1] or null, got {self.lam_critic}")
        if not self.group_eps > 0:
            raise ValueError(f"didpo.group_eps must be > 0, got {self.group_eps}")
        if not 0 <= self.lora_dropout < 1:
            raise ValueError(f"didpo.lora_dropout must be in [0, 1), got {self.lora_dropout}")
        if self.mixed_precision not in _MIXED_PRECISION:
            raise ValueError(f"didpo.mixed_precision must be one of {_MIXED_PRECISION}, got {self.mixed_precision!r}")

    @property
    def clip_high(self) -> float:
        """The upper clip range used: `eps_low` for grpo (symmetric), `eps_high` otherwise."""
        return self.eps_low if self.algo == "grpo" else self.eps_high

    @property
    def uses_critic(self) -> bool:
        """didpo with ``critic: true`` has a value head; every other setting is critic-free."""
        return self.algo == "didpo" and self.critic
