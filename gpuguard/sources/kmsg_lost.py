"""The driver's lines that say a GPU is lost without an Xid (issue 36, item 1): each counts as
Xid 79 (FIELD-NOTES: a "fallen off the bus" line without the word Xid counts as 79), so it
is graded, acted on and cleared as Xid 79 is (judge/xids.py). sources/kmsg.py hands here
only lines of the driver's own records (issue 28: sources/kmsg_records.py), each pattern
matching from the line's first character.

The shapes, from NVIDIA/open-gpu-kernel-modules at df1c9a3de2be4b130f4fc7680f7198193d8ac6ad
(595.45.04; the same strings in 515.43.04, 1739a20efc4acb55fd1dc53dcc66057b70c2613c) and
from public pastes of the proprietary module (tests/fixtures/kmsg/README.md):

- src/nvidia/arch/nvalloc/unix/src/osinit.c (NV_DEV_PRINTF: "NVRM: GPU %04x:%02x:%02x.%x: "):
  `NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.`; issue 36 names the short form
  `NVRM: GPU 18:00.0: GPU has fallen off the bus.` (no PCI domain: domain 0 is meant)
- src/nvidia/arch/nvalloc/unix/src/osapi.c, at probe time, one record of three lines:
  `NVRM: The NVIDIA GPU %04x:%02x:%02x.%x` / `NVRM: (PCI ID: %04x:%04x) installed in this
  system has` / `NVRM: fallen off the bus and is not responding to commands.`
- kernel-open/nvidia/nv.c, nv_drivers_init: `NVRM: The NVIDIA probe routine failed for %d
  device(s).` (names no GPU: the host's; not counted again after a probe-time "fallen off"
  line it sums up)
- osinit.c, RmInitAdapter: `NVRM: GPU 0000:01:00.0: RmInitAdapter failed! (0x%x:0x%x:%d)`;
  the proprietary module before the open one: `NVRM: RmInitAdapter failed! (0x30:0xffff:660)`
- nv.c, nv_start_device: `NVRM: GPU 0000:01:00.0: rm_init_adapter failed, device minor number
  %d`; before: `NVRM: rm_init_adapter failed for device bearing minor number %d`
- kernel-open/nvidia/nv-pci.c, nv_pci_probe: `NVRM: GPU 0000:01:00.0: rm_init_private_state()
  failed!` (the older nv.c, nv_kern_probe: `NVRM: rm_init_private_state() failed!`, no GPU
  named); nv_pci_pm / nv_pci_start: `NVRM: Device start failed for %04x:%02x:%02x.%x
  (ret=%d)`
- osapi.c, rm_is_supported_device (print_unsupported), at probe time: `NVRM: The NVIDIA GPU
  %04x:%02x:%02x.%x (PCI ID: %04x:%04x)` / `NVRM: installed in this system is not supported
  by the` / `NVRM: NVIDIA %s driver release.` (the older nv.c: `... not supported by the
  304.137` / `NVRM: NVIDIA Linux driver release.  Please see 'Appendix`): not a GPU off the
  bus but one this release cannot drive, graded apart (judge/xids.py UNSUPPORTED: install a
  release that supports it; a new boot of the same release gives the same message)

The lines of one failed start (RmInitAdapter, then rm_init_adapter, a moment apart) are one
event: the GPU failed to come up once. So are the driver's Xid 79 line and its "GPU has
fallen off the bus." line for the same GPU (osinit.c logs both for one loss, in either
order): one loss, counted once.
"""

from __future__ import annotations

import re
from typing import Any

from gpuguard.judge.xids import UNSUPPORTED
from gpuguard.model.pci import normalise_pci
from gpuguard.sources.kmsg_records import Record

_PCI = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
# the same, its domain optional (the short form `18:00.0`)
_PCI_SHORT = r"(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"

# NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.   NVRM: GPU has fallen off the bus.
# The words between the GPU and the phrase hold no "[": a line the kernel begins with a
# process's name (`comm[pid]: segfault at ... in <file>`) cannot reach the phrase through
# a name or a file called "fallen off the bus".
FALLEN = re.compile(
    rf"^NVRM: GPU (?:at )?(?:PCI:)?(?P<pci>{_PCI_SHORT})?[^\[\]]{{0,40}}?fallen off the bus",
    re.IGNORECASE)
