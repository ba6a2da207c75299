#!/usr/bin/env bash
# Issue 12's device run (one lent GPU host, one call): the feasibility probe the issue cites,
# then bench/active_probe_device.sh (check vs check --active, PyTorch copies, under a bf16
# load), tarred so that it comes back in one file. Reads only.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-./out}; mkdir -p "$OUT/active"
nvidia-smi --query-gpu=index,name,pcie.link.gen.current,pcie.link.width.current,persistence_mode,driver_version \
    --format=csv > "$OUT/active/gpus.csv" 2>&1
for i in 1 2 3; do python3 bench/cuda_driver_api_probe.py > "$OUT/active/ctypes-probe-$i.json" 2>&1; done
RUNS=${RUNS:-7} bash bench/active_probe_device.sh > "$OUT/active/run.log" 2>&1
tar czf "$OUT/active.tgz" -C "$OUT" active && rm -rf "$OUT/active"
