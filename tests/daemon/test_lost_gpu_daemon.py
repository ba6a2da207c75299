"""Issue 36, item 1 through the daemon: each lost-GPU shape without an Xid
(tests/fixtures/kmsg/lost-*) is xid.recent critical on the GPU it names, with Xid 79's
action (a GPU the release does not support: update_software), as `check` gives it
(tests/test_lost_gpu_cli.py)."""

from __future__ import annotations

import re

import pytest

from tests.conftest import FIXTURES
from tests.daemon.conftest import host_snapshot, write_snapshot
from tests.test_lost_gpu_cli import LATER_SHAPES
from tests.test_lost_gpu_cli import SHAPES as CLI_SHAPES

# every shape the command-line test covers (tests/test_lost_gpu_cli.py), with the GPUs it
# gives critical (`host`: the result of the lines naming no listed GPU) and the action
SHAPES = {**{name: (where, "reboot") for name, where in CLI_SHAPES.items()},
          **{name: (where, action) for name, (where, action, _) in LATER_SHAPES.items()}}
# the fixtures' GPUs (the fake NVML's GPU 1 at 11:00, GPU 2 at 12:00) moved to this
# snapshot's GPU 1 (28:00) and GPU 2 (38:00)
MOVED = {"11:00": "28:00", "12:00": "38:00"}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_the_daemon_gives_the_lost_gpu_critical_on_its_gpu(start_daemon, tmp_path, name):
    where, action = SHAPES[name]
    snap = tmp_path / "host.json"
    write_snapshot(snap, host_snapshot(3))  # GPUs at 18:00, 28:00, 38:00
    log = tmp_path / name
    text = (FIXTURES / "kmsg" / name).read_text()
    for old, new in MOVED.items():
        text = re.sub(rf"\b{old}\b", new, text)
    log.write_text(text)
    daemon = start_daemon("--input", str(snap), "--fast-interval", "0.3", "--kmsg-file",
                          str(log))
    daemon.wait_for(lambda: daemon.result("xid.recent", 2) is not None, what="xid results")
    for key in (0, 1, 2, "host"):
        result = daemon.result("xid.recent", None if key == "host" else key)
        if key not in where:
            assert result is None or result["status"] == "ok", (key, result)
            continue
        assert result is not None, key
        assert (result["status"], result["action"]) == ("critical", action), result["message"]
        # a lost GPU reads as Xid 79; one its release does not support as the driver's probe
        head = "Driver probe (" if action == "update_software" else "Xid 79 ("
        assert head in result["message"], result["message"]  # the host's: after its address
        if action == "update_software":
            assert "Xid 79" not in result["message"], result["message"]
        assert " x2" not in result["message"], result["message"]


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
