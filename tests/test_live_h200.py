"""Recordings of the real H200 through NVML, with nvidia-smi of the same moment."""

import re
import subprocess
import sys

from gpuguard.model.results import Status
from gpuguard.sources import replay
from tests.conftest import FIXTURES, REPO, gpuguard, set_gpu

LIVE = FIXTURES / "h200-live"


def test_idle_h200_checks_clean():
    proc = gpuguard("check", "--input", str(LIVE / "idle-snapshot.json"))
    assert proc.returncode == 0, proc.stdout
    # the columns are as wide as the longest rule id (service.memory_growth, issue 14)
    assert re.search(r"\nOK +driver\.responsive +host +NVML answered in", proc.stdout), proc.stdout


def test_busy_h200_pcie_is_judged_under_real_load(run_rule):
    busy = replay.load(LIVE / "busy-snapshot.json")
    gpu = busy.gpus[0]
    assert gpu.utilization_gpu_percent.get() == 100
    assert gpu.clock_event_reasons.get() == 0x4  # SW power cap while at TDP
    [width] = run_rule("pcie.link_width", busy)
    assert width.status is Status.OK and "idle" not in width.message
    set_gpu(busy, pcie_link_width_current=8)
    assert run_rule("pcie.link_width", busy)[0].status is Status.CRITICAL


def test_busy_h200_power_cap_bit_is_judged_against_draw(run_rule):
    busy = replay.load(LIVE / "busy-snapshot.json")
    [cap] = run_rule("clocks.power_cap", busy)
    # Capped at the default limit with the SM clock at 1470 of 1980 MHz: normal at TDP.
    assert cap.status is Status.OK and "as the board is built to" in cap.message
    assert run_rule("clocks.hw_slowdown", busy)[0].status is Status.OK


def compare(state: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "scripts/compare_with_nvidia_smi.py",
         str(LIVE / f"{state}-snapshot.json"), str(LIVE / f"{state}-nvidia-smi-q.xml")],
        capture_output=True, text=True, cwd=REPO, check=False)


def test_nvml_and_nvidia_smi_agree_idle_and_busy():
    for state in ("idle", "busy"):
        proc = compare(state)
        assert proc.returncode == 0, proc.stdout
        assert "disagree" not in proc.stdout
        assert "| gpu0 | temperature_tlimit_margin_c | agree |" in proc.stdout
        assert "| gpu0 | uuid | agree |" in proc.stdout
