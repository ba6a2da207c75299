#!/usr/bin/env bash
# Issue 29 on the H200 test host (PyTorch there, no network): `gpuguard qualify` for real.
#   1. `check` before;  2. the daemon running beside everything (fast cycles of 1 s, its
#   verdict polled every 2 s: nothing above ok may show);  3. three `qualify --level
#   standard` runs (bundle, chart, JSON, wall time, exit code);  4. PyTorch's bf16 GEMM for
#   30 s, power sampled, beside the numbers;  5. the drill (--inject-bit-flip 7): exit 2,
#   SM 7 named, no pass recorded;  6. SIGTERM mid-run: how long until it exits and until
#   no process is on the GPU;  7. `check` after;  8. `events --kind qualify`.
# Reads only: nothing is installed outside /tmp, no GPU setting is changed.
#   bash bench/device_issue29.sh    (dependencies as wheels in .device/wheels)
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-./out}; R=$OUT/issue29; mkdir -p "$R"
py=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
$py -m venv /tmp/gv29 && /tmp/gv29/bin/pip install -q --no-index --find-links .device/wheels \
    nvidia-ml-py psutil pyudev prometheus-client click pyyaml structlog docker simpleeval msgspec \
    || { echo "the dependencies did not install from .device/wheels"; exit 1; }
GP=/tmp/gv29/bin/python
G=(env "PYTHONPATH=$repo" "$GP" -m gpuguard)
minus() { $GP -c "import sys; print(round(float(sys.argv[1]) - float(sys.argv[2]), 2))" "$1" "$2"; }
W=/tmp/gg29; rm -rf "$W"; mkdir -p "$W/state" "$W/dstate"
S=(--state-dir "$W/state")

echo "== the host"
nvidia-smi --query-gpu=index,name,driver_version,power.draw,power.limit,clocks.sm --format=csv 2>&1 | tee "$R/gpus.csv"
"${G[@]}" check --format json > "$R/check-before.json"; echo "check before: exit $?" | tee -a "$R/summary.txt"

"${G[@]}" daemon --listen 127.0.0.1:19529 --no-udev --no-docker --fast-interval 1 \
    --slow-interval 30 --state-dir "$W/dstate" --status-socket "$W/status.sock" \
    --status-group root --log-format json 2> "$R/daemon.log" & D=$!
( while kill -0 $D 2>/dev/null; do
    "${G[@]}" status --socket "$W/status.sock" --format json 2>/dev/null | $GP -c '
import json, sys, time
try:
    doc = json.load(sys.stdin)
except ValueError:
    print(json.dumps({"t": time.time(), "error": "no verdict"})); sys.exit()
bad = [(r["rule"], r["status"], r["message"][:160]) for r in doc.get("results", [])
       if r["status"] not in ("ok", "skipped")]
print(json.dumps({"t": time.time(), "code": doc.get("code"), "not_ok": bad}))'
    sleep 2; done ) > "$R/daemon-verdicts.jsonl" & P=$!
sleep 8

for n in 1 2 3; do
    sleep 3  # NVML's utilization of the last run must have settled: a busy GPU is refused
    extra=(); [ $n = 1 ] && extra=(--bundle "$R/bundle1.json" --chart "$R/run1.svg")
    began=$(date +%s.%N)
    "${G[@]}" qualify "${S[@]}" --level standard --format json "${extra[@]}" > "$R/qualify$n.json" 2> "$R/qualify$n.err"
    code=$?; ended=$(date +%s.%N)
    echo "qualify standard run $n: exit $code, wall $(minus $ended $began) s" | tee -a "$R/summary.txt"
done

echo "== PyTorch bf16 GEMM, 30 s, power sampled"
$py - > "$R/torch.json" <<'EOF'
import json, threading, time
import pynvml, torch
pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0)
rows, stop = [], threading.Event()
def sample():
    while not stop.is_set():
        rows.append((time.monotonic(), pynvml.nvmlDeviceGetPowerUsage(h) / 1e3,
                     pynvml.nvmlDeviceGetClockInfo(h, 1)))
        time.sleep(0.1)
threading.Thread(target=sample, daemon=True).start()
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
torch.cuda.synchronize(); began = time.monotonic(); n = 0
while time.monotonic() - began < 30:
    for _ in range(20): a @ b
    n += 20; torch.cuda.synchronize()
spent = time.monotonic() - began; stop.set()
steady = sorted(w for t, w, _ in rows if t > began + 3)
clocks = sorted(c for t, _, c in rows if t > began + 3)
print(json.dumps({"tflops": round(n * 2 * 8192 ** 3 / spent / 1e12, 1),
                  "power_w_median": steady[len(steady) // 2], "power_w_max": steady[-1],
                  "limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1e3,
                  "sm_mhz_median": clocks[len(clocks) // 2]}))
EOF
cat "$R/torch.json" | tee -a "$R/summary.txt"

sleep 3
echo "== the drill"
"${G[@]}" qualify "${S[@]}" --level standard --seconds 10 --inject-bit-flip 7 --format json > "$R/drill.json" 2> "$R/drill.err"
echo "drill: exit $?" | tee -a "$R/summary.txt"

sleep 3
echo "== SIGTERM mid-run"
"${G[@]}" qualify "${S[@]}" --level standard --format json > "$R/sigterm.json" 2> "$R/sigterm.err" & Q=$!
sleep 15
nvidia-smi --query-compute-apps=pid,name --format=csv,noheader > "$R/apps-before-sigterm.txt"
t0=$(date +%s.%N); kill -TERM $Q; wait $Q; code=$?; t1=$(date +%s.%N)
for i in $(seq 1 50); do
    [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader)" ] && break; sleep 0.1
done
t2=$(date +%s.%N)
echo "sigterm: exit $code after $(minus $t1 $t0) s; GPU free of processes after $(minus $t2 $t0) s" | tee -a "$R/summary.txt"
nvidia-smi --query-compute-apps=pid,name --format=csv,noheader > "$R/apps-after-sigterm.txt"

sleep 3
"${G[@]}" check --format json > "$R/check-after.json"; echo "check after: exit $?" | tee -a "$R/summary.txt"
"${G[@]}" events "${S[@]}" --kind qualify > "$R/events.txt" 2>&1
kill $P 2>/dev/null; kill -TERM $D; wait $D 2>/dev/null
$GP - "$R" <<'EOF' | tee -a "$R/summary.txt"
import json, sys
r = sys.argv[1]
rows = [json.loads(l) for l in open(f"{r}/daemon-verdicts.jsonl") if l.strip()]
bad = [x for x in rows if x.get("not_ok") or x.get("error")]
print(f"daemon verdicts polled: {len(rows)}, with anything above ok: {len(bad)}")
for x in bad[:5]:
    print("  ", x)
for n in ("qualify1", "qualify2", "qualify3", "drill", "sigterm"):
    doc = json.load(open(f"{r}/{n}.json"))
    print(n, "code", doc.get("code"), sorted({(x["rule"], x["status"]) for x in doc["results"]}))
EOF
tar czf "$OUT/issue29.tgz" -C "$OUT" issue29
