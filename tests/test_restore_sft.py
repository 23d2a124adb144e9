"""scripts/restore_sft.py on a tiny model: an adapter saved by the stage's export rebuilds the same merged checkpoint
(the sha256 the dpo stage requires), and a changed adapter does not."""

import importlib.util
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from models.checkpoint import checkpoint_hash
from models.lora import apply_lora
from models.policy import build_tiny_causal_lm, load_policy
from models.training import export

spec = importlib.util.spec_from_file_location("restore_sft", Path(__file__).parents[1] / "scripts/restore_sft.py")
restore_sft = importlib.util.module_from_spec(spec)
spec.loader.exec_module(restore_sft)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A base checkpoint on disk and the stage's export of a LoRA model trained on it (random nonzero B)."""
    root = tmp_path_factory.mktemp("restore")
    model, tokenizer = build_tiny_causal_lm(seed=0)
    model.save_pretrained(root / "base")
    tokenizer.save_pretrained(root / "base")
    model, tokenizer = load_policy(root / "base", dtype="float32")  # as the sft stage loads its base
    torch.manual_seed(0)
    peft_model = apply_lora(model, r=4, alpha=8.0, dropout=0.0)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.05)  # B starts at 0; a trained adapter does not
    export(peft_model, tokenizer, root / "trained", lora=True)
    return root


def test_restored_checkpoint_is_the_trained_one_bit_for_bit(trained, tmp_path):
    adapter, merged = restore_sft.restore(trained / "base", trained / "trained/adapter", tmp_path, dtype="float32")
    assert checkpoint_hash(merged) == checkpoint_hash(trained / "trained/merged")
    assert restore_sft.same_adapter_weights(adapter, trained / "trained/adapter")
    # the merge did something: the restored checkpoint is not the base model
    assert checkpoint_hash(merged) != checkpoint_hash(trained / "base")


def test_a_changed_adapter_gives_another_hash(trained, tmp_path):
    changed = tmp_path / "changed"
    shutil.copytree(trained / "trained/adapter", changed)
    tensors = load_file(changed / "adapter_model.safetensors")
    name = next(k for k in sorted(tensors) if "lora_B" in k)
    tensors[name][0, 0] += 1e-3
    save_file(tensors, changed / "adapter_model.safetensors", metadata={"format": "pt"})
    assert not restore_sft.same_adapter_weights(changed, trained / "trained/adapter")
    _, merged = restore_sft.restore(trained / "base", changed, tmp_path / "out", dtype="float32")
    assert checkpoint_hash(merged) != checkpoint_hash(trained / "trained/merged")


def test_missing_inputs_are_named(trained, tmp_path):
    with pytest.raises(FileNotFoundError, match="adapter_model.safetensors"):
        restore_sft.restore(trained / "base", tmp_path, tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="dvc repro base_model"):
        restore_sft.restore(tmp_path / "nobase", trained / "trained/adapter", tmp_path / "out")
