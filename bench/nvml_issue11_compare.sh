#!/usr/bin/env bash
# Issue 11 on a real GPU host: the new fields of `gpuguard snapshot` beside
# `nvidia-smi nvlink -s -e`, `topo -m` and `-q -x`, taken at the same moment, as one
# small table per GPU. Raw outputs go to $OUT (or ./out). Reads only: no GPU setting
# is changed and no counter is reset.
set -u
OUT=${OUT:-./out}; mkdir -p "$OUT"
py=${PYTHON:-python3}
gg=${GPUGUARD:-$py -m gpuguard}
# same moment: start all, wait for all
$gg snapshot -o "$OUT/snapshot.json" 2> "$OUT/snapshot.err" &
nvidia-smi -q -x > "$OUT/nvidia-smi-q.xml" &
nvidia-smi nvlink -s > "$OUT/nvlink-s.txt" 2>&1 &
nvidia-smi nvlink -e > "$OUT/nvlink-e.txt" 2>&1 &
nvidia-smi topo -m > "$OUT/topo-m.txt" 2>&1 &
wait
echo "snapshot rc: $(test -s "$OUT/snapshot.json" && echo ok || echo FAILED: "$(tail -1 "$OUT/snapshot.err")")"
sed -n '1,/^$/p' "$OUT/topo-m.txt" | head -12
$py - "$OUT" <<'PY'
import json, os, re, sys
import xml.etree.ElementTree as ET
from pathlib import Path

out = Path(sys.argv[1])
snap = json.loads((out / "snapshot.json").read_text())
xml = ET.parse(out / "nvidia-smi-q.xml").getroot().findall("gpu")
print("nvml:", snap["nvml"].get("elapsed_s"), "s; hung:", snap["nvml"].get("hung_call"),
      "; sweep_error:", snap["nvml"].get("sweep_error"))
print("host fabricmanager_running:", snap["host"].get("fabricmanager_running"))


def smi_links(path):
    """nvidia-smi nvlink -s / -e, per GPU: {link: text}."""
    per, gpu = {}, None
    for line in path.read_text().splitlines():
        if m := re.match(r"GPU (\d+):", line):
            gpu = int(m.group(1)); per[gpu] = {}
        elif gpu is not None and (m := re.match(r"\s+Link (\d+): (.*)", line)):
            per[gpu].setdefault(int(m.group(1)), []).append(m.group(2).strip())
        elif gpu is not None and per[gpu] and line.startswith("\t\t"):
            per[gpu][max(per[gpu])].append(line.strip())
    return per


speeds, errors = smi_links(out / "nvlink-s.txt"), smi_links(out / "nvlink-e.txt")


def x(g, path):
    node = g.find(path)
    return None if node is None or node.text is None else node.text.strip()


def short(v):
    if isinstance(v, dict) and "state" in v:
        return v["state"] + (f" ({v['error'][:50]})" if v.get("error") else "")
    return v


for gpu in snap["gpus"]:
    i = gpu["index"]
    g = xml[i] if i < len(xml) else None
    print(f"\n== GPU {i} {gpu.get('pci_bus_id')}")
    rows = [
        ("fabric state", gpu.get("fabric_state"), g is not None and x(g, "fabric/state")),
        ("fabric status", gpu.get("fabric_status"), g is not None and x(g, "fabric/status")),
        ("fabric clique", gpu.get("fabric_clique_id"), g is not None and x(g, "fabric/cliqueId")),
        ("MIG current/pending", (gpu.get("mig_mode_current"), gpu.get("mig_mode_pending")),
         g is not None and (x(g, "mig_mode/current_mig"), x(g, "mig_mode/pending_mig"))),
        ("HBM temp C", gpu.get("memory_temperature_c"),
         g is not None and x(g, "temperature/memory_temp")),
        ("HBM max C", gpu.get("memory_temperature_max_c"),
         g is not None and (x(g, "temperature/gpu_temp_max_mem_threshold")
                            or "tlimit " + str(x(g, "temperature/gpu_temp_max_mem_tlimit_threshold")))),
        ("app clocks SM/MEM", (gpu.get("clock_sm_app_mhz"), gpu.get("clock_mem_app_mhz")),
         g is not None and (x(g, "applications_clocks/graphics_clock"),
                            x(g, "applications_clocks/mem_clock"))),
        ("default app SM/MEM",
         (gpu.get("clock_sm_app_default_mhz"), gpu.get("clock_mem_app_default_mhz")),
         g is not None and (x(g, "default_applications_clocks/graphics_clock"),
                            x(g, "default_applications_clocks/mem_clock"))),
        ("GSP firmware", gpu.get("gsp_firmware_version"),
         g is not None and x(g, "gsp_firmware_version")),
    ]
    for name, mine, theirs in rows:
        print(f"  {name:<20} gpuguard: {str(short(mine)):<28} nvidia-smi -q -x: {theirs}")
    for p in gpu.get("p2p_status") if isinstance(gpu.get("p2p_status"), list) else [gpu.get("p2p_status")]:
        print("  p2p", short(p))
    links = gpu.get("nvlink_links")
    if not isinstance(links, list):
        print("  nvlink:", short(links), "| nvlink -s:", speeds.get(i, {}).get(0))
        continue
    up = sum(1 for link in links if link["up"])
    print(f"  nvlink: {len(links)} links, {up} up; versions {sorted({l['version'] for l in links}, key=str)};"
          f" remote {sorted({str(l['remote_pci']) for l in links})}")
    print(f"  {'link':>4} {'up':>3} {'replay':>6} {'recov':>5} {'flit':>5} {'data':>6} | nvlink -s | nvlink -e")
    quiet = []
    for link in links:
        n = link["link"]
        # the first two links, and any that is down or counts a fault; FULL=1: all
        if not (n < 2 or not link["up"] or any(link[k] for k in ("replay", "recovery", "crc_flit"))
                or os.environ.get("FULL")):
            quiet.append(link)
            continue
        print(f"  {n:>4} {int(link['up']):>3} {link['replay']!s:>6} {link['recovery']!s:>5}"
              f" {link['crc_flit']!s:>5} {link['crc_data']!s:>6} | "
              f"{' '.join(speeds.get(i, {}).get(n, ['-']))} | "
              f"{'; '.join(errors.get(i, {}).get(n, ['-']))[:70]}")
    if quiet:
        data = [l["crc_data"] for l in quiet if isinstance(l["crc_data"], int)]
        print(f"  ... {len(quiet)} more links up, replay/recovery/flit 0, crc_data"
              f" {min(data, default=None)}-{max(data, default=None)} (FULL=1 lists them)")
PY
