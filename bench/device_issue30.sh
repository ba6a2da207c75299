#!/usr/bin/env bash
# Issue 30, item 3, on the H200 test host (PyTorch there, no vLLM, no network): the
# supervisor's `failback_probe: qualify` once end to end with a real service.
#   1. the real daemon (--fast-interval 1, a kernel-log file of its own) supervises an
#      exec service whose GPU variant is bench/engine_server.py on GPU 0;
#   2. an Xid 48 line for GPU 0 appended to that kernel-log file: a hardware failover
#      (reset_gpu) to the CPU variant;
#   3. a "GPU reset occurred" line for its UUID: xid.recent clears;
#   4. the daemon qualifies GPU 0 (`gpuguard qualify --level standard`, the real GPU, the
#      shipped targets) once the GPU variant is stopped and the GPU idle;
#   5. the failback on its pass; the GPU variant answers again.
# The times of each step (from the daemon's log and the script's clock) go to
# $OUT/issue30/times.json and summary.txt; `failover status` is polled every 2 s, and
# `gpuguard events` shows the pair (the qualify event naming the failover, the failback
# naming the qualification's bundle). No GPU setting is changed; nothing is installed
# outside /tmp. The Xid and reset lines are written to a file the daemon reads, never to
# the host's kernel log.
#   bash bench/device_issue30.sh    (from the checkout; its dependencies as wheels in
#                                    .device/wheels; python3 with torch for the engine)
# A local smoke run: GG_PY=an interpreter with the dependencies, LD_LIBRARY_PATH at the
# fake NVML and libcuda, QUALIFY='{"seconds": 1, "targets": "tests/qualify/targets-fake"}'
# and the fakes' FAKE_NVML_* switches (tests/qualify/test_qualify_cli.py LOADED); without
# PyTorch the engine is a stub of this script's (never on the device).
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-./out}; R=$OUT/issue30; rm -rf "$R"; mkdir -p "$R"
py=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
if [ -n "${GG_PY:-}" ]; then  # a local smoke run: an interpreter that has the dependencies
    GP=$GG_PY
else
    $py -m venv /tmp/gv30 && /tmp/gv30/bin/pip install -q --no-index --find-links .device/wheels \
        nvidia-ml-py psutil pyudev prometheus-client click pyyaml structlog docker simpleeval msgspec \
        || { echo "the dependencies did not install from .device/wheels"; exit 1; }
    GP=/tmp/gv30/bin/python
fi
G=(env "PYTHONPATH=$repo" "$GP" -m gpuguard)
FAST=1; GPU_PORT=18135; CPU_PORT=18136; LISTEN=127.0.0.1:19530
QUALIFY=${QUALIFY:-'{"level": "standard"}'}
W=/tmp/gg30; rm -rf "$W"; mkdir -p "$W/state"
now() { $GP -c 'import time; print(f"{time.time():.3f}")'; }

echo "== the host"
nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version,power.draw,power.limit \
    --format=csv > "$R/gpus.csv" 2>&1 || echo "no nvidia-smi" > "$R/gpus.csv"
cat "$R/gpus.csv"
"${G[@]}" --version
# GPU 0 as NVML names it: the kernel log's spelling of its address, and its UUID
read -r KPCI UUID < <($GP - <<'EOF'
import pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
pci = pynvml.nvmlDeviceGetPciInfo(h).busId
pci = pci.decode() if isinstance(pci, bytes) else pci
uuid = pynvml.nvmlDeviceGetUUID(h)
uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
domain, bus, rest = pci.split(":")
print(f"{domain[-4:]}:{bus}:{rest.split('.')[0]}".lower(), uuid)
EOF
)
echo "GPU 0: kernel address $KPCI, $UUID" | tee "$R/summary.txt"

