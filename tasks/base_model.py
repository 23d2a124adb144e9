"""The ``base_model`` stage's work: materialise the starting checkpoint as a plain safetensors folder."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from tasks.config import EMBEDDED_MODEL, BaseModelConfig


@task
def materialise_base(cfg: BaseModelConfig, out_dir: Path) -> dict:
    """Write the base checkpoint (weights + tokenizer with a chat template) to ``out_dir``; returns facts about it."""
    if cfg.name_or_path == EMBEDDED_MODEL:
        from models.base_model import convert_embedded

        dtype = "float32" if cfg.dtype == "auto" else cfg.dtype
        return {"source": EMBEDDED_MODEL, **convert_embedded(out_dir, dtype=dtype)}
    from models.policy import load_policy

    model, tokenizer = load_policy(cfg.name_or_path, dtype=cfg.dtype, device="cpu")
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    n_params = sum(p.numel() for p in model.parameters())
    return {"source": cfg.name_or_path, "n_params": n_params}
