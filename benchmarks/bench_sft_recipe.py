"""SFT step cost of the recipe's levers on this CPU: LoRA dropout 0.05 vs 0, and (``--bf16``) bf16 autocast.

    .venv/bin/python benchmarks/bench_sft_recipe.py [--model data/checkpoints/base --repeats 3 --bf16]

Needs the converted base model (``dvc repro base_model``) and the prepared problems (``dvc repro prepare``). Same work
on every arm: the same LoRA (r 16, α 32, every projection, initialised from one seed), the same micro-batches (the
first train examples in file order, 2 micro-batches of 4 = one optimizer step of the default recipe, padded to each
micro-batch's longest example, loss on the answer tokens, `models.sft.answer_nll`), forward + backward, 2 threads.
The arms alternate within each repeat, in reversed order every other repeat (the first arm to meet a repeat's new
micro-batch shapes pays the allocator's warm-up), and every repeat uses new micro-batches (the same ones on every arm).

Same work is checked first: with dropout off (eval mode) the arms' losses on the first micro-batch must agree
(fp32 arms within 1e-6 relative, the bf16 arm within 1e-3) — ``CHECK same_work=ok``, else ``FAIL`` and exit 1. The
dropout-0.05 arm is the previous default (the peer); the last line is
``RESULT recipe=dropout0 step_s=<median> peer_step_s=<median> ratio=<ours/peer>`` (ratio < 1: cheaper).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

from repeats import check_same_work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="data/checkpoints/base")
    parser.add_argument("--problems", default="data/prepared/problems.jsonl")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--bf16", action="store_true", help="add the bf16-autocast arm (dropout 0)")
    args = parser.parse_args()
    for path, stage in ((Path(args.model) / "config.json", "base_model"), (Path(args.problems), "prepare")):
        if not path.exists():
            sys.exit(f"{path} is missing: run `dvc repro {stage}` first")

    import torch

    from models.lora import apply_lora
    from models.policy import load_policy
    from models.sft import answer_nll, build_sft_examples, collate

    torch.set_num_threads(args.threads)
    rows = [json.loads(line) for line in Path(args.problems).open()]
    train = [r for r in rows if r.get("split") == "train"][: 8 * args.repeats]
    arms = {"dropout0.05": (0.05, False), "dropout0": (0.0, False)}
    if args.bf16:
        arms["dropout0+bf16"] = (0.0, True)
    models = {}
    for name, (dropout, _) in arms.items():
        model, tokenizer = load_policy(Path(args.model), dtype="float32")
        torch.manual_seed(0)  # the same adapter initialisation on every arm
        models[name] = apply_lora(model, 16, 32.0, dropout, "auto", 0)
    examples = build_sft_examples(tokenizer, train, max_seq_len=640)
    pad = tokenizer.pad_token_id

    def autocast(bf16: bool):
        return torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()

    first = collate(examples[:4], pad)
    losses = {}
    with torch.no_grad():
        for name, (_, bf16) in arms.items():
            models[name].eval()
            with autocast(bf16):
                nll, n = answer_nll(models[name], first)
            losses[name] = nll.item() / n
    losses_text = ", ".join(f"{k} {v:.6f}" for k, v in losses.items())
    peer = losses["dropout0.05"]
    same = all(
        abs(loss - peer) <= (1e-3 * abs(peer) if arms[name][1] else 1e-6 * abs(peer)) for name, loss in losses.items()
    )
    check_same_work(same, f"first micro-batch loss in eval mode equal on every arm: {losses_text}")

    times: dict[str, list[float]] = {name: [] for name in arms}
    for rep in range(args.repeats):
        micro = [collate(examples[8 * rep + 4 * i : 8 * rep + 4 * i + 4], pad) for i in range(2)]
        tokens = sum(int(b["attention_mask"].sum()) for b in micro)
        order = list(arms.items()) if rep % 2 == 0 else list(arms.items())[::-1]  # ABBA: who runs first alternates
        for name, (_, bf16) in order:
            model = models[name]
            model.train()
            started = time.perf_counter()
            for batch in micro:
                with autocast(bf16):
                    nll, n = answer_nll(model, batch)
                (nll / n).backward()
            model.zero_grad(set_to_none=True)
            times[name].append(time.perf_counter() - started)
            print(f"repeat {rep}: {name:14s} {times[name][-1]:6.1f} s ({tokens} tokens)", flush=True)
    for name, ts in times.items():
        print(f"{name:14s} median {statistics.median(ts):6.1f} s a step, range {min(ts):.1f}–{max(ts):.1f}")
    ours, theirs = statistics.median(times["dropout0"]), statistics.median(times["dropout0.05"])
    print(f"RESULT recipe=dropout0 step_s={ours:.1f} peer_step_s={theirs:.1f} ratio={ours / theirs:.2f}")


if __name__ == "__main__":
    main()
