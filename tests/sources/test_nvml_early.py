"""`gpuguard check` validates each InfoROM once, early, in a process of its own beside the
sweep (sources/nvml_early.py), and judges it as the direct call did (issue 32)."""

import json
import os
import subprocess
import sys
import time

from tests.conftest import REPO


def run_check(env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess[str], int]:
    """`gpuguard check` as a user runs it, and the pid of that process."""
    proc = subprocess.Popen([sys.executable, "-m", "gpuguard", "check", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "NO_COLOR": "1", **env}, cwd=REPO)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), proc.pid


def inforom_results(stdout: str) -> dict[int, dict[str, str]]:
    return {r["gpu"]["index"]: r for r in json.loads(stdout)["results"]
            if r["rule"] == "gpu.inforom"}


def test_each_inforom_is_validated_once_by_the_early_process(fake_env, host_args, tmp_path):
    calls = tmp_path / "calls"
    proc, check_pid = run_check(
        fake_env(gpus=3, inforom="corrupted", inforom_gpu=1, inforom_calls=str(calls)),
        *host_args, "--format", "json")
    assert proc.returncode == 2, proc.stderr
    results = inforom_results(proc.stdout)
    assert {i: r["status"] for i, r in results.items()} == {0: "ok", 1: "critical", 2: "ok"}
    assert results[1]["message"] == "the InfoROM is corrupted (nvmlDeviceValidateInforom)"
    lines = [line.split() for line in calls.read_text().splitlines()]
    assert sorted(int(index) for index, _, _ in lines) == [0, 1, 2]  # once each
    # not by the worker (a child of `check`) but by the early process, the worker's child
    assert all(int(ppid) != check_pid for _, _, ppid in lines), (check_pid, lines)


def test_a_crash_in_the_early_validation_is_named_as_the_direct_call_was(fake_env, host_args):
    proc, _ = run_check(fake_env(gpus=2, crash="nvmlDeviceValidateInforom", crash_gpu=0),
                        *host_args, "--format", "json", "--timeout", "5")
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    responsive = next(r for r in doc["results"] if r["rule"] == "driver.responsive")
    # the early process died alone; the sweep validated directly and died at that call,
    # after the host's readings: the driver is still named, not "no usable driver"
    assert "died of SIGSEGV in nvmlDeviceValidateInforom (GPU 0)" in responsive["message"]
    assert "import pynvml" not in responsive["message"]
    assert doc["host"]["driver_version"] == "580.159.04"


def test_a_hung_early_validation_is_named_and_leaves_nothing_behind(fake_env, host_args):
    timeout = "1.37"  # a mark of this test's processes
    proc, _ = run_check(fake_env(gpus=2, hang="nvmlDeviceValidateInforom", hang_gpu=1),
                        *host_args, "--format", "json", "--timeout", timeout)
    assert proc.returncode == 2, proc.stderr
    doc = json.loads(proc.stdout)
    responsive = next(r for r in doc["results"] if r["rule"] == "driver.responsive")
    assert responsive["status"] == "critical"
    assert "nvmlDeviceValidateInforom (GPU 1)" in responsive["message"]
    assert inforom_results(proc.stdout)[0]["status"] == "ok"
    assert inforom_results(proc.stdout)[1]["status"] == "unknown"
    left = ""
    for _ in range(20):  # the early process dies with the killed worker (PDEATHSIG)
        time.sleep(0.1)
        left = subprocess.run(["pgrep", "-f", f"gpuguard check .*--timeout {timeout}"],
                              capture_output=True, text=True, check=False).stdout.strip()
        if not left:
            break
    assert left == ""
