"""OpenVINO IR of a LoRA-merged checkpoint: patched from its family's cached IR vs exported by optimum-cli.

    .venv/bin/python benchmarks/bench_export.py [--donor data/checkpoints/base --model data/checkpoints/sft/merged]

Needs the two checkpoints (``dvc repro base_model sft`` or ``scripts/restore_run.py restore``) and the export
environment (``make export-env``). The donor is exported once into a scratch cache (not timed). Then each repeat
makes the IR of ``--model`` twice, into fresh scratch caches: **export** (no donor in the cache: ``optimum-cli export
openvino``, what `models.openvino_engine.export` did for every checkpoint before 2026-12-07) and **patch** (the donor's
IR in the cache: its weight buffer copied with the differing projections written in). The sides alternate
(`repeats.alternate`), ``--repeats`` times each.

Same work is checked first: the patched folder's model XML, weight buffer, tokenizer and detokenizer files equal the
exported one's byte for byte (``CHECK same_work=ok``; otherwise ``same_work=FAIL`` and exit 1).

Against the machine: the patch reads the checkpoint's weights and the donor's buffer, hashes both and writes the
buffer, so its floor is memory and disk traffic, not arithmetic. The run measures this machine's copy bandwidth
(numpy copy of a buffer the size of the weights, median of 3) and prints the patch's bytes moved (read + written)
per second as a share of it. Last line: ``RESULT patch_s=<median> export_s=<median> ratio=<export/patch>``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from repeats import alternate, check_same_work, spread

COMPARED = ("openvino_model.xml", "openvino_model.bin", "openvino_tokenizer.bin", "openvino_detokenizer.bin")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--donor", type=Path, default=Path("data/checkpoints/base"))
    parser.add_argument("--model", type=Path, default=Path("data/checkpoints/sft/merged"))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for folder in (args.donor, args.model):
        if not (folder / "config.json").is_file():
            sys.exit(f"{folder} has no config.json: run `dvc repro base_model sft` or scripts/restore_run.py restore")

    import numpy as np

    from models import openvino_engine as engine

    reason = engine.engine_available()
    if reason:
        sys.exit(f"the OpenVINO engine is not available: {reason}")
    scratch = Path(tempfile.mkdtemp(prefix="bench_export."))
    donor_cache = scratch / "donor"
    t0 = time.perf_counter()
    donor_ir = engine.export(args.donor, donor_cache)
    print(f"donor {args.donor} exported in {time.perf_counter() - t0:.1f} s (not timed)")
    made: dict[str, Path] = {}

    def export_side() -> float:
        cache = scratch / "export"
        shutil.rmtree(cache, ignore_errors=True)
        start = time.perf_counter()
        made["export"] = engine.export(args.model, cache)
        return time.perf_counter() - start

    def patch_side() -> float:
        cache = scratch / "patch"
        shutil.rmtree(cache, ignore_errors=True)
        shutil.copytree(donor_ir, cache / donor_ir.name)  # the donor in the cache, as after an earlier stage
        start = time.perf_counter()
        made["patch"] = engine.export(args.model, cache)
        return time.perf_counter() - start

    export_side(), patch_side()  # the same-work check's pair (not timed)
    same = all((made["patch"] / n).read_bytes() == (made["export"] / n).read_bytes() for n in COMPARED)
    check_same_work(same, f"patched IR equals the exported IR byte for byte ({', '.join(COMPARED)})")

    weights_bytes = sum(p.stat().st_size for p in args.model.glob("*.safetensors"))
    buffer_bytes = (donor_ir / "openvino_model.bin").stat().st_size
    moved = weights_bytes + 2 * buffer_bytes  # checkpoint read, donor buffer read, patched buffer written
    source = np.ones(buffer_bytes // 4, dtype=np.float32)
    copies = []
    for _ in range(3):
        start = time.perf_counter()
        target = source.copy()
        copies.append(2 * buffer_bytes / (time.perf_counter() - start))  # read + write
    del source, target
    peak = statistics.median(copies)

    figures = alternate({"export": export_side, "patch": patch_side}, args.repeats)
    export_s = spread("export", figures["export"], "s")
    patch_s = spread("patch", figures["patch"], "s")
    rate = moved / patch_s
    print(
        f"patch moves {moved / 1e6:.0f} MB: {rate / 1e9:.2f} GB/s against this machine's copy bandwidth "
        f"{peak / 1e9:.2f} GB/s ({rate / peak:.1%}; the rest is hashing and the file system)"
    )
    shutil.rmtree(scratch, ignore_errors=True)
    print(f"RESULT patch_s={patch_s:.2f} export_s={export_s:.2f} ratio={export_s / patch_s:.1f}")


if __name__ == "__main__":
    main()
