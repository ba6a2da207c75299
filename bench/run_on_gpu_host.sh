#!/usr/bin/env bash
# One pass on a real GPU host: snapshot vs nvidia-smi at the same moment, every
# output format, import timing and the benchmark. Results go to $OUT (or ./out).
# gpuguard only reads: nothing here changes GPU settings.
set -u
OUT=${OUT:-./out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
# how to run gpuguard: an installed console script (as /opt/gpuguard/bin/gpuguard) or -m
gg=${GPUGUARD:-$py -m gpuguard}
nvidia-smi -L | tee "$OUT/nvidia-smi-L.txt"
$py -c 'import pynvml, sys; print("pynvml", pynvml.__file__, sys.version)'
$gg --version
# same moment: start both, wait for both
$gg snapshot -o "$OUT/snapshot.json" & nvidia-smi -q -x > "$OUT/nvidia-smi-q.xml"; wait
nvidia-smi -q > "$OUT/nvidia-smi-q.txt"
$py scripts/compare_with_nvidia_smi.py "$OUT/snapshot.json" "$OUT/nvidia-smi-q.xml" \
    --markdown "$OUT/compare.md" > /dev/null; echo "compare rc=$?"; tail -1 "$OUT/compare.md"
grep -E 'disagree|one-side' "$OUT/compare.md"
$gg check; echo "check rc=$?"
$gg check --format json > "$OUT/check.json"; echo "json rc=$?"
$gg check --format prometheus > "$OUT/check.prom"; echo "prom rc=$?"
$gg check --input "$OUT/nvidia-smi-q.xml" -q; echo "replay xml rc=$?"
$gg check --input "$OUT/snapshot.json" -q; echo "replay snapshot rc=$?"
$py -X importtime $( [ -n "${GPUGUARD:-}" ] && echo "$GPUGUARD" || echo "-m gpuguard") check 2> "$OUT/importtime.txt" > /dev/null
sort -t'|' -k2 -n -r "$OUT/importtime.txt" | head -15
$py bench/check_vs_nvidia_smi.py --runs 21 --gpuguard "$gg" --out "$OUT/bench.json"
