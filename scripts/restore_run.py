"""Save a finished run's trained stages to a committed snapshot, and restore them in another clone instead of
training again (the default SFT alone is 84 min on 2 AVX512-BF16 cores and ≈ 3 h on AVX2 ones).

    .venv/bin/python scripts/restore_run.py save    [--snapshot DIR] [--stages baseline,sft,gate,selfplay,dpo,didpo]
    .venv/bin/python scripts/restore_run.py restore [--snapshot DIR] [--stages baseline,sft,gate,selfplay,dpo,didpo]

The DVC remote of a run lives outside git, so a new clone has the run's dvc.lock and metrics but none of its cached
outputs, and `dvc repro` would train everything again. `save` copies the listed stages' DVC-cached outputs (dvc.yaml
``outs`` without ``cache: false``) from data/ into the snapshot, mirrored under the same paths, except the merged
checkpoints (≈ 540 MB each): of those only the LoRA adapter beside them (≈ 20 MB) is kept. `restore`, run after `didpo
run --stages base_model,prepare,simulate_logs,validate,mine` (minutes; or the same `dvc repro`), copies the outputs back
(and checks out from HEAD the stages' git-tracked metrics, histories and plots that an interrupted run of a stage
deleted or changed) and rebuilds each ``merged/`` from its start checkpoint and the adapter exactly as the stage exports
it (`models.training.export`: ``merge_and_unload``, then the weights with the tokenizer): sft on the base model, dpo on
sft's merged weights, didpo on dpo's. Then it asks DVC itself: `dvc status --json <stages>` must find every dependency
and every output equal to what the run's dvc.lock recorded (for ``merged/`` that is the md5 of the rebuilt weights, so a
merge that another CPU rounded otherwise is caught); equal outputs that are only absent from this clone's cache ("not in
cache") are then `dvc commit`ted into it, dvc.lock unchanged byte for byte, and `dvc repro` continues after the last
restored stage. Anything DVC still sees as changed is printed and the exit status is 1: `dvc repro` will recompute it. A
stage whose code dependency changed since the run is reported the same way; `dvc commit <stage>` accepts the restored
outputs when the change does not touch what the stage computes. `save` also keeps this clone's stage timings
(`.cache/stage_seconds.json`) and `restore` adds them for the stages never run in the new clone, so `didpo run`'s ETA
has a figure for each stage.

Errors (a message, exit status 2): a stage with no cached outputs in the snapshot, a missing start checkpoint.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

DEFAULT_SNAPSHOT = Path("docs/results/default_run")
DEFAULT_STAGES = "baseline,sft,gate,selfplay,dpo,didpo"


def _output_entries(stage: str, dvc_yaml: Path, keys: tuple[str, ...]) -> list[tuple[Path, bool]]:
    """``(path, cached)`` of the stage's entries under `keys` (``outs``, ``metrics``, ``plots``), in dvc.yaml's order;
    ``cached`` is False for ``cache: false``.

    Raises KeyError for a stage dvc.yaml does not define."""
    import yaml

    stage_yaml = yaml.safe_load(dvc_yaml.read_text())["stages"][stage]
    entries = []
    for entry in [e for key in keys for e in stage_yaml.get(key, [])]:
        path, options = (entry, {}) if isinstance(entry, str) else next(iter(entry.items()))
        entries.append((Path(path), (options or {}).get("cache", True) is not False))
    return entries


def cached_outputs(stage: str, dvc_yaml: Path = Path("dvc.yaml")) -> list[Path]:
    """The stage's DVC-cached outputs (``outs`` entries without ``cache: false``), in dvc.yaml's order.

    Raises KeyError for a stage dvc.yaml does not define."""
    return [path for path, cached in _output_entries(stage, dvc_yaml, ("outs",)) if cached]


def git_outputs(stage: str, dvc_yaml: Path = Path("dvc.yaml")) -> list[Path]:
    """The stage's outputs kept in git rather than the DVC cache (``outs``, ``metrics`` and ``plots`` entries with
    ``cache: false``: its metrics, histories and plots), in dvc.yaml's order.

    Raises KeyError for a stage dvc.yaml does not define."""
    return [path for path, cached in _output_entries(stage, dvc_yaml, ("outs", "metrics", "plots")) if not cached]


def restore_from_git(paths: list[Path]) -> list[Path]:
    """Check out from HEAD those of `paths` that git tracks and that the working tree lacks or changed: DVC deletes a
    stage's outputs before it runs it, so an interrupted `didpo run` of the stage leaves its committed metrics and
    histories deleted, and `dvc status` then differs from dvc.lock (issue 19's re-trial: restore exited 1 after a
    Ctrl-C'd SFT). Returns the paths checked out."""
    restored = []
    for path in paths:
        tracked = subprocess.run(["git", "ls-files", "--", str(path)], capture_output=True, text=True)
        if tracked.returncode != 0 or not tracked.stdout.strip():
            continue  # not in git (never committed, ignored, or no git repository here): nothing to restore it from
        status = subprocess.run(
            ["git", "status", "--porcelain", "--", str(path)], capture_output=True, text=True, check=True
        )
        if status.stdout.strip():
            subprocess.run(["git", "checkout", "HEAD", "--", str(path)], capture_output=True, text=True, check=True)
            restored.append(path)
    return restored


def start_checkpoint(stage: str) -> Path:
    """Where the stage's LoRA training started: the weights its adapter is merged into."""
    from flows.paths import BASE_CHECKPOINT, DPO_CHECKPOINT, SFT_CHECKPOINT

    return {"sft": BASE_CHECKPOINT, "dpo": SFT_CHECKPOINT / "merged", "didpo": DPO_CHECKPOINT / "merged"}[stage]


def rebuild_merged(start: Path, adapter: Path, merged: Path, dtype: str = "auto") -> Path:
    """Write `merged` (a full checkpoint with the tokenizer) from the `start` weights and a saved LoRA `adapter`,
    through the stages' own export (`models.training.export`). Returns `merged`.

    Raises FileNotFoundError when `start` is not a checkpoint or `adapter` holds no adapter weights."""
    from peft import PeftModel

    from models.checkpoint import atomic_directory
    from models.policy import load_policy
    from models.training import export

    if not (adapter / "adapter_model.safetensors").is_file():
        raise FileNotFoundError(f"{adapter} holds no adapter_model.safetensors")
    if not (start / "config.json").is_file():
        raise FileNotFoundError(f"{start} is not a checkpoint: restore or reproduce the stage that writes it first")
    model, tokenizer = load_policy(start, dtype=dtype)
    model = PeftModel.from_pretrained(model, str(adapter))
    merged.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=merged.parent) as tmp:
        _, exported = export(model, tokenizer, Path(tmp), lora=True)  # writes tmp/adapter (dropped) and tmp/merged
        with atomic_directory(merged) as final:  # replaces `merged` only once the new one is complete
            final.rmdir()
            exported.rename(final)
    return merged


