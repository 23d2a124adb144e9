"""Scale-out check (issues 8, 22): DPO, SFT, GRPO and DiDPO steps under ``accelerate launch`` with 2 CPU processes,
data parallel (DDP) and sharded (FSDP2), end with the parameters of one process with the same global batch.

Slow (two processes on CPU): run with ``pytest -m slow tests/test_distributed.py``.

`accelerate launch --cpu --num_processes 2` on one machine starts ONE process (accelerate 1.15's simple launcher), so
the test launches ``--multi_gpu --num_processes 2``: torchrun spawns two processes, which train on the CPU (the configs
say ``device: cpu``) and join a gloo group (`models.distributed`). No accelerate config file is read (``--cpu`` off,
every launch option passed; ``HF_HOME`` points at an empty folder). The FSDP2 launch reads
``configs/accelerate_fsdp2.yaml`` (what ``launch.config_file`` passes); Accelerate sets FSDP up on GPUs only, so the
entry script makes its Accelerator take the FSDP2 path on these CPU processes (`tests.distributed_entry.fsdp_on_cpu`).

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
FSDP2_CONFIG = ENTRY.parents[1] / "configs" / "accelerate_fsdp2.yaml"
RUNS = ("dpo", "sft", "sft_resumed", "grpo", "didpo")
GLOBAL_BATCH = 4  # DPO pairs per micro-batch, RL rollouts per minibatch; 2 per process under the launcher


def trained(out: Path) -> dict[str, dict[str, torch.Tensor]]:
    return {run: torch.load(out / run / "trained.pt") for run in RUNS}


def assert_same_parameters(one: dict, other: dict) -> dict[str, float]:
    """Every run's trained tensors equal within the module's tolerance; returns the largest difference per run."""
    worst = {}
    for name in RUNS:
        assert one[name].keys() == other[name].keys() and one[name]
        # LoRA B starts at 0: it moved, so the comparison is not of untouched tensors
        assert max(v.abs().max().item() for k, v in one[name].items() if "lora_B" in k) > 1e-4
        for key, a in one[name].items():
            diff = (a - other[name][key]).abs().max().item()
            worst[name] = max(worst.get(name, 0.0), diff)
            assert diff <= 1e-5 * a.abs().max().item() + 1e-6, (name, key, diff)
    return worst


@pytest.mark.slow
def test_two_processes_end_with_the_parameters_of_one(tmp_path):
    """DDP (2 processes) and FSDP2 (2 processes, parameters, gradients and AdamW states sharded) each end every loop
    with the parameters of one process; an SFT run stopped after its step-2 checkpoint and resumed ends where the
    uninterrupted one does under all three, and FSDP2's checkpoint holds whole tensors (the one-process format)."""
    from flows.cli import launch_command
    from models.checkpoint import latest_checkpoint, load_checkpoint
    from tests.distributed_entry import run

    model, tok = build_tiny_causal_lm(0)
    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)

    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": str(ENTRY.parents[1])}
    env.pop("WORLD_SIZE", None)

    def target(out: str) -> list[str]:
        return [str(ENTRY), str(model_dir), str(tmp_path / out), str(GLOBAL_BATCH // 2)]

    # what `didpo stage` runs for launch.num_processes 2 (and launch.config_file for FSDP2)
    launched = subprocess.Popen(
        launch_command(2, target("two")), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    run(model_dir, tmp_path / "one", GLOBAL_BATCH)  # meanwhile, one process with the whole batch
    output, _ = launched.communicate(timeout=600)
    assert launched.returncode == 0, output[-4000:]
    sharded = subprocess.run(
        launch_command(2, target("fsdp"), str(FSDP2_CONFIG)), env=env, capture_output=True, text=True, timeout=600
    )
    assert sharded.returncode == 0, (sharded.stdout + sharded.stderr)[-4000:]
    for out, world, is_sharded in (("one", "1", "False"), ("two", "2", "False"), ("fsdp", "2", "True")):
        assert (tmp_path / out / "world_size.txt").read_text() == world
        assert (tmp_path / out / "sharded.txt").read_text() == is_sharded

    one = trained(tmp_path / "one")
    print("max |one − ddp| per run:", assert_same_parameters(one, trained(tmp_path / "two")))
    print("max |one − fsdp2| per run:", assert_same_parameters(one, trained(tmp_path / "fsdp")))

    ckpt_one, ckpt_fsdp = (
        load_checkpoint(latest_checkpoint(tmp_path / out / "sft_resumed" / "checkpoints")) for out in ("one", "fsdp")
    )
    assert ckpt_one.step == ckpt_fsdp.step == 3
    state_one, state_fsdp = ckpt_one.objects["optimizer"]["state"], ckpt_fsdp.objects["optimizer"]["state"]
    assert state_one.keys() == state_fsdp.keys() and state_one
    for index, moments in state_one.items():
        for key in ("exp_avg", "exp_avg_sq"):
            a, b = moments[key], state_fsdp[index][key]
            assert type(b) is torch.Tensor and a.shape == b.shape  # whole tensors, not DTensor shards
            assert (a - b).abs().max().item() <= 1e-5 * a.abs().max().item() + 1e-9, (index, key)


@pytest.mark.parametrize(
    ("kind", "fsdp2", "env", "message"),
    [
        ("DEEPSPEED", False, {}, "DeepSpeed is not supported"),
        ("FSDP", False, {}, "set fsdp_config.fsdp_version: 2"),
        ("MULTI_CPU", False, {"ACCELERATE_USE_FSDP": "true"}, "asks for FSDP but Accelerate set up MULTI_CPU"),
    ],
)
def test_a_launch_the_loops_cannot_train_under_is_refused(monkeypatch, kind, fsdp2, env, message):
    """DeepSpeed, FSDP version 1, and an FSDP config that Accelerate silently turned into plain data parallelism on
    CPU processes each stop with the reason, before any training."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from models.distributed import _refuse_unsupported

    for key in ("ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match=message):
        _refuse_unsupported(SimpleNamespace(distributed_type=DistributedType[kind], is_fsdp2=fsdp2))
    for key in env:
        monkeypatch.delenv(key)
    _refuse_unsupported(SimpleNamespace(distributed_type=DistributedType.MULTI_GPU, is_fsdp2=False))  # DDP: fine
    _refuse_unsupported(SimpleNamespace(distributed_type=DistributedType.FSDP, is_fsdp2=True))  # FSDP2: fine


def test_the_fsdp2_config_file_is_passed_to_the_launcher_and_ddp_needs_none():
    """``launch.config_file`` reaches ``accelerate launch --config_file`` with the process count, precision "no" and a
    port given on the command line (they override the file's); without it the launch is DDP (``--multi_gpu``)."""
    from flows.cli import launch_command

    sharded = launch_command(8, ["-m", "flows.cli"], str(FSDP2_CONFIG))
    assert sharded[sharded.index("--config_file") + 1] == str(FSDP2_CONFIG) and "--multi_gpu" not in sharded
    assert sharded[sharded.index("--num_processes") + 1] == "8"
    assert sharded[sharded.index("--mixed_precision") + 1] == "no"
    plain = launch_command(8, ["-m", "flows.cli"])
    assert "--multi_gpu" in plain and "--config_file" not in plain
    import yaml

    config = yaml.safe_load(FSDP2_CONFIG.read_text())
    assert config["distributed_type"] == "FSDP" and config["fsdp_config"]["fsdp_version"] == 2


def test_one_process_needs_no_gathering():
    """Without a launcher the data-parallel helpers hand back what they were given: nothing is wrapped, copied or
    gathered."""
    from models.distributed import data_parallel

    model, _ = build_tiny_causal_lm(0)
    optimizer = torch.optim.AdamW(model.parameters())
    dp = data_parallel("cpu")
    assert (dp.world_size, dp.sharded) == (1, False)
    assert dp.prepare(model, optimizer) == (model, optimizer)
    assert dp.export_copy(model) is None and dp.exportable(model, None) is model
    with dp.full_params(model) as inside:
        assert inside is model
