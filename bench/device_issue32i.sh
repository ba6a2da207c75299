#!/usr/bin/env bash
# Issue 32 on the lent H200: why the kept-InfoROM cold checks are bimodal (docs/benchmarks.md,
# "Not understood yet"). The wheels of device_issue32h.sh (before = d6157d8, after = this
# tree), run through pip's console script, interleaved with `nvidia-smi -q`, 3 warm-up and
# 21 rounds, each run's kept InfoROM line (a moved "at" is a miss) and its GPUGUARD_TIMING
# line recorded: alone and idle unpinned, the same with every command on one CPU of the
# GPU's NUMA node (taskset: where our own processes run, no host or GPU setting), beside a
# daemon idle, beside it under a bf16 load. The CPUs' frequency governor and clock and the
# kernel log's last records are saved (reads only). Results in $OUT/issue32i.tgz.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-./out}; R=$OUT/issue32i; rm -rf "$R"; mkdir -p "$R"
repo=$(cd "$(dirname "$0")/.." && pwd)
. "$repo/bench/device_venvs.sh"
wheel_venvs 32i || exit 1
B=/tmp/gv32i-before/bin/gpuguard; A=/tmp/gv32i-after/bin/gpuguard
nvidia-smi --query-gpu=name,driver_version,inforom.img,power.draw --format=csv | tee "$R/gpu.csv"
nvidia-smi topo -m > "$R/topo.txt" 2>&1
lscpu > "$R/lscpu.txt" 2>&1
cat /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor 2>/dev/null | sort | uniq -c > "$R/governor.txt"
grep MHz /proc/cpuinfo | sort | uniq -c | sort -rn | head -20 > "$R/mhz-before.txt"
# the first CPU of the GPU's NUMA affinity ("0-7" or "0-7,16-23"), else CPU 2
cpu=$(awk '/^GPU0/ {for (i = 1; i <= NF; i++) if ($i ~ /^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$/ && $i ~ /-/) {split($i, a, "[-,]"); print a[1] + 2; exit}}' "$R/topo.txt")
cpu=${cpu:-2}; echo "pinned CPU $cpu" | tee "$R/pin.txt"
ST=$(mktemp -d)
runs=(--command "before=$B" --command "after=$A" --miss-command "after-miss=$A" --state-dir "$ST" --timing)
tb=/tmp/gv32i-after/bin/python
echo "== alone, idle"
$tb "$repo/bench/check_trees.py" "${runs[@]}" --runs 21 --warmup 3 --out "$R/alone_idle.json" | tail -2
# PINNED=0 leaves the two pinned sets out (they were measured once: 2.8-2.9x on one CPU)
[ "${PINNED:-1}" = 1 ] && echo "== alone, idle, pinned to CPU $cpu" && $tb "$repo/bench/check_trees.py" "${runs[@]}" --pin "$cpu" --runs 21 --warmup 3 --out "$R/alone_idle_pinned.json" | tail -2
echo "== beside a daemon (the after wheel, default cadence), idle"
state=$(mktemp -d)
$A daemon --listen 127.0.0.1:19435 --no-udev --state-dir "$state" 2> "$R/daemon.log" &
D=$!
sleep 8
$tb "$repo/bench/check_trees.py" "${runs[@]}" --runs 21 --warmup 3 --out "$R/beside_idle.json" | tail -2
[ "${PINNED:-1}" = 1 ] && echo "== beside the daemon, idle, pinned to CPU $cpu" && $tb "$repo/bench/check_trees.py" "${runs[@]}" --pin "$cpu" --runs 21 --warmup 3 --out "$R/beside_idle_pinned.json" | tail -2
echo "== beside the daemon, under a bf16 load"
python3 "$repo/bench/gpu_load.py" --seconds 100 > "$R/load.txt" 2>&1 & L=$!
sleep 15
nvidia-smi --query-gpu=power.draw,utilization.gpu --format=csv,noheader | tee "$R/load-power.txt"
$tb "$repo/bench/check_trees.py" "${runs[@]}" --runs 21 --warmup 3 --out "$R/beside_load.json" | tail -2
nvidia-smi --query-gpu=power.draw,utilization.gpu --format=csv,noheader | tee -a "$R/load-power.txt"
kill $L 2>/dev/null; wait $L 2>/dev/null
kill -TERM $D; wait $D; echo "daemon exit $?"
# one kept run's import tree (the parent's and the worker's lines both; the worker's start
# at its fork) and three timing lines, idle, after the load
for n in 1 2 3; do GPUGUARD_TIMING=1 $A check --state-dir "$ST/after" > /dev/null 2>> "$R/timing-hit.txt"; done
PYTHONPROFILEIMPORTTIME=1 $A check --state-dir "$ST/after" > /dev/null 2> "$R/importtime-hit.txt"
rm -rf "$state" "$ST"
grep MHz /proc/cpuinfo | sort | uniq -c | sort -rn | head -20 > "$R/mhz-after.txt"
dmesg -r 2>/dev/null | tail -60 > "$R/kmsg-tail.txt"
cd "$OUT" && tar czf issue32i.tgz issue32i && ls issue32i
