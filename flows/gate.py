"""Stage ``gate``: RL runs only if the SFT model already "knows how" — unbiased pass@k on val above a threshold.

It also reports the external guard (never deciding): the base and SFT models each answer ``gate.external_problems``
HumanEval problems greedily; the paired change, its interval and one-sided p of "SFT is worse" are ``external`` in
data/gate/metrics.json — the in-family gate can pass while general ability falls (issue 23).

A failed gate exits non-zero with a message that names the figure, the threshold and what to do next; the MLflow run
is tagged ``gate=failed``; `didpo run` stops and no later stage runs.
"""

from __future__ import annotations

from prefect import flow

from flows.paths import BASE_CHECKPOINT, GATE, GATE_HEADLINE, GATE_METRICS, SFT_CHECKPOINT, VALID_PROBLEMS
from tasks import tracking
from tasks.config import load_params
from tasks.gate import external_change, gate_verdict
from tasks.io import headline, read_problems, write_json
from tasks.measure import (
    greedy_results,
    load_checkpoint,
    make_sampler,
    measure_split,
    resolve_engine,
)
from tasks.sandbox import make_verifier

# the DVC metric (tasks.io.headline): the SFT model's sampled pass@k on the gate's val problems, and the verdict
HEADLINE = {"val.pass@1": "pass@1", "val.pass@16": "pass@16", "gate": "passed"}


@flow(name="gate")
def run(params_path: str = "params.yaml") -> dict:
    """Sample n answers per val problem with the SFT model, verify, decide; raises GateFailed below the threshold."""
    params = load_params(params_path)
    cfg = params.gate
    merged = SFT_CHECKPOINT / "merged"
    inputs = (str(VALID_PROBLEMS), str(merged), str(BASE_CHECKPOINT))
    with tracking.stage_run("gate", params.tracking, cfg, inputs=inputs):
        problems = read_problems(VALID_PROBLEMS, "val", cfg.val_problems, required=True)
        external = read_problems(VALID_PROBLEMS, "humaneval", cfg.external_problems)
        engine = resolve_engine(cfg.engine, cfg.precision, "gate")
        with make_verifier(params.verifier) as verifier:

            def external_passes(name, model, tokenizer, sampler):
                out = GATE / f"external_{name}.jsonl"
                results = greedy_results(
                    model, tokenizer, external, cfg.max_new_tokens, cfg.seed, verifier, out, sampler
                )
                return [r.pass_at(1) for r in results]

            base_model, base_tokenizer = load_checkpoint(BASE_CHECKPOINT, params.base_model.dtype)
            base_passes = external_passes(
                "base", base_model, base_tokenizer, make_sampler(BASE_CHECKPOINT, base_tokenizer, engine)
            )
            del base_model
            model, tokenizer = load_checkpoint(merged, params.base_model.dtype)
            sampler = make_sampler(merged, tokenizer, engine)
            sft_passes = external_passes("sft", model, tokenizer, sampler)
            metrics = measure_split(
                model, tokenizer, problems, cfg, verifier, GATE, "val", greedy=False, sampler=sampler
            )
        verdict = gate_verdict(metrics, cfg)
        metrics = {**metrics, "threshold": cfg.threshold, "passed": verdict.passed, "engine": "/".join(engine)}
        if external:
            metrics["external"] = external_change(base_passes, sft_passes, seed=cfg.seed)
        write_json(metrics, GATE_METRICS)
        write_json(headline(metrics, HEADLINE), GATE_HEADLINE)
        tracking.log_artifacts(GATE, artifact_path="gate")
        flat = {f"gate/{k}": v for k, v in metrics.items() if isinstance(v, int | float)}
        flat |= {f"gate/external/{k}": v for k, v in metrics.get("external", {}).items() if isinstance(v, int | float)}
        tracking.mlflow_emit(flat, step=0)
        tracking.set_tags({"gate": "passed" if verdict.passed else "failed"})
        verdict.raise_if_failed()
    return metrics
