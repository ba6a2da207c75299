#!/usr/bin/env bash
# Issue 28, item 5, on the H200 test host (PyTorch there, no vLLM, no network): the real
# daemon (--fast-interval 1, a status socket, NPD's files) supervises an exec service whose
# GPU variant is bench/engine_server.py on the GPU (vLLM's metric names), probed with
# request_timeout 3, saturated by 96 clients. `gpuguard status` every second for 60 s must
# exit 0 every time with nothing stale (before: 20 of 60 exited 3, "stale"); the daemon's
# logged stale_after must be 2 x (interval + NVML's timeout + the service's slowest wait
# + 1 s of grace + 1 s of history); after SIGSTOP of the daemon, every NPD file reads
# Unknown within its max_age (bench/issue28_drive.py). Reads only: nothing is installed
# outside /tmp, no GPU setting is changed. Results in $OUT/issue28.
#   bash bench/device_issue28.sh    (from the checkout; its dependencies as wheels in
#                                    .device/wheels; python3 with torch for the engine)
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-./out}; R=$OUT/issue28; mkdir -p "$R"
py=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
if [ -n "${GG_PY:-}" ]; then  # a local smoke run: an interpreter that has the dependencies
    GP=$GG_PY
else
    $py -m venv /tmp/gv28 && /tmp/gv28/bin/pip install -q --no-index --find-links .device/wheels \
        nvidia-ml-py psutil pyudev prometheus-client click pyyaml structlog docker simpleeval msgspec
    GP=/tmp/gv28/bin/python
fi
G=(env "PYTHONPATH=$repo" "$GP" -m gpuguard)
FAST=1; TIMEOUT=4; REQUEST_TIMEOUT=3; ENGINE_TIMEOUT=2
GPU_PORT=18133; CPU_PORT=18134; LISTEN=127.0.0.1:19433
W=/tmp/gg28; rm -rf "$W"; mkdir -p "$W/rules.d" "$W/state" "$W/npd"

echo "== the host"
nvidia-smi --query-gpu=index,name,driver_version,power.draw,power.limit --format=csv 2>&1 | tee "$R/gpus.csv"
"${G[@]}" --version

$py - "$W" "$here/engine_server.py" "$py" $GPU_PORT $CPU_PORT $REQUEST_TIMEOUT $ENGINE_TIMEOUT \
    "${ENGINE_DEVICE:-cuda}" "${GPU_DIM:-8192}" "${GPU_LAYERS:-80}" > "$W/gpuguard.yaml" <<'EOF'
import json, sys
w, server, py, gpu_port, cpu_port, request_timeout, engine_timeout = sys.argv[1:8]

def variant(name, dev, port, dim, layers):
    pid, log = f"{w}/{name}.pid", f"{w}/{name}.log"
    return {f"start_{name}": ["sh", "-c", f"{py} {server} --port {port} --device {dev} "
                              f"--dim {dim} --layers {layers} --log {log} >> {log} 2>&1 & "
                              f"echo $! > {pid}"],
            f"stop_{name}": ["sh", "-c", f"[ -f {pid} ] && kill $(cat {pid}); rm -f {pid}; true"],
            f"running_{name}": ["sh", "-c", f"[ -f {pid} ] && kill -0 $(cat {pid})"],
            f"pid_file_{name}": pid, f"log_file_{name}": log}

service = {
    "name": "llm", "backend": "exec", "failover_after": 3, "failback": "manual",
    "rules": ["service.*"],
    "engine": {"name": "vllm", "timeout": float(engine_timeout)},
    "probe": {"http": {"gpu": f"http://127.0.0.1:{gpu_port}/v1/completions",
                       "cpu": f"http://127.0.0.1:{cpu_port}/v1/completions"},
              "body": {"model": "m", "prompt": "hi", "max_tokens": 4},
              "json_path": "choices.0.text", "request_timeout": float(request_timeout),
              "timeout": 120},
    "exec": {**variant("gpu", sys.argv[8], gpu_port, int(sys.argv[9]), int(sys.argv[10])),
             **variant("cpu", "cpu", cpu_port, 256, 2)}}
print(json.dumps({"services": [service]}, indent=1))
EOF
cp "$W/gpuguard.yaml" "$R/"

"${G[@]}" daemon --listen $LISTEN --no-udev --no-docker --fast-interval $FAST --slow-interval 600 \
    --timeout $TIMEOUT --state-dir "$W/state" --config "$W/gpuguard.yaml" --rules "$W/rules.d" \
    --status-socket "$W/status.sock" --status-group root --npd-dir "$W/npd" \
    --log-format json 2> "$R/daemon.log" & D=$!

echo "== waiting for the GPU variant to answer"
$GP - "http://127.0.0.1:$GPU_PORT/v1/completions" <<'EOF'
import json, sys, time, urllib.request
end = time.monotonic() + 180
while time.monotonic() < end:
    try:
        req = urllib.request.Request(sys.argv[1], json.dumps(
            {"model": "m", "prompt": "hi", "max_tokens": 1}).encode(),
            {"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=5).read()
        print("the GPU variant answers"); break
    except OSError:
        time.sleep(1)
EOF
# the formula (daemon/freshness.py): the service's wait is max(request_timeout, the engine
# read's timeout, the log read's deadline) + 1 s of grace; the history wait 1 s
LOG_DEADLINE=$(env "PYTHONPATH=$repo" $GP -c \
    'from gpuguard.daemon.service_logs import DEADLINE_S; print(DEADLINE_S)')
EXPECT=$($GP -c "print(2 * ($FAST + $TIMEOUT + max($REQUEST_TIMEOUT, $ENGINE_TIMEOUT, $LOG_DEADLINE) + 1.0 + 1.0))")
echo "expected fast stale_after: $EXPECT s"

$GP "$here/issue28_drive.py" --engine "http://127.0.0.1:$GPU_PORT" \
    --socket "$W/status.sock" --npd "$W/npd" --plugin "$repo/packaging/kubernetes/gpuguard-npd-plugin.sh" \
    --metrics "http://$LISTEN/metrics" --max-tokens "${MAX_TOKENS:-512}" \
    --daemon-pid $D --daemon-log "$R/daemon.log" --expect-stale-after "$EXPECT" --out "$R" \
    -- "${G[@]}" 2>&1 | tee "$R/summary.txt"
rc=${PIPESTATUS[0]}
nvidia-smi --query-gpu=power.draw,clocks.sm --format=csv >> "$R/gpus.csv" 2>&1

kill -TERM $D; wait $D
for v in gpu cpu; do [ -f "$W/$v.pid" ] && kill "$(cat "$W/$v.pid")" 2>/dev/null; done
cp "$W"/gpu.log "$W"/cpu.log "$R/" 2>/dev/null
echo "drive exit $rc"
exit "$rc"
