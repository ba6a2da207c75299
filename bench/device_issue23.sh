#!/usr/bin/env bash
# Issue 23 on the H200 test host (PyTorch there, no vLLM, no network): the real daemon
# supervises an exec service whose GPU variant is bench/engine_server.py on the GPU (real
# matmuls per token, vLLM's metric names on /metrics) and whose CPU variant is the same
# server on the CPU. Three phases, timed on the monotonic clock:
#   1. idle, then saturated: 256 concurrent requests, tokens rising, the probe's request
#      waits behind them past its request_timeout -> service.engine "saturated",
#      service.inference ok "saturated", NO failover (held for stuck_after + 20 s);
#   2. hung: a few requests in flight, then POST /admin/hang (the step loop stops; /health
#      still answers) -> service.engine stuck after stuck_after -> failover to the CPU
#      variant within stuck_after + 3 fast cycles (+1 for the first flat read);
# The GPU engine: 80 layers of 8192 x 8192 bf16 weights (10.7 GB, a 70B model's layer count
# and width, one matmul per layer), one step per token for up to 32 running requests: a
# decode step of some milliseconds, so 512 clients queue long enough that the probe's
# request (2 s) waits past its deadline while tokens rise.
#   3. the numbers: seconds and fast cycles from the hang to failover_started and to the
#      CPU variant serving, the engine states seen, the daemon's log.
# Reads only: nothing is installed outside /tmp, no GPU setting is changed. Results in
# $OUT/issue23; the summary on stdout and in $OUT/issue23/summary.txt.
#   bash bench/device_issue23.sh     (from the checkout; gpuguard's wheel and its
#                                     dependencies in .device/wheels, else an importable
#                                     checkout; python3 with torch for the engine)
# GG_INPUT=snapshot.json replays a snapshot instead of NVML (a smoke run without a GPU,
# with ENGINE_DEVICE=cpu).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-./out}; R=$OUT/issue23; mkdir -p "$R"
py=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
if [ -d .device/wheels ]; then
    $py -m venv /tmp/gv23 && /tmp/gv23/bin/pip install -q --no-index --find-links .device/wheels gpuguard
    G=/tmp/gv23/bin/gpuguard
else
    G="$py -m gpuguard"
fi
STUCK_AFTER=${STUCK_AFTER:-20}
FAST=${FAST:-1}
DEVICE=${ENGINE_DEVICE:-cuda}
GPU_PORT=18123; CPU_PORT=18124; LISTEN=127.0.0.1:19423
W=/tmp/gg23; rm -rf "$W"; mkdir -p "$W/rules.d" "$W/state"

echo "== the host"
nvidia-smi --query-gpu=index,name,driver_version --format=csv 2>&1 | tee "$R/gpus.csv"
$py -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' 2>&1 | tee "$R/torch.txt"
$G --version

cat > "$W/rules.d/issue23.yaml" <<EOF
overrides:
  service.engine:
    thresholds: {stuck_after_s: $STUCK_AFTER, kv_full_percent: 95}
EOF
# the service: JSON (YAML's subset), commands as argument lists
$py - "$W" "$here/engine_server.py" "$py" "$DEVICE" $GPU_PORT $CPU_PORT "${GPU_DIM:-8192}" "${CPU_DIM:-256}" "${GPU_LAYERS:-80}" > "$W/gpuguard.yaml" <<'EOF'
import json, sys
w, server, py, device, gpu_port, cpu_port, gpu_dim, cpu_dim, gpu_layers = sys.argv[1:10]

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
    # only the service's own rules move it: an old Xid of this shared host must not
    "rules": ["service.*"],
    "engine": {"name": "vllm", "timeout": 2},
    "probe": {"http": {"gpu": f"http://127.0.0.1:{gpu_port}/v1/completions",
                       "cpu": f"http://127.0.0.1:{cpu_port}/v1/completions"},
              "body": {"model": "m", "prompt": "hi", "max_tokens": 4},
              "json_path": "choices.0.text", "request_timeout": 2, "timeout": 120},
    "exec": {**variant("gpu", device, gpu_port, gpu_dim, gpu_layers),
             **variant("cpu", "cpu", cpu_port, cpu_dim, 2)}}
print(json.dumps({"services": [service]}, indent=1))
EOF
cp "$W/gpuguard.yaml" "$W/rules.d/issue23.yaml" "$R/"

input=(); [ -n "${GG_INPUT:-}" ] && input=(--input "$GG_INPUT")
$G daemon --listen $LISTEN --no-udev --no-docker --fast-interval "$FAST" --slow-interval 600 \
    --state-dir "$W/state" --config "$W/gpuguard.yaml" --rules "$W/rules.d" \
    --log-format json "${input[@]}" 2> "$R/daemon.log" & D=$!

$py "$here/engine_drive.py" --metrics "http://$LISTEN/metrics" --engine "http://127.0.0.1:$GPU_PORT" \
    --stuck-after "$STUCK_AFTER" --fast "$FAST" --out "$R" --daemon-log "$R/daemon.log" \
    2>&1 | tee "$R/summary.txt"
rc=${PIPESTATUS[0]}

kill -TERM $D; wait $D
for v in gpu cpu; do [ -f "$W/$v.pid" ] && kill "$(cat "$W/$v.pid")" 2>/dev/null; done
cp "$W"/gpu.log "$W"/cpu.log "$R/" 2>/dev/null
echo "drive exit $rc"
exit "$rc"
