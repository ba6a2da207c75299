"""Issue 3 through the command line: replayed NVML data combined with fixture roots,
and the live kernel log (a test line written to the real /dev/kmsg, then acknowledged)."""

import json
import os
import random

import pytest

from tests.conftest import FIXTURES, H200_XML, gpuguard

LIVE_IDLE = FIXTURES / "h200-live" / "idle-snapshot.json"


def results(proc):
    assert "Traceback" not in proc.stderr, proc.stderr
    return {r["rule"]: r for r in json.loads(proc.stdout)["results"]}


def of_rule(proc, rule):
    """A rule's results by GPU index, `host` for the host's (xid.recent gives one per GPU
    and one for lines naming no GPU NVML lists)."""
    return {"host" if r["gpu"] is None else r["gpu"]["index"]: r
            for r in json.loads(proc.stdout)["results"] if r["rule"] == rule}


def test_replay_alone_does_not_read_this_machine():
    by_rule = results(gpuguard("check", "--input", str(H200_XML), "--format", "json"))
    for rule in ("xid.recent", "driver.module_match", "driver.nouveau", "persistence.daemon",
                 "toolkit.parity", "toolkit.docker"):
        assert by_rule[rule]["status"] == "skipped", (rule, by_rule[rule]["message"])
    assert by_rule["pcie.aer"]["status"] == "skipped"


def test_replay_combined_with_fixture_roots_and_a_kernel_log():
    proc = gpuguard("check", "--input", str(H200_XML), "--format", "json",
                    "--kmsg-file", str(FIXTURES / "kmsg" / "dmesg.log"),
                    "--path.procfs", str(FIXTURES / "procfs-mismatch"),
                    "--path.sysfs", str(FIXTURES / "sysfs-aer"),
                    "--path.rootfs", str(FIXTURES / "rootfs-cdi-stale"),
                    env={"DOCKER_HOST": ""})
    assert proc.returncode == 2
    by_rule = results(proc)
    xids = of_rule(proc, "xid.recent")  # the H200 at 00:06 and the addresses it lacks
    assert xids[0]["status"] == "critical" and xids[0]["message"].startswith("Xid 119")
    assert xids["host"]["status"] == "critical"
    assert xids["host"]["message"].startswith("0000:3b:00.0 (not among the GPUs NVML lists): "
                                              "Xid 154")
    assert by_rule["driver.module_match"]["status"] == "critical"
    assert by_rule["toolkit.parity"]["status"] == "critical"
    # the H200's bus address has no device in this sysfs tree: an error, never ok
    assert by_rule["pcie.aer"]["status"] == "unknown"


def test_snapshot_records_host_facts_for_replay(tmp_path):
    out = tmp_path / "snap.json"
    made = gpuguard("snapshot", "--input", str(H200_XML), "-o", str(out),
                    "--kmsg-file", str(FIXTURES / "kmsg" / "fallen-off.log"),
                    "--path.procfs", str(FIXTURES / "procfs-match"))
    assert made.returncode == 0, made.stderr
    recorded = json.loads(out.read_text())
    assert recorded["host"]["kernel_log"]["xids"][0]["xid"] == 79
    assert recorded["host"]["kernel_module_version"] == "580.159.04"
    by_rule = results(gpuguard("check", "--input", str(out), "--format", "json"))
    assert by_rule["xid.recent"]["status"] == "critical"
    assert by_rule["driver.module_match"]["status"] == "ok"


def test_xid_window_option(tmp_path):
    args = ("check", "--input", str(H200_XML), "--format", "json", "--only", "xid.recent",
            "--kmsg-file", str(FIXTURES / "kmsg" / "dmesg.log"))
    since_boot = of_rule(gpuguard(*args), "xid.recent")["host"]  # the 13 is at 86:00
    windowed = of_rule(gpuguard(*args, "--xid-window", "1h"), "xid.recent")["host"]
    assert since_boot["observed"]["aged_out"] == 0
    assert windowed["observed"]["aged_out"] == 2


def test_bad_kernel_log_is_unknown_and_others_still_run(tmp_path):
    bad = tmp_path / "kmsg.bin"
    bad.write_bytes(bytes(range(256)) * 4)
    proc = gpuguard("check", "--input", str(H200_XML), "--format", "json",
                    "--kmsg-file", str(bad))
    by_rule = results(proc)
    assert by_rule["xid.recent"]["status"] == "unknown"
    assert str(bad) in by_rule["xid.recent"]["message"]
    assert by_rule["ecc.uncorrected"]["status"] == "ok"


def _kmsg_writable() -> bool:
    try:
        with open("/dev/kmsg", "w"):
            return True
    except OSError:
        return False


def test_live_kernel_log_is_read_without_writing_to_it(tmp_path):
    """The real /dev/kmsg, read only: it parses (or says why it cannot), never hangs."""
    proc = gpuguard("check", "--input", str(H200_XML), "--format", "json", "--only",
                    "xid.recent", "--kmsg-file", "/dev/kmsg", "--state-dir", str(tmp_path))
    xid = results(proc)["xid.recent"]
    if os.access("/dev/kmsg", os.R_OK):
        assert xid["status"] in ("ok", "warning", "critical"), xid  # read, and judged
    else:
        assert xid["status"] == "unknown" and "/dev/kmsg" in xid["message"]


# Writing to the host's real kernel log changes the machine (every later live check
# would count the line until reboot): only when asked, on a throwaway machine.
WRITE_KMSG = os.environ.get("GPUGUARD_TEST_WRITE_KMSG") == "1"


@pytest.mark.live(needs="root, and the host's /dev/kmsg, which it writes a line to")
@pytest.mark.skipif(not WRITE_KMSG or not _kmsg_writable(),
                    reason="writes the real /dev/kmsg: set GPUGUARD_TEST_WRITE_KMSG=1 (root)")
def test_live_kernel_log_and_ack(tmp_path):
    # A test line in the real kernel log, at a PCI address no machine has, graded warning.
    bus = f"0000:ff:{random.randrange(256):02x}"
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write(f"NVRM: Xid (PCI:{bus}): 13, pid={os.getpid()}, name=gpuguard-selftest, "
                   "written by gpuguard's test suite\n")
    state = tmp_path / "state"
    args = ("check", "--input", str(H200_XML), "--format", "json", "--only", "xid.recent",
            "--kmsg-file", "/dev/kmsg", "--state-dir", str(state))

    def ours(proc):
        return [e for e in results(proc)["xid.recent"]["observed"].get("events", [])
                if e["pci"] == f"{bus}.0"]

    # --kmsg-file /dev/kmsg reads the device like the live default does
    assert len(ours(gpuguard(*args))) == 1
    acked = gpuguard("xid", "ack", "--state-dir", str(state), "--kmsg-file", "/dev/kmsg")
    assert acked.returncode == 0, acked.stderr
    assert "acknowledged" in acked.stdout
    assert ours(gpuguard(*args)) == []


def test_corrupt_ack_file_hides_nothing(tmp_path):
    from gpuguard.sources.boot_state import read_xid_ack

    (tmp_path / "xid-ack.json").write_text("{not json")
    assert read_xid_ack(tmp_path, FIXTURES / "procfs-match") is None
