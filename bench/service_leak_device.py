#!/usr/bin/env python3
"""service.memory_growth on a real GPU: a PyTorch process whose GPU memory grows in steps
(+512 MiB every 5 s) is a leak within the window; one that allocates once and holds is not.

Runs the real daemon (this checkout's gpuguard) with two exec-backend services, real NVML
per-process accounting and psutil, a short window from a rules.d override, and polls its
/status. Writes the figures to $OUT/leak (summary.json, status samples, the daemon's log).
About 3 minutes. Needs: a Python with PyTorch (runs the two workers; this script's own
interpreter), and the daemon's dependencies: if this interpreter lacks them, a venv that
sees the system's packages is made from .device/wheels (no internet needed).

    python3 bench/service_leak_device.py            # on the GPU host, from the repo root
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = Path(os.environ.get("OUT", "./out")) / "leak"
WORK = Path("/tmp/gg-leak")
PORT = 19417
FAST_S = 2.0
RUN_S = float(os.environ.get("LEAK_RUN_S", "150"))  # how long the workers are watched
STEP_MIB, STEP_S = 512, 5.0

LEAK = f"""
import time, torch
x = torch.zeros(1, device="cuda")  # the CUDA context first: part of the warm-up
held = []
time.sleep(1)
while True:
    held.append(torch.empty({STEP_MIB} * 1024 * 1024, dtype=torch.uint8, device="cuda"))
    torch.cuda.synchronize()
    time.sleep({STEP_S})
"""

STEADY = """
import time, torch
x = torch.zeros(1, device="cuda")
held = torch.empty(8 * 1024 ** 3, dtype=torch.uint8, device="cuda")  # once, 8 GiB
torch.cuda.synchronize()
while True:
    time.sleep(1)
"""

# the window of the test: seconds, not the default 30 minutes; the CUDA context and the
# first allocation fall in the warm-up
RULES = """\
overrides:
  service.memory_growth:
    thresholds: {window_s: 120, warmup_s: 15, min_samples: 10, min_r2: 0.8,
                 recent_ratio: 0.5, horizon_s: 7200}
