#!/usr/bin/env bash
# Issue 32 on the lent H200: the daemon's CPU per fast cycle (the daemon and its NVML
# worker, real NVML, 5 s cadence, bench/daemon_cost.py --nvml) with the InfoROM validated
# every sweep (the tree before the change, carried in .device/before) and at most once a
# slow interval (this tree), interleaved, two rounds each; and one sweep's calls timed.
#   bash bench/device_issue32.sh   (dependencies as py3.12 wheels in .device/wheels)
# Reads only; changes no GPU setting; writes under $OUT and /tmp.
set -u
OUT=${OUT:-./out}; R=$OUT/issue32; rm -rf "$R"; mkdir -p "$R"
here=$(cd "$(dirname "$0")" && pwd); repo=$(cd "$here/.." && pwd)
python3 -m venv /tmp/gv32 && /tmp/gv32/bin/pip install -q --no-index \
    --find-links "$repo/.device/wheels" nvidia-ml-py psutil pyudev prometheus-client click \
    pyyaml structlog docker simpleeval msgspec || { echo "wheels did not install"; exit 1; }
PY=/tmp/gv32/bin/python
nvidia-smi --query-gpu=name,driver_version,power.draw,utilization.gpu --format=csv > "$R/gpu.txt"
for round in 1 2; do
    for tree in before after; do
        dir=$repo; [ "$tree" = before ] && dir=$repo/.device/before
        (cd "$dir" && PYTHONPATH="$dir" $PY bench/daemon_cost.py --nvml --interval 5 \
            --seconds "${SECONDS_EACH:-60}" --scrapes 10 --event-store off \
            --out "$R/$tree-$round.json" > "$R/$tree-$round.log" 2>&1)
        echo "$tree $round: $(grep -o '"cpu_s_per_cycle": [0-9.]*' "$R/$tree-$round.json")"
    done
done
# one sweep's calls, timed (which call costs what on this board)
PYTHONPATH=$repo $PY - > "$R/calls.json" <<'PYEOF'
import json, time, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
out = {}
for name, fn in [("ValidateInforom", lambda: pynvml.nvmlDeviceValidateInforom(h)),
                 ("GetTemperature", lambda: pynvml.nvmlDeviceGetTemperature(h, 0)),
                 ("GetPowerUsage", lambda: pynvml.nvmlDeviceGetPowerUsage(h))]:
    times = []
    for _ in range(5):
        t = time.perf_counter(); fn(); times.append((time.perf_counter() - t) * 1000)
    out[name] = sorted(times)[2]
print(json.dumps(out))
PYEOF
cat "$R/calls.json"
tar -czf "$OUT/issue32.tgz" -C "$OUT" issue32
