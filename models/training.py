"""The training toolkit the SFT, DPO and RL loops share: plain functions and two small state holders, no Trainer.

Each loop (`models.sft.train_sft`, `models.dpo.train_dpo`, `models.rl.train_rl`) keeps its step body inline and
reads top to bottom, as cleanrl's single-file loops do; what they have in common lives here, once:

- `autocast_factory`: bf16 autocast where the hardware runs it natively (or as configured);
- `adamw`, `cosine_schedule`: the optimizer (no weight decay on biases and norms) and the warm-up + cosine schedule;
- `DataOrder`: the seeded, checkpointed stream of example indices;
- `EarlyStopping`: best-step selection and early stopping on a held-out loss;
- `open_checkpoints`, `restore_loop_state`, `save_loop_state`: the one resume policy (resume the latest checkpoint
  of *this* run, refuse another run's, never delete a previous run's checkpoints before this run has saved its own)
  and the state every loop checkpoints (trainable weights, optimizer, schedule, data order, early stopping, RNGs);
- `resume_or_start_over`: what a stage does when the checkpoint it finds belongs to another run;
- `export`: the LoRA adapter and the merged checkpoint, each written atomically.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tqdm.auto import tqdm

from models.checkpoint import (
    Checkpoint,
    CheckpointMismatchError,
    atomic_directory,
    capture_rng_state,
    full_optimizer_state,
    is_sharded,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    load_full_optimizer_state,
    load_trainable_state_dict,
    restore_rng_state,
    save_checkpoint,
    trainable_state_dict,
)

if TYPE_CHECKING:
    import torch

T = TypeVar("T")

# ------------------------------------------------------------------------------------------------ precision


def native_bf16(device: str) -> bool:
    """Whether `device` runs bf16 arithmetic natively: a CUDA device with bf16 support, or a CPU with AVX512-BF16 or
    AMX (``torch.cpu._is_avx512_bf16_supported`` / ``_is_amx_tile_supported``; oneDNN emulates bf16 elsewhere)."""
    import torch

    kind = device.split(":")[0]
    if kind == "cuda":
        return torch.cuda.is_bf16_supported()
    if kind == "cpu":
        return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return False


def autocast_factory(mixed_precision: str, device: str, auto_on_cpu: bool = False) -> Callable[[], Any] | None:
    """A bf16 autocast context factory, or None (train in the weights' dtype; the weights stay fp32 either way).

    ``auto``: bf16 on CUDA devices that support it; on a CPU only with ``auto_on_cpu`` and native bf16 (`native_bf16`),
    none elsewhere. SFT passes ``auto_on_cpu=True``: on an AMD EPYC with AVX512-BF16 one SmolLM2-135M SFT step (2 × 4
    examples, LoRA dropout 0) took 17.1 s against 24.7 s in fp32, its loss within 5e-4 relative
    (``benchmarks/bench_sft_recipe.py --bf16``, 2026-12-02, 633f650). RL passes it too since 2026-12-07
    (benchmarks/bench_rl_update.py; tests/test_rl_update_paths.py holds bf16 to float32 within 0.05 nats per token). DPO
    keeps fp32 on CPU: its log-prob ratios (policy against reference) were measured in fp32 only. ``bf16``: on any
    device; on a CPU without native bf16 it warns, since oneDNN then emulates bf16: measured on an AMD EPYC (Zen 3,
    AVX2), one SFT step did not finish in 330 s against 27 s in fp32 (docs/results/bench_sft_recipe_bf16.txt). ``no``:
    none.
    """
    import torch

    kind = device.split(":")[0]
    if mixed_precision == "auto":
        use = native_bf16(device) and (kind == "cuda" or (kind == "cpu" and auto_on_cpu))
    else:
        use = mixed_precision == "bf16"
    if use and kind == "cpu" and not native_bf16(device):
        warnings.warn(
            "mixed_precision=bf16 on a CPU without AVX512-BF16 or AMX: bf16 is emulated and a step is many times "
            "slower than float32 (measured > 10x on an AVX2 CPU); use mixed_precision: auto or no here",
            stacklevel=2,
        )
    return (lambda: torch.autocast(kind, dtype=torch.bfloat16)) if use else None


# ------------------------------------------------------------------------------------ optimizer and schedule


def adamw(model, learning_rate: float, weight_decay: float) -> tuple[torch.optim.AdamW, list[torch.nn.Parameter]]:
    """AdamW over the trainable parameters: `weight_decay` on matrices (ndim ≥ 2), none on biases and norm scales.

    Returns ``(optimizer, params)``; params are the trainable parameters (for clipping and gradient all-reduce).

    Raises:
        ValueError: the model has no trainable parameters.
    """
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=learning_rate), params


def cosine_schedule(optimizer, warmup_ratio: float, total_steps: int):
    """Linear warm-up over ``ceil(warmup_ratio * total_steps)`` steps, then cosine decay to 0 at `total_steps`
    (``transformers.get_cosine_schedule_with_warmup``, the schedule of TRL's SFT and DPO trainers)."""
    from transformers import get_cosine_schedule_with_warmup

    return get_cosine_schedule_with_warmup(optimizer, math.ceil(warmup_ratio * total_steps), total_steps)


# --------------------------------------------------------------------------------- data order, early stopping


class DataOrder:
    """An endless, seeded stream of example indices: a fresh permutation (``torch.randperm`` from its own
    generator) for every epoch, so batches may span an epoch boundary. Its position is checkpointed."""

    def __init__(self, n: int, seed: int):
        import torch

        if n < 1:
            raise ValueError("no training examples")
        self.n = n
        self.generator = torch.Generator().manual_seed(seed)
        self.epoch = 0
        self.cursor = 0
        self.order = self._permutation()

    def _permutation(self) -> list[int]:
        import torch

        return torch.randperm(self.n, generator=self.generator).tolist()

    def take(self, k: int) -> list[int]:
        """The next `k` indices."""
        out = []
        while len(out) < k:
            if self.cursor == self.n:
                self.order, self.cursor, self.epoch = self._permutation(), 0, self.epoch + 1
            out.append(self.order[self.cursor])
            self.cursor += 1
        return out

    @property
    def epochs_done(self) -> float:
        """Epochs consumed, fractional."""
        return self.epoch + self.cursor / self.n

    def state_dict(self) -> dict:
        """Position in the stream (JSON); the generator state is checkpointed with the other RNGs."""
        return {"n": self.n, "epoch": self.epoch, "cursor": self.cursor, "order": self.order}

    def load_state_dict(self, state: dict) -> None:
        if state["n"] != self.n:
            raise ValueError(f"data order was saved for {state['n']} examples, not {self.n}")
        self.epoch, self.cursor, self.order = state["epoch"], state["cursor"], list(state["order"])


class EarlyStopping:
    """The best held-out loss so far (lower is better; a tie keeps the earlier step) and early stopping:
    `should_stop` after `patience` evaluations in a row without a strictly lower loss (patience 0 never stops)."""

    def __init__(self, patience: int):
        self.patience = patience
        self.best: float | None = None
        self.best_step: int | None = None
        self.bad_evals = 0

    def update(self, loss: float, step: int) -> bool:
        """Record an evaluation; True when it is a new best."""
        if self.best is None or loss < self.best:
            self.best, self.best_step, self.bad_evals = loss, step, 0
            return True
        self.bad_evals += 1
        return False

    @property
    def should_stop(self) -> bool:
        return self.patience > 0 and self.bad_evals >= self.patience

    def state_dict(self) -> dict:
        return {"best": self.best, "best_step": self.best_step, "bad_evals": self.bad_evals}

    def load_state_dict(self, state: dict) -> None:
        self.best, self.best_step, self.bad_evals = state["best"], state["best_step"], state["bad_evals"]


# ------------------------------------------------------------------------------------------ resume policy


def open_checkpoints(root: Path, resume: bool, fingerprint: str, other_run: str) -> tuple[Checkpoint | None, list]:
    """The resume policy of every loop: ``(checkpoint to resume or None, superseded)``.

    ``resume=True``: the latest checkpoint under `root`, which must carry this run's `fingerprint` (a hash of the
    config and the data); nothing is superseded. ``resume=False``: no checkpoint is loaded, and the existing ones are
    returned as ``superseded``: `save_loop_state` deletes them once this run has written its first checkpoint, never
    before (a run that dies earlier leaves the previous run resumable).

    Raises:
        models.checkpoint.CheckpointMismatchError: the latest checkpoint was written by another run; the message
            says it came from a run with `other_run` (e.g. "another sft config or other data").
    """
    root = Path(root)
    latest = latest_checkpoint(root) if resume else None
    superseded = [] if resume else list_checkpoints(root)
    ckpt = load_checkpoint(latest) if latest is not None else None
    if ckpt is not None and ckpt.state["fingerprint"] != fingerprint:
        raise CheckpointMismatchError(
            f"{latest} was written by a run with {other_run}; delete {root} (or pass resume=False) to start over"
        )
    return ckpt, superseded


def restore_loop_state(
    ckpt: Checkpoint,
    model,
    optimizer,
    order: DataOrder,
    generators: Mapping[str, torch.Generator],
    scheduler=None,
    stopper: EarlyStopping | None = None,
) -> None:
    """Put the state `save_loop_state` wrote back: trainable weights, optimizer, schedule (when the loop has one),
    data-order position, early stopping (when the loop has it) and every RNG (`generators`: the loop's own)."""
    load_trainable_state_dict(model, ckpt.tensors["trainable"])
    load_full_optimizer_state(optimizer, ckpt.objects["optimizer"])
    if scheduler is not None:
        scheduler.load_state_dict(ckpt.objects["scheduler"])
    order.load_state_dict(ckpt.state["data_order"])
    if stopper is not None:
        stopper.load_state_dict(ckpt.state["early_stopping"])
    restore_rng_state(ckpt.objects["rng"], generators)


def save_loop_state(
    root: Path,
    step: int,
    model,
    optimizer,
    order: DataOrder,
    generators: Mapping[str, torch.Generator],
    fingerprint: str,
    superseded: list,
    scheduler=None,
    stopper: EarlyStopping | None = None,
    tensors: Mapping[str, Mapping[str, torch.Tensor]] | None = None,
    state: Mapping[str, Any] | None = None,
    write: bool = True,
) -> Path | None:
    """Write the exact-resume checkpoint of `step` (`models.checkpoint.save_checkpoint`, atomic): the loop state
    `restore_loop_state` reads, plus the loop's own extra tensor groups and JSON state. The first save of a run that
    started over deletes the `superseded` checkpoints (and empties the list). Returns the checkpoint directory.

    Data parallel: every process calls it and only the one with ``write=True`` (rank 0) writes; the others return
    None, after taking part in gathering the sharded weights and optimizer states (FSDP2: a collective)."""
    if not (write or is_sharded(model)):  # nothing to write, nothing to take part in
        superseded.clear()
        return None
    objects = {"optimizer": full_optimizer_state(optimizer), "rng": capture_rng_state(generators)}
    trainable = trainable_state_dict(model)
    if not write:  # its part of the gathers done
        superseded.clear()
        return None
    if scheduler is not None:
        objects["scheduler"] = scheduler.state_dict()
    loop_state = {"fingerprint": fingerprint, "data_order": order.state_dict()}
    if stopper is not None:
        loop_state["early_stopping"] = stopper.state_dict()
    path = save_checkpoint(
        root,
        step,
        tensors={"trainable": trainable, **(tensors or {})},
        objects=objects,
        state={**loop_state, **(state or {})},
        supersedes=superseded,
    )
    superseded.clear()
    tqdm.write(f"checkpoint: {path} (step {step})")  # the resume point, said where the progress bar is
    return path


def resume_or_start_over(run: Callable[[bool], T]) -> T:
    """``run(resume=True)``; when the checkpoint it finds belongs to another run (`CheckpointMismatchError`: another
    config or other data, i.e. a new run rather than a resumed one), ``run(resume=False)``, which starts over and
    deletes that checkpoint only once it has saved its own. `run` loads its own model: the first attempt may have
    wrapped it in adapters before the mismatch was found."""
    try:
        return run(True)
    except CheckpointMismatchError:
        return run(False)


# ----------------------------------------------------------------------------------------------------- export


def export(model, tokenizer, out_dir: Path, lora: bool) -> tuple[Path | None, Path]:
    """Write ``out_dir/adapter/`` (LoRA only) and ``out_dir/merged/`` (the adapters merged in, with the tokenizer),
    each atomically (`models.checkpoint.atomic_directory`). Returns ``(adapter_path or None, merged_path)``.
    With LoRA the model is merged (``merge_and_unload``) on the way."""
    out_dir = Path(out_dir)
    adapter_path = None
    if lora:
        adapter_path = out_dir / "adapter"
        with atomic_directory(adapter_path) as tmp:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        model = model.merge_and_unload()
    merged_path = out_dir / "merged"
    with atomic_directory(merged_path) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return adapter_path, merged_path
