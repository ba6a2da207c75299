#!/usr/bin/env bash
# Issue 32 on the lent H200: cold `gpuguard check` with pynvml imported with and without
# ctypes.util (the tree before, in .device/before, and this one) against `nvidia-smi -q`,
# interleaved (bench/check_trees.py), GPU idle, no daemon beside. Reads only.
set -u
OUT=${OUT:-./out}; R=$OUT/issue32b; rm -rf "$R"; mkdir -p "$R"
here=$(cd "$(dirname "$0")" && pwd); repo=$(cd "$here/.." && pwd)
python3 -m venv /tmp/gv32 && /tmp/gv32/bin/pip install -q --no-index \
    --find-links "$repo/.device/wheels" nvidia-ml-py psutil pyudev prometheus-client click \
    pyyaml structlog docker simpleeval msgspec || { echo "wheels did not install"; exit 1; }
for d in "$repo" "$repo/.device/before"; do /tmp/gv32/bin/python -m compileall -q "$d/gpuguard"; done
/tmp/gv32/bin/python "$repo/bench/check_trees.py" --tree "before=$repo/.device/before" \
    --tree "after=$repo" --runs 21 --warmup 3 --out "$R/check_trees.json"
(cd "$repo" && GPUGUARD_TIMING=1 PYTHONPATH=$repo /tmp/gv32/bin/python -m gpuguard check \
    2>&1 >/dev/null | tail -3) > "$R/timing-after.txt"
(cd "$repo/.device/before" && GPUGUARD_TIMING=1 PYTHONPATH=$repo/.device/before \
    /tmp/gv32/bin/python -m gpuguard check 2>&1 >/dev/null | tail -3) > "$R/timing-before.txt"
cat "$R"/timing-*.txt
