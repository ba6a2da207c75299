"""A live host of a test's own for the return-to-service gate (issue 30): the fake NVML's two
H200s (GPU i on bus 0x10 + i) and the fake libcuda, a procfs with the driver's device list
and loaded module, a sysfs with the two PCI devices (no AER counters), a kernel log in
/dev/kmsg's form (each record numbered, as the store keeps one repair per line), and the
qualify options the fake needs (its targets, a short load). Shared by the fake-Slurm tests
(test_qualify_gate.py) and the real cluster's (test_slurm_qualify_cluster.py)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from gpuguard.qualify import detached, records
from tests.conftest import own_host
from tests.qualify.test_qualify_cli import FAKE_TARGETS, LOADED

LOAD = ("NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  "
        "(nixbld@)")
XID_48 = ("NVRM: Xid (PCI:0000:10:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable "
          "double bit error (DBE) has been detected on GPU in the framebuffer.")
RESET_0 = "GPU reset occurred: 0000:10:00.0"
DRAINED = "gpuguard: reset_gpu: xid.recent GPU 0"
FLOORS = "active_probe:\n  floors_gbps:\n    NVIDIA H200: {pcie: 0.5, memory: 0.5, nvlink: 0.5}\n"
FAKE_SERIALS = ("1654000000000", "1654000000001")


def kmsg(*lines: str) -> str:
    """The kernel log as /dev/kmsg gives it: from the boot's record 0, each line numbered
    (sequence 100, 101, ...) a second apart, the driver loaded first."""
    return "6,0,0,-;Linux version 6.8.0\n" + "".join(
        f"4,{100 + i},{(1000 + i) * 1_000_000},-;{text}\n" for i, text in enumerate((LOAD, *lines)))


def live_host(root: Path, *lines: str, state: Path | None = None) -> list[str]:
    """The host's options (--path.*, --kmsg-file, --profile, --state-dir: `state`, else
    root/state), its kernel log these lines after the driver's load."""
    host = root / "host"
    args = own_host(host, kmsg=kmsg(*lines))
    for minor in (0, 1):
        bus = f"0000:{0x10 + minor:02x}:00.0"
        info = host / "proc" / "driver" / "nvidia" / "gpus" / bus
        info.mkdir(parents=True, exist_ok=True)
        (info / "information").write_text(f"Model: NVIDIA H200\nDevice Minor: {minor}\n")
        (host / "sys" / "bus" / "pci" / "devices" / bus).mkdir(parents=True, exist_ok=True)
    (host / "proc" / "modules").write_text("nvidia 104071168 0 - Live 0x0000000000000000\n")
    profile = root / "profile.yaml"
    profile.write_text(FLOORS)
    at = args.index("--state-dir")
    return [*args[:at], *args[at + 2:], "--profile", str(profile), "--state-dir",
            str(state or root / "state")]


def write_kmsg(root: Path, *lines: str) -> None:
    (root / "host" / "kmsg.log").write_text(kmsg(*lines))


def qualify_args(seconds: float = 1.0, attempts: int = 2) -> list[str]:
    """The gate's options for the fake: its targets, a short load."""
    return ["--qualify-targets", str(FAKE_TARGETS), "--qualify-seconds", f"{seconds:g}",
            "--qualify-attempts", str(attempts)]


def gpu_env(fake_nvml: Path, fake_cuda: Path, **switches: Any) -> dict[str, str]:
    """The fake GPUs as the health run and the qualification it starts see them: two
    H200s at full load's power while loaded (the fake's readings are what qualify
    judges; the passive check judges them too, and none of them drains)."""
    return {"LD_LIBRARY_PATH": f"{fake_nvml}:{fake_cuda}", "FAKE_NVML_GPUS": "2",
            "FAKE_NVML_MEM_TOTAL_MIB": "1000",
            **{k.upper(): str(v) for k, v in {**LOADED, **switches}.items()}}


def drain_record(state: Path) -> dict[str, Any]:
    return dict(json.loads((state / "slurm" / "drain.json").read_text()))


def attempt(state: Path) -> dict[str, Any]:
    found = drain_record(state).get("attempt")
    assert isinstance(found, dict), drain_record(state)
    return found


def running(found: dict[str, Any]) -> bool:
    """Whether the attempt's qualification still runs (as health asks: detached.alive)."""
    record = detached.Detached(found["pid"], found["started_at"], found["boot_id"], "standard")
    return detached.alive(record, Path("/proc"), found["boot_id"])


def wait_ended(state: Path, timeout: float = 120) -> dict[str, Any]:
    """The attempt, once its qualification has ended."""
    found = attempt(state)
    until = time.monotonic() + timeout
    while running(found):
        assert time.monotonic() < until, f"the qualification {found} did not end"
        time.sleep(0.2)
    return found


def wait_running(state: Path, timeout: float = 30) -> dict[str, Any]:
    until = time.monotonic() + timeout
    while True:
        try:
            found = attempt(state)
            if running(found):
                return found
        except (OSError, AssertionError, ValueError):
            pass
        assert time.monotonic() < until, "no qualification started"
        time.sleep(0.1)


def qualify_events(state: Path) -> list[records.Qualification]:
    return records.qualifications(state)


def slurm_events(state: Path) -> list[str]:
    """The messages of health's own events (slurm.node), oldest first."""
    import sqlite3

    with sqlite3.connect(state / "events.db") as db:
        rows = db.execute("SELECT message FROM events WHERE rule = 'slurm.node' ORDER BY id"
                          ).fetchall()
    return [str(r[0]) for r in rows]


def kill(pid: int, sig: int) -> None:
    os.kill(pid, sig)
