"""Issue 21, item 3: cleared by the repair, not by waiting. A GPU reset line (NVSentinel's
"GPU reset occurred: <GPU>") or a driver reload in the kernel log clears the kernel-log
findings before it that asked for no more (xid.recent, gsp.firmware), the event store
records the repair (`gpuguard events --kind repair`), and a hardware finding that comes
back after its repair escalates, as after a reboot. Through `gpuguard check --record` on
the fake NVML (GPU 0 at bus 10, GPU 1 at bus 11)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import FIXTURES, gpuguard
from tests.events.conftest import BOOT_A, GPU_RESET, NONE, events, procfs, result

UUID0 = "GPU-fa4e0000-0000-0000-0000-000000000000"
XID_48 = ("NVRM: Xid (PCI:0000:{bus}:00): 48, pid='<unknown>', name=<unknown>, An "
          "uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.")
LOAD = ("NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  "
        "(nixbld@)")


def kmsg(tmp: Path, name: str, *lines: str) -> Path:
    """A kernel log of these lines, after the boot's driver load, a second apart."""
    path = tmp / name
    path.write_text("".join(f"4,{100 + i},{(1000 + i) * 1_000_000},-;{text}\n"
                            for i, text in enumerate((LOAD, *lines))))
    return path


def test_a_gpu_reset_line_clears_the_finding_and_is_in_gpuguard_events(tmp_path, run):
    """The issue's "done means": the fixture's reset line of GPU 0 clears GPU 0's Xid 48
    and its GSP line (both asked for a reset), not its Xid 79 (which asked for a reboot);
    the store has the repair, with the board, and `events` shows it."""
    state, proc = tmp_path / "state", procfs(tmp_path, BOOT_A)
    log = FIXTURES / "kmsg" / "repairs.kmsg"
    before = kmsg(tmp_path, "before.kmsg", XID_48.format(bus=10))
    assert result(run(state, proc, "--kmsg-file", str(before), recovery=NONE),
                  "xid.recent", 0)["status"] == "critical"
    # the fixture up to (not with) its driver reload: the resets only (after its boot line)
    lines = log.read_text().splitlines()
    resets = tmp_path / "resets.kmsg"
    resets.write_text("\n".join(lines[:8]) + "\n")
    doc = run(state, proc, "--kmsg-file", str(resets), recovery=NONE,
              only=("xid.recent", "gsp.firmware"))
    gpu0 = result(doc, "xid.recent", 0)
    assert gpu0["status"] == "critical" and gpu0["observed"]["codes"] == [
        {"xid": 79, "count": 1, "severity": "critical", "suggested": "reboot"}]
    assert gpu0["observed"]["cleared"] == 1  # the Xid 48
    gsp0 = result(doc, "gsp.firmware", 0)
    assert gsp0["status"] == "ok"
    assert gsp0["message"] == ("no GSP error line since boot (1 cleared by a GPU reset at "
                               "[5100.000000])")
    # GPU 1's Xid 48, reset by its bus id: nothing left
    gpu1 = result(doc, "xid.recent", 1)
    assert gpu1["status"] == "ok"
    assert gpu1["message"] == ("no Xid since boot to act on (1 cleared by a GPU reset at "
                               "[5200.000000])")
    repairs = events(state, "--kind", "repair")
    assert sorted((e["status"], e["gpu_index"], e["gpu_uuid"], e["seq"]) for e in repairs) == [
        ("gpu_reset", 0, UUID0, 210),
        ("gpu_reset", 1, "GPU-fa4e0000-0000-0000-0000-000000000001", 211)]
    table = gpuguard("events", "--state-dir", str(state), "--kind", "repair")
    assert table.returncode == 0 and "gpu reset" in table.stdout
    assert "GPU reset occurred:" in table.stdout and "gpu_reset" in table.stdout
    # read again: each line recorded once
    run(state, proc, "--kmsg-file", str(resets), recovery=NONE)
    assert len(events(state, "--kind", "repair")) == 2


def test_a_driver_reload_clears_every_gpus_findings_but_a_reboots(tmp_path, run):
    state, proc = tmp_path / "state", procfs(tmp_path, BOOT_A)
    doc = run(state, proc, "--kmsg-file", str(FIXTURES / "kmsg" / "repairs.kmsg"),
              recovery=NONE)
    gpu0, gpu1 = (result(doc, "xid.recent", i) for i in (0, 1))
    # the Xid 79 asked for a reboot: neither a reset nor a reload is that
    assert gpu0["status"] == "critical" and [c["xid"] for c in gpu0["observed"]["codes"]] == [79]
    assert gpu1["status"] == "ok" and "cleared by a driver reload at [6000.000000]" in \
        gpu1["message"]
    reload = [e for e in events(state, "--kind", "repair") if e["status"] == "driver_reload"]
    assert len(reload) == 1 and reload[0]["gpu_index"] is None  # every GPU's


