"""Drives bench/device_issue28.sh against a running daemon and engine (stdlib only):
96 clients saturate the engine; meanwhile `gpuguard status` runs every second for 60 s
(each call's exit code, whether a result is stale, the header's stale_after); the
daemon's logged stale_after is checked against the formula; then the daemon is stopped
(SIGSTOP) and NPD's plugin is read every 0.25 s until each file reads Unknown, timed
against the file's max_age. Times on the monotonic clock; the summary on stdout and in
OUT/summary.json. Exit 0 when every status call exited 0 with nothing stale and every NPD
file turned Unknown within its max_age (+1 s of the poll's and the clock's rounding)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any


def client(url: str, stop: threading.Event, counts: dict[str, int], tokens: int) -> None:
    body = json.dumps({"model": "m", "prompt": "hi", "max_tokens": tokens}).encode()
    while not stop.is_set():
        try:
            req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=120).read()
            counts["ok"] += 1
        except OSError:
            counts["failed"] += 1
            time.sleep(0.2)


def status(gpuguard: list[str], sock: str, *extra: str) -> dict[str, Any]:
    started = time.monotonic()
    run = subprocess.run([*gpuguard, "status", "--socket", sock, "--format", "json", *extra],
                         capture_output=True, text=True, timeout=30, check=False)
    out: dict[str, Any] = {"code": run.returncode, "took_s": round(time.monotonic() - started, 3)}
    try:
        doc = json.loads(run.stdout)
    except ValueError:
        out["stderr"] = run.stderr[-300:]
        return out
    out["stale"] = sorted({r["rule"] for r in doc.get("results", [])
                           if (r.get("observed") or {}).get("stale")})
    out["failing"] = sorted({f"{r['rule']}={r['status']}" for r in doc.get("results", [])
                             if r.get("status") in ("warning", "critical", "unknown")})
    out["notes"] = doc.get("notes", [])
    return out


def scrape(url: str) -> dict[str, float]:
    """The fast cycle's last duration and the service's engine state, from /metrics."""
    try:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line.startswith('gpuguard_cycle_duration_seconds{cadence="fast"}'):
            out["fast_cycle_s"] = float(line.split()[-1])
        elif line.startswith("gpuguard_service_engine_state{"):
            # 0 ok, 1 saturated, 2 capacity, 3 stuck, 4 unknown (daemon/service_metrics.py)
            out["engine_state"] = float(line.split()[-1])
        elif line.startswith("gpuguard_failover_active{"):
            out["failover_active"] = float(line.split()[-1])
    return out


def logged_freshness(log: Path) -> dict[str, Any] | None:
    for line in log.read_text(errors="replace").splitlines():
        if '"freshness"' in line:
            try:
                return dict(json.loads(line))
            except ValueError:
                continue
    return None


def npd_until_unknown(plugin: str, npd: Path, limit_s: float) -> dict[str, Any]:
    """Each file's max_age and how long after its write the plugin first said Unknown."""
    files = {p.name: p.read_text() for p in sorted(npd.iterdir()) if p.is_file()}
    seen: dict[str, Any] = {}
    for name, text in files.items():
        fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
        seen[name] = {"status": fields.get("status"), "max_age_cs": int(fields["max_age_cs"]),
                      "boottime_cs": int(fields["boottime_cs"]), "unknown_after_s": None}
    end = time.monotonic() + limit_s
    while time.monotonic() < end and any(v["unknown_after_s"] is None for v in seen.values()):
        for name, v in seen.items():
            if v["unknown_after_s"] is not None:
                continue
            code = subprocess.run(["sh", plugin, str(npd / name)], capture_output=True,
                                  text=True, check=False).returncode
            if code == 2:
                uptime_cs = int(float(Path("/proc/uptime").read_text().split()[0]) * 100)
                v["unknown_after_s"] = round((uptime_cs - v["boottime_cs"]) / 100, 2)
        time.sleep(0.25)
    return seen


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", required=True)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--npd", type=Path, required=True)
    ap.add_argument("--plugin", required=True)
    ap.add_argument("--daemon-pid", type=int, required=True)
    ap.add_argument("--daemon-log", type=Path, required=True)
    ap.add_argument("--expect-stale-after", type=float, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--clients", type=int, default=96)
    ap.add_argument("--samples", type=int, default=60)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--metrics", required=True)
    ap.add_argument("gpuguard", nargs="+")
    a = ap.parse_args()
    summary: dict[str, Any] = {"clients": a.clients}
    stop, counts = threading.Event(), {"ok": 0, "failed": 0}
    threads = [threading.Thread(target=client, args=(a.engine + "/v1/completions", stop,
                                                     counts, a.max_tokens), daemon=True)
               for _ in range(a.clients)]
    for t in threads:
        t.start()
    time.sleep(15)  # saturated before sampling
    samples = []
    for _ in range(a.samples):
        began = time.monotonic()
        samples.append({"all": status(a.gpuguard, a.socket),
                        "service": status(a.gpuguard, a.socket, "--only", "service.*"),
                        "metrics": scrape(a.metrics)})
        time.sleep(max(0.0, 1.0 - (time.monotonic() - began)))
    summary["requests"] = dict(counts)
    stop.set()
    logged = logged_freshness(a.daemon_log)
    summary["logged_freshness"] = logged
    summary["expected_fast_stale_after_s"] = a.expect_stale_after
    summary["status_codes_all"] = [s["all"]["code"] for s in samples]
    summary["status_codes_service"] = [s["service"]["code"] for s in samples]
    summary["stale_seen"] = sorted({r for s in samples for k in ("all", "service")
                                    for r in s[k].get("stale", [])})
    summary["failing_seen"] = sorted({r for s in samples for r in s["all"].get("failing", [])})
    summary["first_notes"] = samples[0]["all"].get("notes")
    cycles = [s["metrics"].get("fast_cycle_s") for s in samples]
    summary["fast_cycle_s_max"] = max((c for c in cycles if c is not None), default=None)
    summary["fast_cycles_over_2s"] = sum(1 for c in cycles if c is not None and c > 2.0)
    names = {0.0: "ok", 1.0: "saturated", 2.0: "capacity", 3.0: "stuck", 4.0: "unknown"}
    summary["engine_states"] = sorted({names.get(s["metrics"].get("engine_state", -1), "none")
                                       for s in samples})
    summary["failover_active_max"] = max((s["metrics"].get("failover_active", 0.0)
                                          for s in samples), default=0.0)
    (a.out / "samples.json").write_text(json.dumps(samples, indent=1))
    os.kill(a.daemon_pid, signal.SIGSTOP)
    try:
        npd = npd_until_unknown(a.plugin, a.npd, a.expect_stale_after * 2 + 10)
    finally:
        os.kill(a.daemon_pid, signal.SIGCONT)
    summary["npd_after_sigstop"] = npd
    ok_status = all(c == 0 for c in summary["status_codes_service"]) and not summary["stale_seen"]
    ok_log = logged is not None and abs(float(logged.get("fast_stale_after_s", -1))
                                        - a.expect_stale_after) < 1e-6
    ok_npd = all(v["unknown_after_s"] is not None and
                 v["unknown_after_s"] <= v["max_age_cs"] / 100 + 1.0 for v in npd.values())
    summary.update(ok_status=ok_status, ok_logged_formula=ok_log, ok_npd=ok_npd)
    text = json.dumps(summary, indent=1)
    (a.out / "summary.json").write_text(text)
    print(text)
    return 0 if ok_status and ok_log and ok_npd else 1


if __name__ == "__main__":
    raise SystemExit(main())
