"""Issue 36 through the command line: every form of a lost GPU on a live `check` (the fake
NVML, a host of the test's own: tests/conftest.py own_host)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conftest import FIXTURES, gpuguard, own_host

K = FIXTURES / "kmsg"


def by_gpu(proc: Any, rule: str) -> dict[Any, dict[str, Any]]:
    """A rule's results by GPU index, `host` for the host's."""
    assert "Traceback" not in proc.stderr, proc.stderr
    return {"host" if r["gpu"] is None else r["gpu"]["index"]: r
            for r in json.loads(proc.stdout)["results"] if r["rule"] == rule}


def check(root: Path, env: dict[str, str], kmsg: str = "", *extra: str) -> Any:
    return gpuguard("check", "--format", "json", *own_host(root, kmsg=kmsg), *extra, env=env)


def test_a_log_whose_last_line_has_no_newline_is_read_and_the_result_says_it_may_be_cut(
        tmp_path, fake_env):
    """A pasted excerpt without its last newline: its Xid 79 on GPU 0 (the fake's GPU 0 is
    at 0000:10:00.0) is read, not every kernel-log rule unknown; the messages say the last
    line may be cut."""
    line = "[ 200.000000] NVRM: Xid (PCI:0000:10:00): 79, pid=1, name=x, GPU has fallen off the bus"
    proc = check(tmp_path, fake_env(), line)
    xids = by_gpu(proc, "xid.recent")
    assert xids[0]["status"] == "critical", xids[0]["message"]
    assert "may be cut" in xids[0]["message"]
    gsp = by_gpu(proc, "gsp.firmware")
    assert gsp[0]["status"] == "ok" and "may be cut" in gsp[0]["message"]


# each shape (tests/fixtures/kmsg/README.md cites its source): the result it gives, by GPU
# (the fake's GPU 1 is at 0000:11:00.0, GPU 2 at 0000:12:00.0; `host`: a line naming none)
SHAPES = {
    "lost-single-line.log": {1},
    "lost-short-form.log": {1},
    "lost-multi-line.log": {1},
    "lost-multi-line.kmsg": {1},
    "lost-init-failed.log": {1},
    "lost-start-failed.log": {1, 2},
    "lost-probe-failed.log": {"host"},
    "lost-init-failed-old.log": {"host"},
}


def test_each_lost_gpu_shape_is_critical_on_its_gpu_with_xid_79s_action(tmp_path, fake_env):
    for name, where in SHAPES.items():
        proc = check(tmp_path / name, fake_env(gpus=3), (K / name).read_text())
        xids = by_gpu(proc, "xid.recent")
        assert proc.returncode == 2, (name, proc.stderr)
        for key, result in xids.items():
            if key in where:
                assert (result["status"], result["action"]) == ("critical", "reboot"), name
                assert "Xid 79" in result["message"], (name, result["message"])
            else:
                assert result["status"] == "ok", (name, key, result["message"])


def test_the_lost_gpu_is_cleared_as_xid_79_is(tmp_path, fake_env):
    """Xid 79 asks for a reboot: a driver reload after it clears it not, nor the lost-GPU
    line; a window that the line is older than leaves both out (a reboot's log holds
    neither)."""
    reload = ("[ 7000.000000] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.14  "
              "Thu Feb 22 01:44:30 UTC 2024\n")
    lost = (K / "lost-init-failed.log").read_text()
    xid79 = "[ 6100.000000] NVRM: Xid (PCI:0000:11:00): 79, pid=1, name=x, GPU has fallen " \
        "off the bus.\n"
    for extra in ((), ("--xid-window", "5m")):
        got = [by_gpu(check(tmp_path / f"{n}{len(extra)}", fake_env(gpus=3), log + reload,
                            *extra), "xid.recent")[1]
               for n, log in (("lost", lost), ("xid", xid79))]
        assert got[0]["status"] == got[1]["status"] == ("ok" if extra else "critical")
        assert got[0]["action"] == got[1]["action"]


# -- PCI against NVML (issue 36, item 2) ------------------------------------------------

SYSFS = FIXTURES / "sysfs-pci-gpus"  # its README: GPUs at 10:00, 11:00 (nvidia), 12:00
# (vfio-pci), 13:00 (no driver); an audio function, two NVSwitch bridges


def test_an_nvidia_gpu_on_the_bus_that_nvml_does_not_list_is_critical_without_a_profile(
        tmp_path, fake_env):
    proc = check(tmp_path, fake_env(gpus=1), "", "--path.sysfs", str(SYSFS))
    count = by_gpu(proc, "gpu.count")["host"]
    assert count["status"] == "critical", count["message"]
    assert "0000:11:00.0" in count["message"]
    # the GPUs of another driver, the audio function and the NVSwitch bridges are not
    # counted missing
    for address in ("0000:12:00.0", "0000:13:00.0", "0000:10:00.1", "0000:05:00.0"):
        assert address not in count["message"].split("list:")[1], count["message"]
    assert count["observed"]["not_listed"] == ["0000:11:00.0"]
    assert count["observed"]["on_bus"] == ["0000:10:00.0", "0000:11:00.0", "0000:12:00.0",
                                           "0000:13:00.0"]


def test_gpus_of_another_driver_are_named_and_not_counted_missing(tmp_path, fake_env):
    proc = check(tmp_path, fake_env(gpus=2), "", "--path.sysfs", str(SYSFS))
    count = by_gpu(proc, "gpu.count")["host"]
    assert count["status"] == "ok", count["message"]
    assert count["message"].endswith("not the nvidia driver's, not counted: 0000:12:00.0 "
                                     "(vfio-pci), 0000:13:00.0 (no driver)")


def driver_procfs(root: Path, *addresses: str) -> None:
    """The nvidia driver's procfs in the test's own host: a folder per GPU it lists."""
    for address in addresses:
        (root / "proc" / "driver" / "nvidia" / "gpus" / address).mkdir(parents=True)


def test_a_gpu_the_container_was_not_given_is_no_lost_gpu(tmp_path, fake_env):
    """In a container the toolkit binds back only the given GPUs' /proc/driver/nvidia/gpus
    entries, while /sys shows the host's whole bus: GPU 11:00 is another container's."""
    args = own_host(tmp_path)
    driver_procfs(tmp_path, "0000:10:00.0")
    proc = gpuguard("check", "--format", "json", *args, "--path.sysfs", str(SYSFS),
                    env=fake_env(gpus=1))
    count = by_gpu(proc, "gpu.count")["host"]
    assert count["status"] == "ok", count["message"]
    assert count["message"].endswith("not given to this container (not in "
                                     "/proc/driver/nvidia/gpus), not counted: 0000:11:00.0")
    assert count["observed"]["not_this_container"] == ["0000:11:00.0"]


def test_a_gpu_the_driver_lists_but_nvml_does_not_is_critical(tmp_path, fake_env):
    """On a host the driver's procfs lists every GPU it probed, lost or not (here in the
    eight-digit domain form some drivers write)."""
    args = own_host(tmp_path)
    driver_procfs(tmp_path, "0000:10:00.0", "00000000:11:00.0")
    proc = gpuguard("check", "--format", "json", *args, "--path.sysfs", str(SYSFS),
                    env=fake_env(gpus=1))
    count = by_gpu(proc, "gpu.count")["host"]
    assert count["status"] == "critical", count["message"]
    assert count["observed"]["not_listed"] == ["0000:11:00.0"]


# -- a handle NVML cannot give (issue 36, item 3) ---------------------------------------

def test_a_handle_nvml_cannot_give_is_gpu_lost_critical_naming_the_error(tmp_path, fake_env):
    """nvidia-smi's "Unable to determine the device handle for GPU ...: Unknown Error": the
    fake's GPU 1 answers NVML_ERROR_UNKNOWN (999) to nvmlDeviceGetHandleByIndex."""
    proc = check(tmp_path, fake_env(gpus=2, handle_error=999, handle_error_gpu=1))
    lost = by_gpu(proc, "gpu.lost")
    assert lost[1]["status"] == "critical", lost[1]["message"]
    assert "nvmlDeviceGetHandleByIndex: Unknown Error" in lost[1]["message"]
    assert lost[1]["observed"]["handle_error"] == "nvmlDeviceGetHandleByIndex: Unknown Error"
    assert lost[0]["status"] == "ok"
    assert proc.returncode == 2


