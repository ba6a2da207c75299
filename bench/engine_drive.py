"""Drives bench/device_issue23.sh's phases against a running daemon and engine
(bench/engine_server.py), stdlib only: saturate the engine with many concurrent requests
and watch that nothing fails over; hang it and time the failover to the CPU variant.
Polls the daemon's /metrics every 0.25 s; times on the monotonic clock. Prints the
summary; exit 0 when saturated never failed over and stuck did within stuck_after + 3
fast cycles (+1 for the first flat read, +1 of slack for the poll), else 1."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

STATES = ("ok", "saturated", "capacity", "stuck", "unknown")


def scrape(url: str) -> dict[str, float]:
    try:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
    except OSError:
        return {}
    found = {}
    for line in text.splitlines():
        m = re.match(r'^(gpuguard_service_engine_state|gpuguard_failover_active|'
                     r'gpuguard_cycles_total|gpuguard_service_engine_requests|'
                     r'gpuguard_rule_status)\{([^}]*)\} (\S+)$', line)
        if not m:
            continue
        labels = m.group(2)
        if m.group(1) == "gpuguard_cycles_total" and 'cadence="fast"' not in labels:
            continue
        if m.group(1) == "gpuguard_rule_status" and 'rule="service.inference"' not in labels:
            continue
        key = m.group(1)
        if key == "gpuguard_service_engine_requests":
            key += "_" + re.search(r'state="(\w+)"', labels).group(1)  # type: ignore[union-attr]
        found[key] = float(m.group(3))
    return found


def post(url: str, body: dict[str, Any], timeout: float = 600) -> None:
    request = urllib.request.Request(url, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with contextlib.suppress(OSError):
        urllib.request.urlopen(request, timeout=timeout).read()


def load(engine: str, clients: int, max_tokens: int, stop: threading.Event) -> list[int]:
    done = [0]

    def client() -> None:
        while not stop.is_set():
            post(f"{engine}/v1/completions", {"prompt": "x", "max_tokens": max_tokens}, 60)
            done[0] += 1

    for _ in range(clients):
        threading.Thread(target=client, daemon=True).start()
    return done


def watch(metrics: str, seconds: float, timeline: list[dict[str, Any]], phase: str,
          until: Any = None) -> dict[str, float] | None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        seen = scrape(metrics)
        state = seen.get("gpuguard_service_engine_state")
        timeline.append({"t": round(time.monotonic(), 2), "phase": phase, **seen,
                         "state": STATES[int(state)] if state is not None else None})
        if until is not None and until(seen):
            return seen
        time.sleep(0.25)
    return None


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("--metrics", "--engine", "--out", "--daemon-log"):
        parser.add_argument(name, required=True)
    parser.add_argument("--stuck-after", type=float, required=True)
    parser.add_argument("--fast", type=float, required=True)
    args = parser.parse_args()
    timeline: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"stuck_after_s": args.stuck_after, "fast_s": args.fast}

    print("== waiting for the GPU variant to serve and its engine to be read")
    t0 = time.monotonic()
    ready = watch(args.metrics, 300, timeline, "start",
                  lambda s: s.get("gpuguard_service_engine_state") == 0.0)
    summary["ready_s"] = round(time.monotonic() - t0, 1)
    if ready is None:
        print("the engine was never read ok: see daemon.log")
        Path(args.out, "timeline.json").write_text(json.dumps(timeline))
        return 1
    watch(args.metrics, 5, timeline, "idle")

    print("== saturated: 512 concurrent requests of 256 tokens")
    stop = threading.Event()
    done = load(args.engine, 512, 256, stop)
    window = args.stuck_after + 20
    failed_over = watch(args.metrics, window, timeline, "saturated",
                        lambda s: s.get("gpuguard_failover_active") == 1.0)
    stop.set()
    states = sorted({str(x["state"]) for x in timeline if x["phase"] == "saturated"})
    summary["saturated"] = {"held_s": window, "engine_states": states,
                            "requests_completed": done[0],
                            "failed_over": failed_over is not None}
    print(f"saturated for {window:.0f} s: states {states}, {done[0]} requests done, "
          f"failover: {'YES (wrong)' if failed_over else 'none'}")
    watch(args.metrics, 30, timeline, "drain",
          lambda s: s.get("gpuguard_service_engine_requests_waiting", 1) == 0
          and s.get("gpuguard_service_engine_requests_running", 1) == 0)

    print("== hung: 8 requests in flight, then the step loop held")
    stop = threading.Event()
    load(args.engine, 8, 4096, stop)
    time.sleep(2)
    before = scrape(args.metrics).get("gpuguard_cycles_total", 0.0)
    hung_at = time.monotonic()
    post(f"{args.engine}/admin/hang", {})
    seen = watch(args.metrics, args.stuck_after + 60, timeline, "hung",
                 lambda s: s.get("gpuguard_failover_active") == 1.0)
    stop.set()
    took = time.monotonic() - hung_at
    cycles = (seen or {}).get("gpuguard_cycles_total", before) - before
    started = [json.loads(line) for line in Path(args.daemon_log).read_text().splitlines()
               if "failover_started" in line]
    first_stuck = next((x["t"] - hung_at for x in timeline
                        if x["phase"] == "hung" and x["state"] == "stuck"), None)
    bound_cycles = args.stuck_after / args.fast + 3 + 2
    summary["stuck"] = {"failed_over": seen is not None, "hang_to_cpu_serving_s": round(took, 1),
                        "fast_cycles": cycles, "hang_to_stuck_s":
                            None if first_stuck is None else round(first_stuck, 1),
                        "bound_cycles": bound_cycles,
                        "reason": started[0].get("reason") if started else None}
    print(f"hang -> engine stuck: {summary['stuck']['hang_to_stuck_s']} s; hang -> failover "
          f"active (CPU variant serving): {took:.1f} s, {cycles:.0f} fast cycles "
          f"(stuck_after {args.stuck_after:g} s = {args.stuck_after / args.fast:.0f} cycles; "
          f"bound {bound_cycles:.0f})")
    print(f"failover reason: {summary['stuck']['reason']}")
    Path(args.out, "timeline.json").write_text(json.dumps(timeline))
    Path(args.out, "summary.json").write_text(json.dumps(summary, indent=1))
    good = not summary["saturated"]["failed_over"] and seen is not None \
        and cycles <= bound_cycles
    print("RESULT:", "pass" if good else "FAIL")
    return 0 if good else 1


if __name__ == "__main__":
    raise SystemExit(main())
