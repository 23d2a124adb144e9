"""The RL update of one step, previous path against the current one, on SmolLM2-135M with the same rollouts, and how
close each runs to this machine's own matmul peak.

What is timed is the update phase of one RL step (everything after the rollouts are verified and before the next
step's sampling): the no-gradient passes, the advantages and the PPO/NLL minibatches with their optimizer steps.

- **previous**: `models/didpo.py` as of git ``PREVIOUS_COMMIT`` (b3e0729, 2026-12-05), imported from ``git show``,
  driven by the update block of its ``train_didpo`` (`previous_update`, copied from that commit): every row its own
  prompt + completion sequence, the current policy's and the start policy's forward on every row (rft included),
  every row in the minibatches, float32 (its ``mixed_precision: auto`` left CPUs in float32);
- **current**: `models.rl.update_policy`, what ``train_rl`` runs: each prompt once per forward (its cache
  shared by the answers), identical rows merged with their multiplicity, zero-advantage rows out of the forward, rft
  without the old-log-prob pass, the start policy on ``kl_start_rows`` rows, bf16 autocast where the CPU runs bf16
  natively (``mixed_precision: auto``).

Same work: the same model (the embedded SmolLM2-135M-Instruct converted to safetensors, LoRA as params.yaml's
``didpo``: r 16, alpha 32, every linear layer but the LM head), the same rollouts (one step of the committed
default run, docs/results/default_run/data/didpo/rollouts.jsonl: its 2 groups × 8 answers, re-tokenised; prompts
rendered from the generated problems by task id), the same config (params.yaml's ``didpo`` section, ``--algo`` to
override), the same minibatch order (the generator seeded alike), and before each timed run the same adapters and a
fresh AdamW. Before timing, ``CHECK same_work`` compares the loss of the first minibatch: previous (float32) vs
current in float32 within 1e-4 relative, and current in bf16 within `BF16_RTOL` of float32 (bf16 keeps 8 mantissa
bits). Then each side runs `--repeats` times, alternating who goes first.

Peak: the same run measures float32 and bf16 GEMM throughput (`matmul_peak`: square matrices, best of 10, once before
and once after the timed runs, the larger kept) and
counts each side's floating-point operations once (``torch.utils.flop_counter.FlopCounterMode``: matmuls and
attention, forward and backward), so each side prints its achieved GFLOP/s and its share of the peak of the dtype it
runs in. ``--stages`` adds one SFT step and one DPO step (`models.sft` / `models.dpo` losses on the same answers) for
README's table of how close each training stage runs to the hardware.

Last line: ``RESULT rollouts_per_s=<current> previous=<previous> ratio=<current/previous>``; rollouts per second =
the step's sampled rollouts (16) / the update's wall time (the figure an RL budget is made of).

Run: ``.venv/bin/python benchmarks/bench_rl_update.py [--repeats 3 --step 1 --algo rft --stages]``
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.repeats import alternate, check_same_work, spread  # noqa: E402

PREVIOUS_COMMIT = "b3e0729"
ROLLOUTS = ROOT / "docs/results/default_run/data/didpo/rollouts.jsonl"
MODEL_DIR = ROOT / ".cache/bench/smollm2-135m"
BF16_RTOL = 2e-2


def previous_module():
    """`models/didpo.py` at `PREVIOUS_COMMIT`, imported as ``didpo_previous``."""
    source = subprocess.run(
        ["git", "show", f"{PREVIOUS_COMMIT}:models/didpo.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    path = ROOT / ".cache/bench/didpo_previous.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("didpo_previous", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["didpo_previous"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def previous_update(old, model, rollouts, cfg, step, optimizer, params, generator, start_policy, pad_id):
    """The update block of ``train_didpo`` at `PREVIOUS_COMMIT` (one process, rollouts from an engine, no critic),
    with its float32 forward (autocast None)."""
    from models.rl_losses import kl_k3, masked_mean

    metrics = {}
    batch = old.build_batch(rollouts, pad_id)
    mask = batch["completion_mask"]
    _, logps, ref_logps = old._no_grad_passes(
        model, batch, None, None, cfg.minibatch_size, start_policy, cfg.temperature
    )
    metrics["kl_start"] = float(masked_mean(kl_k3(logps, ref_logps), mask))
    is_weights, _ = old.truncated_is_weights(logps, batch["old_per_token_logps"], cfg.is_cap)
    batch.update(old_per_token_logps=logps, is_weights=is_weights * mask)
    if cfg.algo == "didpo":
        batch["advantages"] = old.didpo_token_advantages(rollouts, mask, cfg)
    elif cfg.algo == "rft":
        batch["advantages"] = mask.clone()
    else:
        batch["advantages"] = old.group_token_advantages(rollouts, mask, cfg)
    if cfg.kl_coef:
        batch["ref_per_token_logps"] = ref_logps
    metrics.update(old.ppo_update(model, None, optimizer, params, batch, cfg, generator, None, True))
    return metrics


def load_rollouts(tokenizer, cfg, step: int):
    """The committed default run's rollouts of `step` as `models.rl.Rollout`s in group order (rft: the passing
    answers of groups with one, as its loop trains)."""
    from datalib.exercises import exercise_problems
    from datalib.generate import generate_problems
    from models.prompts import user_message
    from models.rl import Rollout
    from models.sampling import Completion, build_chat_prompt, extract_code

    rows = [json.loads(line) for line in ROLLOUTS.read_text().splitlines()]
    rows = [r for r in rows if r["step"] == step]
    problems = {p["task_id"]: p for p in [*generate_problems(1600, 0), *exercise_problems()]}
    rollouts = []
    for r in rows:
        problem = problems[r["task_id"]]
        prompt_ids = tokenizer(build_chat_prompt(tokenizer, user_message(problem)), add_special_tokens=False)[
            "input_ids"
        ]
        ids = tokenizer(r["completion"], add_special_tokens=False)["input_ids"]
        if r["finish_reason"] == "eos":
            ids = [*ids, tokenizer.eos_token_id]
        completion = Completion(
            r["completion"], extract_code(r["completion"]), prompt_ids, ids, [math.nan] * len(ids), r["finish_reason"]
        )
        rollouts.append(
            Rollout(
                problem,
                r["draw"],
                r["sample"],
                completion,
                r["passed"],
                r["total"],
                r["reason"],
                r["outcome"],
                r["reward"],
            )
        )
    if cfg.algo == "rft":
        passing = {r.problem["task_id"] for r in rollouts if r.passed}
        return rollouts, [r for r in rollouts if r.problem["task_id"] in passing and r.passed]
    return rollouts, rollouts


def matmul_peak(dtype: torch.dtype, size: int = 2048, repeats: int = 10) -> float:
    """This machine's GEMM throughput in GFLOP/s for `dtype` (best of `repeats` runs of 8 size³ products)."""
    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    torch.matmul(a, b)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(8):
            torch.matmul(a, b)
        best = min(best, (time.perf_counter() - start) / 8)
    return 2 * size**3 / best / 1e9


