"""The ``didpo`` stage's work: load the DPO checkpoint, run RL (models.rl), summarise; MLflow receives every step."""

from __future__ import annotations

import shutil
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from models.config import RLConfig
from models.distributed import is_main_process
from models.openvino_engine import OpenVINOSampler, export
from models.policy import load_policy
from models.rl import EmptyPoolError, check_budget_fits_answers, train_rl
from models.training import resume_or_start_over
from models.vllm_engine import VLLMSampler
from tasks.config import InputError, Params
from tasks.io import headline, read_problems, write_history, write_json
from tasks.measure import resolve_engine
from tasks.sandbox import make_verifier
from tasks.tracking import mlflow_emit

# the DVC metric (tasks.io.headline): the last step's rollout pass rate and KL to the start policy
HEADLINE = {"algo": "algo", "step": "global_step", "pass_rate": "pass_rate/last", "kl_start": "kl_start/last"}

# Screens of the start policy by their key (`models.rl.pool_cache_key`): RL arms from the same start weights and
# problems (an ablation, a budget curve) screen once.
POOL_CACHE = Path(".cache/rl_pool")


def copy_file(source: Path, target: Path) -> None:
    """Copy `source` to `target` atomically (a temporary sibling, then a rename), creating parent folders."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    shutil.copyfile(source, tmp)
    tmp.replace(target)


def summarise_history(history: list[dict], algo: str, global_step: int) -> dict:
    """The stage's metrics (data/didpo/metrics.json): the algorithm, steps done, and for each logged ``didpo/…``
    series its first and last value and its mean over the run (keys ``<name>/first``, ``/last``, ``/mean``,
    without the ``didpo/`` prefix)."""
    series: dict[str, list[float]] = {}
    for record in history:
        for key, value in record.items():
            if key.startswith("didpo/"):
                series.setdefault(key.removeprefix("didpo/"), []).append(float(value))
    out: dict = {"algo": algo, "global_step": global_step}
    for name, values in sorted(series.items()):
        out[f"{name}/first"] = values[0]
        out[f"{name}/last"] = values[-1]
        out[f"{name}/mean"] = sum(values) / len(values)
    return out


def rollout_engine(cfg: RLConfig, policy: Path, tokenizer):
    """The engine RL samples its rollouts with (``didpo.rollout_engine``), started from the `policy` checkpoint:
    an `models.openvino_engine.OpenVINOSampler` (fp32, the checkpoint exported once) or a
    `models.vllm_engine.VLLMSampler`; None for the torch sampler, or when the engine cannot run here (said once,
    `tasks.measure.resolve_engine`)."""
    if cfg.rollout_engine == "torch" or resolve_engine(cfg.rollout_engine, "f32", "didpo")[0] == "torch":
        return None
    if cfg.rollout_engine == "vllm":
        return VLLMSampler(policy, tokenizer, seed=cfg.seed)
    import torch

    ir = export(Path(policy), Path(".cache/openvino"))
    return OpenVINOSampler(ir, tokenizer, precision="f32", threads=torch.get_num_threads())


@task(cache_policy=NO_CACHE)
def run_didpo(
    policy: Path, dtype: str, problems: list[dict], cfg: RLConfig, verifier, out: Path, rollouts: Path, pool: Path
) -> tuple[dict, list[dict]]:
    """Train and export; returns ``(metrics, history)`` where history holds every emitted record (for plots).

    ``didpo.rollout_engine`` openvino or vllm samples the rollouts with that engine (`rollout_engine`), its weights
    synced from the policy before every step. Refuses a token budget below the SFT answers' p90 length on these problems
    before anything runs (`models.rl.check_budget_fits_answers`). The screened prompt pool
    (`models.rl.screen_prompt_pool`) is copied to `pool` (a DVC out); its summary (screened, pool_size, pass
    rates) joins the metrics.

    An empty pool (no screened problem is informative) raises `tasks.config.InputError` with the screen's message.

    A leftover resume checkpoint written with another config or other problems is discarded (a new run); a
    checkpoint of this very run is resumed. The loop appends its rollouts beside its checkpoints (``out``), which DVC
    leaves alone, so a resumed run keeps the rollouts of the steps before the crash; the finished file is then
    copied to `rollouts` (the DVC out, which DVC deletes before it re-runs the stage).
    """
    engines: list = []  # built once (a resumed attempt that starts over reuses it)

    def attempt(resume: bool):
        model, tokenizer = load_policy(policy, dtype=dtype)
        check_budget_fits_answers(tokenizer, problems, cfg)
        if not engines:
            engines.append(rollout_engine(cfg, policy, tokenizer))
        engine = engines[0]
        return train_rl(
            model, tokenizer, problems, cfg, verifier, out, mlflow_emit, resume, engine=engine, pool_cache=POOL_CACHE
        )

    try:
        result = resume_or_start_over(attempt)
    except EmptyPoolError as exc:  # its message names the key to raise: the stage stops with it as one line
        raise InputError(f"the RL prompt pool is empty: {exc}") from None
    if not is_main_process():  # a rank > 0 under `accelerate launch`: rank 0 writes the outputs
        return {}, result.history
    copy_file(result.rollouts_path, rollouts)
    metrics = summarise_history(result.history, cfg.algo, result.global_step)
    metrics["trainable_params"] = result.trainable_params
    if result.pool is not None:
        copy_file(result.pool_path, pool)
        metrics.update({f"pool/{k}": v for k, v in result.pool.summary().items()})
    else:
        Path(pool).parent.mkdir(parents=True, exist_ok=True)
        Path(pool).write_text("{}\n")  # no screen (didpo.screen_samples 0): an empty pool file keeps the DVC out
    return metrics, result.history


def rl(
    params: Params,
    policy: Path,
    problems_path: Path,
    out: Path,
    rollouts_out: Path,
    pool_out: Path,
    metrics_out: Path,
    headline_out: Path,
    history_out: Path,
) -> dict:
    """The stage's work (rank 0): RL (``didpo.algo``) from `policy` (the DPO export) on `problems_path`'s train split,
    exported to `out`, rollouts to `rollouts_out`, the pool to `pool_out`; the metrics to `metrics_out`, their headline
    to `headline_out`, the per-step curves to `history_out`. Returns the metrics.

    Raises:
        FileNotFoundError: `policy` holds no checkpoint (the dpo stage has not run).
    """
    if not (policy / "config.json").is_file():
        raise FileNotFoundError(f"{policy} holds no checkpoint: run the dpo stage first (`didpo stage dpo`)")
    problems = read_problems(problems_path, "train", required=True)
    with make_verifier(params.verifier) as verifier:
        metrics, history = run_didpo(
            policy, params.base_model.dtype, problems, params.didpo, verifier, out, rollouts_out, pool_out
        )
    write_json(metrics, metrics_out)
    write_json(headline(metrics, HEADLINE), headline_out)
    write_history(history, history_out)
    return metrics


def rl_worker(params: Params, policy: Path, problems_path: Path, out: Path, rollouts_out: Path, pool_out: Path) -> None:
    """A rank > 0 under ``accelerate launch``: the training alone (rank 0 runs `rl`); its verifier checks its share of
    every step's programs."""
    problems = read_problems(problems_path, "train")
    with make_verifier(params.verifier) as verifier:
        run_didpo.fn(policy, params.base_model.dtype, problems, params.didpo, verifier, out, rollouts_out, pool_out)
