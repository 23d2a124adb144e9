"""Stage ``selfplay``: the SFT model answers training prompts K times; best vs worst answers become preference pairs,
merged with the mined (and human) pairs into data/selfplay/pairs.jsonl, each pair tagged with its source.

Runs after the gate (it depends on data/gate/metrics.json, so a failed gate blocks it).
"""

from __future__ import annotations

from collections import Counter

from prefect import flow, get_run_logger

from flows.paths import (
    MINED_PAIRS,
    SELFPLAY_HEADLINE,
    SELFPLAY_METRICS,
    SELFPLAY_PAIRS,
    SFT_CHECKPOINT,
    VALID_PAIRS,
    VALID_PROBLEMS,
)
from tasks import tracking
from tasks.config import load_params
from tasks.io import headline, read_problems, write_json
from tasks.measure import load_checkpoint
from tasks.sandbox import make_verifier
from tasks.selfplay import (
    generate_selfplay_pairs,
    merge_sources,
    no_selfplay_pairs_warning,
    read_pairs,
    write_pairs,
)

HEADLINE = {"pairs": "n_pairs"}  # the DVC metric (tasks.io.headline): the training pairs DPO gets, every source


@flow(name="selfplay")
def run(params_path: str = "params.yaml") -> dict:
    """Sample, verify, pair, merge; writes the pairs and data/selfplay/metrics.json (counts per source)."""
    params = load_params(params_path)
    cfg = params.selfplay
    merged = SFT_CHECKPOINT / "merged"
    inputs = (str(VALID_PROBLEMS), str(merged), str(MINED_PAIRS))
    with tracking.stage_run("selfplay", params.tracking, cfg, inputs=inputs):
        model, tokenizer = load_checkpoint(merged, params.base_model.dtype)
        problems = read_problems(VALID_PROBLEMS, "train", cfg.n_prompts, required=True)
        with make_verifier(params.verifier) as verifier:
            selfplay, stats = generate_selfplay_pairs(model, tokenizer, problems, cfg, verifier)
        mined = read_pairs(MINED_PAIRS) if cfg.include_mined else []
        human = read_pairs(VALID_PAIRS) if cfg.include_human else []
        pairs = merge_sources(selfplay, mined, human)
        counts = Counter(p["source"] for p in pairs)
        metrics = {
            **stats,
            "n_pairs": len(pairs),
            **{f"n_{s}_pairs_kept": counts.get(s, 0) for s in ("human", "mined", "selfplay")},
        }
        write_pairs(pairs, SELFPLAY_PAIRS)
        write_json(metrics, SELFPLAY_METRICS)
        write_json(headline(metrics, HEADLINE), SELFPLAY_HEADLINE)
        tracking.log_artifacts(SELFPLAY_METRICS, artifact_path="selfplay")
        tracking.mlflow_emit({f"selfplay/{k}": v for k, v in metrics.items()}, step=0)
        warning = no_selfplay_pairs_warning(stats, cfg, len(pairs))
        if warning:
            get_run_logger().warning(f"{warning} (counts: {SELFPLAY_METRICS})")
    return metrics