PROBE_GPU = re.compile(rf"^NVRM: The NVIDIA GPU (?P<pci>{_PCI})")
PROBE_FALLEN = re.compile(r"^NVRM: (?:[^\[\]]{0,80}\s)?fallen off the bus and is not responding")
PROBE_FAILED = re.compile(r"^NVRM: The NVIDIA probe routine failed for (?P<n>\d{1,4}) device")
# nv.c, nv_drivers_init: no GPU came up, so the load fails here and never prints its load
# line (it does after "probe routine failed" alone: some GPUs did come up); the older nv.c,
# nvidia_init_module: "None of the NVIDIA graphics adapters were initialized!"
LOAD_FAILED = re.compile(r"^NVRM: (?:None of the NVIDIA (?:devices|graphics adapters) were "
                         r"initialized|No NVIDIA devices probed)")
# the probe's second line for a GPU the release does not support (open nvidia.ko names the
# missing GSP on it: "... not supported by open")
PROBE_UNSUPPORTED = re.compile(r"^NVRM: installed in this system is not supported by\b")
# a start of the GPU that failed; `pci` where the line names the GPU
_GPU = rf"(?:GPU (?P<pci>{_PCI}): )?"
INIT_FAILED = (
    re.compile(rf"^NVRM: {_GPU}RmInitAdapter failed! \([0-9a-fA-Fx:]{{1,40}}\)"),
    re.compile(rf"^NVRM: {_GPU}rm_init_adapter failed(?:, device minor number| for device "
               r"bearing minor number) \d{1,6}"),
    re.compile(rf"^NVRM: {_GPU}rm_init_private_state\(\) failed!"),
    re.compile(rf"^NVRM: Device start failed for (?P<pci>{_PCI}) \(ret=-?\d{{1,6}}\)"),
)
# the lines of one failed start come within this of each other
SAME_START_US = 1_000_000
# a driver's load line comes within this of its probe's lines (one GPU probed after another)
SAME_LOAD_US = 10_000_000


def address(pci: str | None) -> str | None:
    """The bus id a line names, in one spelling; a short one (no domain) in domain 0."""
    if pci is None:
        return None
    return normalise_pci(pci if pci.count(":") == 2 else f"0000:{pci}")


def fallen_off(record: Record, pci: str | None, line: str | None = None) -> dict[str, Any]:
    """Xid 79 for the GPU at `pci` (None: the line names none); `line`: the driver's words
    where they are not the fall itself (a start that failed), shown by xid.recent."""
    event: dict[str, Any] = {"xid": 79, "pci": address(pci), "pid": None, "process": None,
                             "text": "GPU has fallen off the bus.", "seq": record.seq,
                             "usec": record.usec}
    if line is not None:
        event["line"] = line.removeprefix("NVRM: ")[:200]
    return event


