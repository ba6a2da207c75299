#!/usr/bin/env bash
# On a GPU host, from a venv with gpuguard installed (PYTHON): the check benchmark, the
# daemon's cost on the real NVML and on synthetic 1/8/16/64-GPU hosts, and one real
# /metrics page and /status. gpuguard only reads: no GPU setting is changed.
set -u
OUT=${OUT:-./out}; mkdir -p "$OUT"
py=${PYTHON:-python3}
gg=${GPUGUARD:-$py -m gpuguard}
export PYTHONUNBUFFERED=1
$py bench/check_vs_nvidia_smi.py --runs 21 --gpuguard "$gg" --out "$OUT/bench-check.json" \
    | grep -A8 median_ms
port=19412
$gg daemon --listen 127.0.0.1:$port --no-udev --fast-interval 1 --state-dir /tmp/gg-state \
    2> "$OUT/daemon.log" &
pid=$!
sleep 6
curl -s "127.0.0.1:$port/metrics" > "$OUT/metrics.txt"
curl -s "127.0.0.1:$port/status" > "$OUT/status.json"
curl -s "127.0.0.1:$port/healthz"; echo
kill -TERM $pid; wait $pid; echo "daemon exit $?"
grep -vc '^#' "$OUT/metrics.txt"
$py bench/daemon_cost.py --nvml --interval 1 --seconds 30 --out "$OUT/daemon-nvml.json" \
    | grep -A12 '"runs"'
$py bench/daemon_cost.py --gpus 1,8,16,64 --interval 1 --seconds 20 \
    --out "$OUT/daemon-synthetic.json" | grep '^{"gpus'
