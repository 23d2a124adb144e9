"""Scale-out check (issue 8): DPO, SFT, GRPO and DiDPO steps under ``accelerate launch`` with 2 CPU processes end
with the parameters of one process with the same global batch.

Slow (two processes on CPU): run with ``pytest -m slow tests/test_distributed.py``.

`accelerate launch --cpu --num_processes 2` on one machine starts ONE process (accelerate 1.15's simple launcher), so
the test launches ``--multi_gpu --num_processes 2``: torchrun spawns two processes, which train on the CPU (the configs
say ``device: cpu``) and join a gloo group (`models.distributed`). No accelerate config file is read (``--cpu`` off,
every launch option passed; ``HF_HOME`` points at an empty folder).

Tolerance: the two runs differ only in float32 summation order (each process sums its half of the batch, the
all-reduce adds the halves; the reference/old-value passes pad to other lengths), a relative error of ~1e-7 per
operation, carried through a few AdamW steps whose update m/√v divides out the gradient's scale. We allow 1e-5 of the
tensor's largest magnitude plus 1e-6 absolute: a wrong normaliser (the local count instead of the global one), a lost
shard or a rollout sampled differently moves the parameters by 1e-3 or more (lr 5e-3 / 1e-3 AdamW steps of ~lr each).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from models.policy import build_tiny_causal_lm

ENTRY = Path(__file__).with_name("distributed_entry.py")
RUNS = ("dpo", "sft", "grpo", "didpo")
GLOBAL_BATCH = 4  # DPO pairs per micro-batch, RL rollouts per minibatch; 2 per process under the launcher


def trained(out: Path) -> dict[str, dict[str, torch.Tensor]]:
    return {run: torch.load(out / run / "trained.pt") for run in RUNS}


@pytest.mark.slow
def test_two_processes_end_with_the_parameters_of_one(tmp_path):
    from tests.distributed_entry import run

    model, tok = build_tiny_causal_lm(0)
    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)

    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": str(ENTRY.parents[1])}
    env.pop("WORLD_SIZE", None)
    from flows.cli import launch_command

    target = [str(ENTRY), str(model_dir), str(tmp_path / "two"), str(GLOBAL_BATCH // 2)]
    command = launch_command(2, target)  # what `didpo stage` runs for launch.num_processes 2
    launched = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run(model_dir, tmp_path / "one", GLOBAL_BATCH)  # meanwhile, one process with the whole batch
    output, _ = launched.communicate(timeout=600)
    assert launched.returncode == 0, output[-4000:]
    assert (tmp_path / "two" / "world_size.txt").read_text() == "2"
    assert (tmp_path / "one" / "world_size.txt").read_text() == "1"

    one, two = trained(tmp_path / "one"), trained(tmp_path / "two")
    worst = {}
    for name in RUNS:
        assert one[name].keys() == two[name].keys() and one[name]
        # LoRA B starts at 0: it moved, so the comparison is not of untouched tensors
        assert max(v.abs().max().item() for k, v in one[name].items() if "lora_B" in k) > 1e-4
        for key, a in one[name].items():
            b = two[name][key]
            diff = (a - b).abs().max().item()
            worst[name] = max(worst.get(name, 0.0), diff)
            assert diff <= 1e-5 * a.abs().max().item() + 1e-6, (name, key, diff)
    print("max |one − two| per run:", worst)
