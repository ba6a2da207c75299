#!/usr/bin/env bash
# Issue 11 on a lent multi-GPU machine: the new fields against nvidia-smi of the same
# moment, `gpuguard check` idle, its time against `nvidia-smi -q`, and the daemon's
# series count and new rules. Reads only.
set -u
FINAL=${OUT:-./out}; mkdir -p "$FINAL"
export OUT=/tmp/gg11; rm -rf "$OUT"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
python3 -m venv /tmp/gv && /tmp/gv/bin/pip install -q --no-index --find-links .device/wheels gpuguard
export GPUGUARD=/tmp/gv/bin/gpuguard PYTHON=/tmp/gv/bin/python
bash bench/nvml_issue11_compare.sh 2>&1 | tee "$OUT/compare.txt"
$GPUGUARD check > "$OUT/check.txt" 2>&1; echo "check rc=$?" | tee -a "$OUT/check.txt"; cat "$OUT/check.txt"
$PYTHON bench/check_vs_nvidia_smi.py --runs 21 --gpuguard "$GPUGUARD" --out "$OUT/bench.json" | grep -A7 median_ms
$GPUGUARD daemon --listen 127.0.0.1:19412 --no-udev --state-dir /tmp/gg-state --log-format json 2> "$OUT/daemon.log" & D=$!
sleep 12
curl -s 127.0.0.1:19412/metrics > "$OUT/metrics.txt"; curl -s 127.0.0.1:19412/status > "$OUT/status.json"
kill -TERM $D; wait $D
echo "series: $(grep -vc '^#' "$OUT/metrics.txt")"
grep -E 'rule="(nvlink|fabric|p2p|memory.temperature|mig|clocks.applications|sxid)' "$OUT/metrics.txt" | grep rule_status | sed 's/uuid="[^"]*",//' 
grep -E '^gpuguard_gpu_(nvlink|fabric|memory_temperature)' "$OUT/metrics.txt" | sed 's/uuid="[^"]*",//' | head -20
tar czf "$FINAL/results11.tgz" -C "$OUT" .
cp "$OUT/compare.txt" "$OUT/check.txt" "$OUT/bench.json" "$FINAL/"
