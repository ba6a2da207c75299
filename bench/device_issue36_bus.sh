#!/usr/bin/env bash
# Issue 36 (by-PCI lookups, sources/nvml_bus.py) on the lent H200: a healthy host asks NVML
# nothing by bus id (every GPU on the bus is listed: gpu.count ok, no gpu.lost host result,
# host.pci_handles absent), and the real NVML's answers to the lookup as nvml_bus.ask maps
# them: the GPU's own bus id (found, in both domain widths) and addresses that hold no GPU.
# Reads only. Results on stdout and in $OUT/issue36-bus.txt.
set -u
OUT=${OUT:-./out}; mkdir -p "$OUT"
repo=$(cd "$(dirname "$0")/.." && pwd)
. "$repo/bench/device_venvs.sh"
deps_venv /tmp/gv36 || exit 1
export PYTHONPATH=$repo
P=/tmp/gv36/bin/python
{
nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv
lspci -D -d 10de: -nn 2>/dev/null
echo "--- check (live, this tree)"
$P -m gpuguard check --format json > /tmp/check.json; echo "rc=$?"
$P - <<'PY'
import json
doc = json.load(open("/tmp/check.json"))
for r in doc["results"]:
    if r["rule"] in ("gpu.count", "gpu.lost"):
        print(r["rule"], r["gpu"] and r["gpu"]["index"], r["status"], r["message"])
print("gpu.lost host results:", sum(1 for r in doc["results"]
                                    if r["rule"] == "gpu.lost" and r["gpu"] is None))
PY
echo "--- snapshot: host.pci_handles"
$P -m gpuguard snapshot | $P -c 'import json,sys; print(json.load(sys.stdin)["host"]["pci_handles"])'
echo "--- the real NVML's by-PCI answers (nvml_bus.ask)"
$P - <<'PY'
import pynvml
from gpuguard.sources import nvml_bus
pynvml.nvmlInit()
bus = pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).busId
bus = bus.decode() if isinstance(bus, bytes) else bus
short = nvml_bus.key(bus)
for address in (bus, short, short.upper(), "0000:ff:1f.0", "0000:00:00.0", "not-a-bus-id"):
    print(repr(address), nvml_bus.ask(pynvml, address))
PY
} 2>&1 | tee "$OUT/issue36-bus.txt"