def count_flops(fn) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return float(counter.get_total_flops())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--step", type=int, default=1, help="which step of the committed default run")
    parser.add_argument("--algo", default=None, help="override params.yaml's didpo.algo")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--stages", action="store_true", help="also one SFT and one DPO step (GFLOP/s vs peak)")
    args = parser.parse_args()

    import yaml
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import models.rl as current
    from models.base_model import convert_embedded
    from models.config import ProcessRewardConfig, RLConfig
    from models.lora import apply_lora
    from models.sampling import pad_token_id
    from models.training import autocast_factory

    if args.threads:
        torch.set_num_threads(args.threads)
    section = yaml.safe_load((ROOT / "params.yaml").read_text())["didpo"]
    reward = ProcessRewardConfig(**section.pop("reward"))
    cfg = RLConfig(**{**section, "reward": reward, "target_kl": 0.0, **({"algo": args.algo} if args.algo else {})})
    if not (MODEL_DIR / "model.safetensors").exists():
        convert_embedded(MODEL_DIR)
    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    base = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32)
    torch.manual_seed(cfg.seed)
    model = apply_lora(base, cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_target_modules, cfg.lora_layers)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    start_state = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    old = previous_module()
    pad_id = pad_token_id(tokenizer)
    sampled, trained = load_rollouts(tokenizer, cfg, args.step)
    if cfg.algo == "didpo":  # grpo/dapo/rft read the recorded rewards; didpo's gaps are not in the JSONL
        raise SystemExit("--algo didpo needs the rollouts' process scores, which the committed JSONL lacks")
    bf16 = autocast_factory(cfg.mixed_precision, "cpu", auto_on_cpu=True)
    prompt_tokens = sum(len(r.completion.prompt_ids) for r in trained)
    answer_tokens = sum(len(r.completion.completion_ids) for r in trained)
    print(
        f"model SmolLM2-135M (LoRA r {cfg.lora_r}), algo {cfg.algo}, step {args.step}: {len(sampled)} rollouts "
        f"sampled, {len(trained)} trained ({prompt_tokens} prompt + {answer_tokens} answer tokens), minibatch "
        f"{cfg.minibatch_size}, threads {torch.get_num_threads()}, current autocast "
        f"{'bf16' if bf16 else 'none (float32)'}",
        flush=True,
    )

    def start_policy():
        return current._adapters_disabled(model)

    def fresh():
        with torch.no_grad():
            for n, p in model.named_parameters():
                if p.requires_grad:
                    p.copy_(start_state[n])
        optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=0.0)
        return optimizer, torch.Generator().manual_seed(1234)

    def run_previous() -> dict:
        optimizer, generator = fresh()
        return previous_update(old, model, trained, cfg, 0, optimizer, params, generator, start_policy, pad_id)

    def run_current(autocast=bf16) -> dict:
        optimizer, generator = fresh()
        return current.update_policy(
            model, trained, cfg, 0, optimizer, params, generator, start_policy, pad_id, autocast, True
        )

    # ---- same work: the first minibatch's loss, previous vs current (float32, then bf16)
    def first_loss(which: str, autocast=None) -> float:
        """The loss of the update's first minibatch (the same rows: the generator seeded alike), with the same
        advantages per row and old log-probs fixed at −1 nat per token on both sides, so the ratio varies and the
        clipped surrogate reads the log-probs (rft's NLL reads neither); the current side merges duplicates as it
        trains."""
        fresh()
        rows = torch.randperm(len(trained), generator=torch.Generator().manual_seed(1234))[: cfg.minibatch_size]
        mod = old if which == "previous" else current
        batch = mod.build_batch(trained, pad_id)
        minibatch = {k: v[rows] for k, v in batch.items()} if mod is old else current.select_rows(batch, rows)
        mask = minibatch["completion_mask"]
        minibatch.update(advantages=torch.linspace(-1.0, 1.0, len(rows)).unsqueeze(1) * mask)
        minibatch.update(old_per_token_logps=torch.full_like(mask, -1.0))
        if mod is current:
            minibatch, _ = current.merge_duplicates(minibatch)
        with torch.no_grad():
            logps, logits, _ = mod.policy_forward(model, minibatch, None, autocast, temperature=cfg.temperature)
            loss, _ = mod.ppo_losses(logps, logits, None, minibatch, cfg)
        return float(loss)

    previous_loss, current_loss = first_loss("previous"), first_loss("current")
    bf16_loss = first_loss("current", bf16) if bf16 else current_loss
    fp32_gap = abs(current_loss - previous_loss) / abs(previous_loss)
    bf16_gap = abs(bf16_loss - previous_loss) / abs(previous_loss)
    check_same_work(
        fp32_gap <= 1e-4 and bf16_gap <= BF16_RTOL,
        f"first minibatch loss previous {previous_loss:.6f}, current float32 {current_loss:.6f} (rel {fp32_gap:.1e} "
        f"<= 1e-4), current bf16 {bf16_loss:.6f} (rel {bf16_gap:.1e} <= {BF16_RTOL}); same {len(trained)} rollouts, "
        f"{answer_tokens} answer tokens on both sides",
    )

    # ---- peak and FLOPs (untimed)
    peak = {"float32": matmul_peak(torch.float32), "bf16": matmul_peak(torch.bfloat16)}
    flops = {"previous": count_flops(run_previous), "current": count_flops(run_current)}

    def timed(fn):
        def once() -> float:
            start = time.perf_counter()
            fn()
            return time.perf_counter() - start

        return once

    times = alternate({"previous": timed(run_previous), "current": timed(run_current)}, args.repeats)
    median = {side: spread(side, values, "s") for side, values in times.items()}
    # the peak: the best of a measurement before and one after the timed runs (another process's load lowers one)
    peak = {
        "float32": max(peak["float32"], matmul_peak(torch.float32)),
        "bf16": max(peak["bf16"], matmul_peak(torch.bfloat16)),
    }
    print(
        f"machine GEMM peak (2048², best of 10, before and after the runs): float32 {peak['float32']:.1f} GFLOP/s, "
        f"bf16 {peak['bf16']:.1f} GFLOP/s"
    )
    dtype = {"previous": "float32", "current": "bf16" if bf16 else "float32"}
    for side in ("previous", "current"):
        achieved = flops[side] / median[side] / 1e9
        print(
            f"{side:9s} {flops[side] / 1e12:.2f} TFLOP per update, {achieved:.1f} GFLOP/s = "
            f"{achieved / peak[dtype[side]]:.0%} of the {dtype[side]} GEMM peak"
        )
    if args.stages:
        stage_figures(model, tokenizer, trained, peak, bf16)
    rate = {side: len(sampled) / median[side] for side in median}
    print(
        f"RESULT rollouts_per_s={rate['current']:.3f} previous={rate['previous']:.3f} "
        f"ratio={rate['current'] / rate['previous']:.2f}"
    )


