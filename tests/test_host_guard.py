"""The guard that keeps tests off the host (gpuguard/io/paths.py, set by tests/conftest.py):
every default host path is refused with exit 4 naming it and the option to give instead,
and the switch can replace a default with a file of the test's own."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuguard.io.paths import FORBID_ENV, HostPathForbidden, Paths, host_default
from tests.conftest import FIXTURES, H200_XML, gpuguard, own_host

XID_LINE = ("4,100,1000000000,-;NVRM: Xid (PCI:0000:10:00): 79, pid='<unknown>', "
            "name=<unknown>, GPU has fallen off the bus.\n")


def without(args: list[str], option: str) -> list[str]:
    i = args.index(option)
    return args[:i] + args[i + 2:]


@pytest.mark.parametrize(("left_out", "named"), [
    ("--kmsg-file", "/dev/kmsg"),
    ("--path.procfs", "/proc"),
    ("--path.sysfs", "/sys"),
    ("--path.rootfs", "the host's / "),
])
def test_a_live_check_that_reaches_for_the_host_stops_naming_the_path(
        fake_env, tmp_path, left_out, named):
    args = without(own_host(tmp_path), left_out)
    # the switch as conftest set it, less any default kernel log that test.sh's second
    # pass points at a file of Xids
    switch = ",".join(item for item in os.environ[FORBID_ENV].split(",")
                      if not item.startswith("kmsg="))
    proc = gpuguard("check", *args, env={**fake_env(), FORBID_ENV: switch})
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert proc.stdout == ""  # no verdict: nothing was checked
    assert named in proc.stderr and f"give {left_out}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_state_dir_the_udev_socket_and_the_boot_id_are_refused(tmp_path):
    events = gpuguard("events")
    assert events.returncode == 4 and "/var/lib/gpuguard" in events.stderr
    assert "give --state-dir" in events.stderr
    daemon = gpuguard("daemon", "--input", str(H200_XML), "--listen", "127.0.0.1:1",
                      timeout=30)
    assert daemon.returncode == 4 and "give --no-udev" in daemon.stderr
    # the daemon's event store needs this boot's id: the tests' own unless lifted
    strict = {FORBID_ENV: f"1,etc={tmp_path / 'etc'}"}
    ack = gpuguard("ack", "recovery.action", "--gpu", "0", "--reason", "r", "--state-dir",
                   str(tmp_path), env=strict)
    assert ack.returncode == 4 and "/proc/sys/kernel/random/boot_id" in ack.stderr


def test_a_replay_reads_nothing_of_the_host_so_it_needs_no_option():
    proc = gpuguard("check", "--input", str(H200_XML), env={FORBID_ENV: "1"})
    # /etc/gpuguard is refused too: the profile and rules are looked up even for a replay
    assert proc.returncode == 4 and "/etc/gpuguard" in proc.stderr
    proc = gpuguard("check", "--input", str(H200_XML))  # the conftest's empty /etc/gpuguard
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_switch_points_the_default_kernel_log_at_a_file_of_the_tests_own(
        fake_env, tmp_path):
    log = tmp_path / "xids.log"
    log.write_text(XID_LINE)
    switch = os.environ[FORBID_ENV] + f",kmsg={log}"
    args = without(own_host(tmp_path), "--kmsg-file")
    proc = gpuguard("check", *args, "--format", "json", "--only", "xid.recent",
                    env={**fake_env(), FORBID_ENV: switch})
    assert proc.returncode == 2, proc.stderr
    [xid] = json.loads(proc.stdout)["results"]
    assert xid["status"] == "critical" and xid["observed"]["counted"] == 1


def test_in_process_the_defaults_are_refused_and_given_roots_are_not(monkeypatch):
    monkeypatch.setenv(FORBID_ENV, "1")
    for kind in ("kmsg", "procfs", "sysfs", "rootfs", "etc", "state", "boot_id", "udev"):
        with pytest.raises(HostPathForbidden):
            host_default(kind)
    paths = Paths(procfs=FIXTURES / "procfs-match")
    assert paths.procfs == FIXTURES / "procfs-match"  # given: never refused
    assert paths.boot_id_file == FIXTURES / "procfs-match" / "sys/kernel/random/boot_id"
    with pytest.raises(HostPathForbidden, match=r"give --path\.sysfs"):
        _ = paths.sysfs
    monkeypatch.setenv(FORBID_ENV, "0")  # off: the host's own paths
    assert host_default("procfs") == Path("/proc")
    assert Paths().rootfs == Path("/")
