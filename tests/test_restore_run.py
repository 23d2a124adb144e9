"""scripts/restore_run.py on a tiny model: an adapter saved by the stages' export rebuilds the very merged checkpoint
(bit for bit: the sha256 the dpo stage requires, the md5 DVC recorded), and a changed adapter does not; save and
restore mirror a stage's cached outputs (dvc.yaml's, merged checkpoints as their adapter)."""

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from models.checkpoint import checkpoint_hash
from models.lora import apply_lora
from models.policy import build_tiny_causal_lm, load_policy
from models.training import export

ROOT = Path(__file__).parents[1]
spec = importlib.util.spec_from_file_location("restore_run", ROOT / "scripts/restore_run.py")
restore_run = importlib.util.module_from_spec(spec)
spec.loader.exec_module(restore_run)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A start checkpoint on disk and the stages' export of a LoRA model trained on it (random nonzero B)."""
    root = tmp_path_factory.mktemp("restore")
    model, tokenizer = build_tiny_causal_lm(seed=0)
    model.save_pretrained(root / "base")
    tokenizer.save_pretrained(root / "base")
    model, tokenizer = load_policy(root / "base", dtype="float32")  # as a stage loads its start checkpoint
    torch.manual_seed(0)
    peft_model = apply_lora(model, r=4, alpha=8.0, dropout=0.0)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.05)  # B starts at 0; a trained adapter does not
    export(peft_model, tokenizer, root / "trained", lora=True)
    return root


def test_rebuilt_merged_checkpoint_is_the_trained_one_bit_for_bit(trained, tmp_path):
    merged = restore_run.rebuild_merged(trained / "base", trained / "trained/adapter", tmp_path / "merged", "float32")
    assert checkpoint_hash(merged) == checkpoint_hash(trained / "trained/merged")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):  # what DVC's md5 covers besides weights
        assert (merged / name).read_bytes() == (trained / "trained/merged" / name).read_bytes()
    assert checkpoint_hash(merged) != checkpoint_hash(trained / "base")  # the merge did something
    # an existing directory is replaced, and no temporary directory is left beside it
    restore_run.rebuild_merged(trained / "base", trained / "trained/adapter", merged, "float32")
    assert checkpoint_hash(merged) == checkpoint_hash(trained / "trained/merged")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged"]


def test_a_changed_adapter_gives_another_checkpoint(trained, tmp_path):
    changed = tmp_path / "changed"
    shutil.copytree(trained / "trained/adapter", changed)
    tensors = load_file(changed / "adapter_model.safetensors")
    name = next(k for k in sorted(tensors) if "lora_B" in k)
    tensors[name][0, 0] += 1e-3
    save_file(tensors, changed / "adapter_model.safetensors", metadata={"format": "pt"})
    merged = restore_run.rebuild_merged(trained / "base", changed, tmp_path / "merged", "float32")
    assert checkpoint_hash(merged) != checkpoint_hash(trained / "trained/merged")


def test_missing_inputs_are_named(trained, tmp_path):
    with pytest.raises(FileNotFoundError, match="adapter_model.safetensors"):
        restore_run.rebuild_merged(trained / "base", tmp_path, tmp_path / "merged")
    with pytest.raises(FileNotFoundError, match="not a checkpoint"):
        restore_run.rebuild_merged(tmp_path / "nobase", trained / "trained/adapter", tmp_path / "merged")


def test_cached_outputs_are_dvc_yamls(monkeypatch):
    assert restore_run.cached_outputs("sft", ROOT / "dvc.yaml") == [
        Path("data/checkpoints/sft/adapter"),
        Path("data/checkpoints/sft/merged"),
    ]
    gate = restore_run.cached_outputs("gate", ROOT / "dvc.yaml")
    assert Path("data/gate/val_samples.jsonl") in gate and Path("data/gate/metrics.json") not in gate  # cache: false
    with pytest.raises(KeyError):
        restore_run.cached_outputs("nosuchstage", ROOT / "dvc.yaml")


def test_save_then_restore_mirrors_the_outputs(tmp_path, monkeypatch):
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  s:\n    cmd: x\n    outs:\n      - data/s/rows.jsonl\n      - data/s/report.json:\n"
        "          cache: false\n      - data/s/dir\n"
    )
    monkeypatch.chdir(tmp_path)
    Path("data/s/dir").mkdir(parents=True)
    Path("data/s/rows.jsonl").write_text('{"a": 1}\n')
    Path("data/s/report.json").write_text("{}")
    Path("data/s/dir/f.txt").write_text("x")
    timings = Path(".cache/stage_seconds.json")
    restore_run.save(["s"], Path("snap"), timings)  # no timings here yet: none saved
    assert sorted(str(p) for p in Path("snap").rglob("*") if p.is_file()) == [
        "snap/data/s/dir/f.txt",
        "snap/data/s/rows.jsonl",
    ]
    timings.parent.mkdir()
    timings.write_text('{"s": 12.5, "t": 3.0}')
    restore_run.save(["s"], Path("snap"), timings)
    timings.write_text('{"s": 20.0}')  # this clone ran s itself: its own figure stays, t comes from the snapshot
    assert restore_run.restore_timings(Path("snap"), timings) == ["t"]
    assert json.loads(timings.read_text()) == {"s": 20.0, "t": 3.0}
    Path("snap/stage_seconds.json").unlink()
    shutil.rmtree("data")
    restore_run.restore(["s"], Path("snap"))
    assert Path("data/s/rows.jsonl").read_text() == '{"a": 1}\n' and Path("data/s/dir/f.txt").read_text() == "x"
    shutil.rmtree("snap/data/s/dir")
    with pytest.raises(FileNotFoundError, match="was not saved"):
        restore_run.restore(["s"], Path("snap"))