def stage_figures(model, tokenizer, rollouts, peak: dict, bf16) -> None:
    """One SFT step and one DPO step of the stages' own loss code on the same model, each with its stage's autocast
    choice (SFT: bf16 where the CPU runs it natively; DPO: float32 on CPU): `models.sft.answer_nll` on 8 of the
    rollouts' problems rendered as SFT examples (the reference answers), and `models.dpo.sequence_logps` of policy
    (with gradient) and reference (adapters disabled) on 4 pairs (chosen / rejected = two different answers of the
    same prompt) with `models.dpo.sigmoid_loss`. Prints FLOPs, time (best of 3) and the share of the peak."""
    import contextlib

    from models.dpo import build_pair_examples, collate_pairs, sequence_logps, sigmoid_loss
    from models.prompts import user_message
    from models.rl import _adapters_disabled
    from models.sft import answer_nll, build_sft_examples, collate

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    problems = list({r.problem["task_id"]: r.problem for r in rollouts}.values())
    sft_batch = collate(build_sft_examples(tokenizer, (problems * 8)[:8]), pad)
    texts: dict[str, list[str]] = {}
    for r in rollouts:
        texts.setdefault(r.problem["task_id"], [])
        if r.completion.text not in texts[r.problem["task_id"]]:
            texts[r.problem["task_id"]].append(r.completion.text)
    by_id = {p["task_id"]: p for p in problems}
    rows = [
        {"prompt": user_message(by_id[t]), "chosen": a, "rejected": b}
        for t, answers in texts.items()
        for a, b in zip(answers[::2], answers[1::2], strict=False)
    ][:4]
    pair_batch = collate_pairs(build_pair_examples(tokenizer, rows, 1024), pad)

    def run(autocast, fn):
        with autocast() if autocast else contextlib.nullcontext():
            fn()
        model.zero_grad(set_to_none=True)

    def sft_step():
        total, count = answer_nll(model, sft_batch)
        (total / count).backward()

    def dpo_step():
        logps, _ = sequence_logps(model, pair_batch)
        with torch.no_grad(), _adapters_disabled(model):
            ref, _ = sequence_logps(model, pair_batch)
        half = logps.shape[0] // 2
        losses, _, _ = sigmoid_loss(logps[:half], logps[half:], ref[:half], ref[half:], 0.1)
        losses.mean().backward()

    for name, fn, autocast in (("sft", sft_step, bf16), ("dpo", dpo_step, None)):
        dtype = "bf16" if autocast else "float32"
        flops = count_flops(lambda: run(autocast, fn))  # noqa: B023
        best = min(_seconds(lambda: run(autocast, fn)) for _ in range(3))  # noqa: B023
        achieved = flops / best / 1e9
        print(
            f"stage {name}: {flops / 1e12:.3f} TFLOP a step, {best:.2f} s, {achieved:.1f} GFLOP/s = "
            f"{achieved / peak[dtype]:.0%} of the {dtype} GEMM peak"
        )


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
