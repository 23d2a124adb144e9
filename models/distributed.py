"""Data parallelism for the training loops through Hugging Face Accelerate: N processes, each on its shard of the
global batch, gradients averaged by PyTorch's DistributedDataParallel (bucketed, overlapped with the backward).

Started by ``accelerate launch`` (or ``torchrun``), which sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT``; `data_parallel` then builds the process's ``accelerate.Accelerator`` (gloo on
CPU, nccl on CUDA). Without them (``WORLD_SIZE`` unset or 1) it returns a one-process object whose methods do
nothing and whose `wrap` returns the module itself: one process behaves exactly as before.

How the loops use it: the module that takes gradients is wrapped once (`DataParallel.wrap`, Accelerate's
``prepare_model``: DDP, which also broadcasts rank 0's parameters); the training forward goes through the wrapper,
everything else (peft's ``disable_adapter()`` for the reference, the sampler's KV-cached decoding, evaluation,
``merge_and_unload`` on export, checkpoints) uses the unwrapped module, which shares its parameters. The loss
normalisers are the *global* counts, which the loops know before the backward pass: each rank divides its summed
loss by the global normaliser and multiplies it by `DataParallel.loss_scale` (N), so DDP's mean over ranks is the
single-process gradient of the whole batch (up to float32 summation order). Micro-batches before the last of an
accumulated step run under `DataParallel.no_sync` (one all-reduce per optimizer step).

Note: `accelerate launch --cpu --num_processes N` on one machine runs ONE process (accelerate 1.15's simple launcher;
several CPU processes need an MPI hostfile); ``accelerate launch --multi_gpu --num_processes N`` spawns N processes
through torchrun and, on a machine without CUDA (or with ``device: cpu``), they train on the CPU over gloo.

Source: Accelerate, "Accelerator" and "Gradient accumulation" guides (``prepare_model``, ``no_sync``, ``reduce``,
``gather_object``); PyTorch ``DistributedDataParallel`` (``find_unused_parameters``).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class DataParallel:
    """This process's place in the data-parallel group.

    Attributes:
        rank: 0 … world_size − 1; rank 0 writes checkpoints, exports and rollouts and calls ``emit``.
        world_size: processes in the group (1 = no distribution at all).
        device: the torch device this process trains on (``cuda:<LOCAL_RANK>`` for CUDA under a launcher).
        accelerator: the process's ``accelerate.Accelerator`` (None in one process).
    """

    rank: int = 0
    world_size: int = 1
    device: str = "cpu"
    accelerator: Any = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def loss_scale(self) -> int:
        """The factor on each rank's loss (already divided by the global normaliser) that turns DDP's mean of the
        gradients over ranks into their sum: ``world_size``."""
        return self.world_size

    def shard(self, items: Sequence[T]) -> Sequence[T]:
        """This rank's contiguous slice of `items` (a list or a 1-D tensor): sizes differ by at most one, the first
        ``len % world_size`` ranks take one more (``torch.tensor_split``'s rule); possibly empty."""
        n = len(items)
        base, extra = divmod(n, self.world_size)
        start = self.rank * base + min(self.rank, extra)
        return items[start : start + base + (self.rank < extra)]

    def wrap(self, module):
        """`module` ready for data-parallel training: Accelerate's ``prepare_model`` (DDP over the group, rank 0's
        parameters broadcast to all) when there are several processes; the module itself in one."""
        if self.world_size == 1:
            return module
        return self.accelerator.prepare_model(module)

    def no_sync(self, wrapped, last: bool):
        """A context for one micro-batch's backward: gradients are only accumulated locally unless it is the `last`
        micro-batch of the optimizer step (then DDP all-reduces them)."""
        if self.world_size == 1 or last:
            return contextlib.nullcontext()
        return self.accelerator.no_sync(wrapped)

    def sum(self, value: float) -> float:
        """``value`` summed over the ranks (float64)."""
        if self.world_size == 1:
            return value
        return self.sum_dict({"v": value})["v"]

    def sum_dict(self, values: dict[str, float]) -> dict[str, float]:
        """Every value summed over the ranks (float64; every rank must pass the same keys)."""
        if self.world_size == 1:
            return values
        import torch

        keys = sorted(values)
        flat = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=self.accelerator.device)
        flat = self.accelerator.reduce(flat, reduction="sum")
        return dict(zip(keys, flat.tolist(), strict=True))

    def gather(self, items: list) -> list:
        """Every rank's `items` (picklable objects), concatenated in rank order, on every rank."""
        if self.world_size == 1:
            return list(items)
        from accelerate.utils import gather_object

        return list(gather_object(list(items)))

    def barrier(self) -> None:
        if self.world_size > 1:
            self.accelerator.wait_for_everyone()


def is_main_process() -> bool:
    """False in a process of rank > 0 under a launcher (``RANK`` set by torchrun / ``accelerate launch``): rank 0
    alone writes outputs, logs and talks to the tracking and orchestration servers."""
    return int(os.environ.get("RANK", "0")) == 0


@functools.cache
def _accelerator(cpu: bool):
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs

    # mixed precision stays the loops' own (models.training.autocast_factory); an RL step may leave the policy's
    # adapters without gradient (critic warm-up), so DDP looks for unused parameters.
    return Accelerator(
        cpu=cpu,
        mixed_precision="no",
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)],
    )


def data_parallel(device: str) -> DataParallel:
    """The data-parallel group of this process, joining it on first use.

    Args:
        device: the resolved training device ("cpu", "cuda", "cuda:1", ...). Under a launcher with CUDA, "cuda" becomes
            ``cuda:<LOCAL_RANK>`` and the backend nccl; otherwise the backend is gloo.

    Returns:
        a `DataParallel`; ``world_size`` 1 (and neither Accelerate nor torch.distributed touched) when
        ``WORLD_SIZE`` is unset or 1.

    Raises:
        ValueError: ``WORLD_SIZE`` > 1 but ``RANK`` is missing (not started by a launcher).
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DataParallel(0, 1, device)
    if "RANK" not in os.environ:
        raise ValueError("WORLD_SIZE > 1 but RANK is unset: start the run with `accelerate launch` or `torchrun`")
    accelerator = _accelerator(cpu=not device.startswith("cuda"))
    return DataParallel(accelerator.process_index, accelerator.num_processes, str(accelerator.device), accelerator)
