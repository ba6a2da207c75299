#!/usr/bin/env bash
# Issue 10 on a lent GPU machine, from a fresh venv made from the wheel (as a new user):
# idle `gpuguard check` (exit code and output), the speed against `nvidia-smi -q` idle and
# under a bf16 matmul on every GPU (medians of 21 interleaved rounds), why JSON costs
# more than the table (import times, profiles), and the daemon for 2 minutes under the
# load (its /metrics, /status and log). Results under $OUT. Nothing changes a GPU setting.
set -u
FINAL=${OUT:-./out}; mkdir -p "$FINAL"
OUT=/tmp/gg-results; rm -rf "$OUT"; mkdir -p "$OUT"  # at most 8 files come back: tar them
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
python3 -m venv /tmp/gv && /tmp/gv/bin/pip install -q --no-index --find-links .device/wheels gpuguard
GG=/tmp/gv/bin/gpuguard; PY=/tmp/gv/bin/python
nvidia-smi -L | tee "$OUT/nvidia-smi-L.txt"; $GG --version
nvidia-smi -q -x > "$OUT/idle-nvidia-smi-q.xml"
$GG check > "$OUT/idle-check.txt" 2>&1; echo "idle check rc=$?" | tee -a "$OUT/idle-check.txt"
$GG check --format json > "$OUT/idle-check.json"; echo "idle json rc=$?"
$GG snapshot -o "$OUT/idle-snapshot.json"
cat "$OUT/idle-check.txt"
$PY bench/check_vs_nvidia_smi.py --runs 21 --gpuguard "$GG" --out "$OUT/bench-idle.json" | grep -A9 median_ms
for f in table json; do
  $PY -X importtime -m gpuguard check --format $f 2> "$OUT/importtime-$f.txt" > /dev/null
  $PY -m cProfile -o "$OUT/profile-$f.prof" -m gpuguard check --format $f > /dev/null
done
python3 bench/gpu_load.py --seconds 230 > "$OUT/load.txt" 2>&1 & LOAD=$!
sleep 15
nvidia-smi --query-gpu=index,power.draw,power.limit,clocks.sm,utilization.gpu,clocks_event_reasons.active --format=csv | tee "$OUT/load-nvidia-smi.csv"
$GG check > "$OUT/busy-check.txt" 2>&1; echo "busy check rc=$?" | tee -a "$OUT/busy-check.txt"
$GG snapshot -o "$OUT/busy-snapshot.json"
$PY bench/check_vs_nvidia_smi.py --runs 21 --gpuguard "$GG" --out "$OUT/bench-busy.json" | grep -A9 median_ms
$GG daemon --listen 127.0.0.1:19412 --no-udev --state-dir /tmp/gg-state --log-format json 2> "$OUT/daemon.log" & D=$!
sleep 125
curl -s 127.0.0.1:19412/metrics > "$OUT/busy-metrics.txt"; curl -s 127.0.0.1:19412/status > "$OUT/busy-status.json"
curl -s 127.0.0.1:19412/healthz; echo
kill -TERM $D; wait $D; echo "daemon exit $?"
grep -E '^gpuguard_rule_(status|failed_cycles)' "$OUT/busy-metrics.txt" | grep -v ' 0.0$' | grep -v ' -1.0$' || echo "every rule ok or skipped"
wait $LOAD; cat "$OUT/load.txt"
tar czf "$FINAL/results.tgz" -C "$OUT" .
cp "$OUT/idle-check.txt" "$OUT/busy-check.txt" "$OUT/bench-idle.json" "$OUT/bench-busy.json" "$FINAL/"
