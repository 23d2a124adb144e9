"""Restore the sft stage's outputs from a committed adapter instead of training again (84 min on 2 AVX512-BF16 cores,
≈ 3 h on AVX2 ones).

    .venv/bin/python scripts/restore_sft.py [--adapter docs/results/sft_default/adapter]

A session that ran the default SFT commits its LoRA adapter (≈ 20 MB) under docs/results/ together with the run's
dvc.lock and data/sft/metrics.json. This script, run after `dvc repro base_model prepare validate`:

1. loads the base checkpoint and that adapter (peft ``PeftModel.from_pretrained``);
2. exports both exactly as the stage does (`models.training.export`: the adapter re-saved, then
   ``merge_and_unload`` and the merged checkpoint with the tokenizer) into data/checkpoints/sft/;
3. checks that the re-saved adapter's weights are the committed ones byte for byte and that the merged checkpoint's
   sha256 (`models.checkpoint.checkpoint_hash`) is the ``merged_sha256`` the sft stage recorded in
   data/sft/metrics.json (the one the dpo stage requires of its reference).

When both hold, the outputs are the trained ones bit for bit: `dvc status sft` reports nothing to do and `dvc repro`
continues from the gate. When the merged hash differs (the merge ``W + (α/r)·B·A`` rounded otherwise by another CPU's
kernels), it says so and exits 1; the directories are left for inspection and `dvc repro sft` trains again.

Raises (as a message and exit status 2): the base checkpoint, the adapter or the recorded hash is missing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEFAULT_ADAPTER = Path("docs/results/sft_default/adapter")


def restore(base: Path, adapter: Path, out_dir: Path, dtype: str = "auto") -> tuple[Path, Path]:
    """Export ``out_dir/adapter`` and ``out_dir/merged`` from `base` + the saved LoRA `adapter` as the sft stage does.

    Returns ``(adapter_path, merged_path)``. Raises FileNotFoundError when `base` or `adapter` is not there.
    """
    from peft import PeftModel

    from models.policy import load_policy
    from models.training import export

    if not (adapter / "adapter_model.safetensors").is_file():
        raise FileNotFoundError(f"{adapter} holds no adapter_model.safetensors")
    if not (base / "config.json").is_file():
        raise FileNotFoundError(f"{base} is not a checkpoint: run `dvc repro base_model` first")
    model, tokenizer = load_policy(base, dtype=dtype)
    model = PeftModel.from_pretrained(model, str(adapter))
    return export(model, tokenizer, out_dir, lora=True)


def same_adapter_weights(a: Path, b: Path) -> bool:
    """True when two saved adapters hold the same tensors, bit for bit (names, dtypes, shapes, bytes)."""
    from safetensors.torch import load_file

    x, y = load_file(a / "adapter_model.safetensors"), load_file(b / "adapter_model.safetensors")
    return x.keys() == y.keys() and all(
        x[k].dtype == y[k].dtype and x[k].shape == y[k].shape and bool((x[k].view(-1) == y[k].view(-1)).all())
        for k in x
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapter", type=Path, default=DEFAULT_ADAPTER, help="the committed LoRA adapter directory")
    args = parser.parse_args()

    from flows.env import setup_environment

    setup_environment(Path("."))
    from flows.paths import BASE_CHECKPOINT, SFT_CHECKPOINT, SFT_METRICS
    from models.checkpoint import checkpoint_hash
    from tasks.config import load_params

    expected = json.loads(SFT_METRICS.read_text()).get("merged_sha256") if SFT_METRICS.is_file() else None
    if not expected:
        print(f"error: {SFT_METRICS} records no merged_sha256: nothing to check the restored checkpoint against")
        return 2
    try:
        adapter_path, merged_path = restore(
            BASE_CHECKPOINT, args.adapter, SFT_CHECKPOINT, load_params("params.yaml").base_model.dtype
        )
    except FileNotFoundError as error:
        print(f"error: {error}")
        return 2
    if not same_adapter_weights(args.adapter, adapter_path):
        print(f"error: the re-saved adapter's weights differ from {args.adapter}")
        return 1
    got = checkpoint_hash(merged_path)
    if got != expected:
        print(
            f"the merged checkpoint's sha256 {got[:12]}… differs from the recorded {expected[:12]}… "
            f"({SFT_METRICS}): this CPU rounded the merge otherwise. `dvc repro sft` trains again."
        )
        return 1
    print(f"restored {SFT_CHECKPOINT}/{{adapter,merged}} from {args.adapter}: merged sha256 {got[:12]}… as recorded")
    print("`dvc status sft` should now report nothing to do; `dvc repro` continues from the gate")
    return 0


if __name__ == "__main__":
    sys.exit(main())