def test_only_outputs_missing_from_the_cache_are_accepted():
    missing = {"sft": [{"changed outs": {"data/checkpoints/sft/merged": "not in cache"}}]}
    assert restore_run.only_not_in_cache(missing)
    modified = {"sft": [{"changed outs": {"data/checkpoints/sft/merged": "modified"}}]}
    assert not restore_run.only_not_in_cache(modified)
    deps = {"sft": [{"changed deps": {"models/sft.py": "modified"}}, {"changed outs": {"a": "not in cache"}}]}
    assert not restore_run.only_not_in_cache(deps)
    assert not restore_run.only_not_in_cache({"sft": ["changed checksum"]})


def test_git_tracked_outputs_an_interrupted_run_deleted_are_checked_out(tmp_path, monkeypatch):
    """DVC deletes a stage's outputs before running it: after a Ctrl-C'd SFT its committed metrics, history and plots
    are gone from the working tree, and restore brings back the committed ones (issue 19's re-trial)."""
    assert restore_run.git_outputs("sft", ROOT / "dvc.yaml") == [
        Path("data/sft/history.json"),
        Path("data/sft/plots"),
        Path("data/sft/metrics.json"),
        Path("data/sft/headline.json"),
    ]
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  s:\n    cmd: x\n    outs:\n      - data/s/rows.jsonl\n"
        "      - data/s/plots:\n          cache: false\n"
        "      - data/s/history.json:\n          cache: false\n      - data/s/new.json:\n          cache: false\n"
        "    metrics:\n      - data/s/headline.json:\n          cache: false\n"
    )
    monkeypatch.chdir(tmp_path)
    Path("data/s/plots").mkdir(parents=True)
    Path("data/s/plots/loss.json").write_text("[1, 2]")
    Path("data/s/history.json").write_text('{"loss": [1.0]}')
    Path("data/s/headline.json").write_text('{"eval_loss": 0.5}')
    git = ["git", "-c", "user.email=t@example.invalid", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q"], check=True)
    subprocess.run([*git, "add", "dvc.yaml", "data"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "run"], check=True)
    outputs = restore_run.git_outputs("s")
    names = ("data/s/plots", "data/s/history.json", "data/s/new.json", "data/s/headline.json")
    assert outputs == [Path(p) for p in names]
    assert restore_run.restore_from_git(outputs) == []  # nothing to do on a clean tree
    shutil.rmtree("data/s/plots")
    Path("data/s/history.json").unlink()
    Path("data/s/headline.json").write_text('{"eval_loss": 9.9}')  # a partial re-run's figure
    Path("data/s/new.json").write_text("{}")  # never committed: left as it is
    restored = restore_run.restore_from_git(outputs)
    assert restored == [Path("data/s/plots"), Path("data/s/history.json"), Path("data/s/headline.json")]
    assert Path("data/s/plots/loss.json").read_text() == "[1, 2]"
    assert Path("data/s/history.json").read_text() == '{"loss": [1.0]}'
    assert Path("data/s/headline.json").read_text() == '{"eval_loss": 0.5}'
    assert Path("data/s/new.json").read_text() == "{}"


def test_rl_budget_record_only_accepts_only_this_adapters_fresh_evaluation(trained, tmp_path, monkeypatch):
    """`scripts/rl_budget.py point ARM STEP --record-only` records an evaluation already made only when the RL
    checkpoint it measured is the start merged with this adapter (rebuilt and compared) and the evaluation is newer."""
    import os

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location("rl_budget", ROOT / "scripts/rl_budget.py")
    rl_budget = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rl_budget)
    merged, evaluate = tmp_path / "didpo/merged", tmp_path / "evaluate"
    shutil.copytree(trained / "trained/merged", merged)
    evaluate.mkdir()
    (evaluate / "rl_claim.json").write_text("{}")
    adapter = trained / "trained/adapter"
    assert rl_budget.evaluated_elsewhere(trained / "base", adapter, merged, evaluate) is None
    assert sorted(p.name for p in merged.parent.iterdir()) == ["merged"]  # the scratch rebuild is gone
    changed = tmp_path / "changed"
    shutil.copytree(adapter, changed)
    tensors = load_file(changed / "adapter_model.safetensors")
    tensors[next(k for k in sorted(tensors) if "lora_B" in k)][0, 0] += 1e-3
    save_file(tensors, changed / "adapter_model.safetensors", metadata={"format": "pt"})
    assert "is not" in rl_budget.evaluated_elsewhere(trained / "base", changed, merged, evaluate)
    weights = (merged / "model.safetensors").stat().st_mtime
    os.utime(evaluate / "rl_claim.json", (weights - 60, weights - 60))
    assert "is older than" in rl_budget.evaluated_elsewhere(trained / "base", adapter, merged, evaluate)
    (evaluate / "rl_claim.json").unlink()
    assert "no evaluation" in rl_budget.evaluated_elsewhere(trained / "base", adapter, merged, evaluate)
