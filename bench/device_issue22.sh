#!/usr/bin/env bash
# Issue 22, item 1: `gpuguard status` against `nvidia-smi -q` on one H200 (goal: at most
# 0.25 times its median). The daemon runs live on the GPU (the real NVML, fast cycles of
# 5 s) with its status socket; then interleaved rounds of `gpuguard status` (table and
# JSON), a cold `gpuguard check` and `nvidia-smi -q`, medians and 90th percentiles
# (bench/check_variants.py). Reads only; every result in $OUT. Needs gpuguard's wheel and
# its dependencies in .device/wheels.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-./out}; mkdir -p "$OUT"
nvidia-smi -L; nproc; python3 --version
python3 -m venv /tmp/gv && /tmp/gv/bin/pip install -q --no-index --find-links .device/wheels gpuguard
G=/tmp/gv/bin/gpuguard
S=/tmp/gg-status.sock
state=$(mktemp -d)
$G daemon --listen 127.0.0.1:19422 --no-udev --log-format json --state-dir "$state" \
    --status-socket "$S" 2> "$OUT/daemon.log" &
D=$!
for _ in $(seq 1 60); do [ -S "$S" ] && $G status --socket "$S" > /dev/null 2>&1 && break; sleep 0.5; done
$G status --socket "$S" > "$OUT/status.txt"; echo "status exit $?"
$G status --socket "$S" --format json > "$OUT/status.json"
$G check > "$OUT/check.txt"; echo "check exit $?"
/tmp/gv/bin/python -X importtime -c 'from gpuguard.cli.entry import main; main()' status --socket "$S" 2> "$OUT/importtime-status.txt" > /dev/null
/tmp/gv/bin/python -X importtime -c pass 2> "$OUT/importtime-bare.txt"
# the interpreter's own start, bare and without site: what no import diet can remove
V=(--variant "venv_python=/tmp/gv/bin/python -c pass"
   --variant "venv_python_S=/tmp/gv/bin/python -S -c pass"
   --variant "status=$G status --socket $S"
   --variant "status_json=$G status --socket $S --format json"
   --variant "check_json=$G check --format json")
# prints medians, 90th percentiles and their ratios to nvidia-smi -q
python3 bench/check_variants.py --runs 21 "${V[@]}" --out "$OUT/status-vs-nvidia-smi.json"
kill -TERM $D; wait $D; echo "daemon exit $?"
rm -rf "$state"
