"""Generation through vLLM on CUDA, behind the contract of `models.sampling.sample`, for RL rollouts and evaluation.

vLLM is an extra (``pip install -e '.[vllm]'`` on a CUDA machine), never a core dependency: its builds pin their own
torch and transformers. :func:`engine_available` says why it cannot run here (not installed, no CUDA), and callers
keep the torch sampler.

One `VLLMSampler` holds an in-process ``vllm.LLM`` (colocated with the trainer, as TRL's ``vllm_mode="colocate"``):

- ``sample(prompts, config)`` answers each chat-rendered prompt ``config.n`` times (one request per prompt, seeded
  from ``(config.seed, prompt index)``) and returns `models.sampling.Completion` rows: text, code, prompt ids,
  completion ids (with the final eos), the sampled tokens' log-probs and the finish reason. The log-probs are
  vLLM's *processed* ones (``logprobs_mode="processed_logprobs"``: after temperature scaling, as our sampler's
  log softmax(logits / T)), so RL can compare them with the trainer's forward at the same T.
- ``load_weights(model)`` syncs the trainer's current weights into the engine before a step's rollouts: with LoRA
  the adapters are merged into a copy of each targeted weight (W + scale·B·A, peft's own merge), the names are
  those of the base model, and vLLM's ``model.load_weights`` takes them; the prefix cache is reset (its KV entries
  were computed by the previous weights).

The engine's numerics differ from the trainer's (other kernels, bf16), so its log-probs are not the trainer's: the
RL loop recomputes the old log-probs with the trainer's forward and corrects the update with the truncated
importance weight min(exp(logπ_trainer − logπ_vllm), C) per token (`models.rl_losses.grpo_loss`'s ``is_weights``;
TRL's ``vllm_importance_sampling_correction``, verl's rollout TIS; Yao et al. 2025, "Your Efficient RL Framework
Secretly Brings You Off-Policy RL Training").

Sources: vLLM's offline inference API (``LLM``, ``SamplingParams``, ``TokensPrompt``, ``RequestOutput``), TRL's
``GRPOTrainer._move_model_to_vllm`` (colocate mode: merge, clean the peft names, ``load_weights``,
``reset_prefix_cache``).
"""

from __future__ import annotations

from collections.abc import Sequence

from models.lora import merged_weights
from models.sampling import Completion, SamplingConfig, code_block_closed, extract_code

STOP_FENCE = "\n```\n"


class EngineUnavailable(RuntimeError):
    """vLLM or a CUDA device is missing; the message says which."""


def engine_available() -> str | None:
    """None when vLLM can run here, else the reason (for a one-time log line)."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        return "vllm is not installed (pip install -e '.[vllm]' on a CUDA machine)"
    import torch

    if not torch.cuda.is_available():
        return "vllm needs a CUDA device and none is visible"
    return None


class VLLMSampler:
    """Answers prompts with vLLM: ``sample(prompts, config)`` as `models.sampling.sample`.

    Args:
        model_dir: a Hugging Face checkpoint folder (the architecture and starting weights).
        tokenizer: its tokenizer (prompt ids in, text out, eos).
        dtype: the engine's dtype ("bfloat16" on GPUs; "float32" to compare with the trainer).
        gpu_memory_utilization: the share of the GPU vLLM may take (the trainer is colocated).
        seed: the engine's seed.
        max_model_len: the context it must hold (prompt + answer), or None (the model's).
    Raises:
        EngineUnavailable: vLLM or CUDA is missing.
    """

    def __init__(
        self,
        model_dir,
        tokenizer,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.3,
        seed: int = 0,
        max_model_len: int | None = None,
    ):
        reason = engine_available()
        if reason:
            raise EngineUnavailable(reason)
        import vllm

        self.llm = vllm.LLM(
            model=str(model_dir),
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            seed=seed,
            max_model_len=max_model_len,
            enable_prefix_caching=True,
            logprobs_mode="processed_logprobs",
        )
        self.tokenizer = tokenizer
        self.eos_ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()

    def load_weights(self, model) -> int:
        """Sync `model`'s current weights into the engine (see the module docstring); returns how many tensors.

        The loaded model is reached as TRL's colocate mode does (``llm_engine.model_executor.driver_worker``)."""
        weights = list(merged_weights(model))
        runner = self.llm.llm_engine.model_executor.driver_worker.worker.model_runner
        runner.model.load_weights(weights)
        self.llm.reset_prefix_cache()
        return len(weights)

    def _params(self, config: SamplingConfig, seed: int):
        import vllm

        greedy = config.temperature == 0
        return vllm.SamplingParams(
            n=1 if greedy else config.n,
            temperature=0.0 if greedy else config.temperature,
            top_p=1.0 if greedy else config.top_p,
            max_tokens=config.max_new_tokens,
            seed=seed,
            stop=[*config.stop, *([STOP_FENCE] if config.stop_on_code_block else [])],
            include_stop_str_in_output=True,
            logprobs=0,  # the sampled token's log-prob only
        )

    def sample(self, prompts: Sequence[str], config: SamplingConfig, progress: bool = True) -> list[list[Completion]]:
        """``config.n`` answers for each chat-rendered prompt (``completions[i][j]``, as `models.sampling.sample`);
        greedy (temperature 0) answers once and repeats it ``n`` times.

        Raises:
            ValueError: an empty prompt.
        """
        import numpy as np
        from vllm.inputs import TokensPrompt

        prompt_ids = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        if any(not ids for ids in prompt_ids):
            raise ValueError("empty prompt")
        seeds = [
            int(np.random.SeedSequence([config.seed, i]).generate_state(1, np.uint32)[0]) for i in range(len(prompts))
        ]
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids],
            [self._params(config, s) for s in seeds],
            use_tqdm=progress,
        )
        results = []
        for ids, output in zip(prompt_ids, outputs, strict=True):
            answers = [self._completion(ids, o, config) for o in output.outputs]
            results.append(answers * config.n if config.temperature == 0 else answers)
        return results

    def _completion(self, prompt_ids: list[int], output, config: SamplingConfig) -> Completion:
        tokens = list(output.token_ids)
        logps = [float(step[token].logprob) for token, step in zip(tokens, output.logprobs or [], strict=False)]
        if len(logps) != len(tokens):
            raise RuntimeError(f"vllm returned {len(logps)} log-probs for {len(tokens)} tokens")
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        if tokens and tokens[-1] in self.eos_ids:
            reason = "eos"
        elif output.finish_reason == "stop" or (config.stop_on_code_block and code_block_closed(text)):
            reason = "stop"
        else:
            reason = "length"
        return Completion(text, extract_code(text), list(prompt_ids), tokens, logps, reason)
