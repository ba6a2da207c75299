"""Text that is not the driver's is not taken as the driver's (issue 28, first finding), run as
a user runs it: `gpuguard check --kmsg-file` and `gpuguard slurm health` (against the fake
Slurm). A record that only quotes the driver-load phrase (an input device named after it)
cleared a fatal Xid 48 (xid.recent ok, exit 0; `slurm health` resumed the node drained for
it); an Xid line quoted in another subsystem's record (a USB product string) was a
critical Xid 79 with action reboot (a false drain)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, gpuguard
from tests.daemon.conftest import host_snapshot, write_snapshot
from tests.slurm.test_slurm_scripts import Fleet

LIVE = FIXTURES / "h200-live" / "idle-snapshot.json"  # one H200 at 0000:00:06.0
LOAD = ("NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  "
        "(nixbld@)")


def xid48(pci: str) -> str:
    return (f"NVRM: Xid (PCI:{pci}): 48, pid='<unknown>', name=<unknown>, An uncorrectable "
            "double bit error (DBE) has been detected on GPU in the framebuffer at partition "
            "6, subpartition 0.")


def input_device() -> str:
    return f"input: {LOAD} as /devices/virtual/input/input7"


def usb_product(pci: str) -> str:
    return (f"usb 1-1: Product: NVRM: Xid (PCI:{pci}): 79, pid=1, name=x, GPU has fallen off "
            "the bus.")


def write_log(path: Path, fmt: str, *texts: str) -> Path:
    """The boot's first line, the driver's load, then the texts, 1000 s apart."""
    lines = ["Linux version 6.8.0-49-generic", LOAD, *texts]
    if fmt == "kmsg":
        body = [f"6,{i},{i * 1_000_000_000},-;{t}" for i, t in enumerate(lines)]
    else:
        body = [f"[{i * 1000:5d}.000000] {t}" for i, t in enumerate(lines)]
    path.write_text("\n".join(body) + "\n")
    return path


def check(log: Path, state: Path) -> tuple[int, dict[str, dict[str, object]]]:
    proc = gpuguard("check", "--input", str(LIVE), "--kmsg-file", str(log), "--state-dir",
                    str(state), "--format", "json")
    assert "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    return proc.returncode, {f"{r['rule']}/{(r['gpu'] or {}).get('index')}": r
                             for r in doc["results"] if r["rule"] == "xid.recent"}


@pytest.mark.parametrize("fmt", ["kmsg", "dmesg"])
def test_an_input_device_named_after_the_driver_load_clears_no_xid_48(tmp_path, fmt):
    log = write_log(tmp_path / "log", fmt, xid48("0000:00:06"), input_device())
    code, xid = check(log, tmp_path / "state")
    assert xid["xid.recent/0"]["status"] == "critical", xid
    assert xid["xid.recent/0"]["message"].startswith("Xid 48 (double-bit ECC error)")
    assert code == 2


@pytest.mark.parametrize("fmt", ["kmsg", "dmesg"])
def test_an_xid_line_quoted_in_a_usb_product_string_is_no_xid(tmp_path, fmt):
    log = write_log(tmp_path / "log", fmt, usb_product("0000:00:06"))
    code, xid = check(log, tmp_path / "state")
    assert {k: r["status"] for k, r in xid.items()} == {"xid.recent/0": "ok"}, xid
    assert xid["xid.recent/0"]["message"] == "no Xid since boot"
    assert code == 0


def health(fleet: Fleet, log: Path) -> str:
    snap = fleet.root / "snap.json"
    write_snapshot(snap, host_snapshot(8))
    proc = fleet.gpuguard("health", "--no-daemon", "--input", str(snap), "--kmsg-file",
                          str(log), "--brake-jitter", "0", *fleet.slurm_args())
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout


def test_slurm_health_keeps_the_node_drained_for_xid_48_after_a_quoted_load(tmp_path):
    """The issue's end to end: drained for the Xid 48 of GPU 0 (18:00); then an input
    device named after the driver-load phrase appears in the log: still drained."""
    fleet = Fleet(tmp_path)
    log = tmp_path / "kmsg.log"
    first = health(fleet, write_log(log, "kmsg", xid48("0000:18:00")))
    state, reason = fleet.node()
    assert state == "IDLE+DRAIN" and "xid.recent" in reason, (state, reason, first)
    out = health(fleet, write_log(log, "kmsg", xid48("0000:18:00"), input_device()))
    assert fleet.node() == (state, reason), out


def test_slurm_health_drains_no_node_for_an_xid_quoted_in_a_usb_product_string(tmp_path):
    fleet = Fleet(tmp_path)
    out = health(fleet, write_log(tmp_path / "kmsg.log", "kmsg", usb_product("0000:18:00")))
    assert fleet.node() == ("IDLE", "none"), out
