#!/usr/bin/env bash
# Issue 32 on the lent H200: the every-feature daemon's CPU (bench/every_feature_daemon.py:
# 5 s cadence, the active probe every 30 s, event store, host resources, NPD files, the
# status socket, one exec service with a pid file, a POST probe, a vLLM V1 engine page;
# CPU of the daemon and its NVML worker as % of a core), real NVML and libcuda:
#   1. this tree, 2 rounds of a 20 s warm-up and a 120 s span (the issue's method);
#   2. a short before/after: the tree in .device/before (`git archive d6157d8`) and this
#      one, one round each of 20 s + SHORT_SPAN (default 45 s).
# This tree runs from a gpuguard wheel in .device/wheels when there is one (pip compiles
# its bytecode), else from the tree (bytecode compiled). About 8 minutes in all; each run
# has its own time limit. Reads only: no GPU setting is changed. Results in
# $OUT/issue32d and $OUT/issue32d.tgz.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-./out}; R=$OUT/issue32d; rm -rf "$R"; mkdir -p "$R"
repo=$(cd "$(dirname "$0")/.." && pwd)
before=${BEFORE:-$repo/.device/before}
short=${SHORT_SPAN:-45}
V=/tmp/gv32d
python3 -m venv $V && $V/bin/pip install -q --no-index --find-links "$repo/.device/wheels" \
    nvidia-ml-py psutil pyudev prometheus-client click pyyaml structlog docker simpleeval \
    msgspec || { echo "wheels did not install"; exit 1; }
if ls "$repo"/.device/wheels/gpuguard-*.whl >/dev/null 2>&1 && \
        $V/bin/pip install -q --no-index --no-deps --find-links "$repo/.device/wheels" gpuguard; then
    after=(--gpuguard "$V/bin/gpuguard"); echo "after: the wheel $(ls "$repo"/.device/wheels/gpuguard-*.whl)"
else
    $V/bin/python -m compileall -q "$repo/gpuguard"; after=(--tree "$repo"); echo "after: the tree"
fi
[ -d "$before/gpuguard" ] && $V/bin/python -m compileall -q "$before/gpuguard"
nvidia-smi --query-gpu=name,driver_version,power.draw,utilization.gpu --format=csv \
    | tee "$R/gpu.csv"
bench=($V/bin/python "$repo/bench/every_feature_daemon.py")  # timeout runs no shell function

echo "== the every-feature daemon, this tree: 2 rounds of 20 s + 120 s"
timeout 320 "${bench[@]}" "${after[@]}" --warmup 20 --span 120 --rounds 2 --label after \
    --out "$R/every_feature.json" 2> "$R/every_feature.err" | grep '^round'
echo "exit ${PIPESTATUS[0]}"

if [ -d "$before/gpuguard" ]; then
    echo "== before (d6157d8) and after, one round each of 20 s + ${short} s"
    for who in before after; do
        if [ $who = before ]; then tree=(--tree "$before"); else tree=("${after[@]}"); fi
        timeout $((short + 50)) "${bench[@]}" "${tree[@]}" --warmup 20 --span "$short" --rounds 1 \
            --label "$who" --out "$R/short_$who.json" 2> "$R/short_$who.err" | grep '^round'
        echo "$who exit ${PIPESTATUS[0]}"
    done
else
    echo "no $before: no before/after"
fi
echo "== the per-call profile of one cold sweep (bench/nvml_phases.py, 7 fresh processes)"
(cd "$repo" && PYTHONPATH=$repo timeout 60 $V/bin/python bench/nvml_phases.py --runs 7 \
    --out "$R/nvml_phases.json" > "$R/nvml_phases.txt" 2>&1); tail -25 "$R/nvml_phases.txt"
tar -czf "$OUT/issue32d.tgz" -C "$OUT" issue32d
