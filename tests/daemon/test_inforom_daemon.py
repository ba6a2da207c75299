"""gpu.inforom in the daemon, whose worker validates each board once a slow interval
(sources/nvml_inforom.py, issue 32), against `check`, which validates every run: the same
verdict on a fake whose InfoROM is corrupted, and the repair seen within an interval."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.conftest import REPO
from tests.daemon.conftest import metric_lines


def inforom_status(results: list[dict[str, Any]]) -> list[str]:
    return [r["status"] for r in results if r["rule"] == "gpu.inforom"]


def test_the_daemon_validates_once_a_slow_cycle_and_judges_as_check_does(
        start_daemon: Any, fake_env: Any, host_args: list[str], tmp_path: Path) -> None:
    corrupted = tmp_path / "corrupted"
    corrupted.touch()
    calls = tmp_path / "calls"
    env = fake_env(gpus=2, inforom_file=str(corrupted), inforom_calls=str(calls))
    # check: validates each run, and says critical on each GPU
    done = subprocess.run([sys.executable, "-m", "gpuguard", "check", "--format", "json",
                           *host_args], cwd=REPO, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=60, check=False)
    assert inforom_status(json.loads(done.stdout)["results"]) == ["critical", "critical"]
    assert len(calls.read_text().splitlines()) == 2
    calls.write_text("")
    daemon = start_daemon("--fast-interval", "0.2", "--slow-interval", "2", env=env)
    started = time.monotonic()
    daemon.wait_for(lambda: inforom_status(daemon.status()["results"]) ==
                    ["critical", "critical"], 15, "gpu.inforom critical in the daemon")
    daemon.wait_for(lambda: sum(float(line.rsplit(" ", 1)[1]) for line in metric_lines(
        daemon.metrics(), "gpuguard_cycles_total") if 'cadence="fast"' in line) >= 15,
        30, "15 fast cycles")
    validations = len(calls.read_text().splitlines())
    elapsed = time.monotonic() - started
    # at most one per GPU per started slow interval, though each fast cycle sweeps
    assert validations <= 2 * (elapsed / 2.0 + 2), (validations, elapsed)
    # repaired (a reflash): within a slow interval the daemon says so
    corrupted.unlink()
    daemon.wait_for(lambda: inforom_status(daemon.status()["results"]) == ["ok", "ok"], 20,
                    "gpu.inforom ok again")
