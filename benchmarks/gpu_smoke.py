"""GPU smoke run (issues 7, 22): a few SFT, DPO and RL (didpo) steps of the embedded model, with their step timings
and the peak memory.

The model is ``--model`` (default ``data/checkpoints/base``, the dequantised SmolLM2-135M-Instruct that ``dvc repro
base_model`` writes) or, with ``--tiny`` or when that directory is missing, the tiny random Llama of
`models.policy.build_tiny_causal_lm`. Device "auto": CUDA with bf16 autocast when present (``mixed_precision:
auto``), else the CPU in float32. Each stage starts from the same weights with a fresh LoRA adapter (as the pipeline's
stages do), on generated data-cleaning problems (benchmarks/bench_sft.py); RL scores its rollouts in the real
sandbox.

A stage's step time is the mean wall time between the metrics of its first and its last optimizer step (the first
step, with its one-off costs — CUDA kernels, the DPO reference pass — is excluded); RL's is the mean of
``didpo/step_time_s`` (rollouts + update) over all its steps but the first. Peak memory: the largest
``torch.cuda.max_memory_allocated`` of the stages on CUDA, the process's peak RSS on the CPU. Last line:

    RESULT sft_step_s=<s> dpo_step_s=<s> rl_step_s=<s> rollout_tok_s=<tokens/s> peak_mem_gb=<GiB> device=<name>
        engine=<rollout engine>

RL's rollouts come from vLLM in bf16 (``--rollout-engine``: ``auto`` = vLLM where it runs, i.e. CUDA with the
``vllm`` extra installed; the policy's weights are synced into it every step and the update is TIS-corrected,
`models.vllm_engine`), else from the torch sampler.

Run: ``benchmarks/gpu_smoke.sh`` (a GPU at hand), ``benchmarks/gpu_smoke.sh --tiny`` (anywhere, < 1 min on CPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_dpo import make_pairs  # noqa: E402  (pairs of the DPO benchmark)
from bench_sft import make_problems  # noqa: E402  (problems of the SFT benchmark)

DEFAULT_MODEL = Path("data/checkpoints/base")


class StepClock:
    """An ``emit`` callback that timestamps every step's metrics (the first record of each step)."""

    def __init__(self):
        self.times: dict[int, float] = {}
        self.records: list[dict] = []

    def __call__(self, metrics: dict, step: int) -> None:
        self.times.setdefault(step, time.perf_counter())
        self.records.append(metrics)

    def mean_step_s(self) -> float:
        steps = sorted(s for s in self.times if s > 0)
        if len(steps) < 2:
            raise ValueError("need at least 2 steps to time one without the first")
        return (self.times[steps[-1]] - self.times[steps[0]]) / (steps[-1] - steps[0])


