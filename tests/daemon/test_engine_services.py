"""service.engine in the real daemon (issue 23): supervised exec services that are real
HTTP servers on loopback replaying a recorded engine metrics page
(tests/engines/engine_replay.py on tests/fixtures/engines/), moved along a sequence by the
test: rising, saturated, at capacity, metrics down, stuck. A stuck engine fails over to
the CPU variant within stuck_after and a few cycles; a saturated one, or one at its
capacity, never does."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sqlite3
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from gpuguard.io.atomic import write_text
from tests.conftest import FIXTURES, REPO
from tests.daemon.conftest import free_port, host_snapshot, metric_lines, write_snapshot

REPLAY = REPO / "tests" / "engines" / "engine_replay.py"
STUCK_AFTER = 3.0
INTERVAL = 0.5


def _variant(tmp: Path, name: str, port: int, fixture: str, engine: str,
             log: Path | None = None) -> dict[str, Any]:
    pid, control = tmp / f"{name}.pid", tmp / f"{name}.control.json"
    write_text(control, json.dumps({"mode": "rising"}))
    out = f">> {log} 2>&1" if log else ">/dev/null 2>&1"
    argv = [sys.executable, str(REPLAY), str(port), str(FIXTURES / "engines" / fixture),
            engine, str(control), *([str(log)] if log else [])]
    return {"start": ["sh", "-c", f"{' '.join(argv)} {out} & echo $! > {pid}"],
            "stop": ["sh", "-c", f"[ -f {pid} ] && kill $(cat {pid}); rm -f {pid}; true"],
            "running": ["sh", "-c", f"[ -f {pid} ] && kill -0 $(cat {pid})"],
            "pid_file": str(pid), "control": control, "port": port}


def _config(tmp: Path, gpu: dict[str, Any], cpu: dict[str, Any], engine: dict[str, Any],
            **extra: Any) -> Path:
    ports = {"gpu": gpu["port"], "cpu": cpu["port"]}
    exec_extra = extra.pop("exec_extra", {})
    service = {
        "name": "llm", "backend": "exec", "failover_after": 3, "failback": "manual",
        "engine": engine, **extra,
        "probe": {"http": {v: f"http://127.0.0.1:{p}/v1/completions" for v, p in ports.items()},
                  "body": {"model": "m", "prompt": "hi", "max_tokens": 1},
                  "json_path": "choices.0.text", "request_timeout": 1, "timeout": 20},
        "exec": {"start_gpu": gpu["start"], "stop_gpu": gpu["stop"],
                 "running_gpu": gpu["running"], "pid_file_gpu": gpu["pid_file"],
                 "start_cpu": cpu["start"], "stop_cpu": cpu["stop"],
                 "running_cpu": cpu["running"], "pid_file_cpu": cpu["pid_file"],
                 **exec_extra}}
    path = tmp / "gpuguard.yaml"
    path.write_text(json.dumps({"services": [service]}))
    return path


def _rules(tmp: Path) -> Path:
    rules = tmp / "rules.d"
    rules.mkdir(exist_ok=True)
    (rules / "fast.yaml").write_text(textwrap.dedent(f"""\
        overrides:
          service.engine:
            thresholds: {{stuck_after_s: {STUCK_AFTER}, kv_full_percent: 95}}
          service.engine_full:
            enabled: true
            thresholds: {{kv_full_percent: 95, window_s: 2}}
        """))
    return rules


def _set(variant: dict[str, Any], **state: Any) -> None:
    write_text(variant["control"], json.dumps(state))


def _kill(variants: list[dict[str, Any]]) -> None:
    for v in variants:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(Path(v["pid_file"]).read_text()), signal.SIGKILL)


def _per(daemon: Any, rule: str) -> tuple[str | None, dict[str, Any]]:
    r = daemon.result(rule) or {}
    observed = r.get("observed") or {}
    return (observed.get("service_status") or {}).get("llm"), \
        (observed.get("services") or {}).get("llm") or {}


def _engine_state(metrics: str) -> float | None:
    lines = metric_lines(metrics, "gpuguard_service_engine_state")
    return float(lines[0].rsplit(" ", 1)[1]) if lines else None


def _start(start_daemon: Any, tmp: Path, config: Path, kmsg: Path | None = None) -> Any:
    snap = tmp / "host.json"
    write_snapshot(snap, host_snapshot(2))
    args = ["--input", str(snap), "--config", str(config), "--rules", str(_rules(tmp)),
            "--fast-interval", str(INTERVAL), "--slow-interval", "600"]
    if kmsg is not None:
        args += ["--kmsg-file", str(kmsg)]
    return start_daemon(*args)


@pytest.mark.parametrize(("fixture", "engine"), [("vllm-0.11.prom", "vllm"),
                                                 ("vllm-0.8.5.prom", "auto")])
def test_saturated_and_at_capacity_stay_stuck_fails_over(tmp_path: Path, start_daemon: Any,
                                                         fixture: str, engine: str) -> None:
    """Both vLLM metric generations (kv_cache_usage_perc, gpu_cache_usage_perc), one
    named, one recognised from its page."""
    gpu = _variant(tmp_path, "gpu", free_port(), fixture, "vllm")
    cpu = _variant(tmp_path, "cpu", free_port(), fixture, "vllm")
    daemon = _start(start_daemon, tmp_path, _config(tmp_path, gpu, cpu, {"name": engine}))
    try:
        daemon.wait_for(lambda: _per(daemon, "service.engine")[0] == "ok", 20,
                        "the engine to be read and ok")
        status, seen = _per(daemon, "service.engine")
        assert seen["engine"] == "vllm" and seen["state"] == "ok", seen
        kv = "vllm:kv_cache_usage_perc" if "0.11" in fixture else "vllm:gpu_cache_usage_perc"
        assert seen["metrics"]["kv_cache"] == kv

        # saturated: its requests answer too late, its tokens rise: never a failover
        _set(gpu, mode="saturated", slow=3, rate=5000)
        states, inference = set(), set()
        end = time.monotonic() + STUCK_AFTER + 6 * INTERVAL + 2
        while time.monotonic() < end:
            status, seen = _per(daemon, "service.engine")
            states.add(seen.get("state"))
            inf_status, inf = _per(daemon, "service.inference")
            if inf_status == "ok" and inf.get("saturated"):
                inference.add("saturated")
            assert status != "critical", seen
            time.sleep(0.2)
        assert "saturated" in states and inference == {"saturated"}, (states, inference)
        result = daemon.result("service.inference")
        assert result["status"] == "ok" and "saturated" in result["message"], result
        metrics = daemon.metrics()
        assert 'gpuguard_failover_active{service="llm"} 0.0' in metrics

        # at capacity: KV cache full, preemptions rising: ok, the opt-in warning only
        _set(gpu, mode="capacity")
        daemon.wait_for(lambda: _per(daemon, "service.engine_full")[0] == "warning", 15,
                        "the opt-in capacity warning")
        status, seen = _per(daemon, "service.engine")
        assert status == "ok" and seen["state"] == "capacity", seen
        metrics = daemon.metrics()
        assert _engine_state(metrics) == 2.0  # capacity
        # every engine series is documented (docs/metrics.md), and only those
        engine_series = {line.split("{")[0] for line in metrics.splitlines()
                         if line.startswith("gpuguard_service_engine_")}
        assert engine_series == documented_engine_series(), engine_series

        # its metrics unreachable while its requests answer: the engine rule is unknown,
        # the service judged by its probe
        _set(gpu, mode="down")
        daemon.wait_for(lambda: _per(daemon, "service.engine")[0] == "unknown", 10,
                        "the engine rule to be unknown")
        assert _per(daemon, "service.inference")[0] == "ok"

        # stuck: requests held, the counter flat: critical, and the failover
        _set(gpu, mode="flat")
        switched = time.monotonic()
        cycles_then = _cycles(daemon.metrics())
        daemon.wait_for(lambda: "failover_started" in daemon.log.read_text(), 30,
                        "the failover of the stuck engine")
        took = time.monotonic() - switched
        cycles = _cycles(daemon.metrics()) - cycles_then
        status, seen = _per(daemon, "service.engine")
        log = daemon.log.read_text()
        started = [json.loads(line) for line in log.splitlines() if "failover_started" in line]
        assert "service.engine" in started[0]["reason"] and "stuck" in started[0]["reason"]
        # the window starts at the first read that shows the counter still (within a cycle
        # of the hang), then stuck_after, then failover_after (3) critical cycles; the
        # cycles here take about request_timeout (1 s: the hung probe). Generous: the test
        # machine is shared.
        print(f"stuck -> failover_started: {took:.1f} s, {cycles} fast cycles "
              f"(stuck_after {STUCK_AFTER} s)")
        assert took < STUCK_AFTER + 4 * 1.5 + 5, took
        daemon.wait_for(lambda: 'gpuguard_failover_active{service="llm"} 1.0'
                        in daemon.metrics(), 30, "the CPU variant to serve")
        daemon.wait_for(lambda: "done:cpu" in _transitions(tmp_path), 15,
                        "the event store to keep the failover")
    finally:
        daemon.stop()
        _kill([gpu, cpu])


def documented_engine_series() -> set[str]:
    doc = (REPO / "docs" / "metrics.md").read_text()
    return set(re.findall(r"^\| `(gpuguard_service_engine_[a-z_]+)`", doc, re.MULTILINE))


def _cycles(metrics: str) -> int:
    [line] = [x for x in metric_lines(metrics, "gpuguard_cycles_total") if 'fast' in x]
    return int(float(line.rsplit(" ", 1)[1]))


def _transitions(tmp: Path) -> list[str]:
    store = tmp / "state" / "events.db"
    with contextlib.closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as conn:
        return [row[0] for row in conn.execute(
            "SELECT status FROM events WHERE kind = 'supervisor'")]


# an Xid 48 (double-bit ECC: reset the GPU) on GPU 1 (00000000:28:00.0 in host_snapshot),
# the kernel log's newest line: it is 0 s old at every read of the file
KMSG = ("6,100,1000000,-;NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04\n"
        "4,200,9000000000,-;NVRM: Xid (PCI:0000:28:00): 48, pid=4121, name=vllm, An "
        "uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at "
        "partition 1, subpartition 0.\n")


def test_a_cuda_error_in_its_log_with_an_xid_on_its_gpu_fails_over_with_the_xids_action(
        tmp_path: Path, start_daemon: Any) -> None:
    """Issue 23 item 3: the exec backend's log file read incrementally; an illegal memory
    access written by the engine with an Xid 48 on the service's GPU: service.gpu_errors
    critical, the failover's reason and the suggested action the Xid's (reset_gpu), and the
    event store keeps the pair."""
    log = tmp_path / "llm-gpu.log"
    gpu = _variant(tmp_path, "gpu", free_port(), "vllm-0.11.prom", "vllm", log)
    cpu = _variant(tmp_path, "cpu", free_port(), "vllm-0.11.prom", "vllm")
    kmsg = tmp_path / "kmsg.txt"
    kmsg.write_text(KMSG)
    # only its own rule moves it here (xid.recent, tagged failover, would too)
    config = _config(tmp_path, gpu, cpu, {"name": "vllm"}, gpus=[1],
                     rules=["service.gpu_errors"], exec_extra={"log_file_gpu": str(log)})
    daemon = _start(start_daemon, tmp_path, config, kmsg)
    try:
        daemon.wait_for(lambda: _per(daemon, "service.gpu_errors")[0] == "ok", 20,
                        "the log to be read")
        _set(gpu, mode="rising", log="RuntimeError: CUDA error: an illegal memory access "
                                     "was encountered")
        daemon.wait_for(lambda: _per(daemon, "service.gpu_errors")[0] == "critical", 15,
                        "the error tied to the Xid")
        result = daemon.result("service.gpu_errors")
        assert "with Xid 48 on GPU 1" in result["message"], result
        assert result["action"] == "reset_gpu", result
        daemon.wait_for(lambda: "failover_started" in daemon.log.read_text(), 20,
                        "the failover")
        started = [json.loads(line) for line in daemon.log.read_text().splitlines()
                   if "failover_started" in line]
        assert "service.gpu_errors" in started[0]["reason"], started
        assert "Xid 48" in started[0]["reason"], started

        def recorded() -> list[tuple[str, str, str]]:
            store = tmp_path / "state" / "events.db"
            with contextlib.closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as c:
                return list(c.execute("SELECT action, message, data FROM events WHERE rule "
                                      "= 'service.gpu_errors' AND status = 'critical'"))
        [(action, message, data)] = daemon.wait_for(recorded, 15, "the event store's row")
        # the pair: the engine's error (its kind and line) and the Xid it is tied to
        assert action == "reset_gpu" and "illegal_memory_access" in message \
            and "Xid 48 on GPU 1" in message and "an illegal memory access was" in message
        assert json.loads(data)["names"] == ["llm: illegal_memory_access with Xid 48"]
    finally:
        daemon.stop()
        _kill([gpu, cpu])


def test_a_hung_engine_whose_counter_creeps_is_stuck_and_fails_over(tmp_path: Path,
                                                                    start_daemon: Any) -> None:
    """Review 4 #5 (engine_creep_never_fails_over_daemon_test.py): a hung engine whose
    counter creeps (0.4 token/s with 256 running, under the profile's floor of 0.05 per
    running request) and whose requests never answer: stuck, the failover, and
    service.inference never `ok saturated` once the stuck window holds only the creep
    (before, the window still holds the tokens it made while healthy)."""
    gpu = _variant(tmp_path, "gpu", free_port(), "vllm-0.11.prom", "vllm")
    cpu = _variant(tmp_path, "cpu", free_port(), "vllm-0.11.prom", "vllm")
    daemon = _start(start_daemon, tmp_path, _config(tmp_path, gpu, cpu, {"name": "vllm"}))
    try:
        daemon.wait_for(lambda: _per(daemon, "service.engine")[0] == "ok", 20, "engine read")
        _set(gpu, mode="saturated", slow=100000, rate=0.4)  # never answers, creeps
        hung, saturated = time.monotonic(), []

        def failed_over() -> bool:
            status, inf = _per(daemon, "service.inference")
            if status == "ok" and inf.get("saturated"):
                saturated.append(time.monotonic() - hung)
            return "failover_started" in daemon.log.read_text()

        daemon.wait_for(failed_over, 40, "the failover of the creeping engine")
        started = [json.loads(line) for line in daemon.log.read_text().splitlines()
                   if "failover_started" in line]
        assert "service.engine" in started[0]["reason"] and "stuck" in started[0]["reason"]
        # a cycle's read and judgement may lag the switch by a cycle or two
        assert all(t < STUCK_AFTER + 4 * INTERVAL for t in saturated), saturated
    finally:
        daemon.stop()
        _kill([gpu, cpu])


def test_a_log_flood_past_the_bound_is_unknown_never_ok(tmp_path: Path, start_daemon: Any
                                                        ) -> None:
    """Review 4, item 9: more than a read's bound (sources/service_logs.py MAX_SCAN) in one
    cycle: what the read skipped is said, service.gpu_errors unknown ("N bytes ... not
    read"), never a silent ok."""
    from gpuguard.sources.service_logs import MAX_SCAN

    log = tmp_path / "llm-gpu.log"
    gpu = _variant(tmp_path, "gpu", free_port(), "vllm-0.11.prom", "vllm", log)
    cpu = _variant(tmp_path, "cpu", free_port(), "vllm-0.11.prom", "vllm")
    config = _config(tmp_path, gpu, cpu, {"name": "vllm"}, gpus=[1],
                     rules=["service.gpu_errors"], exec_extra={"log_file_gpu": str(log)})
    daemon = _start(start_daemon, tmp_path, config)
    try:
        daemon.wait_for(lambda: _per(daemon, "service.gpu_errors")[0] == "ok", 20,
                        "the log to be read")
        with log.open("a") as out:
            out.write(("request aborted " + "x" * 1007 + "\n") * (MAX_SCAN // 1024 + 64))
        daemon.wait_for(lambda: _per(daemon, "service.gpu_errors")[0] == "unknown", 15,
                        "the skipped bytes said")
        result = daemon.result("service.gpu_errors")
        assert re.search(r"\d+ bytes of \S+llm-gpu.log not read", result["message"]), result
    finally:
        daemon.stop()
        _kill([gpu, cpu])