class LostLines:
    """The driver's lost-GPU lines that carry no Xid, fed line by line in the log's order."""

    def __init__(self) -> None:
        # a GPU probed: (its address, its line, lines left)
        self.probe: tuple[str, str, int] | None = None
        self.named_in_probe = False  # a probe-time GPU line since the last summary
        self.last_start: dict[str, Any] | None = None  # the last failed start's event
        # the last loss counted from an Xid 79 line ("xid") or a "fallen off" line ("fallen")
        self.last_loss: tuple[str, dict[str, Any], int] | None = None
        # the first probe-time line since the last load: (its place n, its record)
        self.probe_start: tuple[int, Record] | None = None

    def event(self, record: Record, n: int = 0) -> dict[str, Any] | None:
        """Xid 79 for the line (`n`: its place among the driver's lines), or None (a line of
        no loss, or of a loss already counted)."""
        text = record.text
        if m := FALLEN.match(text):
            return fallen_off(record, m["pci"])
        if found := self._probed(record, n):
            return found
        if m := PROBE_FAILED.match(text):
            self._probing(record, n)
            named, self.named_in_probe = self.named_in_probe, False
            return None if named else fallen_off(record, None, text.strip())
        if LOAD_FAILED.match(text):
            # this load ended here: its probe's lines are no later load's (a stale
            # initramfs's old release failing, then the new one loading seconds after)
            self.probe_start = None
            return None
        return self._start_failed(record, n)

    def once(self, event: dict[str, Any], from_xid_line: bool, n: int) -> bool:
        """Whether a loss is counted (`n`: its line's place): the driver logs an Xid 79 line
        and a "GPU has fallen off the bus." line for one loss (osinit.c, either first), so
        the line of the other kind for the same GPU (or a line naming none) within a second,
        or a few lines on in a log without times, is that loss again, not a second one. A
        third line starts the next loss."""
        if event["xid"] != 79 or event.get("line") is not None:
            return True
        kind = "xid" if from_xid_line else "fallen"
        last = self.last_loss
        self.last_loss = (kind, event, n)
        if last is None or last[0] == kind:
            return True
        other, place = last[1], last[2]
        if other["pci"] != event["pci"] and None not in (other["pci"], event["pci"]):
            return True
        moment = _same_moment(other["usec"], other["seq"], event["usec"], event["seq"])
        near = n - place <= 4 if moment is None else moment
        if near:
            self.last_loss = None
        return not near

    def load_place(self, record: Record, n: int) -> int:
        """The place a load line's repair takes (a reload clears what came before it): the
        first line of its own probe where that came just before it (the probe's lines,
        written during the load, are not before the load), else the line's own place `n`."""
        if self.probe_start is None:
            return n
        first, probed = self.probe_start
        if probed.usec is not None and record.usec is not None:
            same = 0 <= record.usec - probed.usec <= SAME_LOAD_US
        elif probed.seq is not None and record.seq is not None:
            same = record.seq - probed.seq <= 50
        else:
            same = True  # no clock, no numbers: the lines since the last load are its probe's
        return first if same else n

    def loaded(self) -> None:
        """The driver's load line: a probe's lines are behind it."""
        self.named_in_probe = False
        self.probe_start = None

    def _probing(self, record: Record, n: int) -> None:
        if self.probe_start is None:
            self.probe_start = (n, record)

    def _probed(self, record: Record, n: int) -> dict[str, Any] | None:
        """Xid 79 from the probe's three-line "fallen off the bus" record, its GPU named on
        the first line (on a line of its own in dmesg -t: the next lines are looked at); the
        unsupported GPU's record, graded apart (UNSUPPORTED)."""
        if m := PROBE_GPU.match(record.text):
            self._probing(record, n)
            self.probe = (m["pci"], record.text.strip(), 3)
            return None
        if self.probe is None:
            return None
        pci, first, left = self.probe
        self.probe = (pci, first, left - 1) if left > 1 else None
        if PROBE_FALLEN.match(record.text):
            self.probe = None
            self.named_in_probe = True
            return fallen_off(record, pci)
        if PROBE_UNSUPPORTED.match(record.text):
            self.probe = None
            self.named_in_probe = True
            event = fallen_off(record, pci, f"{first} {record.text.strip().removeprefix('NVRM: ')}")
            event["text"] = UNSUPPORTED
            return event
        return None

    def _start_failed(self, record: Record, n: int) -> dict[str, Any] | None:
        if "ailed" not in record.text:
            return None
        m = next((m for p in INIT_FAILED if (m := p.match(record.text))), None)
        if m is None:
            return None
        pci = address(m.groupdict().get("pci"))
        if m.re is INIT_FAILED[2]:
            # nv_pci_probe's (nv_kern_probe's): the probe failure after it sums it up
            self._probing(record, n)
            self.named_in_probe = True
        last = self.last_start
        if last is not None and last["pci"] == pci and _close(last, record):
            return None
        self.last_start = fallen_off(record, pci, record.text.strip())
        return self.last_start


def _close(last: dict[str, Any], record: Record) -> bool:
    """Whether the line is of the same failed start as the last one: within a second, or
    (a log without times) at most four records later, or next to it (no numbers either)."""
    moment = _same_moment(last["usec"], last["seq"], record.usec, record.seq)
    return True if moment is None else moment


def _same_moment(usec: int | None, seq: int | None, later_usec: int | None,
                 later_seq: int | None) -> bool | None:
    """Whether two of the driver's lines are of one moment (one failed start, one loss):
    within a second by the log's clock, else at most four records apart by its sequence
    numbers; None where the log carries neither (the caller's place decides)."""
    if usec is not None and later_usec is not None:
        return abs(later_usec - usec) < SAME_START_US
    if seq is not None and later_seq is not None:
        return later_seq - seq <= 4
    return None
