"""RL step time with rollouts from OpenVINO (``didpo.rollout_engine: openvino``) against the torch sampler, on the
embedded model (issue 16 item 3).

Both sides run the same loop (`models.rl.train_rl`: grpo, the stage's batch of 2 prompts × 8 answers, its
384-token budget, the update on the trainer), from the same checkpoint (``--model``, default data/checkpoints/base),
on the same train problems, threads and precision (fp32); only the rollout engine differs. The engines draw
different random samples, so the check that both compute the same thing is the greedy one: after
`OpenVINOSampler.load_weights` of a policy with visible LoRA weights, the engine's greedy answers to the first
problems equal the torch sampler's of that policy, token for token (printed before the timings).

Runs alternate (torch, openvino, torch, openvino, ...); each run does ``--steps`` RL steps and the first is not
timed (compilation, the first weight load). Per engine: the median over runs of the mean rollout seconds, weight-sync
seconds and whole-step seconds of the timed steps, and the generated tokens/s. Last line:

    RESULT rl_step_s=<openvino> ... ratio=<openvino / torch>

Run: ``.venv/bin/python benchmarks/bench_rl_rollouts.py`` (≈ 25 min on 2 cores; needs ``make export-env``).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path("data/checkpoints/base"))
    parser.add_argument("--problems", type=Path, default=Path("data/validated/problems.jsonl"))
    parser.add_argument("--repeats", type=int, default=2, help="runs per engine, alternating")
    parser.add_argument("--steps", type=int, default=2, help="RL steps per run (the first is not timed)")
    args = parser.parse_args()

    import torch

    from models.config import ProcessRewardConfig, RLConfig
    from models.lora import apply_lora
    from models.openvino_engine import OpenVINOSampler, engine_available, export
    from models.policy import configure_threads, load_policy
    from models.prompts import user_message
    from models.rl import train_rl
    from models.sampling import SamplingConfig, build_chat_prompt, sample
    from sandbox.verifier import Verifier, VerifierConfig
    from tasks.io import read_problems

    reason = engine_available()
    if reason:
        raise SystemExit(f"OpenVINO cannot run here: {reason}")
    configure_threads()
    threads = torch.get_num_threads()
    problems = read_problems(args.problems, "train")[:32]
    ir = export(args.model, Path(".cache/openvino"))

    # ---- the check: after a weight load, greedy answers equal the torch sampler's of the same policy
    model, tok = load_policy(args.model, dtype="float32", device="cpu")
    policy = apply_lora(model, 16, 32.0, 0.0, "auto", 0)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02, generator=torch.Generator().manual_seed(0))
    engine = OpenVINOSampler(ir, tok, precision="f32", threads=threads)
    engine.load_weights(policy)
    prompts = [build_chat_prompt(tok, user_message(p)) for p in problems[:2]]
    greedy = SamplingConfig(n=1, temperature=0.0, max_new_tokens=96)
    ours = [g[0].completion_ids for g in sample(policy, tok, prompts, greedy, progress=False)]
    theirs = [g[0].completion_ids for g in engine.sample(prompts, greedy, progress=False)]
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    print(f"check: greedy answers after load_weights equal the torch sampler's on {same}/{len(prompts)} problems")
    del model, policy, engine

    cfg = RLConfig(
        algo="grpo",
        steps=args.steps,
        screen_samples=0,
        checkpoint_every=0,
        device="cpu",
        reward=ProcessRewardConfig(control="group"),
    )
    runs: dict[str, list[dict]] = {"torch": [], "openvino": []}
    with Verifier(VerifierConfig(workers=2)) as verifier, tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name in ("torch", "openvino"):
                model, tok = load_policy(args.model, dtype="float32", device="cpu")
                engine = OpenVINOSampler(ir, tok, precision="f32", threads=threads) if name == "openvino" else None
                result = train_rl(
                    model, tok, problems, cfg, verifier, Path(tmp) / f"{name}{r}", resume=False, engine=engine
                )
                timed = result.history[1:]
                row = {
                    "rollout_s": statistics.mean(h["didpo/time/rollout_s"] for h in timed),
                    "sync_s": statistics.mean(h.get("didpo/time/weight_sync_s", 0.0) for h in timed),
                    "update_s": statistics.mean(h["didpo/time/update_s"] for h in timed),
                    "step_s": statistics.mean(h["didpo/step_time_s"] for h in timed),
                    "tok_s": statistics.mean(h["didpo/tokens_per_s"] for h in timed),
                    "length": statistics.mean(h["didpo/response_length"] for h in timed),
                }
                runs[name].append(row)
                print(f"run {r + 1} {name}: " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()), flush=True)
    med = {name: {k: statistics.median(row[k] for row in rows) for k in rows[0]} for name, rows in runs.items()}
    for name, m in med.items():
        print(f"{name}: median " + ", ".join(f"{k} {v:.1f}" for k, v in m.items()))
    ov, pt = med["openvino"], med["torch"]
    print(
        f"RESULT rl_step_s={ov['step_s']:.1f} torch_rl_step_s={pt['step_s']:.1f} rollout_s={ov['rollout_s']:.1f} "
        f"torch_rollout_s={pt['rollout_s']:.1f} weight_sync_s={ov['sync_s']:.2f} threads={threads} "
        f"ratio={ov['step_s'] / pt['step_s']:.2f}"
    )


if __name__ == "__main__":
    main()
