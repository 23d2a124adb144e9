"""A few DPO, SFT, GRPO and DiDPO steps on a saved tiny model, and an SFT run stopped and resumed; run by
tests/test_distributed.py in one process and under ``accelerate launch --num_processes 2`` (CPU, gloo), with DDP
(``--multi_gpu``) and with FSDP2 (``--config_file configs/accelerate_fsdp2.yaml``, `fsdp_on_cpu`).

    python tests/distributed_entry.py MODEL_DIR OUT_DIR PER_PROCESS_BATCH

``PER_PROCESS_BATCH`` is the DPO pairs per micro-batch and the RL rollouts per minibatch of each process: B in one
process, B/2 in each of two gives the same global batches. Rank 0 writes ``OUT_DIR/<run>/trained.pt`` (the LoRA
adapter's tensors, plus the value head's for didpo), ``OUT_DIR/world_size.txt`` and ``OUT_DIR/sharded.txt``.
"""

from __future__ import annotations

import dataclasses
import sys
import zlib
from pathlib import Path
from types import SimpleNamespace

# Run as a script (accelerate launch), the repository root is not on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RL_BASE = dict(
    steps=2,
    prompts_per_step=2,
    group_size=4,
    max_new_tokens=20,
    learning_rate=1e-3,
    value_learning_rate=1e-2,
    lora_r=4,
    lora_alpha=8.0,
    device="cpu",
    checkpoint_every=0,
    target_kl=0.0,
    ppo_epochs=2,
    screen_samples=0,  # train on the given problems: the stand-in verifier's partial credit is the signal
    mixed_precision="no",  # 2 processes must end with the parameters of 1 to 1e-5: float32 math
)


def problem(i: int) -> dict:
    """A data-cleaning problem (as tests/test_rl_loop.py); even ones ship a reference the sandbox passes."""
    name = f"clean_{i}"
    return {
        "task_id": f"DataClean/strip/{i:04d}",
        "prompt": f'def {name}(items):\n    """Strip each string (variant {i})."""\n',
        "entry_point": name,
        "canonical_solution": "    # Step 1: strip each string\n    out = [s.strip() for s in items]\n    return out\n",
        "test": "def check(candidate):\n    assert candidate([' a ']) == ['a']\n    assert candidate([]) == []\n",
        "steps": ["Step 1: strip each string"],
        "instruction": f"Write a Python function `{name}` that strips each string.",
        "key_patterns": [".strip()"],
        "family": "strip",
        "split": "train",
        "source": "generated:v1",
    }


def pair(i: int) -> dict:
    return {
        "pair_id": f"p{i}",
        "prompt": f"Write a function `add_{i}` that adds two numbers.",
        "chosen": f"The function adds a and b.\n\n```python\ndef add_{i}(a, b):\n    return a + b\n```",
        "rejected": f"def add_{i}(a, b):\n    import os\n    os.system('ls')\n    return a - b" + " # x" * (i % 3),
        "source": "mined",
    }


class TextVerifier:
    """A deterministic stand-in for the sandbox: a program passes crc32(program) % 3 of its 2 tests, a function of
    the program alone, so verdicts do not depend on which process checks it."""

    def check_many(self, jobs):
        return [SimpleNamespace(n_passed=zlib.crc32(p.encode()) % 3, n_tests=2, reason="stub") for p, _, _ in jobs]


def fsdp_on_cpu() -> None:
    """Under an FSDP accelerate config (``ACCELERATE_USE_FSDP`` set by the launcher), make the loops' Accelerator take
    its FSDP2 path on these CPU processes. Accelerate sets FSDP up on GPUs only (on CPU processes it sets up
    ``MULTI_CPU`` and the loops refuse the config); PyTorch's FSDP2 itself shards over gloo on CPU, so this test
    runs the loops' real FSDP2 code: Accelerate's ``prepare`` with the plugin the launcher's config describes."""
    import functools
    import os

    from accelerate import FullyShardedDataParallelPlugin, PartialState
    from accelerate.utils import DistributedType

    import models.distributed

    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() != "true":
        return
    build = models.distributed._accelerator.__wrapped__

    @functools.cache
    def accelerator(cpu: bool):
        made = build(cpu)
        # AcceleratorState copies PartialState's type whenever it is built again: set it on both
        PartialState._shared_state["distributed_type"] = DistributedType.FSDP
        made.state.distributed_type = DistributedType.FSDP
        made.state.fsdp_plugin = FullyShardedDataParallelPlugin()  # read from the launcher's FSDP_* variables
        return made

    models.distributed._accelerator = accelerator


