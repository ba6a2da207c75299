"""node-problem-detector never OK on a guess (issue 27, item 8): the real VerdictFiles'
files read by the real plugin under dash. A condition holding an unknown is Unknown even
beside a warning."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpuguard.daemon.verdict_files import VerdictFiles
from gpuguard.model.identity import GpuId
from gpuguard.model.results import Result, Status
from tests.test_kubernetes import needs_dash, plugin


def result(rule: str, status: Status, gpu: int | None = 0) -> Result:
    ref = None if gpu is None else GpuId(gpu, f"GPU-{gpu}", f"00000000:{gpu + 0x18:02X}:00.0")
    return Result(rule, status, Status.CRITICAL, f"{rule} is {status.value}", ref)


def write(tmp: Path, results: list[Result], fast: float = 5.0, age: float = 0.0) -> Path:
    """The real VerdictFiles, the results of one fast cycle that ended `age` s ago."""
    npd = tmp / "npd"
    updated = time.monotonic() - age
    VerdictFiles(npd, fast).write([(r, "fast", updated) for r in results],
                                  {"fast": fast, "slow": 60.0})
    return npd


def written_at(path: Path) -> float:
    """When the daemon wrote the file, on CLOCK_BOOTTIME (its own key, else whole seconds)."""
    keys = dict(line.split("=", 1) for line in path.read_text().splitlines())
    return int(keys["boottime_cs"]) / 100 if "boottime_cs" in keys else int(keys["boottime"])


def run_at(path: Path, after: float, tmp: Path) -> tuple[int, str]:
    """The plugin as NPD runs it, `after` seconds after the file was written."""
    return plugin(path, written_at(path) + after, tmp)


@needs_dash
@pytest.mark.parametrize(("statuses", "code", "named"), [
    # the bug: status=warning was written and the plugin said OK
    ((Status.WARNING, Status.UNKNOWN), 2, "unknown: ecc.b GPU 1"),
    ((Status.UNKNOWN, Status.WARNING, Status.OK), 2, "unknown: thermal.a GPU 0"),
    ((Status.WARNING, Status.UNKNOWN, Status.CRITICAL), 1, "critical: clocks.c GPU 2"),
    ((Status.WARNING, Status.OK, Status.SKIPPED), 0, "warning: thermal.a GPU 0"),
    ((Status.OK, Status.SKIPPED), 0, "ok: 2 result(s) ok"),
])
def test_unknown_is_worse_than_warning_for_npd(tmp_path: Path, statuses: tuple[Status, ...],
                                               code: int, named: str) -> None:
    rules = ("thermal.a", "ecc.b", "clocks.c")[:len(statuses)]
    npd = write(tmp_path, [result(rule, status, i) for i, (rule, status)
                           in enumerate(zip(rules, statuses, strict=True))])
    got, out = run_at(npd / "gpu-hardware", 0.5, tmp_path)
    assert (got, out.startswith(f"gpuguard: {named}")) == (code, True), out
    assert run_at(npd / "gpu-driver", 0.5, tmp_path)[0] == 0  # nothing of it there
