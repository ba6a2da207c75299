#!/usr/bin/env bash
# Issue 12 on a lent GPU host: `gpuguard check` against `check --active`, idle and with a
# bf16 matmul on the last GPU, and PyTorch copies of the same size, into $OUT/active.
# Reads only. Needs gpuguard's wheel and its dependencies in .device/wheels.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-./out}; mkdir -p "$OUT/active"
python3 -m venv /tmp/gv && /tmp/gv/bin/pip install -q --no-index --find-links .device/wheels gpuguard
nvidia-smi -L | tee "$OUT/active/gpus.txt"
/tmp/gv/bin/gpuguard check --active | tee "$OUT/active/check-active.txt"
python3 bench/active_probe_device.py --runs "${RUNS:-7}" --gpuguard /tmp/gv/bin/gpuguard \
    --out "$OUT/active" 2>&1 | tee "$OUT/active/brief.json"
