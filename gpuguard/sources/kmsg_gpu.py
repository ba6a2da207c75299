"""Kernel-log lines of the NVIDIA driver besides Xids (sources/kmsg.py hands them here):
GSP errors that carry no Xid (gsp.firmware), each time the driver loaded, and the repairs
that clear a GPU's kernel-log findings (a GPU reset, a driver reload: issue 21, item 3).
Each pattern names its source; each has a fixture line in tests/fixtures/kmsg/gsp.kmsg or
tests/fixtures/kmsg/repairs.kmsg.

Every pattern of the driver's own lines matches from the start of a line of the driver's
record (sources/kmsg_records.py: the caller hands only those here), its fixed words long
enough that no other line can begin with them: the kernel begins some lines with a
process's name (`comm[pid]: segfault at ... in <file>`), at most 15 characters chosen by
the process, and the file name after it is anyone's."""

from __future__ import annotations

import re
from collections import deque
from typing import Any

from gpuguard.model.pci import normalise_pci
from gpuguard.model.readings import GSP_KINDS
from gpuguard.sources.kmsg_kept import NewestKept, gsp_key

_PCI = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
# GSP (the GPU System Processor, where the resource manager runs on Hopper and newer):
GSP_PATTERNS = (
    # NVIDIA/open-gpu-kernel-modules, kernel_gsp.c, _kgspRpcIncrementTimeoutCountAndRateLimitPrints;
    # logged after the first Xid 119s (leptonai/gpud testdata/dmesg-with-xid-119.log):
    # "NVRM: Rate limiting GSP RPC error prints for GPU at PCI:0000:9b:00 (printing 1 of
    # every 30).  The GPU likely needs to be reset."
    ("rpc_timeout",
     re.compile(rf"NVRM: Rate limiting GSP RPC error prints for GPU at PCI:(?P<pci>{_PCI})")),
    # kernel_gsp_tu102.c, kgspHealthCheck_TU102 (GSP crashed; usually with Xid 120):
    # "NVRM: GPU0 kgspHealthCheck_TU102: ********* GSP-CrashCat Report *********"
    ("crash", re.compile(r"NVRM: (?:GPU\d{1,4} )?(?:[A-Za-z0-9_]{1,64}: )?\*{0,80} ?"
                         r"GSP-CrashCat Report")),
    # kernel_gsp.c, _kgspBootGspRm, and RmInitAdapter (the GPU is left uninitialised; users'
    # reports: a bus reset or cold reboot clears it):
    # "NVRM: GPU7 _kgspBootGspRm: unexpected WPR2 already up, cannot proceed with booting GSP"
    # "NVRM: GPU7 RmInitAdapter: Cannot initialize GSP firmware RM"
    ("boot_failed", re.compile(r"NVRM: (?:GPU\d{1,4} )?(?:_kgspBootGspRm: [^\[\]]{0,120}"
                               r"cannot proceed with booting GSP|"
                               r"RmInitAdapter: Cannot initialize GSP firmware RM)")),
)
assert tuple(kind for kind, _ in GSP_PATTERNS) == GSP_KINDS
# The driver's own number of a GPU ("NVRM: GPU7 ..."), which is not NVML's index.
_RM_GPU = re.compile(r"NVRM: GPU(?P<n>\d{1,4})\b")
# "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ..."
# (the real H200's log, tests/fixtures/kmsg/h200-healthy.kmsg; the proprietary module says
# "NVIDIA UNIX x86_64 Kernel Module")
_LOADING = re.compile(
    r"NVRM: loading NVIDIA UNIX .{0,80}?Kernel Module.{0,40}?\s(?P<version>\d+\.\d+(?:\.\d+)?)\s")

# A GPU reset. The driver logs none at its default level: in open-gpu-kernel-modules
# 595.45.04 the reset's own lines (os-pci.c, os_pci_trigger_flr: "Start to trigger FLR";
# nv.c: "Trigger FLR!") are NV_DBG_INFO, and NVSentinel's GPU-reset design (ADR-020, "NVSentinel
# Support for GPU Reset") says the same ("there does not exist a corresponding syslog entry"):
# its reset job writes one to the log once `nvidia-smi -r` succeeded:
# "GPU reset occurred: GPU-455d8f70-2051-db6c-0430-ffc457bff834". gpuguard takes that line,
# naming the GPU by UUID or by bus id, from whatever writes it (docs/events.md: a reset script
# writes it to /dev/kmsg). Not taken: the driver's "NVRM: GPU at PCI:0000:9b:00: GPU-<uuid>"
# (kernel_rc.c, _krcLogUuidOnce): it is logged once per attach of the GPU, before its first
# Xid, and an attach also follows the last client closing without persistence mode, so a
# second one proves no reset.
# The whole record, at most behind a writer's tag ("nvsentinel: ", "reset-gpu[123]: "): a
# reset clears findings, so the phrase quoted inside another message (a process or device
# name, a path, a user's text relayed to the log) must not count (review 4), nor another
# record's continuation line (issue 28: sources/kmsg.py hands only a record's first line).
# Its facility is not checked: a reset job writes it from userspace (facility user).
_RESET = re.compile(r"(?:[A-Za-z0-9_.-]{1,32}(?:\[[0-9]{1,10}\])?: )?GPU reset occurred: "
                    r"(?:(?P<uuid>GPU-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}"
                    rf"-[0-9a-fA-F]{{12}})|(?:PCI:)?(?P<pci>{_PCI}))\s*$")