def load(model_path: Path | None):
    """A fresh copy of the model on the CPU (the loops move it to the device), and its tokenizer."""
    from models.policy import build_tiny_causal_lm, load_policy

    if model_path is None:
        return build_tiny_causal_lm(0)
    return load_policy(model_path, dtype="float32", device="cpu")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="checkpoint directory")
    parser.add_argument("--tiny", action="store_true", help="the tiny random Llama instead of --model")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps (RL: RL steps) per stage, >= 2")
    parser.add_argument("--device", default="auto", help='"auto" (CUDA when present), "cpu" or "cuda:N"')
    parser.add_argument(
        "--rollout-engine",
        choices=("auto", "torch", "vllm"),
        default="auto",
        help="RL rollouts: vllm (bf16, weights synced every step, TIS) where it runs (auto), else the torch sampler",
    )
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be >= 2 (the first step is not timed)")

    import torch

    from models.dpo import DPOConfig, train_dpo
    from models.policy import configure_threads, resolve_device
    from models.rl import RLConfig, train_rl
    from models.sft import SFTConfig, train_sft
    from models.vllm_engine import VLLMSampler, engine_available
    from sandbox.verifier import Verifier, VerifierConfig

    engine_name = args.rollout_engine
    if engine_name == "auto":
        engine_name = "torch" if engine_available() else "vllm"
    elif engine_name == "vllm" and engine_available():
        parser.error(f"--rollout-engine vllm: {engine_available()}")
    tiny = args.tiny or not args.model.exists()
    if not args.tiny and tiny:
        print(f"{args.model} not found: using the tiny random model (run `dvc repro base_model` for the real one)")
    model_path = None if tiny else args.model
    device = resolve_device(args.device)
    cuda = device.startswith("cuda")
    if not cuda:
        configure_threads()
    # Sizes: the real model at the pipeline's shapes; the tiny one small enough for a CPU in well under a minute.
    seq, new_tokens, batch, group = (256, 16, 4, 4) if tiny else (512, 128, 8, 8)
    problems = make_problems(16)
    pairs = make_pairs(16)
    common = dict(lora_r=16, lora_alpha=32.0, max_steps=args.steps, grad_accum_steps=1, warmup_ratio=0.0, eval_every=0)
    common.update(checkpoint_every=0, device=device, mixed_precision="auto")
    peaks: list[float] = []

    def stage(name: str, fn, clocks: dict) -> float:
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        clock = clocks[name] = StepClock()
        started = time.perf_counter()
        fn(clock)
        seconds = clock.mean_step_s()
        if name == "rl":  # rollouts + update of every step but the first
            times = [r["didpo/step_time_s"] for r in clock.records[1:]]
            seconds = sum(times) / len(times)
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else peak_rss_gb()
        peaks.append(peak)
        print(
            f"{name}: {seconds:.3f} s/step over steps 2..{args.steps}, {time.perf_counter() - started:.1f} s in all,"
            f" peak {peak:.2f} GiB",
            flush=True,
        )
        return seconds

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)

        def sft(clock):
            model, tok = load(model_path)
            cfg = SFTConfig(**common, batch_size=batch, max_seq_len=seq, lora_dropout=0.0)
            train_sft(model, tok, problems, [], cfg, out / "sft", clock, resume=False)

        def dpo(clock):
            model, tok = load(model_path)
            cfg = DPOConfig(**common, batch_size=batch // 2, max_seq_len=seq, lora_dropout=0.0)
            train_dpo(model, tok, pairs, [], cfg, out / "dpo", clock, resume=False)

        def rl(clock):
            model, tok = load(model_path)
            from models.config import ProcessRewardConfig

            cfg = RLConfig(
                algo="didpo",
                steps=args.steps,
                prompts_per_step=2,
                group_size=group,
                max_new_tokens=new_tokens,
                minibatch_size=group,
                lora_r=16,
                lora_alpha=32.0,
                checkpoint_every=0,
                device=device,
                mixed_precision="auto",
                screen_samples=0,  # a smoke of the step: no screen, the group's own control
                reward=ProcessRewardConfig(control="group"),
            )
            cfg = dataclasses.replace(cfg, rollout_engine=engine_name)
            engine = None
            if engine_name == "vllm":  # the engine loads the starting weights from a folder
                folder = out / "rl-start"
                model.save_pretrained(folder)
                tok.save_pretrained(folder)
                engine = VLLMSampler(folder, tok, dtype="bfloat16", gpu_memory_utilization=0.3)
            with Verifier(VerifierConfig(workers=2, timeout_s=5.0, cpu_s=5)) as verifier:
                train_rl(model, tok, problems, cfg, verifier, out / "rl", clock, resume=False, engine=engine)

        clocks: dict[str, StepClock] = {}
        sft_s, dpo_s, rl_s = stage("sft", sft, clocks), stage("dpo", dpo, clocks), stage("rl", rl, clocks)
    name = torch.cuda.get_device_name(device).replace(" ", "_") if cuda else "cpu"
    bf16 = cuda and torch.cuda.is_bf16_supported()
    sft_tok_s = mean_after_first(clocks["sft"].records, "sft/tokens_per_s")
    rollout_tok_s = mean_after_first(clocks["rl"].records, "didpo/tokens_per_s")
    sync_s = mean_after_first(clocks["rl"].records, "didpo/time/weight_sync_s")
    print(f"model={'tiny' if tiny else model_path} device={device} bf16_autocast={bf16} rollout_engine={engine_name}")
    print(
        f"sft {sft_tok_s:.0f} input tokens/s; rl rollouts {rollout_tok_s:.0f} generated tokens/s"
        + (f", weight sync {sync_s:.2f} s/step" if sync_s == sync_s else "")
    )
    print(
        f"RESULT sft_step_s={sft_s:.3f} dpo_step_s={dpo_s:.3f} rl_step_s={rl_s:.3f} "
        f"rollout_tok_s={rollout_tok_s:.0f} peak_mem_gb={max(peaks):.2f} device={name} engine={engine_name}"
    )


def mean_after_first(records: list[dict], key: str) -> float:
    """The mean of `key` over the records after the first that holds it (NaN when fewer than 2 hold it)."""
    values = [r[key] for r in records if key in r][1:]
    return sum(values) / len(values) if values else float("nan")


def peak_rss_gb() -> float:
    """The process's peak resident set size (Linux reports ru_maxrss in KiB), GiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


if __name__ == "__main__":
    main()
