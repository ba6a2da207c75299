"""Issue 21, item 3, through the daemon: a GPU reset line appended to the kernel log it
reads clears the GPU's Xid finding on a later cycle, the store records the repair
(`gpuguard events --kind repair`), the same Xid logged after the reset escalates to
inspect_hardware, and an NVML-side fault (a row remap pending) clears when NVML says so."""

from __future__ import annotations

import json
from pathlib import Path

from gpuguard.io.atomic import write_text
from tests.conftest import gpuguard
from tests.daemon.conftest import host_snapshot, write_snapshot

UUID0 = "GPU-00000000-0000-0000-0000-000000000000"  # host_snapshot's GPU 0, at bus 18
LOAD = ("NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  "
        "(nixbld@)")
XID_48 = ("NVRM: Xid (PCI:0000:18:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable "
          "double bit error (DBE) has been detected on GPU in the framebuffer.")


def write_log(path: Path, *lines: str) -> None:
    # from the boot's record 0: a log whose first records were lost says so (review 3)
    write_text(path, "6,0,0,-;Linux version 6.8.0\n" + "".join(
        f"4,{100 + i},{(1000 + i) * 1_000_000},-;{text}\n"
        for i, text in enumerate((LOAD, *lines))))


def repairs(state: Path) -> list[dict[str, object]]:
    out = gpuguard("events", "--state-dir", str(state), "--kind", "repair", "--format", "json")
    return list(json.loads(out.stdout)["events"]) if out.returncode == 0 else []


def test_a_reset_line_clears_the_gpus_xid_and_a_fault_back_after_it_escalates(
        start_daemon, tmp_path):
    snap, log, state = tmp_path / "host.json", tmp_path / "kmsg.log", tmp_path / "state"
    write_snapshot(snap, host_snapshot(2))
    write_log(log, XID_48)
    daemon = start_daemon("--input", str(snap), "--fast-interval", "0.3", "--kmsg-file",
                          str(log), "--state-dir", str(state))
    daemon.wait_for(lambda: (daemon.result("xid.recent", 0) or {}).get("status") == "critical",
                    what="GPU 0's Xid 48")
    write_log(log, XID_48, f"GPU reset occurred: {UUID0}")
    cleared = daemon.wait_for(
        lambda: (r := daemon.result("xid.recent", 0)) and r["status"] == "ok" and r,
        what="GPU 0 cleared by its reset")
    assert cleared["message"] == ("no Xid since boot to act on (1 cleared by a GPU reset at "
                                  "[1002.000000])")
    [repair] = daemon.wait_for(lambda: repairs(state), what="the repair in the store")
    assert (repair["status"], repair["gpu_index"], repair["gpu_uuid"], repair["seq"]) == (
        "gpu_reset", 0, UUID0, 102)
    write_log(log, XID_48, f"GPU reset occurred: {UUID0}", XID_48)
    back = daemon.wait_for(
        lambda: (r := daemon.result("xid.recent", 0)) and r["action"] == "inspect_hardware"
        and r, timeout=20, what="the Xid back after the reset escalated")
    assert back["status"] == "critical"
    assert "Xid 48 on GPU 0 also seen before the GPU reset at " in back["action_reason"]
    assert daemon.result("xid.recent", 1)["status"] == "ok"  # GPU 1 had nothing


def test_a_row_remap_pending_clears_when_nvml_says_so(start_daemon, tmp_path):
    """No kernel-log line needed: the next sweep that reads no remap pending is ok."""
    snap = tmp_path / "host.json"
    write_snapshot(snap, host_snapshot(2, {(1, "remapped_rows_pending"): True}))
    daemon = start_daemon("--input", str(snap), "--fast-interval", "0.3")
    daemon.wait_for(lambda: (daemon.result("memory.row_remap", 1) or {}).get("status")
                    == "warning", what="GPU 1's pending remap")
    write_snapshot(snap, host_snapshot(2))  # reset: the remap applied, nothing pending
    daemon.wait_for(lambda: daemon.result("memory.row_remap", 1)["status"] == "ok",
                    what="GPU 1's remap applied")
