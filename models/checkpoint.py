"""Exact-resume checkpoints for the training loops (SFT, DPO, DiDPO).

A checkpoint is one directory ``<root>/checkpoint-<step:08d>/`` holding

- ``<group>.safetensors`` for each named group of tensors (e.g. the trainable weights, the best weights),
- ``<name>.pt`` for each named object state (optimizer, scheduler, RNG states), written with ``torch.save``
  and read back with ``torch.load(weights_only=True)`` (plain containers of tensors and numbers only),
- ``state.json``: the loop's own counters (global step, data-order position, early-stopping state, history).

Writes are atomic: everything goes to a hidden temporary sibling directory, is fsync'ed, and the directory is
renamed into place, so a crash never leaves a half-written checkpoint that `latest_checkpoint` would pick up.
Older checkpoints are pruned after a successful write (``keep_last``). A run that starts over never deletes the
previous run's checkpoints up front: it passes them (`list_checkpoints`, taken at its start) to its first
`save_checkpoint` as ``supersedes``, which deletes them only once that checkpoint is complete, so a run that dies
before its first save leaves the previous run resumable.

Exact resume also needs every random number generator: `capture_rng_state` / `restore_rng_state` cover
Python's `random`, NumPy's global generator, torch's CPU and CUDA generators, and any named
``torch.Generator`` a loop owns (e.g. its data-order generator).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

_CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d{8})$")


class CheckpointMismatchError(ValueError):
    """A checkpoint exists but was written by a different run (other config or data): resuming it would not
    continue this run. Start over (e.g. ``resume=False``) or delete the checkpoint directory."""


@dataclass
class Checkpoint:
    """A loaded checkpoint.

    Attributes:
        path: the checkpoint directory.
        step: the global step it was written at.
        tensors: tensor groups, ``{group: {name: tensor}}`` (CPU tensors).
        objects: object states, ``{name: state}`` (e.g. ``optimizer.state_dict()``), mapped to
            ``map_location``.
        state: the JSON state the loop wrote.
    """

    path: Path
    step: int
    tensors: dict[str, dict[str, torch.Tensor]]
    objects: dict[str, Any]
    state: dict[str, Any]


def set_seed(seed: int) -> None:
    """Seed Python's `random`, NumPy's global generator and torch (CPU and every CUDA device)."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds all CUDA devices


def capture_rng_state(generators: Mapping[str, torch.Generator] | None = None) -> dict[str, Any]:
    """Every RNG state a training step can touch, as plain containers (safe for ``weights_only`` loading).

    Args:
        generators: extra generators owned by the loop, by name (e.g. ``{"data": data_generator}``).

    Returns:
        ``{"python": ..., "numpy": ..., "torch": ByteTensor, "cuda": [ByteTensor, ...],
        "generators": {name: ByteTensor}}``.
    """
    import numpy as np
    import torch

    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": [version, list(internal), gauss],
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "generators": {k: g.get_state() for k, g in (generators or {}).items()},
    }


