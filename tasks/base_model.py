"""The ``base_model`` stage's work: materialise the starting checkpoint as a plain safetensors folder."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from models.base_model import convert_embedded
from models.policy import load_policy
from tasks.config import EMBEDDED_MODEL, BaseModelConfig
from tasks.io import write_json


@task
def materialise_base(cfg: BaseModelConfig, out_dir: Path, report_path: Path) -> dict:
    """Write the base checkpoint (weights + tokenizer with a chat template) to ``out_dir`` and facts about it (source,
    parameters) to `report_path`; returns the facts."""
    if cfg.name_or_path == EMBEDDED_MODEL:
        dtype = "float32" if cfg.dtype == "auto" else cfg.dtype
        facts = {"source": EMBEDDED_MODEL, **convert_embedded(out_dir, dtype=dtype)}
    else:
        model, tokenizer = load_policy(cfg.name_or_path, dtype=cfg.dtype, device="cpu")
        out_dir.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
        facts = {"source": cfg.name_or_path, "n_params": sum(p.numel() for p in model.parameters())}
    write_json(facts, report_path)
    return facts