"""

DEPS = ["psutil", "msgspec", "structlog", "apscheduler", "prometheus_client", "yaml",
        "simpleeval", "click", "pyudev", "docker", "pynvml"]


def daemon_python() -> str:
    probe = "import " + ", ".join(DEPS)
    if subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0:
        return sys.executable
    venv = WORK / "venv"
    wheels = REPO / ".device" / "wheels"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    packages = ["psutil", "msgspec", "structlog", "apscheduler", "prometheus-client", "pyyaml",
                "simpleeval", "click", "pyudev", "docker", "nvidia-ml-py"]
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-index", "--find-links",
                    str(wheels), *packages], check=True)
    return str(venv / "bin" / "python")


def service(name: str, script: Path) -> dict[str, Any]:
    pid = WORK / f"{name}.pid"
    idle = WORK / f"{name}-cpu.pid"

    def start(command: str, pid_file: Path) -> list[str]:
        return ["sh", "-c", f"{command} >{WORK}/{pid_file.stem}.log 2>&1 & echo $! > {pid_file}"]

    def stop(pid_file: Path) -> list[str]:
        return ["sh", "-c", f"[ -f {pid_file} ] && kill $(cat {pid_file}); rm -f {pid_file}; true"]

    def running(pid_file: Path) -> list[str]:
        return ["sh", "-c", f"[ -f {pid_file} ] && kill -0 $(cat {pid_file})"]

    return {"name": name, "backend": "exec", "probe": {"exec": ["true"], "timeout": 30},
            "failback": "manual", "rules": ["service.inference"],
            "exec": {"start_gpu": start(f"{sys.executable} {script}", pid),
                     "stop_gpu": stop(pid), "running_gpu": running(pid),
                     "pid_file_gpu": str(pid),
                     "start_cpu": start("sleep 3600", idle), "stop_cpu": stop(idle),
                     "running_cpu": running(idle), "pid_file_cpu": str(idle)}}


def status() -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/status", timeout=5) as resp:
        return dict(json.loads(resp.read()))


def result(doc: dict[str, Any], rule: str) -> dict[str, Any]:
    return next((r for r in doc.get("results", []) if r["rule"] == rule), {})


def main() -> int:
    subprocess.run(["rm", "-rf", str(WORK)], check=False)
    WORK.mkdir(parents=True)
    OUT.mkdir(parents=True, exist_ok=True)
    (WORK / "leak.py").write_text(LEAK)
    (WORK / "steady.py").write_text(STEADY)
    (WORK / "rules.d").mkdir()
    (WORK / "rules.d" / "leak.yaml").write_text(RULES)
    (WORK / "services.yaml").write_text(json.dumps({"services": [
        service("leak", WORK / "leak.py"), service("steady", WORK / "steady.py")]}))
    python = daemon_python()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    log = (OUT / "daemon.log").open("w")
    started = time.time()
    daemon = subprocess.Popen(
        [python, "-m", "gpuguard", "daemon", "--listen", f"127.0.0.1:{PORT}", "--no-udev",
         "--log-format", "json", "--state-dir", str(WORK / "state"),
         "--fast-interval", str(FAST_S), "--slow-interval", "60",
         "--config", str(WORK / "services.yaml"), "--rules", str(WORK / "rules.d")],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=log)
    samples: list[dict[str, Any]] = []
    try:
        while time.time() - started < RUN_S + 15:
            time.sleep(FAST_S)
            try:
                doc = status()
            except OSError:
                continue
            growth, gpu_mem = result(doc, "service.memory_growth"), \
                result(doc, "service.gpu_memory")
            samples.append({"t": round(time.time() - started, 1),
                            "memory_growth": {k: growth.get(k) for k in
                                              ("status", "message", "observed")},
                            "gpu_memory": {k: gpu_mem.get(k) for k in ("status", "message")}})
        # what nvidia-smi says of the same processes (NVML lists no process inside a
        # container without the host's PID namespace: the GPU series would be empty)
        try:
            apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name,"
                                   "used_memory", "--format=csv"], capture_output=True,
                                  text=True, timeout=30, check=False)
            (OUT / "nvidia-smi-apps.txt").write_text(apps.stdout + apps.stderr)
        except (OSError, subprocess.TimeoutExpired) as exc:
            (OUT / "nvidia-smi-apps.txt").write_text(f"nvidia-smi: {exc}\n")
        pids = {n: (WORK / f"{n}.pid").read_text().strip() for n in ("leak", "steady")
                if (WORK / f"{n}.pid").exists()}
        (OUT / "pids.json").write_text(json.dumps(pids))
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(15)
        except subprocess.TimeoutExpired:
            daemon.kill()
        for name in ("leak", "steady", "leak-cpu", "steady-cpu"):
            pid = WORK / f"{name}.pid"
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid.read_text()), signal.SIGKILL)
    (OUT / "samples.json").write_text(json.dumps(samples, indent=1))
    OUT.joinpath("summary.json").write_text(json.dumps(summarise(samples), indent=2))
    print(json.dumps(summarise(samples), indent=2))
    return 0


def summarise(samples: list[dict[str, Any]]) -> dict[str, Any]:
    def per(sample: dict[str, Any], name: str) -> str | None:
        observed = sample["memory_growth"].get("observed") or {}
        return (observed.get("service_status") or {}).get(name)

    def series(sample: dict[str, Any] | None, name: str, label: str = "GPU memory"
               ) -> dict[str, Any]:
        observed = (sample or {}).get("memory_growth", {}).get("observed") or {}
        return ((observed.get("services") or {}).get(name) or {}).get(label) or {}

    def mib_s(found: dict[str, Any]) -> float | None:
        slope = found.get("slope_bytes_per_s")
        return None if slope is None else round(slope / 2**20, 2)

    flagged = next((s for s in samples if per(s, "leak") == "warning"), None)
    after = samples[samples.index(flagged):] if flagged else []
    last = samples[-1] if samples else None
    return {
        "step": f"+{STEP_MIB} MiB every {STEP_S:g} s",
        "expected_slope_mib_per_s": STEP_MIB / STEP_S,
        "fast_interval_s": FAST_S,
        "cycles_seen": len(samples),
        "leak_flagged_after_s": flagged["t"] if flagged else None,
        "leak_message": flagged["memory_growth"]["message"] if flagged else None,
        "leak_gpu_slope_mib_per_s_at_flag": mib_s(series(flagged, "leak")),
        "leak_projected_s_at_flag": series(flagged, "leak").get("projected_s"),
        "leak_r2_at_flag": series(flagged, "leak").get("r2"),
        "leak_flagged_share_after_first": round(
            sum(1 for s in after if per(s, "leak") == "warning") / len(after), 3)
        if after else None,
        "leak_gpu_slope_mib_per_s_last": mib_s(series(last, "leak")),
        "leak_r2_last": series(last, "leak").get("r2"),
        "leak_host_slope_mib_per_s_last": mib_s(series(last, "leak", "host RSS")),
        "steady_false_positives": sum(1 for s in samples if per(s, "steady") == "warning"),
        "steady_statuses": sorted({str(per(s, "steady")) for s in samples}),
        "steady_gpu_slope_mib_per_s_last": mib_s(series(last, "steady")),
        "gpu_memory_last": last["gpu_memory"] if last else None,
    }


if __name__ == "__main__":
    sys.exit(main())