def test_an_xid_back_after_its_reset_escalates_and_one_before_it_does_not(tmp_path, run):
    """Xid 48 asks for a reset; logged again after the reset of its GPU, the reset did not
    help: inspect_hardware. The same reset on GPU 1 does not touch GPU 0."""
    state, proc = tmp_path / "state", procfs(tmp_path, BOOT_A)
    once = kmsg(tmp_path, "once.kmsg", XID_48.format(bus=10),
                f"GPU reset occurred: {UUID0}")
    assert result(run(state, proc, "--kmsg-file", str(once), recovery=NONE),
                  "xid.recent", 0)["status"] == "ok"
    again = kmsg(tmp_path, "again.kmsg", XID_48.format(bus=10),
                 f"GPU reset occurred: {UUID0}", XID_48.format(bus=10))
    back = result(run(state, proc, "--kmsg-file", str(again), recovery=NONE), "xid.recent", 0)
    assert (back["status"], back["action"]) == ("critical", "inspect_hardware")
    assert "Xid 48 on GPU 0 also seen before the GPU reset at " in back["action_reason"]
    assert "came back after the repair" in back["action_reason"]
    # another board's reset: GPU 0's Xid 48 is its first, a reset is what it asks for
    state2 = tmp_path / "state2"
    other = kmsg(tmp_path, "other.kmsg", XID_48.format(bus=10), "GPU reset occurred: "
                 "0000:11:00.0", XID_48.format(bus=10))
    first = result(run(state2, proc, "--kmsg-file", str(other), recovery=NONE), "xid.recent", 0)
    assert (first["status"], first["action"]) == ("critical", "reset_gpu")


def test_nvml_faults_clear_when_nvml_says_so_and_escalate_when_back_after_a_reset(tmp_path,
                                                                                    run):
    """The driver's recovery action (NVML) needs no kernel-log line to clear: the next read
    that says none is ok, recorded as a transition. Critical before GPU 0's reset, ok after
    it, critical again: the reset did not help, inspect_hardware."""
    state, proc = tmp_path / "state", procfs(tmp_path, BOOT_A)
    quiet = kmsg(tmp_path, "quiet.kmsg")
    first = result(run(state, proc, "--kmsg-file", str(quiet)), "recovery.action", 0)
    assert (first["status"], first["action"]) == ("critical", "reset_gpu")
    reset = kmsg(tmp_path, "reset.kmsg", f"GPU reset occurred: {UUID0}")
    cleared = result(run(state, proc, "--kmsg-file", str(reset), recovery=NONE),
                     "recovery.action", 0)
    assert cleared["status"] == "ok"
    assert [(e["old_status"], e["status"]) for e in reversed(
        events(state, "--kind", "rule", "--rule", "recovery.action"))] == [
        (None, "critical"), ("critical", "ok")]
    back = result(run(state, proc, "--kmsg-file", str(reset), recovery=GPU_RESET),
                  "recovery.action", 0)
    assert (back["status"], back["action"]) == ("critical", "inspect_hardware")
    assert back["action_reason"].startswith("also critical before the GPU reset at ")
    # GPU 1 was not reset and never critical: nothing to escalate
    assert result(run(state, proc, "--kmsg-file", str(reset), recovery=GPU_RESET),
                  "recovery.action", 1)["status"] == "ok"


def test_a_finding_that_never_cleared_after_the_reset_keeps_its_action(tmp_path, run):
    """The cycle (or run) that saw the reset line may have read the GPU before it: a fault
    that never read ok after the repair is not called one that came back."""
    state, proc = tmp_path / "state", procfs(tmp_path, BOOT_A)
    run(state, proc, "--kmsg-file", str(kmsg(tmp_path, "quiet.kmsg")))
    reset = kmsg(tmp_path, "reset.kmsg", f"GPU reset occurred: {UUID0}")
    still = result(run(state, proc, "--kmsg-file", str(reset)), "recovery.action", 0)
    assert (still["status"], still["action"]) == ("critical", "reset_gpu")