def _copy(source: Path, target: Path) -> None:
    if target.is_dir():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    (shutil.copytree if source.is_dir() else shutil.copy2)(source, target)


def save(stages: list[str], snapshot: Path, timings: Path) -> None:
    """Copy the stages' cached outputs into `snapshot` (a merged checkpoint: its adapter only), and `timings` (every
    stage's seconds the last time it ran here: `flows.pipeline.TIMINGS`) when there is one."""
    for stage in stages:
        for out in cached_outputs(stage):
            if out.name != "merged":  # the adapter beside it is an output of the same stage
                _copy(out, snapshot / out)
                print(f"saved {out}")
    if timings.is_file():
        _copy(timings, snapshot / timings.name)
        print(f"saved {timings}")


def restore_timings(snapshot: Path, timings: Path) -> list[str]:
    """Add the snapshot's stage seconds to `timings` for the stages never run here (those run here keep theirs), so
    that `didpo run`'s ETA has a figure for every stage in a restored clone (issue 19's re-trial: ``ETA ?`` at all 13
    stages). Returns the stages added."""
    saved = snapshot / timings.name
    if not saved.is_file():
        return []
    here = json.loads(timings.read_text()) if timings.is_file() else {}
    added = {k: v for k, v in json.loads(saved.read_text()).items() if k not in here}
    timings.parent.mkdir(parents=True, exist_ok=True)
    timings.write_text(json.dumps(here | added, indent=1, sort_keys=True))
    return sorted(added)


