"""LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models") through peft.

Target modules: ``"auto"`` is peft's ``"all-linear"`` shorthand, i.e. every ``nn.Linear``/``Conv1D`` layer of
the model except its output embedding (the LM head). For Llama-like models (SmolLM2, Llama, Mistral, Qwen2)
that is all attention and MLP projections: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; for
GPT-2 it is c_attn, c_proj, c_fc. QLoRA (Dettmers et al. 2023, sec. 4) found adapting all linear layers needed
to match full fine-tuning. Anything else is a comma-separated list of module-name suffixes, passed to peft
as is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from peft import PeftModel


def parse_target_modules(spec: str) -> str | list[str]:
    """peft's ``target_modules`` for a config string: ``"auto"`` → ``"all-linear"``, ``"q_proj, v_proj"`` →
    ``["q_proj", "v_proj"]``.

    Raises:
        ValueError: an empty spec.
    """
    spec = spec.strip()
    if spec == "auto":
        return "all-linear"
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise ValueError("lora target modules must be 'auto' or a comma-separated list of module names")
    return names


def apply_lora(model: torch.nn.Module, r: int, alpha: float, dropout: float, target_modules: str = "auto") -> PeftModel:
    """Wrap a causal LM with fresh LoRA adapters; only the adapter weights require grad afterwards.

    The adapters are initialised the peft way (A Kaiming-uniform from torch's global RNG, B zero), so the
    wrapped model computes exactly what the base model does until the first update; seed torch first for
    reproducible A. Adapter weights are kept in float32 even when the base is in bf16/fp16 (peft's
    ``autocast_adapter_dtype``).

    Args:
        model: a ``PreTrainedModel`` (modified in place: its targeted layers become LoRA layers).
        r: adapter rank.
        alpha: scaling numerator; the update is ``(alpha / r) · B A``.
        dropout: dropout on the adapter input during training.
        target_modules: see the module docstring.

    Returns:
        the ``PeftModelForCausalLM``.

    Raises:
        ValueError: none of the named modules exists in the model (from peft), or an empty spec.
    """
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=parse_target_modules(target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def targeted_module_names(peft_model: PeftModel) -> list[str]:
    """The leaf names of the layers that carry adapters, sorted (e.g. ``["down_proj", ..., "v_proj"]``)."""
    from peft.tuners.lora import LoraLayer

    return sorted({name.rsplit(".", 1)[-1] for name, m in peft_model.named_modules() if isinstance(m, LoraLayer)})


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """``(trainable, total)`` parameter counts (tied weights counted once)."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return trainable, total
