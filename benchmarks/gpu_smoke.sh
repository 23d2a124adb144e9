#!/usr/bin/env bash
# GPU smoke run (issue 7): a few SFT, DPO and RL steps of the embedded model on CUDA with bf16 autocast when a GPU is
# present (the CPU otherwise); prints per-stage step timings and peak memory, last line `RESULT ...`.
#   benchmarks/gpu_smoke.sh            # data/checkpoints/base (`dvc repro base_model`), else the tiny model
#   benchmarks/gpu_smoke.sh --tiny     # the tiny random model: < 1 min on a CPU
# Extra arguments go to benchmarks/gpu_smoke.py (--steps N, --device cuda:1, --model DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
[[ -x $PYTHON ]] || PYTHON=python3
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
exec "$PYTHON" benchmarks/gpu_smoke.py "$@"
