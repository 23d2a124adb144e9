"""Data parallelism for the training loops through Hugging Face Accelerate: N processes, each on its shard of the
global batch, gradients averaged by PyTorch's DistributedDataParallel (bucketed, overlapped with the backward), or,
with an FSDP accelerate config, parameters, gradients and optimizer states sharded by PyTorch's FSDP2.

Started by ``accelerate launch`` (or ``torchrun``), which sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT``; `data_parallel` then builds the process's ``accelerate.Accelerator`` (gloo on
CPU, nccl on CUDA). Without them (``WORLD_SIZE`` unset or 1) it returns a one-process object whose methods do
nothing and whose `DataParallel.prepare` returns the module itself: one process behaves exactly as before. Which
parallelism runs is the launch's accelerate config (``launch.config_file``): none or ``MULTI_GPU`` is DDP,
``distributed_type: FSDP`` with ``fsdp_version: 2`` is FSDP2 (``configs/accelerate_fsdp2.yaml``); DeepSpeed and
FSDP version 1 are refused, as is an FSDP config on CPU processes (Accelerate would quietly run DDP there).

How the loops use it: the module that takes gradients and its optimizer go through `DataParallel.prepare` once
(DDP: Accelerate's ``prepare_model``; FSDP2: Accelerate's ``prepare``, which shards the module in place and points
the optimizer at the shards), and the loops clip and step through the optimizer's ``param_groups``. The training
forward goes through the trainer; everything else uses the inner module: peft's ``disable_adapter()`` for the
reference, evaluation, checkpoints. Under FSDP2 the KV-cached sampler and anything that calls an inner module run
inside `DataParallel.full_params` (every unit all-gathered, as TRL gathers ZeRO-3 weights around ``generate``),
checkpoints gather the sharded weights and AdamW moments whole (`models.checkpoint.full_tensor`: the one-process
format), and rank 0 exports from a CPU copy taken before sharding (`DataParallel.export_copy`/`exportable`).

The loss normalisers are the *global* counts, which the loops know before the backward pass: each rank divides its
summed loss by the global normaliser and multiplies it by `DataParallel.loss_scale` (N), so the mean over ranks that
DDP's all-reduce and FSDP2's reduce-scatter both take is the single-process gradient of the whole batch (up to
float32 summation order). Micro-batches before the last of an accumulated step run under `DataParallel.no_sync` (one
reduction per optimizer step).

Note: `accelerate launch --cpu --num_processes N` on one machine runs ONE process (accelerate 1.15's simple launcher;
several CPU processes need an MPI hostfile); ``accelerate launch --multi_gpu --num_processes N`` spawns N processes
through torchrun and, on a machine without CUDA (or with ``device: cpu``), they train on the CPU over gloo.

Source: Accelerate, "Accelerator", "Gradient accumulation" and "FSDP" guides (``prepare``, ``no_sync``, ``reduce``,
``gather_object``, ``FullyShardedDataParallelPlugin``); PyTorch ``DistributedDataParallel``
(``find_unused_parameters``) and FSDP2 (``fully_shard``, ``FSDPModule.unshard``/``reshard``, ``DTensor``).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from models.checkpoint import full_tensor, load_trainable_state_dict, trainable_state_dict

T = TypeVar("T")


@dataclass(frozen=True)
class DataParallel:
    """This process's place in the data-parallel group.

    Attributes:
        rank: 0 … world_size − 1; rank 0 writes checkpoints, exports and rollouts and calls ``emit``.
        world_size: processes in the group (1 = no distribution at all).
        device: the torch device this process trains on (``cuda:<LOCAL_RANK>`` for CUDA under a launcher).
        accelerator: the process's ``accelerate.Accelerator`` (None in one process).
        sharded: parameters, gradients and optimizer states sharded over the processes: FSDP2, chosen by the
            accelerate config file of the launch (``distributed_type: FSDP``, ``fsdp_version: 2``); else DDP.
    """

    rank: int = 0
    world_size: int = 1
    device: str = "cpu"
    accelerator: Any = None
    sharded: bool = False

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

    def prepare(self, module, optimizer):
        """``(trainer, optimizer)`` ready for data-parallel training, `optimizer` built over `module`'s parameters.

        One process: both as they are. DDP: Accelerate's ``prepare_model`` (rank 0's parameters broadcast to all),
        the optimizer as it is. FSDP2: Accelerate's ``prepare(module, optimizer)`` shards `module` in place (its
        parameters become ``DTensor`` shards; the trainer is `module` itself) and points the optimizer at the
        shards; the plain ``torch.optim`` optimizer is returned, not Accelerate's wrapper. Clip and step through
        the returned optimizer's ``param_groups`` (the old parameter objects are gone under FSDP2)."""
        if self.world_size == 1:
            return module, optimizer
        if not self.sharded:
            return self.accelerator.prepare_model(module), optimizer
        module, optimizer = self.accelerator.prepare(module, optimizer)
        return module, optimizer.optimizer

    @contextlib.contextmanager
    def full_params(self, module):
        """Inside, every parameter of `module` (the trainer `prepare` returned: FSDP2's root) is whole on every
        process, so KV-cached sampling and any forward through an inner module work as in one process; FSDP2's
        units are all-gathered on entry (``unshard``, resharding after forward off) and resharded on exit. Nothing
        is done without sharding. Every process must enter it (the gathers are collectives). Source: FSDP2's
        ``FSDPModule.unshard``/``reshard`` (PyTorch), as TRL gathers ZeRO-3 weights around ``generate``."""
        if not self.sharded:
            yield module
            return
        from torch.distributed.fsdp import FSDPModule

        units = [m for m in module.modules() if isinstance(m, FSDPModule)]
        # FSDP2 picks its root at the first forward, which must go through the root: sampling before any training
        # forward (the prompt-pool screening) calls inner modules, so settle the root here (private, idempotent).
        units[0]._get_fsdp_state()._lazy_init()
        for unit in units:
            unit.set_reshard_after_forward(False, recurse=False)
            unit.unshard()
        try:
            yield module
        finally:
            for unit in units:
                unit.reshard()
                unit.set_reshard_after_forward(self.accelerator.state.fsdp_plugin.reshard_after_forward, recurse=False)

    def export_copy(self, module):
        """Rank 0's copy of `module` (taken before `prepare`, on the CPU) to export from at the end when training is
        sharded: FSDP2 shards in place, and merging adapters into shards is not possible. None otherwise."""
        if not (self.sharded and self.is_main):
            return None
        return copy.deepcopy(module).to("cpu")

    def exportable(self, module, export_copy):
        """The model rank 0 exports: `module` itself, or under sharding `export_copy` with the trained weights
        gathered into it (every process must call this: the gather is collective); None on other ranks then."""
        if not self.sharded:
            return module

        weights = trainable_state_dict(module)
        if export_copy is None:
            return None
        load_trainable_state_dict(export_copy, weights)
        return export_copy

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


