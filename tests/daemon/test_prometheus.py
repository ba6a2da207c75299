"""A real Prometheus server scrapes the daemon; PromQL through its HTTP API sees the rules."""

import json
import shutil
import subprocess
import time
import urllib.parse

import pytest

from tests.daemon.conftest import free_port, get, host_snapshot, write_snapshot


@pytest.fixture
def prometheus(tmp_path):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is missing: ./scripts/test.sh installs Debian's package")
    procs = []

    def start(targets):
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            "  - job_name: gpuguard\n"
            f"    static_configs: [{{targets: {json.dumps(targets)}}}]\n")
        proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"))
        procs.append(proc)
        return f"http://127.0.0.1:{port}"

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=20)


def query(base, promql):
    code, body = get(f"{base}/api/v1/query?query={urllib.parse.quote(promql)}")
    assert code == 200, body
    return json.loads(body)["data"]["result"]


def test_prometheus_scrapes_rule_states(start_daemon, prometheus, tmp_path):
    snap = tmp_path / "host.json"
    write_snapshot(snap, host_snapshot(8, {(5, "remapped_rows_failure"): True}))
    daemon = start_daemon("--input", str(snap), "--fast-interval", "0.5")
    base = prometheus([f"127.0.0.1:{daemon.port}"])

    deadline = time.monotonic() + 60
    rows = []
    while time.monotonic() < deadline:
        try:
            rows = query(base, 'gpuguard_rule_status{rule="memory.row_remap"}')
        except (OSError, AssertionError):
            rows = []
        if len(rows) == 8:
            break
        time.sleep(0.5)
    assert len(rows) == 8, rows
    by_gpu = {r["metric"]["gpu"]: float(r["value"][1]) for r in rows}
    assert by_gpu["5"] == 2.0 and all(v == 0.0 for g, v in by_gpu.items() if g != "5")
    [up] = query(base, 'up{job="gpuguard"}')
    assert up["value"][1] == "1"
    critical = query(base, 'gpuguard_rule_status == 2')
    assert {(r["metric"]["rule"], r["metric"]["gpu"]) for r in critical} == \
        {("memory.row_remap", "5")}
