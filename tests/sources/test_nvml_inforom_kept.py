"""`gpuguard check` keeps a passed InfoROM validation per boot and asks again whenever
something says the board or the driver may have changed (sources/nvml_inforom_kept.py,
issue 32): through the real command on the fake NVML, counting the validations the fake
was asked."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuguard.sources.kmsg_driver_marks import DriverMarks, read_marks
from gpuguard.sources.nvml_inforom_kept import KEPT_FILE, MAX_AGE_S
from tests.conftest import REPO, own_host

# the real H200's boot, as /dev/kmsg gives it (tests/fixtures/kmsg/h200-healthy.kmsg)
LOG = (REPO / "tests" / "fixtures" / "kmsg" / "h200-healthy.kmsg").read_text().rstrip("\n") \
    + "\n"
UUID0 = "GPU-fa4e0000-0000-0000-0000-000000000000"  # the fake's GPUs 0 and 1
UUID1 = "GPU-fa4e0000-0000-0000-0000-000000000001"


class Host:
    def __init__(self, root: Path, fake_env, **switches: str | int) -> None:
        self.root = root
        self.args = own_host(root, kmsg=LOG)
        self.calls = root / "calls"
        self.switches = {"gpus": 2, "inforom_calls": str(self.calls), **switches}
        self.fake_env = fake_env

    def check(self, **switches: str | int) -> dict[int, dict[str, str]]:
        env = {**os.environ, "NO_COLOR": "1",
               **self.fake_env(**{**self.switches, **switches})}
        proc = subprocess.run([sys.executable, "-m", "gpuguard", "check", *self.args,
                               "--format", "json"], capture_output=True, text=True,
                              env=env, cwd=REPO, timeout=60)
        assert proc.returncode in (0, 1, 2, 3) and "Traceback" not in proc.stderr, proc.stderr
        return {r["gpu"]["index"]: r for r in json.loads(proc.stdout)["results"]
                if r["rule"] == "gpu.inforom"}

    def validations(self) -> int:
        return len(self.calls.read_text().splitlines()) if self.calls.exists() else 0

    def log(self, *records: str) -> None:
        with open(self.kmsg, "a") as f:
            f.writelines(record + "\n" for record in records)

    @property
    def kmsg(self) -> Path:
        return self.root / "kmsg.log"

    @property
    def kept(self) -> Path:
        return self.root / "state" / KEPT_FILE


def test_a_passed_validation_is_kept_and_judged_the_same(tmp_path, fake_env):
    host = Host(tmp_path, fake_env)
    first = host.check()
    assert host.validations() == 2 and host.kept.is_file()
    again = host.check()
    assert host.validations() == 2  # nothing asked of NVML's 68 ms call this time
    assert again == first and {r["status"] for r in again.values()} == {"ok"}
    assert [line.split()[1] for line in host.kept.read_text().splitlines()[2:]] == \
        [UUID0, UUID1]


# each change, made after a kept validation, must make the next check validate again
CHANGES = {
    "a reset line": lambda host: host.log("12,400,9000000,-;GPU reset occurred: " + UUID1),
    "a driver reload": lambda host: host.log(
        "3,400,9000000,-;NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  "
        "580.159.04  Release Build  (nixbld@)"),
    "an Xid": lambda host: host.log(
        "4,400,9000000,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus."),
    "a new boot": lambda host: (host.root / "proc/sys/kernel/random/boot_id").write_text(
        "7e570000-0000-4000-8000-000000000002\n"),
    "a ring that wrapped past it": lambda host: host.kmsg.write_text(
        "6,9000,9000000,-;usb 1-1: new device\n"),
    "a log without sequence numbers": lambda host: host.kmsg.write_text(
        "[    1.000000] NVRM: loading\n"),
    "an hour gone": lambda host: age(host, MAX_AGE_S + 1),
    "a bad file": lambda host: host.kept.write_text(
        host.kept.read_text().replace(" 580.159.04 ", " 580.159.04 x ")),
    "another boot's file": lambda host: host.kept.write_text(
        host.kept.read_text().replace("boot 7e57", "boot 8e57")),
    "a file others may write": lambda host: host.kept.chmod(0o666),
}


def age(host: Host, seconds: float) -> None:
    """Each kept validation made `seconds` ago on the boot clock."""
    lines = host.kept.read_text().splitlines()
    at = time.clock_gettime(time.CLOCK_BOOTTIME) - seconds
    for i, line in enumerate(lines):
        if line.startswith("gpu "):
            words = line.split()
            words[4] = repr(at)
            lines[i] = " ".join(words)
    host.kept.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("change", CHANGES)
def test_a_change_validates_again(tmp_path, fake_env, change):
    host = Host(tmp_path, fake_env)
    host.check()
    assert host.validations() == 2
    CHANGES[change](host)
    host.check()
    assert host.validations() == 4, change
    host.log("6,9001,9000001,-;usb 1-1: unrelated")  # a record, not the driver's
    host.check()
    # kept again from the new validation, except where the log cannot order records
    expected = 6 if change == "a log without sequence numbers" else 4
    assert host.validations() == expected, change


@pytest.mark.parametrize("switch", [{"inforom_image": "G520.0282.02.03"},
                                    {"driver_version": "580.200.01"}])
def test_a_reflash_or_a_new_driver_validates_again(tmp_path, fake_env, switch):
    host = Host(tmp_path, fake_env)
    host.check()
    host.check(**switch)
    assert host.validations() == 4


def test_a_failed_validation_is_never_kept(tmp_path, fake_env):
    host = Host(tmp_path, fake_env, inforom="corrupted", inforom_gpu=1)
    for run in range(1, 4):
        results = host.check()
        assert {i: r["status"] for i, r in results.items()} == {0: "ok", 1: "critical"}
        assert host.validations() == run + 1  # GPU 1 each time, GPU 0 once
    assert [line.split()[1] for line in host.kept.read_text().splitlines()[2:]] == [UUID0]


def test_a_corruption_the_driver_logs_is_found_at_the_next_check(tmp_path, fake_env):
    host = Host(tmp_path, fake_env)
    assert {r["status"] for r in host.check().values()} == {"ok"}
    host.log("4,400,9000000,-;NVRM: GPU at PCI:0000:18:00: " + UUID1)
    results = host.check(inforom="corrupted", inforom_gpu=1)
    assert results[1]["status"] == "critical"
    assert results[1]["message"] == "the InfoROM is corrupted (nvmlDeviceValidateInforom)"


def test_marks_read_from_a_file_of_records(tmp_path):
    log = tmp_path / "kmsg"
    log.write_text("6,10,1,-;usb\n SUBSYSTEM=usb\n4,11,2,-;NVRM: Xid 13\n6,12,3,-;eth0 up\n")
    marks = read_marks(str(log), 1.0)
    assert marks == DriverMarks(first_seq=10, last_seq=12, last_mark=11)
    assert marks.quiet_since(11) and marks.quiet_since(12)
    assert not marks.quiet_since(10)  # the Xid came after it
    assert not DriverMarks(20, 30, -1).quiet_since(10)  # records 11-19 are gone
    log.write_text("")
    assert read_marks(str(log), 1.0) is None
    log.write_text("6,12,1,-;b\n6,11,2,-;a\n")
    assert read_marks(str(log), 1.0) is None  # not in order: not one log
    assert read_marks(str(tmp_path / "missing"), 1.0) is None


def test_the_fake_keeps_nothing_in_the_hosts_own_state_dir(fake_nvml):
    """A README reader's fake-NVML run (the guard lifted, no --state-dir) must leave no
    kept validity of the fake's GPUs in /var/lib/gpuguard; a test's own state dir keeps."""
    import ctypes

    from gpuguard.sources.nvml_early import is_fake_in_host_state

    lib = ctypes.CDLL(str(fake_nvml / "libnvidia-ml.so.1"))
    assert is_fake_in_host_state(lib, "/var/lib/gpuguard")
    assert is_fake_in_host_state(lib, "/var/lib/gpuguard/")
    assert not is_fake_in_host_state(lib, "/tmp/a-state-dir")
    libc = ctypes.CDLL(None)  # no marker: a real driver's library keeps where it is told
    assert not is_fake_in_host_state(libc, "/var/lib/gpuguard")
