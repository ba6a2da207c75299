"""Issue 36, item 1 through the daemon: each lost-GPU shape without an Xid
(tests/fixtures/kmsg/lost-*) is xid.recent critical on the GPU it names, with Xid 79's
action, as `check` gives it (tests/test_lost_gpu_cli.py)."""

from __future__ import annotations

import pytest

from tests.conftest import FIXTURES
from tests.daemon.conftest import host_snapshot, write_snapshot


@pytest.mark.parametrize("name", ["lost-multi-line.log", "lost-multi-line.kmsg",
                                  "lost-short-form.log", "lost-init-failed.log"])
def test_the_daemon_gives_the_lost_gpu_critical_on_its_gpu(start_daemon, tmp_path, name):
    snap = tmp_path / "host.json"
    write_snapshot(snap, host_snapshot(3))  # GPUs at 18:00, 28:00, 38:00
    log = tmp_path / name
    # the fixture's GPU (the fake NVML's GPU 1, 11:00) moved to this snapshot's GPU 1
    log.write_text((FIXTURES / "kmsg" / name).read_text().replace("11:00.0", "28:00.0"))
    daemon = start_daemon("--input", str(snap), "--fast-interval", "0.3", "--kmsg-file",
                          str(log))
    daemon.wait_for(lambda: daemon.result("xid.recent", 1) is not None, what="xid results")
    gpu1 = daemon.result("xid.recent", 1)
    assert (gpu1["status"], gpu1["action"]) == ("critical", "reboot"), gpu1["message"]
    assert gpu1["message"].startswith("Xid 79 (GPU has fallen off the bus")
    assert daemon.result("xid.recent", 0)["status"] == "ok"


def test_the_daemon_names_an_nvidia_gpu_on_the_bus_that_nvml_does_not_list(start_daemon,
                                                                          fake_env):
    """Issue 36, item 2: from its first sweep, without a profile or a GPU seen before."""
    sysfs = FIXTURES / "sysfs-pci-gpus"  # its README: 11:00 bound to nvidia, 12:00 vfio-pci
    daemon = start_daemon("--fast-interval", "0.3", "--path.sysfs", str(sysfs),
                          env=fake_env(gpus=1))
    count = daemon.wait_for(lambda: (r := daemon.result("gpu.count")) and
                            r["status"] != "unknown" and r, what="gpu.count")
    assert count["status"] == "critical", count["message"]
    assert "not in NVML's list: 0000:11:00.0 " in count["message"]


def test_the_daemon_gives_a_handle_nvml_cannot_give_as_gpu_lost(start_daemon, fake_env):
    daemon = start_daemon("--fast-interval", "0.3",
                          env=fake_env(gpus=2, handle_error=999, handle_error_gpu=1))
    lost = daemon.wait_for(lambda: daemon.result("gpu.lost", 1), what="gpu.lost of GPU 1")
    assert lost["status"] == "critical", lost["message"]
    assert "nvmlDeviceGetHandleByIndex: Unknown Error" in lost["message"]
    assert daemon.result("gpu.lost", 0)["status"] == "ok"