def run(model_dir: Path, out_dir: Path, batch: int) -> None:
    """DPO and SFT (3 steps; a step = 2 micro-batches of `batch` examples per process), then grpo and didpo (2 steps
    of 8 rollouts, 2 PPO epochs in minibatches of `batch` rollouts per process), each from the saved model."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import models.sampling
    from models.distributed import data_parallel
    from models.dpo import DPOConfig, train_dpo
    from models.sft import SFTConfig, train_sft

    torch.set_num_threads(1)
    out_dir = Path(out_dir)
    fsdp_on_cpu()
    dp = data_parallel("cpu")
    if dp.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "world_size.txt").write_text(str(dp.world_size))
        (out_dir / "sharded.txt").write_text(str(dp.sharded))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def save(name: str, tensors: dict) -> None:
        if dp.is_main:
            torch.save({k: v.detach().cpu().clone() for k, v in tensors.items()}, out_dir / name / "trained.pt")

    cfg = DPOConfig(
        batch_size=batch,
        grad_accum_steps=2,
        max_steps=3,
        warmup_ratio=0.0,
        eval_every=0,
        checkpoint_every=0,
        learning_rate=5e-3,
        lora_r=4,
        lora_alpha=8.0,
        lora_dropout=0.0,  # dropout masks depend on the shard's shape: equivalence needs none
        max_seq_len=128,
        device="cpu",
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    # the exported adapter holds the trained LoRA tensors (the returned model is merged)
    result = train_dpo(model, tokenizer, [pair(i) for i in range(8)], [], cfg, out_dir / "dpo", resume=False)
    save("dpo", load_file(result.adapter_path / "adapter_model.safetensors"))

    problems = [problem(i) for i in range(6)]
    cfg = SFTConfig(
        batch_size=batch,
        grad_accum_steps=2,
        max_steps=3,
        warmup_ratio=0.0,
        eval_every=0,
        checkpoint_every=0,
        learning_rate=5e-3,
        lora_r=4,
        lora_alpha=8.0,
        lora_dropout=0.0,
        max_seq_len=256,
        device="cpu",
        mixed_precision="no",  # 2 processes must end with the parameters of 1 to 1e-5: float32 math
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    result = train_sft(model, tokenizer, problems, [], cfg, out_dir / "sft", resume=False)
    save("sft", load_file(result.adapter_path / "adapter_model.safetensors"))
    result = stopped_and_resumed_sft(
        model_dir, tokenizer, problems, dataclasses.replace(cfg, checkpoint_every=1), out_dir
    )
    save("sft_resumed", load_file(result.adapter_path / "adapter_model.safetensors"))

    # A random tiny model writes no fenced code, so every program of a group would be the bare prompt (equal rewards,
    # no gradient): the code is the whole completion here, so programs differ.
    extract_code, models.sampling.extract_code = models.sampling.extract_code, lambda text: text
    try:
        train_both_rl(model_dir, tokenizer, problems, out_dir, batch, save)
    finally:
        models.sampling.extract_code = extract_code


class Stop(Exception):
    """Raised by every process at the same point, as a crash that loses the run after its last checkpoint."""


def stopped_and_resumed_sft(model_dir, tokenizer, problems, cfg, out_dir: Path):
    """The SFT run of `run`, checkpointed every step and stopped as step 3 starts (after checkpoint 2), then resumed
    from that checkpoint: it must end where the uninterrupted run ends, in one process and in N (the checkpoint
    holds the gathered, whole weights and optimizer states; `models.training.save_loop_state`)."""
    from transformers import AutoModelForCausalLM

    from models.sft import train_sft
    from models.training import DataOrder

    take, draws = DataOrder.take, []

    def stopping(self, n):
        draws.append(n)
        if len(draws) > 2 * cfg.grad_accum_steps:  # the first draw of step 3
            raise Stop
        return take(self, n)

    DataOrder.take = stopping
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        train_sft(model, tokenizer, problems, [], cfg, out_dir / "sft_resumed", resume=False)
        raise AssertionError("the run was not stopped")
    except Stop:
        pass
    finally:
        DataOrder.take = take
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return train_sft(model, tokenizer, problems, [], cfg, out_dir / "sft_resumed", resume=True)


def train_both_rl(model_dir, tokenizer, problems, out_dir, batch, save) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from models.config import ProcessRewardConfig
    from models.rl import RLConfig, train_rl

    # A random tiny model never passes a test in the real sandbox, and writes no complete line (no process reward
    # either): all rewards would be 0 and nothing would move. The stand-in verifier gives programs partial credit
    # from their text, so the outcome rewards vary within groups, for grpo and didpo alike.
    verifier = TextVerifier()
    for algo in ("grpo", "didpo"):
        reward = ProcessRewardConfig(w_partial=0.5, control="group")  # V1 alone would be 0 everywhere here
        cfg = RLConfig(**RL_BASE, algo=algo, minibatch_size=batch, critic=algo == "didpo", reward=reward)
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        result = train_rl(model, tokenizer, problems, cfg, verifier, out_dir / algo, resume=False)
        tensors = load_file(result.adapter_path / "adapter_model.safetensors")
        if result.value_head is not None:
            tensors.update({f"value_head.{k}": v for k, v in result.value_head.state_dict().items()})
        save(algo, tensors)


if __name__ == "__main__":
    run(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