server="$here/engine_server.py"; device=${ENGINE_DEVICE:-cuda}
if ! $py -c "import torch" 2>/dev/null; then
    [ -n "${GG_PY:-}" ] || { echo "no PyTorch for the engine"; exit 1; }
    server="$W/stub_server.py"; device=stub  # the smoke run's stand-in
    cat > "$server" <<'EOF'
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(BaseHTTPRequestHandler):
    def answer(self):
        body = json.dumps({"choices": [{"text": "ok"}]}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
    do_GET = do_POST = answer
    def log_message(self, *a): pass
ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
EOF
fi

# the kernel-log file the daemon reads: the boot's first record, the driver's load line
UP=$(cut -d' ' -f1 /proc/uptime | tr -d .)0000  # microseconds since boot, about
KMSG=$W/kmsg.log
printf '6,0,0,-;Linux version (gpuguard device_issue30)\n4,100,%s,-;NVRM: loading NVIDIA UNIX Open Kernel Module\n' \
    "$UP" > "$KMSG"
kline() { printf '4,%s,%s,-;%s\n' "$1" "$(cut -d' ' -f1 /proc/uptime | tr -d .)0000" "$2" >> "$KMSG"; }

$GP - "$W" "$server" "$py" $GPU_PORT $CPU_PORT "$device" "$QUALIFY" > "$W/gpuguard.yaml" <<'EOF'
import json, sys
w, server, py, gpu_port, cpu_port, device, qualify = sys.argv[1:8]

def variant(name, dev, port, dim, layers):
    pid, log = f"{w}/{name}.pid", f"{w}/{name}.log"
    return {f"start_{name}": ["sh", "-c", f"{py} {server} --port {port} --device {dev} "
                              f"--dim {dim} --layers {layers} --log {log} >> {log} 2>&1 & "
                              f"echo $! > {pid}"],
            f"stop_{name}": ["sh", "-c", f"[ -f {pid} ] && kill $(cat {pid}); "
                             f"while [ -f {pid} ] && kill -0 $(cat {pid}) 2>/dev/null; do "
                             f"sleep 0.1; done; rm -f {pid}; true"],
            f"running_{name}": ["sh", "-c", f"[ -f {pid} ] && kill -0 $(cat {pid})"],
            f"pid_file_{name}": pid, f"log_file_{name}": log}

service = {
    "name": "llm", "backend": "exec", "gpus": [0], "rules": ["xid.recent"],
    "failover_after": 2, "failback_after": 3, "min_cpu_time": 0,
    "failback_probe": "qualify", "qualify": json.loads(qualify),
    "engine": "none",
    "probe": {"http": {"gpu": f"http://127.0.0.1:{gpu_port}/v1/completions",
                       "cpu": f"http://127.0.0.1:{cpu_port}/v1/completions"},
              "body": {"model": "m", "prompt": "hi", "max_tokens": 4},
              "json_path": "choices.0.text", "request_timeout": 10, "timeout": 180},
    "exec": {**variant("gpu", device if device != "stub" else "cuda", gpu_port, 4096, 8),
             **variant("cpu", "cpu", cpu_port, 256, 2)}}
print(json.dumps({"services": [service]}, indent=1))
EOF
cp "$W/gpuguard.yaml" "$R/"

T_START=$(now)
"${G[@]}" daemon --listen $LISTEN --no-udev --no-docker --fast-interval $FAST --slow-interval 600 \
    --state-dir "$W/state" --config "$W/gpuguard.yaml" --kmsg-file "$KMSG" \
    --log-format json 2> "$R/daemon.log" & D=$!
( while kill -0 $D 2>/dev/null; do
    echo "--- $(date -u +%H:%M:%S.%N)"; "${G[@]}" failover status --state-dir "$W/state" 2>&1
    sleep 2; done ) > "$R/failover-status.log" & P=$!

waitlog() {  # waitlog EVENT N SECONDS: until the daemon has logged EVENT N times
    local end=$((SECONDS + $3))
    while [ $SECONDS -lt $end ]; do
        [ "$(grep -c "\"event\": \"$1\"" "$R/daemon.log")" -ge "$2" ] && return 0; sleep 0.5
    done
    echo "timed out waiting for $1 ($2)" | tee -a "$R/summary.txt"; return 1
}
answers() {  # answers PORT: the variant answers a completion
    $GP - "http://127.0.0.1:$1/v1/completions" <<'EOF'
import json, sys, urllib.request
req = urllib.request.Request(sys.argv[1], json.dumps({"model": "m", "prompt": "hi",
                             "max_tokens": 1}).encode(), {"Content-Type": "application/json"})
urllib.request.urlopen(req, timeout=5).read()
EOF
}

echo "== the GPU variant starts"
end=$((SECONDS + 240)); until answers $GPU_PORT 2>/dev/null; do
    [ $SECONDS -lt $end ] || { echo "the GPU variant never answered" | tee -a "$R/summary.txt"; break; }
    sleep 1; done
T_GPU_UP=$(now)
sleep $((3 * FAST))
nvidia-smi --query-compute-apps=pid,name,used_memory --format=csv > "$R/apps-serving.csv" 2>&1

echo "== Xid 48 on GPU 0"
T_XID=$(now)
kline 101 "NVRM: Xid (PCI:$KPCI): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer."
waitlog failover_done 1 120
T_ON_CPU=$(now)
answers $CPU_PORT && echo "the CPU variant answers" | tee -a "$R/summary.txt"
sleep 5  # the Xid stays critical: nothing may be qualified meanwhile
grep -q failback_qualify_started "$R/daemon.log" && echo "BAD: qualified before the reset" | tee -a "$R/summary.txt"

echo "== the GPU reset line"
T_RESET=$(now)
kline 102 "GPU reset occurred: $UUID"
waitlog failback_qualify_started 1 120 && T_QSTART=$(now)
nvidia-smi --query-gpu=power.draw,clocks.sm,temperature.gpu --format=csv -l 2 > "$R/power-during.csv" 2>&1 & S=$!
waitlog failover_done 2 400
T_BACK=$(now)
kill $S 2>/dev/null
end=$((SECONDS + 240)); until answers $GPU_PORT 2>/dev/null; do
    [ $SECONDS -lt $end ] || { echo "the GPU variant never answered again" | tee -a "$R/summary.txt"; break; }
    sleep 1; done
T_GPU_AGAIN=$(now)
sleep 3

"${G[@]}" failover status --state-dir "$W/state" > "$R/failover-status-end.txt" 2>&1
COLUMNS=250 "${G[@]}" events --state-dir "$W/state" --kind supervisor --kind qualify --kind repair \
    --kind xid > "$R/events.txt" 2>&1
"${G[@]}" events --state-dir "$W/state" --kind supervisor --kind qualify --format json > "$R/events.json" 2>&1
kill $P 2>/dev/null; kill -TERM $D; wait $D
for v in gpu cpu; do [ -f "$W/$v.pid" ] && kill "$(cat "$W/$v.pid")" 2>/dev/null; done
cp "$W"/gpu.log "$W"/cpu.log "$W"/state/qualify-failback-llm.log "$R/" 2>/dev/null
cp -r "$W/state/qualify-bundles" "$R/" 2>/dev/null

$GP - "$R" "$T_START" "$T_GPU_UP" "$T_XID" "$T_ON_CPU" "$T_RESET" "${T_QSTART:-0}" "$T_BACK" \
    "$T_GPU_AGAIN" <<'EOF' | tee -a "$R/summary.txt"
import datetime, json, sys
r = sys.argv[1]
script = dict(zip(["start", "gpu_up", "xid_written", "seen_on_cpu", "reset_written",
                   "seen_qualifying", "seen_on_gpu", "gpu_answers_again"],
                  map(float, sys.argv[2:])))
def stamp(line):
    return datetime.datetime.fromisoformat(line["timestamp"].replace("Z", "+00:00")).timestamp()
log = [json.loads(l) for l in open(f"{r}/daemon.log") if l.startswith("{")]
def first(event, **match):
    for line in log:
        if line.get("event") == event and all(line.get(k) == v for k, v in match.items()):
            return line
    return None
marks = {"failover_started": first("failover_started", to="cpu"),
         "failover_done": first("failover_done", active="cpu"),
         "qualify_started": first("failback_qualify_started"),
         "qualify_ended": first("failback_qualify_ended"),
         "qualify_passed": first("failback_qualify_passed"),
         "failback_started": first("failover_started", to="gpu"),
         "failback_done": first("failover_done", active="gpu")}
daemon = {k: stamp(v) for k, v in marks.items() if v}
x, reset = script["xid_written"], script["reset_written"]
def since(t0, key):
    return round(daemon[key] - t0, 2) if key in daemon else None
out = {"script": script, "daemon": daemon,
       "xid_to_failover_done_s": since(x, "failover_done"),
       "reset_to_qualify_started_s": since(reset, "qualify_started"),
       "qualify_s": round(daemon["qualify_ended"] - daemon["qualify_started"], 2)
       if {"qualify_ended", "qualify_started"} <= daemon.keys() else None,
       "qualify_end_to_failback_done_s": round(daemon["failback_done"] - daemon["qualify_ended"], 2)
       if {"failback_done", "qualify_ended"} <= daemon.keys() else None,
       "failback_took_s": (marks["failback_done"] or {}).get("took_s"),
       "reset_to_gpu_answers_s": round(script["gpu_answers_again"] - reset, 2),
       "xid_to_gpu_answers_s": round(script["gpu_answers_again"] - x, 2),
       "qualify_code": (marks["qualify_ended"] or {}).get("code"),
       "blocked_reasons": sorted({l["reason"][:200] for l in log if l.get("event") == "failback_blocked"}),
       "qualified_before_reset": bool(marks["qualify_started"]) and daemon.get("qualify_started", 0) < reset}
json.dump(out, open(f"{r}/times.json", "w"), indent=1)
for k, v in out.items():
    if k not in ("script", "daemon"):
        print(f"{k}: {v}")
events = json.load(open(f"{r}/events.json"))["events"] if open(f"{r}/events.json").read(1) == "{" else []
q = [e for e in events if e["kind"] == "qualify"]
print("qualify events:", [(e["gpu_index"], e["status"], e["data"].get("purpose")) for e in q])
print("supervisor events:", [e["status"] for e in reversed(events) if e["kind"] == "supervisor"])
ok = out["qualify_code"] == 0 and "failback_done" in daemon and not out["qualified_before_reset"]
print("END TO END:", "ok" if ok else "NOT ok")
sys.exit(0 if ok else 1)
EOF
rc=${PIPESTATUS[0]}
tar czf "$OUT/issue30.tgz" -C "$OUT" issue30
echo "exit $rc"
exit "$rc"