def test_a_handle_not_supported_is_no_lost_gpu(tmp_path, fake_env):
    proc = check(tmp_path, fake_env(gpus=2, handle_error=3, handle_error_gpu=1))
    lost = by_gpu(proc, "gpu.lost")
    assert lost[1]["status"] != "critical", lost[1]["message"]
    # the other GPU is still read whole (its P2P status with the peer of no handle too)
    assert by_gpu(proc, "p2p.status")[0]["status"] == "ok"


# -- shapes the audit found (issue 36, item 1): their result by GPU, the action, and words
# the message must hold (the reboot of Xid 79 where the GPU is lost; for a GPU the release
# does not support, installing one that does, and never a reboot)

UNSUPPORTED_WORDS = ("not supported by the installed NVIDIA driver release",
                     "install an NVIDIA driver release that supports this GPU")
LATER_SHAPES: dict[str, tuple[set[Any], str, tuple[str, ...]]] = {
    "lost-unsupported.log": ({1}, "update_software", UNSUPPORTED_WORDS),
    "lost-unsupported-old.log": ({1}, "update_software", UNSUPPORTED_WORDS),
    "lost-unsupported.kmsg": ({1}, "update_software", UNSUPPORTED_WORDS),
    "lost-unsupported-gsp.log": ({1}, "update_software", UNSUPPORTED_WORDS),
    "lost-private-state-old.log": ({"host"}, "reboot", ("rm_init_private_state() failed!",)),
    # the Xid 79 line and the driver's "fallen off" line of one loss: one event, not x2
    "lost-xid-and-fallen.log": ({1}, "reboot", ("Xid 79 (GPU has fallen off the bus)",)),
}


def test_each_later_shape_is_critical_on_its_gpu_with_its_action(tmp_path, fake_env):
    for name, (where, action, words) in LATER_SHAPES.items():
        proc = check(tmp_path / name, fake_env(gpus=3), (K / name).read_text())
        xids = by_gpu(proc, "xid.recent")
        assert proc.returncode == 2, (name, proc.stderr)
        assert set(xids) >= where, (name, set(xids))
        for key, result in xids.items():
            if key not in where:
                assert result["status"] == "ok", (name, key, result["message"])
                continue
            assert (result["status"], result["action"]) == ("critical", action), \
                (name, result["action"], result["message"])
            for word in words:
                assert word in result["message"], (name, result["message"])
            assert " x2" not in result["message"], (name, result["message"])
            if action == "update_software":
                assert "reboot" not in result["message"].lower(), result["message"]
                # not named as an Xid 79, which reads as a GPU off the bus
                assert result["message"].startswith("Driver probe ("), result["message"]
                assert "Xid 79" not in result["message"], result["message"]
