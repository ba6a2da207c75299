"""Issue 36, items 2 and 3 through the daemon: its NVML worker asks NVML by bus id for a
GPU on the PCI bus that its list lacks (sources/nvml_bus.py), as `check` does
(tests/test_lost_gpu_bus_cli.py). tests/fixtures/sysfs-pci-display (its README): 11:00.0,
class 0x0380, bound to nvidia, absent where the fake counts one GPU."""

from __future__ import annotations

from tests.conftest import FIXTURES

SYSFS = FIXTURES / "sysfs-pci-display"
MISSING = "0000:11:00.0"


def judged(daemon, rule: str, gpu: int | None = None):
    return daemon.wait_for(lambda: (r := daemon.result(rule, gpu)) and
                           r["status"] != "unknown" and r, what=rule)


def test_the_daemon_gives_a_failed_lookup_by_bus_id_as_gpu_lost(start_daemon, fake_env):
    daemon = start_daemon("--fast-interval", "0.3", "--path.sysfs", str(SYSFS),
                          env=fake_env(gpus=1, bus_handle_error=999,
                                       bus_handle_error_bus=MISSING))
    lost = judged(daemon, "gpu.lost")
    assert lost["status"] == "critical", lost["message"]
    assert "nvmlDeviceGetHandleByPciBusId_v2: Unknown Error" in lost["message"]
    assert MISSING in lost["message"]
    assert daemon.result("gpu.lost", 0)["status"] == "ok"
    count = judged(daemon, "gpu.count")
    assert count["status"] == "critical" and MISSING in count["message"]


def test_the_daemon_leaves_a_gpu_not_found_by_bus_id_to_gpu_count(start_daemon, fake_env,
                                                                  tmp_path):
    calls = tmp_path / "calls"
    daemon = start_daemon("--fast-interval", "0.3", "--path.sysfs", str(SYSFS),
                          env=fake_env(gpus=1, bus_calls=calls))
    count = judged(daemon, "gpu.count")
    assert count["status"] == "critical", count["message"]
    assert f"not in NVML's list: {MISSING} " in count["message"]
    assert judged(daemon, "gpu.lost", 0)["status"] == "ok"
    assert daemon.result("gpu.lost") is None  # no host result: nothing to say
    # each sweep asks the one GPU the list lacks, nothing else
    assert set(daemon.wait_for(lambda: calls.exists() and calls.read_text().split(),
                               what="a lookup")) == {MISSING}
