#!/usr/bin/env bash
# Issue 21 on a lent H200: no new false alarm. `gpuguard check` live (real NVML, the real
# kernel log, /proc, /sys, /dev) idle and under a bf16 matmul on every GPU, three times
# each; every result of the rules issue 21 added or changed that is not ok (or skipped
# with a reason) is printed as NONOK. Also: what the new readings read on a real board
# (nvmlDeviceValidateInforom and the InfoROM versions, with the calls' time), the D-state
# processes and modules the source saw, and the daemon's series count on this host.
# Reads only: no GPU setting, module or process is changed.
#
# Needs: .device/wheels with the gpuguard wheel of this branch (the lead's combined run
# builds it), python3 with venv, PyTorch with CUDA for bench/gpu_load.py, root (the kernel
# log and every process's /proc/PID/fd). Prints a summary; files under $OUT.
set -u
FINAL=${OUT:-./out}; mkdir -p "$FINAL"
export OUT=/tmp/gg21; rm -rf "$OUT"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
python3 -m venv /tmp/gv21 && /tmp/gv21/bin/pip install -q --no-index --find-links .device/wheels gpuguard
GG=/tmp/gv21/bin/gpuguard PY=/tmp/gv21/bin/python
NEW='^(xid\.recent|xid\.app_repeated|sxid\.recent|gsp\.firmware|gpu\.inforom|devices\.|memory\.row_remap)'

nonok() {  # $1: a check's JSON; prints the non-ok results of the rules above
  $PY - "$1" "$NEW" <<'EOF'
import json, re, sys
doc = json.load(open(sys.argv[1]))
for r in doc["results"]:
    if not re.match(sys.argv[2], r["rule"]):
        continue
    gpu = "host" if r["gpu"] is None else r["gpu"]["index"]
    if r["status"] != "ok":
        print(f"NONOK {sys.argv[1].rsplit('/', 1)[-1]} {r['rule']} gpu={gpu} "
              f"{r['status']} action={r['action']}: {r['message']}")
    else:
        print(f"ok    {r['rule']} gpu={gpu}: {r['message'][:110]}")
EOF
}

for n in 1 2 3; do
  $GG check --format json > "$OUT/idle-$n.json" 2> "$OUT/idle-$n.err"; echo "idle check $n exit $?"
done
$GG check > "$OUT/idle-table.txt" 2>&1
python3 bench/gpu_load.py --seconds 75 > "$OUT/load.txt" 2>&1 & L=$!
sleep 10
for n in 1 2 3; do
  $GG check --format json > "$OUT/busy-$n.json" 2> "$OUT/busy-$n.err"; echo "busy check $n exit $?"
  sleep 5
done
$GG check > "$OUT/busy-table.txt" 2>&1
# the processes under load as the source sees them (the matmul's in D now and then?)
$PY -c "
import json, time
from pathlib import Path
from gpuguard.sources import gpu_devices
for i in range(10):
    r = gpu_devices.read(Path('/proc'), Path('/sys'), Path('/'), 5.0).get()
    print('gpu_devices', i, json.dumps(r)); time.sleep(1)
" > "$OUT/gpu-devices-busy.txt" 2>&1
wait $L
for f in "$OUT"/idle-[123].json "$OUT"/busy-[123].json; do nonok "$f"; done | sort | uniq -c | tee "$OUT/summary.txt"

# what the new NVML reads read on a real board, and how long they take
$PY - > "$OUT/inforom.txt" 2>&1 <<'EOF'
import time
import pynvml as nv
nv.nvmlInit()
for i in range(nv.nvmlDeviceGetCount()):
    h = nv.nvmlDeviceGetHandleByIndex(i)
    for name, call in (("validate", lambda: nv.nvmlDeviceValidateInforom(h)),
                       ("image", lambda: nv.nvmlDeviceGetInforomImageVersion(h)),
                       ("oem", lambda: nv.nvmlDeviceGetInforomVersion(h, nv.NVML_INFOROM_OEM)),
                       ("ecc", lambda: nv.nvmlDeviceGetInforomVersion(h, nv.NVML_INFOROM_ECC)),
                       ("power", lambda: nv.nvmlDeviceGetInforomVersion(h, nv.NVML_INFOROM_POWER))):
        t = time.perf_counter()
        try:
            value = call()
        except nv.NVMLError as exc:
            value = f"<{type(exc).__name__}: {exc}>"
        print(f"gpu {i} {name}: {value!r} ({(time.perf_counter() - t) * 1000:.2f} ms)")
EOF
cat "$OUT/inforom.txt"
dmesg 2>/dev/null | grep -E "NVRM|Xid|SXid|GSP" | tail -40 > "$OUT/dmesg-nvrm.txt"
head -5 "$OUT/gpu-devices-busy.txt"

# the daemon on this host: its series count (docs/metrics.md's budget) and the new rules
$GG daemon --listen 127.0.0.1:19421 --no-udev --state-dir /tmp/gg21-state --log-format json \
  2> "$OUT/daemon.log" & D=$!
sleep 15
curl -s 127.0.0.1:19421/metrics > "$OUT/metrics.txt"
kill -TERM $D; wait $D
echo "series: $(grep -vc '^#' "$OUT/metrics.txt")"
grep -E 'gpuguard_rule_status\{rule="(xid|sxid|gsp|gpu\.inforom|devices)' "$OUT/metrics.txt" \
  | sed 's/uuid="[^"]*",//'
tar czf "$FINAL/results21.tgz" -C "$OUT" .
cp "$OUT/summary.txt" "$OUT/inforom.txt" "$FINAL/"