# the newest kept (a wedged GPU's GSP lines come by the hundred), and the latest of each
# kind and GPU outside them (sources/kmsg_kept.py)
MAX_GSP = 500
MAX_LOADS = 16
MAX_REPAIRS = 64


class GspLines:
    """GSP error lines without an Xid: {"kind", "pci", "rm_gpu", "text", "seq", "usec"};
    the lines of one event (the boot failure is logged twice, a moment apart) are one."""

    def __init__(self) -> None:
        self.kept = NewestKept(MAX_GSP, gsp_key)

    def add(self, text: str, seq: int | None, usec: int | None, n: int | None = None) -> bool:
        """Take the line if it is one; whether it was. `n`: its place among the driver's
        lines (what a later repair is compared with)."""
        if "GSP" not in text:
            return False
        kind, match = next(((k, m) for k, p in GSP_PATTERNS if (m := p.match(text))),
                           (None, None))
        if kind is None or match is None:
            return False
        pci = match.groupdict().get("pci")
        rm = _RM_GPU.match(text)
        event = {"kind": kind, "pci": normalise_pci(pci) if pci else None,
                 "rm_gpu": int(rm["n"]) if rm else None, "text": text.strip()[:300],
                 "seq": seq, "usec": usec, "n": n}
        last = self.kept.last()
        if last is not None and all(last[k] == event[k] for k in ("kind", "pci", "rm_gpu")) \
                and (usec is None or last["usec"] is None or usec - last["usec"] < 1_000_000):
            return True
        self.kept.append(event)
        return True


def driver_load(text: str, seq: int | None, usec: int | None) -> dict[str, Any] | None:
    """The driver's "loading" line: when it (re)loaded, and which version."""
    found = _LOADING.match(text + " ")
    if found is None:
        return None
    return {"version": found["version"], "seq": seq, "usec": usec}


class DriverLoads:
    def __init__(self) -> None:
        self.events: deque[dict[str, Any]] = deque(maxlen=MAX_LOADS)
        self.seen = 0

    def add(self, text: str, seq: int | None, usec: int | None) -> bool:
        if "loading NVIDIA" not in text or (event := driver_load(text, seq, usec)) is None:
            return False
        self.events.append(event)
        self.seen += 1
        return True


class DriverLines:
    """The driver's loads, and the repairs: a GPU reset line, a load after an earlier one."""

    def __init__(self) -> None:
        self.loads = DriverLoads()
        self.repairs: deque[dict[str, Any]] = deque(maxlen=MAX_REPAIRS)

    def add(self, record: Any, n: int, after_lines: bool) -> bool:
        """Take the driver's line (a kmsg.Record) if it is a load; `after_lines`: the
        driver's Xid or GSP lines came before it."""
        text, seq, usec = record.text, record.seq, record.usec
        if not self.loads.add(text, seq, usec):
            return False
        # the boot's first load clears nothing; a later one, or one after the driver's lines
        # (the log's start was overwritten), is a reload
        if self.loads.seen > 1 or after_lines:
            self.repairs.append(driver_reload(self.loads.events[-1], text, n))
        return True

    def reset(self, record: Any, n: int) -> bool:
        """Take a record's first line (a kmsg.Record) if it is a GPU reset line."""
        reset = gpu_reset(record.text, record.seq, record.usec, n)
        if reset is None:
            return False
        self.repairs.append(reset)
        return True


def gpu_reset(text: str, seq: int | None, usec: int | None, n: int) -> dict[str, Any] | None:
    """A GPU reset line: {"kind": "gpu_reset", "uuid" or "pci" (the GPU it names), "text",
    "seq", "usec", "n"}."""
    found = _RESET.match(text.strip())
    if found is None:
        return None
    return {"kind": "gpu_reset", "uuid": found["uuid"],
            "pci": normalise_pci(found["pci"]) if found["pci"] else None,
            "text": text.strip()[:300], "seq": seq, "usec": usec, "n": n}


def driver_reload(load: dict[str, Any], text: str, n: int) -> dict[str, Any]:
    """A load of the driver after an earlier one (or after its lines): every GPU's state
    before it is gone, so the repair of all of them."""
    return {"kind": "driver_reload", "uuid": None, "pci": None, "text": text.strip()[:300],
            "seq": load["seq"], "usec": load["usec"], "n": n}
