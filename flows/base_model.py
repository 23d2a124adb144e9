"""Stage ``base_model``: the starting checkpoint as a DVC-tracked safetensors folder (data/checkpoints/base).

The embedded default dequantises SmolLM2-135M-Instruct's GGUF once; any other ``base_model.name_or_path`` (a local
Hugging Face directory or a hub id) is loaded and saved as is, so every later stage reads one versioned checkpoint.
"""

from __future__ import annotations

from prefect import flow

from flows.paths import BASE_CHECKPOINT, BASE_REPORT
from tasks import tracking
from tasks.base_model import materialise_base
from tasks.config import load_params


@flow(name="base_model")
def run(params_path: str = "params.yaml") -> dict:
    """Materialise the base checkpoint and record where it came from."""
    params = load_params(params_path)
    with tracking.stage_run("base_model", params.tracking, params.base_model):
        facts = materialise_base(params.base_model, BASE_CHECKPOINT, BASE_REPORT)
        tracking.log_artifacts(BASE_REPORT)
    return facts
