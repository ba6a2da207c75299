"""A service's name becomes root's file names in the state directory (issue 20, item 14):
a name that could leave it is refused when the file is loaded, in the real daemon."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

from tests.daemon.conftest import host_snapshot, metric_lines, write_snapshot

ESCAPING = "/../../escaped"


def _config(path: Path, name: str, marks: Path) -> None:
    def commands(v: str) -> dict[str, list[str]]:
        mark = str(marks / v)
        return {f"start_{v}": ["touch", mark], f"stop_{v}": ["rm", "-f", mark],
                f"running_{v}": ["test", "-f", mark]}

    path.write_text(json.dumps({"services": [{
        "name": name, "backend": "exec", "probe": {"exec": ["true"], "timeout": 5},
        "exec": {**commands("gpu"), **commands("cpu")}}]}, indent=2))


def _setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    marks = tmp_path / "marks"
    marks.mkdir()
    snapshot = tmp_path / "host.json"
    write_snapshot(snapshot, host_snapshot(2))
    # the directory that made `failover-/../../escaped.json` resolve: with it there, the
    # old daemon wrote its state to tmp_path/escaped.json, outside its state directory
    (tmp_path / "state" / "failover-").mkdir(parents=True)
    return marks, snapshot, tmp_path / "gpuguard.yaml"


def _written_outside(tmp_path: Path) -> list[str]:
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("escaped*"))


def test_the_daemon_refuses_a_name_that_leaves_the_state_dir(tmp_path: Path,
                                                             start_daemon: Any) -> None:
    marks, snapshot, config = _setup(tmp_path)
    _config(config, ESCAPING, marks)
    daemon = start_daemon("--input", str(snapshot), "--config", str(config),
                          "--fast-interval", "0.3", "--slow-interval", "600", healthy=False)
    try:
        code = daemon.proc.wait(timeout=30)
    except Exception:
        daemon.stop()
        raise AssertionError("the daemon runs with a service named " + ESCAPING) from None
    log = daemon.log.read_text()
    assert code == 3, log
    # file:line: what is wrong (the name's line in the JSON written with indent=2)
    assert f"{config}:4: services[0]: name must be 1 to 64 letters" in log, log
    assert _written_outside(tmp_path) == [], _written_outside(tmp_path)
    assert list((tmp_path / "state" / "failover-").iterdir()) == []


def test_a_reload_keeps_the_services_it_started_with(tmp_path: Path,
                                                     start_daemon: Any) -> None:
    """Services are read at start only (docs/supervisor.md): a SIGHUP after the file
    gained an escaping name leaves the running services as they were and writes nothing
    outside the state directory; the next start refuses the file (test above)."""
    marks, snapshot, config = _setup(tmp_path)
    _config(config, "llm", marks)
    daemon = start_daemon("--input", str(snapshot), "--config", str(config),
                          "--fast-interval", "0.3", "--slow-interval", "600")
    state_file = tmp_path / "state" / "failover-llm.json"
    daemon.wait_for(state_file.exists, 20, "the supervisor's state file")
    _config(config, ESCAPING, marks)
    daemon.proc.send_signal(signal.SIGHUP)
    daemon.wait_for(lambda: '"config_reload' in daemon.log.read_text(), 20, "the reload")
    time.sleep(1.5)  # a few cycles after it
    assert daemon.proc.poll() is None, daemon.log.read_text()
    active = metric_lines(daemon.metrics(), "gpuguard_failover_active")
    assert active == ['gpuguard_failover_active{service="llm"} 0.0'], active
    assert json.loads(state_file.read_text())["active"] == "gpu"
    assert _written_outside(tmp_path) == []
    assert list((tmp_path / "state" / "failover-").iterdir()) == []
