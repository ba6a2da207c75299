#!/usr/bin/env bash
# Issue 32 on the lent H200, with the InfoROM validity kept per boot: cold `gpuguard check`
# of the tree before (BEFORE, default .device/before), this one (its kept answer reused:
# "after") and this one with the kept answer removed before each run ("after-miss": the
# first check of a boot), against `nvidia-smi -q`, interleaved (bench/check_trees.py: 3
# warm-up rounds, 21 measured, bytecode compiled), each tree with a --state-dir of its own
# under a temporary folder: alone and idle; beside a gpuguard daemon at default cadence,
# idle; beside the daemon under a bf16 load (bench/gpu_load.py). Then the check's own
# timing split, hit and miss (8 runs each), the parent's import tree (-X importtime), the
# gpu.inforom result of both, and `gpuguard status` by each launcher against
# `python -c pass` beside a live daemon (bench/launchers.py). Reads only: no GPU setting
# is changed. Results in $OUT/issue32f.tgz.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-./out}; R=$OUT/issue32f; rm -rf "$R"; mkdir -p "$R"
repo=$(cd "$(dirname "$0")/.." && pwd)
before=${BEFORE:-$repo/.device/before}
V=/tmp/gv32f
python3 -m venv $V && $V/bin/pip install -q --no-index --find-links "$repo/.device/wheels" \
    nvidia-ml-py psutil pyudev prometheus-client click pyyaml structlog docker simpleeval \
    msgspec || { echo "wheels did not install"; exit 1; }
for d in "$repo" "$before"; do $V/bin/python -m compileall -q "$d/gpuguard"; done
nvidia-smi --query-gpu=name,driver_version,inforom.img,power.draw,temperature.gpu \
    --format=csv | tee "$R/gpu.csv"
ST=$(mktemp -d)
trees=(--tree "before=$before" --tree "after=$repo" --miss "after-miss=$repo" --state-dir "$ST")

echo "== alone, idle"
$V/bin/python "$repo/bench/check_trees.py" "${trees[@]}" --runs 21 --warmup 3 \
    --out "$R/alone_idle.json" | tail -4
for t in before miss hit; do
    dir=$repo; [ $t = before ] && dir=$before
    for i in 1 2 3 4 5 6 7 8; do
        [ $t = miss ] && rm -f "$ST/timing/inforom-valid"
        (cd "$dir" && GPUGUARD_TIMING=1 PYTHONPATH=$dir $V/bin/python -m gpuguard check \
            --state-dir "$ST/timing" 2>&1 >/dev/null | tail -1)
    done > "$R/timing-$t.txt"
done
head -50 "$R"/timing-*.txt
(cd "$repo" && PYTHONPATH=$repo $V/bin/python -X importtime -m gpuguard check \
    --state-dir "$ST/timing" 2> "$R/importtime-hit.txt" >/dev/null)
for t in miss hit; do
    [ $t = miss ] && rm -f "$ST/json/inforom-valid"
    (cd "$repo" && PYTHONPATH=$repo $V/bin/python -m gpuguard check --format json \
        --state-dir "$ST/json" > "$R/check-$t.json")
done
cp "$ST/json/inforom-valid" "$R/" 2>/dev/null
$V/bin/python - "$R" <<'PY'
import json, sys
r = sys.argv[1]
def rules(name):
    doc = json.load(open(f"{r}/check-{name}.json"))
    return {(x["rule"], (x.get("gpu") or {}).get("index")): (x["status"], x["message"])
            for x in doc["results"]}
miss, hit = rules("miss"), rules("hit")
diff = {k: (miss.get(k), hit.get(k)) for k in set(miss) | set(hit) if miss.get(k) != hit.get(k)}
print("inforom", {k: v for k, v in hit.items() if k[0] == "gpu.inforom"})
print("differ (miss vs hit):", diff)
PY

echo "== beside a daemon (this tree, default cadence), idle"
state=$(mktemp -d)
(cd "$repo" && PYTHONPATH=$repo exec $V/bin/python -m gpuguard daemon \
    --listen 127.0.0.1:19434 --no-udev --state-dir "$state") 2> "$R/daemon.log" &
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

echo "== gpuguard status by each launcher, beside a live daemon"
(cd "$repo" && PYTHONPATH=$repo $V/bin/python bench/launchers.py --live --runs 21 --warmup 3 \
    --out "$R/launchers.json")
rm -rf "$ST"
cd "$OUT" && tar czf issue32f.tgz issue32f && ls -la issue32f
