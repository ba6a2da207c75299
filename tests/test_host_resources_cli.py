"""`gpuguard check` leaves psutil and the host-resource rules alone unless asked
(--host-resources): the preflight's start-up cost stays what it was (issue 14)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import FIXTURES, REPO, own_host


def run_check(root: Path, *args: str) -> tuple[dict[str, dict[str, object]], str]:
    """A live check (its host sources in their forked child, as in production) under
    `python -X importtime`, which logs every module the parent or the child imports."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gpuguard", "check", "--format", "json",
         *own_host(root), "--kmsg-file", str(FIXTURES / "kmsg" / "oom.kmsg"), "--no-docker",
         "--path.procfs", str(FIXTURES / "procfs-meminfo"), *args],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False,
        env={**os.environ, "NO_COLOR": "1"})
    results = {r["rule"]: r for r in json.loads(proc.stdout)["results"]
               if r["rule"].startswith("host.")}
    return results, proc.stderr


def imported(stderr: str) -> set[str]:
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines()
            if line.startswith("import time:") and line.count("|") >= 2}


def test_a_default_check_does_not_import_psutil_and_skips_host_rules(tmp_path):
    results, stderr = run_check(tmp_path)
    modules = imported(stderr)
    # the log lists the forked host child's imports too (the kernel log is read there)
    assert "gpuguard.sources.kmsg" in modules
    assert "psutil" not in modules and "gpuguard.sources.host_memory" not in modules
    assert results["host.memory"]["status"] == "skipped"
    assert results["host.disk"]["status"] == "skipped"


def test_host_resources_when_asked(tmp_path):
    results, stderr = run_check(tmp_path, "--host-resources")
    assert "psutil" in imported(stderr)  # in the forked host child
    # the fixture /proc: 7 % available, swap 75 % used; and a saved log is timed by its
    # own last line, so two of its kills fall in the 24 h window: one host-wide, one at a
    # container's own limit (named, not counted as the host's)
    assert results["host.memory"]["status"] == "warning"
    message = str(results["host.memory"]["message"])
    assert "swap 75 % in use" in message and "1 OOM kill(s) in the last 1d" in message
    assert "1 OOM kill(s) at a cgroup's own memory limit" in message
