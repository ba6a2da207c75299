#!/usr/bin/env bash
# Issue 32 on the lent H200: cold `gpuguard check` of the tree before (BEFORE, default
# .device/before) and this one against `nvidia-smi -q`, interleaved (bench/check_trees.py:
# 3 warm-up rounds, 21 measured, bytecode compiled): alone and idle; beside a gpuguard
# daemon at default cadence, idle; beside the daemon under a bf16 load (bench/gpu_load.py).
# Then the InfoROM overlap probe (bench/inforom_overlap.py), the check's own timing split,
# and the kernel-log tail check (bench/kmsg_tail_devcheck.py). Reads only: no GPU setting
# is changed. Results in $OUT/issue32c.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-./out}; R=$OUT/issue32c; rm -rf "$R"; mkdir -p "$R"
repo=$(cd "$(dirname "$0")/.." && pwd)
before=${BEFORE:-$repo/.device/before}
V=/tmp/gv32c
python3 -m venv $V && $V/bin/pip install -q --no-index --find-links "$repo/.device/wheels" \
    nvidia-ml-py psutil pyudev prometheus-client click pyyaml structlog docker simpleeval \
    msgspec || { echo "wheels did not install"; exit 1; }
for d in "$repo" "$before"; do $V/bin/python -m compileall -q "$d/gpuguard"; done
nvidia-smi --query-gpu=name,driver_version,inforom.img,power.draw,temperature.gpu \
    --format=csv | tee "$R/gpu.csv"
trees=(--tree "before=$before" --tree "after=$repo")

echo "== alone, idle"
$V/bin/python "$repo/bench/check_trees.py" "${trees[@]}" --runs 21 --warmup 3 \
    --out "$R/alone_idle.json" | tail -4
for t in before after; do
    dir=$before; [ $t = after ] && dir=$repo
    (cd "$dir" && GPUGUARD_TIMING=1 PYTHONPATH=$dir $V/bin/python -m gpuguard check \
        2>&1 >/dev/null | tail -4) > "$R/timing-$t.txt"
done
cat "$R"/timing-*.txt

echo "== beside a daemon (this tree, default cadence), idle"
state=$(mktemp -d)
(cd "$repo" && PYTHONPATH=$repo exec $V/bin/python -m gpuguard daemon \
    --listen 127.0.0.1:19432 --no-udev --state-dir "$state") 2> "$R/daemon.log" &
D=$!
sleep 8
$V/bin/python "$repo/bench/check_trees.py" "${trees[@]}" --runs 21 --warmup 3 \
    --out "$R/beside_idle.json" | tail -4

echo "== beside the daemon, under a bf16 load"
python3 "$repo/bench/gpu_load.py" --seconds 100 > "$R/load.txt" 2>&1 & L=$!
sleep 15
nvidia-smi --query-gpu=power.draw,utilization.gpu --format=csv,noheader | tee "$R/load-power.txt"
$V/bin/python "$repo/bench/check_trees.py" "${trees[@]}" --runs 21 --warmup 3 \
    --out "$R/beside_load.json" | tail -4
nvidia-smi --query-gpu=power.draw,utilization.gpu --format=csv,noheader | tee -a "$R/load-power.txt"
kill $L 2>/dev/null; wait $L 2>/dev/null
kill -TERM $D; wait $D; echo "daemon exit $?"; rm -rf "$state"

echo "== does a validation hold the device? (the early path's premise)"
$V/bin/python "$repo/bench/inforom_overlap.py" --out "$R/inforom_overlap.json" --rounds 7
echo "== the kernel-log tail against a whole read"
$V/bin/python "$repo/bench/kmsg_tail_devcheck.py" > "$R/kmsg_devcheck.json"; tail -c 400 "$R/kmsg_devcheck.json"