def restore(stages: list[str], snapshot: Path, dtype: str = "auto") -> None:
    """Copy the stages' outputs back from `snapshot` and rebuild their merged checkpoints, in the order given; their
    git-tracked outputs that an interrupted run deleted or changed are checked out from HEAD (`restore_from_git`).

    Raises FileNotFoundError: the snapshot lacks one of the outputs, or a start checkpoint is missing."""
    for stage in stages:
        for path in restore_from_git(git_outputs(stage)):
            print(f"restored {path} (git HEAD)")
        outs = cached_outputs(stage)
        for out in outs:
            if out.name == "merged":
                rebuild_merged(start_checkpoint(stage), snapshot / out.parent / "adapter", out, dtype)
            elif (snapshot / out).exists():
                _copy(snapshot / out, out)
            else:
                raise FileNotFoundError(f"{snapshot / out} is missing: `{stage}` was not saved in this snapshot")
            print(f"restored {out}")


def dvc_changes(stages: list[str]) -> dict:
    """What `dvc status --json` still finds changed for the stages (empty when each matches dvc.lock)."""
    result = subprocess.run(["dvc", "status", "--json", *stages], capture_output=True, text=True, check=True)
    return json.loads(result.stdout or "{}")


def only_not_in_cache(changes: dict) -> bool:
    """True when every change DVC reports is an output equal to its dvc.lock hash but absent from the local cache
    (DVC says ``modified`` for an output whose content differs, and lists changed deps or params apart)."""
    entries = [entry for stage in changes.values() for entry in stage]
    return all(
        isinstance(entry, dict)
        and set(entry) == {"changed outs"}
        and set(entry["changed outs"].values()) == {"not in cache"}
        for entry in entries
    )


def commit_to_cache(stages: list[str]) -> None:
    """`dvc commit --force` the restored stages: their outputs enter the local cache (else `dvc repro` runs them
    again, their objects being absent); dvc.lock must come out byte for byte unchanged.

    Raises RuntimeError when it did not (the outputs were not the recorded ones after all)."""
    lock = Path("dvc.lock").read_bytes()
    subprocess.run(["dvc", "commit", "--force", *stages], capture_output=True, text=True, check=True)
    if Path("dvc.lock").read_bytes() != lock:
        Path("dvc.lock").write_bytes(lock)
        raise RuntimeError("dvc commit changed dvc.lock: the restored outputs are not the recorded ones")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["save", "restore"])
    parser.add_argument("--snapshot", type=Path, default=DEFAULT_SNAPSHOT, help=f"default {DEFAULT_SNAPSHOT}")
    parser.add_argument("--stages", default=DEFAULT_STAGES, help="comma-separated, in dvc.yaml's order")
    args = parser.parse_args()
    stages = [s for s in args.stages.split(",") if s]

    from flows.env import setup_environment

    setup_environment(Path("."))
    from flows.pipeline import TIMINGS
    from tasks.config import load_params

    if args.action == "save":
        changed = dvc_changes(stages)
        if changed:
            print(f"error: DVC finds these stages changed since dvc.lock, save a finished run only: {changed}")
            return 2
        save(stages, args.snapshot, TIMINGS)
        return 0
    try:
        restore(stages, args.snapshot, load_params("params.yaml").base_model.dtype)
    except (FileNotFoundError, KeyError) as error:
        print(f"error: {error}")
        return 2
    if added := restore_timings(args.snapshot, TIMINGS):
        print(f"the ETA of `didpo run` takes the saved run's seconds for {', '.join(added)} ({TIMINGS})")
    changed = dvc_changes(stages)
    if changed and only_not_in_cache(changed):
        commit_to_cache(stages)  # equal to dvc.lock, only missing from the cache of this clone
        changed = dvc_changes(stages)
    if changed:
        print(f"DVC still finds changes; `dvc repro` recomputes them: {json.dumps(changed, indent=1)}")
        return 1
    print(f"{', '.join(stages)}: every dependency and output equals dvc.lock; `dvc repro` continues after them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