def clip_grad_norm(params, max_norm: float) -> float:
    """``torch.nn.utils.clip_grad_norm_`` over `params`, in one process, under DDP and under FSDP2 (whose sharded
    gradients give a replicated ``DTensor`` norm, read whole here); returns the norm before clipping."""
    import torch

    return float(full_tensor(torch.nn.utils.clip_grad_norm_(params, max_norm)))


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
    _refuse_unsupported(accelerator)
    return DataParallel(
        accelerator.process_index,
        accelerator.num_processes,
        str(accelerator.device),
        accelerator,
        sharded=accelerator.is_fsdp2,
    )


def _refuse_unsupported(accelerator) -> None:
    """Stop on a launch this code does not train correctly under, instead of silently training otherwise.

    Raises:
        ValueError: an accelerate config asks for DeepSpeed (not supported: use FSDP2), for FSDP version 1 (use
            ``fsdp_version: 2``), or for FSDP on CPU processes (Accelerate falls back to plain data parallelism there
            without a word).
    """
    from accelerate.utils import DistributedType

    kind = accelerator.distributed_type
    if kind == DistributedType.DEEPSPEED or os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
        raise ValueError(
            "DeepSpeed is not supported by the training loops; shard with FSDP2 instead (an accelerate config with "
            "distributed_type: FSDP and fsdp_config: {fsdp_version: 2})"
        )
    if kind == DistributedType.FSDP and not accelerator.is_fsdp2:
        raise ValueError("FSDP version 1 is not supported by the training loops: set fsdp_config.fsdp_version: 2")
    if kind != DistributedType.FSDP and os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true":
        raise ValueError(
            f"the accelerate config asks for FSDP but Accelerate set up {kind.value} (it runs FSDP on GPUs only; "
            "these processes train on the CPU): use a config with distributed_type: MULTI_GPU here"
        )
