"""Data parallelism for the training loops: N processes, each on its shard of the global batch, gradients summed.

Started by ``accelerate launch`` (or ``torchrun``), which sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT``; `data_parallel` then joins the process group (gloo on CPU, nccl on CUDA).
Without them (``WORLD_SIZE`` unset or 1) it returns a single-process object whose methods do nothing, and
torch.distributed is never touched: one process behaves exactly as before.

Why plain ``torch.distributed`` collectives rather than wrapping the model in DDP (``Accelerator.prepare``): the loops
call peft's ``disable_adapter()`` for the reference, the sampler's own KV-cached decoding and ``merge_and_unload`` on
export, none of which go through a DDP wrapper; and the loss normalisers below need the *global* counts, which the
loops know before the backward pass. So each rank divides its summed loss by the global normaliser, and
`all_reduce_gradients` sums the gradients once per optimizer step: the sum over ranks is then exactly the gradient of
the single-process loss over the whole batch (up to float32 summation order).

Note: `accelerate launch --cpu --num_processes N` on one machine runs ONE process (accelerate 1.15's simple launcher;
several CPU processes need an MPI hostfile); ``accelerate launch --multi_gpu --num_processes N`` spawns N processes
through torchrun and, on a machine without CUDA (or with ``device: cpu``), they train on the CPU over gloo.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class DataParallel:
    """This process's place in the data-parallel group.

    Attributes:
        rank: 0 … world_size − 1; rank 0 writes checkpoints, exports and rollouts and calls ``emit``.
        world_size: processes in the group (1 = no distribution at all).
        device: the torch device this process trains on (``cuda:<LOCAL_RANK>`` for CUDA under a launcher).
    """

    rank: int = 0
    world_size: int = 1
    device: str = "cpu"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, items: Sequence[T]) -> Sequence[T]:
        """This rank's contiguous slice of `items` (a list or a 1-D tensor): sizes differ by at most one, the first
        ``len % world_size`` ranks take one more (``torch.tensor_split``'s rule); possibly empty."""
        n = len(items)
        base, extra = divmod(n, self.world_size)
        start = self.rank * base + min(self.rank, extra)
        return items[start : start + base + (self.rank < extra)]

    def all_reduce_gradients(self, params: Sequence) -> None:
        """Sum every parameter's gradient over the ranks, in place (a missing gradient counts as zeros: a rank whose
        shard was empty still takes part). One flat all-reduce per call."""
        if self.world_size == 1:
            return
        import torch
        import torch.distributed as dist

        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p.grad))
            offset += p.numel()

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
        import torch.distributed as dist

        keys = sorted(values)
        flat = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=self._comm_device)
        dist.all_reduce(flat)
        return dict(zip(keys, flat.tolist(), strict=True))

    def gather(self, items: list) -> list:
        """Every rank's `items` (picklable objects), concatenated in rank order, on every rank."""
        if self.world_size == 1:
            return list(items)
        import torch.distributed as dist

        out: list = [None] * self.world_size
        dist.all_gather_object(out, list(items))
        return [x for part in out for x in part]

    def broadcast_parameters(self, params: Sequence) -> None:
        """Copy rank 0's parameter values to every rank (the same seed already gives the same initialisation;
        this makes it a guarantee)."""
        if self.world_size == 1:
            return
        import torch.distributed as dist

        for p in params:
            dist.broadcast(p.data, src=0)

    def barrier(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier()

    @property
    def _comm_device(self) -> str:
        return self.device if self.device.startswith("cuda") else "cpu"


def data_parallel(device: str) -> DataParallel:
    """The data-parallel group of this process, joining it on first use.

    Args:
        device: the resolved training device ("cpu", "cuda", "cuda:1", ...). Under a launcher with CUDA, "cuda" becomes
            ``cuda:<LOCAL_RANK>`` and the backend nccl; otherwise the backend is gloo.

    Returns:
        a `DataParallel`; ``world_size`` 1 (and torch.distributed untouched) when ``WORLD_SIZE`` is unset or 1.

    Raises:
        ValueError: ``WORLD_SIZE`` > 1 but ``RANK`` is missing (not started by a launcher).
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DataParallel(0, 1, device)
    if "RANK" not in os.environ:
        raise ValueError("WORLD_SIZE > 1 but RANK is unset: start the run with `accelerate launch` or `torchrun`")
    import torch
    import torch.distributed as dist

    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device == "cuda":
        device = f"cuda:{local_rank}"
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    return DataParallel(rank, world_size, device)
