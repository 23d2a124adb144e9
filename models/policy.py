"""Loading the policy (any Hugging Face causal LM) and building the tiny test model.

Device and precision: CPU in float32 by default; CUDA in bfloat16 when a GPU is present (float16 on GPUs
without bf16 support).

Threads: PyTorch runs CPU matmuls on an intra-op thread pool. `configure_threads` picks its size from
``DIDPO_NUM_THREADS`` when set, else the CPUs this process may run on (``os.sched_getaffinity``, which
respects container CPU limits set through affinity, unlike ``os.cpu_count``). On a shared machine fewer
threads can be much faster: one project note records two threads running 40x slower than one while
another process was loading, because a spinning thread waits for a core that is busy elsewhere. Set
``DIDPO_NUM_THREADS=1`` when other CPU-heavy work shares the box.
"""

from __future__ import annotations

import os
from pathlib import Path

NUM_THREADS_ENV = "DIDPO_NUM_THREADS"

# ChatML without a default system message: the tiny test tokenizer's template.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_TINY_CORPUS = [
    "def clean(items):\n    return [x.strip() for x in items if x and x.strip()]\n",
    "def add(a, b):\n    return a + b\n",
    "import re\n\ndef normalise(text):\n    if text is None:\n        return ''\n    return text.lower()\n",
    "```python\ndef dedupe(values):\n    seen = set()\n    out = []\n    for v in values:\n"
    "        if v not in seen:\n            seen.add(v)\n            out.append(v)\n    return out\n```\n",
    "Write a Python function that removes empty strings from a list.",
    "Here is the function:\n",
]


def resolve_device(device: str = "auto") -> str:
    """``"cuda"`` when `device` is "auto" and CUDA is available, ``"cpu"`` for "auto" otherwise; any other
    value (e.g. "cpu", "cuda:1") is returned unchanged."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def resolve_dtype(dtype: str, device: str):
    """The torch dtype for `dtype` ("auto", "float32", "bfloat16", "float16") on `device`.

    "auto" is float32 on CPU, bfloat16 on CUDA (float16 when the GPU has no bf16 support).

    Raises:
        ValueError: unknown dtype name.
    """
    import torch

    if dtype == "auto":
        if device.startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"unknown dtype {dtype!r}; expected auto, float32, bfloat16 or float16")
    return getattr(torch, dtype)


def default_num_threads() -> int:
    """The CPUs this process may use.

    Measured on a quiet 2-core box (SmolLM2-135M, LoRA SFT step of 8 × ~430 tokens): 2 threads ≈ 33 s, 1 thread ≈ 55 s.
    On a box where other heavy processes compete for the cores, 2 threads ran 8–23× slower than 1 (sampling): there,
    set ``DIDPO_NUM_THREADS=1``.
    """
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def configure_threads(num_threads: int | None = None) -> int:
    """Set PyTorch's intra-op CPU thread count and return it.

    Order of precedence: `num_threads`, the ``DIDPO_NUM_THREADS`` environment variable, `default_num_threads`.
    See the module docstring for why the choice matters on shared machines.

    Raises:
        ValueError: a thread count below 1, or a non-integer ``DIDPO_NUM_THREADS``.
    """
    import torch

    if num_threads is None:
        env = os.environ.get(NUM_THREADS_ENV)
        if env:
            try:
                num_threads = int(env)
            except ValueError as err:
                raise ValueError(f"{NUM_THREADS_ENV}={env!r} is not an integer") from err
        else:
            num_threads = default_num_threads()
    if num_threads < 1:
        raise ValueError(f"thread count must be >= 1, got {num_threads}")
    torch.set_num_threads(num_threads)
    return num_threads


def load_policy(name_or_path: str | Path, dtype: str = "auto", device: str = "auto", num_threads: int | None = None):
    """Load a causal LM and its tokenizer for sampling or training.

    `name_or_path` is a local checkpoint directory (e.g. the converted SmolLM2) or a hub id; hub access
    follows the usual Hugging Face settings (``HF_HUB_OFFLINE=1`` / ``TRANSFORMERS_OFFLINE=1`` make a
    missing hub id fail instead of downloading). On CPU the thread count is set by `configure_threads`.

    The tokenizer gets a pad token (its eos token) when it has none; padding side is left untouched (the
    sampler pads on the left itself). The model is returned in eval mode.

    Returns:
        ``(model, tokenizer)``: a ``PreTrainedModel`` on `device` in the resolved dtype, and its tokenizer.

    Raises:
        OSError: the directory or hub id cannot be found/loaded (from transformers).
        ValueError: unknown dtype, or a tokenizer with neither pad nor eos token.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    if device == "cpu":
        configure_threads(num_threads)
    tokenizer = AutoTokenizer.from_pretrained(str(name_or_path))
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer of {name_or_path} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(str(name_or_path), dtype=torch_dtype)
    model.to(device)
    model.eval()
    return model, tokenizer


def build_tiny_tokenizer(vocab_size: int = 384):
    """A small byte-level BPE tokenizer with ChatML special tokens, trained in-process (no files).

    Byte-level, so every string encodes and decodes losslessly. Special tokens: ``<|endoftext|>`` (id 0,
    unk), ``<|im_start|>`` (1, bos), ``<|im_end|>`` (2, eos and pad), as in SmolLM2. The chat template is
    `CHATML_TEMPLATE`. Training on a fixed corpus is deterministic, so the vocabulary is the same each call.

    Returns:
        a ``PreTrainedTokenizerFast`` with ``len(tokenizer) <= vocab_size``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_TINY_CORPUS, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
        model_max_length=2048,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def build_tiny_causal_lm(seed: int = 0):
    """A tiny random ``LlamaForCausalLM`` (hidden 32, 2 layers, 4 heads, 2 kv heads, tied embeddings, a 2048-token
    context: SmolLM2's layout in miniature) and the `build_tiny_tokenizer` tokenizer, built from a config without
    any files.

    Weights are drawn under a forked RNG seeded with `seed`, so the global torch RNG is left untouched and the
    same seed gives the same model. The model is in eval mode, float32, on CPU.

    Returns:
        ``(model, tokenizer)``.
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = build_tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,  # the generated problems' prompts run to ≈ 780 of its tokens
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    model.eval()
    return model, tokenizer