def restore_rng_state(state: Mapping[str, Any], generators: Mapping[str, torch.Generator] | None = None) -> None:
    """Restore what `capture_rng_state` captured.

    Raises:
        KeyError: a generator in `generators` has no saved state.
        RuntimeError: CUDA states were saved but this process sees a different number of CUDA devices.
    """
    import numpy as np
    import torch

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        if not torch.cuda.is_available() or torch.cuda.device_count() != len(state["cuda"]):
            raise RuntimeError(
                f"checkpoint holds RNG states for {len(state['cuda'])} CUDA devices; this process sees "
                f"{torch.cuda.device_count() if torch.cuda.is_available() else 0}"
            )
        torch.cuda.set_rng_state_all(state["cuda"])
    for key, generator in (generators or {}).items():
        generator.set_state(state["generators"][key])


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole value of `tensor`: a sharded ``DTensor`` (FSDP2's parameters and optimizer states) is all-gathered,
    so every process of its mesh must call this in the same order; any other tensor is returned as is."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether any parameter of `model` is a ``DTensor`` shard (FSDP2): its whole value needs every process."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def trainable_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """CPU copies of the parameters that require grad, by name (LoRA adapters only, or every weight in full
    fine-tuning). Tied parameters appear once, under their first name. Sharded parameters (FSDP2) are gathered whole
    (`full_tensor`: a collective, every process calls it), so the result is the same in one process and in N."""
    return {n: full_tensor(p.detach()).to("cpu", copy=True) for n, p in model.named_parameters() if p.requires_grad}


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 (hex) over the names, dtypes, shapes and bytes of every parameter and buffer of `model`, in name order.

    What a resume fingerprint needs to tell two starting checkpoints apart: a run resumed on other initial weights
    (e.g. a new DPO export under an old RL checkpoint) would silently mix two models. ≈ 1 s for 135 M parameters.
    """
    import hashlib

    import torch

    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def load_trainable_state_dict(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy `state` into the model's trainable parameters, in place (dtype and device of the model kept).

    Raises:
        KeyError: the names differ from the model's trainable parameters (missing or unexpected keys).
    """
    import torch

    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if set(params) != set(state):
        missing, unexpected = sorted(set(params) - set(state)), sorted(set(state) - set(params))
        raise KeyError(f"trainable weights do not match: missing {missing[:5]}, unexpected {unexpected[:5]}")
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(_like(param, state[name]))


def _like(param: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """`value` (a whole tensor of `param`'s shape) placed as `param` is: this process's shard of it when `param` is a
    sharded ``DTensor`` (every process holds the whole value, so nothing is communicated), else `value` itself."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not isinstance(param, DTensor):
        return value
    value = value.to(device=param.device, dtype=param.dtype)
    return distribute_tensor(value, param.device_mesh, param.placements, src_data_rank=None)


def full_optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``optimizer.state_dict()`` with every sharded state (FSDP2's ``exp_avg`` …) gathered whole (`full_tensor`:
    every process calls it): the format one process writes, so a checkpoint resumes under any number of processes."""
    state = optimizer.state_dict()
    full = {
        i: {k: full_tensor(v) if hasattr(v, "shape") else v for k, v in s.items()} for i, s in state["state"].items()
    }
    return {**state, "state": full}


def load_full_optimizer_state(optimizer: torch.optim.Optimizer, state: Mapping[str, Any]) -> None:
    """The inverse of `full_optimizer_state`: each whole state tensor shaped like its parameter is cut to this
    process's shard when the parameter is a sharded ``DTensor``, then ``optimizer.load_state_dict``."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    placed = {}
    for i, s in state["state"].items():
        param = params[int(i)]
        placed[i] = {
            k: _like(param, v) if hasattr(v, "shape") and tuple(v.shape) == tuple(param.shape) else v
            for k, v in s.items()
        }
    optimizer.load_state_dict({**state, "state": placed})


@contextmanager
def atomic_directory(final: Path) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it replaces `final` (any existing one) by a rename.

    On an exception the temporary directory is removed and `final` is left untouched. Files written inside
    are fsync'ed before the rename, so the new directory is complete once it is visible.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield tmp
        for file in tmp.rglob("*"):
            if file.is_file():
                with open(file, "rb") as handle:
                    os.fsync(handle.fileno())
        old = final.parent / f".old-{final.name}-{os.getpid()}"
        if final.exists():
            os.rename(final, old)
        os.rename(tmp, final)
        if old.exists():
            shutil.rmtree(old)
        _fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def checkpoint_path(root: Path, step: int) -> Path:
    """``<root>/checkpoint-<step:08d>``."""
    return Path(root) / f"checkpoint-{step:08d}"


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoint directories under `root`, oldest step first (temporary directories excluded)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _CHECKPOINT_NAME.match(p.name)]
    return sorted(found, key=lambda p: int(_CHECKPOINT_NAME.match(p.name).group(1)))


def latest_checkpoint(root: Path) -> Path | None:
    """The checkpoint with the highest step under `root`, or None."""
    found = list_checkpoints(root)
    return found[-1] if found else None


def save_checkpoint(
    root: Path,
    step: int,
    *,
    tensors: Mapping[str, Mapping[str, torch.Tensor]],
    objects: Mapping[str, Any],
    state: Mapping[str, Any],
    keep_last: int = 1,
    supersedes: Iterable[Path] = (),
) -> Path:
    """Write checkpoint `step` atomically under `root`, delete `supersedes`, then all but the newest `keep_last`.

    Args:
        root: the directory holding the checkpoints (created if missing).
        step: the global step (names the directory).
        tensors: tensor groups, each saved as ``<group>.safetensors`` (moved to CPU, made contiguous).
        objects: object states (state dicts of plain containers + tensors), each saved as ``<name>.pt``.
        state: JSON-serialisable loop state, saved as ``state.json`` (``step`` is added).
        keep_last: how many checkpoints to keep, at least 1.
        supersedes: another run's checkpoints that this run replaces (a run starting over passes
            `list_checkpoints` taken at its start to its first save): deleted only once this checkpoint is complete,
            and before pruning, so their (possibly higher) steps neither outlive nor outrank it. Nothing is deleted
            when the write fails.

    Returns:
        the checkpoint directory.

    Raises:
        ValueError: `keep_last` < 1, or a group/object named ``state``.
        TypeError: `state` is not JSON-serialisable (nothing is written then).
    """
    import torch
    from safetensors.torch import save_file

    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    if "state" in tensors or "state" in objects:
        raise ValueError("'state' is reserved for state.json")
    payload = json.dumps({**state, "step": step}, indent=1)
    final = checkpoint_path(root, step)
    with atomic_directory(final) as tmp:
        for group, named in tensors.items():
            save_file({k: v.detach().to("cpu").contiguous() for k, v in named.items()}, tmp / f"{group}.safetensors")
        for name, obj in objects.items():
            torch.save(obj, tmp / f"{name}.pt")
        (tmp / "state.json").write_text(payload)
    for old in supersedes:
        if Path(old) != final:  # a superseded checkpoint of the same step was replaced by the rename already
            shutil.rmtree(old, ignore_errors=True)
    for old in list_checkpoints(root)[:-keep_last]:
        shutil.rmtree(old)
    return final


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Read a checkpoint written by `save_checkpoint`.

    Raises:
        FileNotFoundError: `path` has no ``state.json``.
    """
    import torch
    from safetensors.torch import load_file

    path = Path(path)
    state = json.loads((path / "state.json").read_text())
    tensors = {f.stem: load_file(f) for f in sorted(path.glob("*.safetensors"))}
    objects = {f.stem: torch.load(f, map_location=map_location, weights_only=True) for f in sorted(path.glob("*.pt"))}
    return Checkpoint(path=path, step=int(state["step"]), tensors=tensors, objects=objects, state=state)


def checkpoint_hash(path: str | Path) -> str:
    """sha256 over a checkpoint directory's ``*.safetensors`` files and ``config.json``.

    Files are taken in sorted order of their path relative to `path`; each contributes its relative path, its byte
    length and its bytes, so renaming or splitting files changes the hash. The tokenizer files are not included.

    Raises:
        FileNotFoundError: `path` has no ``config.json`` or no ``*.safetensors`` file.
    """
    import hashlib

    path = Path(path)
    weights = sorted(path.rglob("*.safetensors"))
    if not (path / "config.json").is_file() or not weights:
        raise FileNotFoundError(f"{path} is not a checkpoint: it needs config.json and *.safetensors files")
    digest = hashlib.sha256()
    for file in [path / "config.json", *weights]:
        name = file.relative_to(path).as_posix().encode()
        digest.update(len(name).to_bytes(8, "little") + name + file.stat().st_size.to_bytes(8, "little"))
        with open(file, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()
