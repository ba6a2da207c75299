#!/usr/bin/env bash
# Issue 32 on the lent H200, by the issue's method to the letter: gpuguard installed from
# its wheel (pip compiles the bytecode), before (d6157d8's wheel, .device/gg-before) and
# after (this tree's wheel, .device/gg-after), each in a venv of its own, run through
# pip's console script; cold `check` against `nvidia-smi -q`, interleaved
# (bench/check_trees.py --command: 3 warm-up and 21 measured rounds, a --state-dir each):
# alone and idle, beside a gpuguard daemon at default cadence idle, and beside it under a
# bf16 load (bench/gpu_load.py). "after-miss": the kept InfoROM validity removed before
# each run. Reads only: no GPU setting is changed. Results in $OUT/issue32h.tgz.
#   (make the wheels: `pip wheel --no-deps -w .device/gg-after .` in a clean export of
#   this tree, and the same of `git archive d6157d8` into .device/gg-before)
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-./out}; R=$OUT/issue32h; rm -rf "$R"; mkdir -p "$R"
repo=$(cd "$(dirname "$0")/.." && pwd)
. "$repo/bench/device_venvs.sh"
wheel_venvs 32h || exit 1
B=/tmp/gv32h-before/bin/gpuguard; A=/tmp/gv32h-after/bin/gpuguard
nvidia-smi --query-gpu=name,driver_version,inforom.img,power.draw --format=csv | tee "$R/gpu.csv"
ST=$(mktemp -d)
runs=(--command "before=$B" --command "after=$A" --miss-command "after-miss=$A" --state-dir "$ST")
tb=/tmp/gv32h-after/bin/python
echo "== alone, idle"
$tb "$repo/bench/check_trees.py" "${runs[@]}" --runs 21 --warmup 3 --out "$R/alone_idle.json" | tail -2
echo "== beside a daemon (the after wheel, default cadence), idle"
state=$(mktemp -d)
$A daemon --listen 127.0.0.1:19435 --no-udev --state-dir "$state" 2> "$R/daemon.log" &
D=$!
sleep 8
$tb "$repo/bench/check_trees.py" "${runs[@]}" --runs 21 --warmup 3 --out "$R/beside_idle.json" | tail -2
echo "== beside the daemon, under a bf16 load"
python3 "$repo/bench/gpu_load.py" --seconds 100 > "$R/load.txt" 2>&1 & L=$!
sleep 15
nvidia-smi --query-gpu=power.draw,utilization.gpu --format=csv,noheader | tee "$R/load-power.txt"
$tb "$repo/bench/check_trees.py" "${runs[@]}" --runs 21 --warmup 3 --out "$R/beside_load.json" | tail -2
nvidia-smi --query-gpu=power.draw,utilization.gpu --format=csv,noheader | tee -a "$R/load-power.txt"
kill $L 2>/dev/null; wait $L 2>/dev/null
kill -TERM $D; wait $D; echo "daemon exit $?"; rm -rf "$state" "$ST"
# the kernel log's last records (dmesg -r: priority and time; it prints no sequence numbers)
dmesg -r 2>/dev/null | tail -60 > "$R/kmsg-tail.txt"
cd "$OUT" && tar czf issue32h.tgz issue32h && ls issue32h
