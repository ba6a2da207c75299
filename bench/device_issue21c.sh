#!/usr/bin/env bash
# Issue 21, item 3 on a lent H200, read-only (the device rules forbid a GPU reset, so no
# reset is made here): what the real kernel log holds that the repair parser reads (the
# driver's loads, a reload, any "GPU reset occurred" line, the driver's per-attach
# "NVRM: GPU at PCI:...: GPU-<uuid>" lines, which gpuguard deliberately does not take as a
# reset), and that `check --record` on this host clears nothing, escalates nothing and
# records only what the log shows (`gpuguard events --kind repair`), idle.
#
# Needs: .device/wheels with the gpuguard wheel of this branch (the lead's combined run
# builds it), python3 with venv, root (the kernel log). Prints a summary; files under $OUT.
set -u
FINAL=${OUT:-./out}; mkdir -p "$FINAL"
export OUT=/tmp/gg21c; rm -rf "$OUT"; mkdir -p "$OUT"
python3 -m venv /tmp/gv21c && /tmp/gv21c/bin/pip install -q --no-index --find-links .device/wheels gpuguard
GG=/tmp/gv21c/bin/gpuguard PY=/tmp/gv21c/bin/python
STATE=$(mktemp -d)

dmesg 2>/dev/null | grep -E "NVRM|Xid|GSP|GPU reset" > "$OUT/dmesg-nvrm.txt"
echo "driver lines: $(wc -l < "$OUT/dmesg-nvrm.txt")"
echo "loads: $(grep -c 'NVRM: loading NVIDIA' "$OUT/dmesg-nvrm.txt")"
echo "per-attach UUID lines: $(grep -c 'NVRM: GPU at PCI:' "$OUT/dmesg-nvrm.txt")"
echo "reset lines: $(grep -c 'GPU reset occurred' "$OUT/dmesg-nvrm.txt")"
# the summary the source makes of the live log: its repairs, and the time it took
$PY - > "$OUT/repairs.txt" 2>&1 <<'PYEOF'
import json, time
from pathlib import Path
from gpuguard.sources import kmsg
t = time.perf_counter()
log = kmsg.read_device(Path("/dev/kmsg")).get()
ms = (time.perf_counter() - t) * 1000
print(f"records {log['records']} read in {ms:.1f} ms; loads {len(log['driver_loads'])}; "
      f"repairs {json.dumps(log['repairs'])}; xids {len(log['xids'])}; gsp {len(log['gsp'])}")
PYEOF
cat "$OUT/repairs.txt"
for n in 1 2; do
  $GG check --record --state-dir "$STATE" --only xid.recent --only gsp.firmware \
      --only recovery.action --only memory.row_remap --format json > "$OUT/check-$n.json" \
      2> "$OUT/check-$n.err"
  echo "check $n exit $?"
done
$PY - "$OUT/check-2.json" <<'PYEOF' | tee "$OUT/summary.txt"
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    gpu = "host" if r["gpu"] is None else r["gpu"]["index"]
    cleared = r["observed"].get("cleared")
    tag = "NONOK" if r["status"] != "ok" or r["action"] == "inspect_hardware" else "ok   "
    print(f"{tag} {r['rule']} gpu={gpu} {r['status']} action={r['action']} cleared={cleared}: "
          f"{r['message'][:120]}")
PYEOF
$GG events --state-dir "$STATE" --kind repair --since 30d > "$OUT/events-repair.txt" 2>&1
echo "repair events: $(grep -c -E 'gpu_reset|driver_reload' "$OUT/events-repair.txt")"
rm -rf "$STATE"
cp -r "$OUT"/. "$FINAL"/
