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
  failed!`; nv_pci_pm / nv_pci_start: `NVRM: Device start failed for %04x:%02x:%02x.%x
  (ret=%d)`

The lines of one failed start (RmInitAdapter, then rm_init_adapter, a moment apart) are one
event: the GPU failed to come up once.
"""

from __future__ import annotations

import re
from typing import Any

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
# a start of the GPU that failed; `pci` where the line names the GPU
_GPU = rf"(?:GPU (?P<pci>{_PCI}): )?"
INIT_FAILED = (
    re.compile(rf"^NVRM: {_GPU}RmInitAdapter failed! \([0-9a-fA-Fx:]{{1,40}}\)"),
    re.compile(rf"^NVRM: {_GPU}rm_init_adapter failed(?:, device minor number| for device "
               r"bearing minor number) \d{1,6}"),
    re.compile(rf"^NVRM: GPU (?P<pci>{_PCI}): rm_init_private_state\(\) failed!"),
    re.compile(rf"^NVRM: Device start failed for (?P<pci>{_PCI}) \(ret=-?\d{{1,6}}\)"),
)
# the lines of one failed start come within this of each other
SAME_START_US = 1_000_000


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
        self.probe: tuple[str, int] | None = None  # a GPU probed: (its address, lines left)
        self.named_in_probe = False  # a probe-time "fallen off" line since the last summary
        self.last_start: dict[str, Any] | None = None  # the last failed start's event

    def event(self, record: Record) -> dict[str, Any] | None:
        """Xid 79 for the line, or None (a line of no loss, or of a loss already counted)."""
        text = record.text
        if m := FALLEN.match(text):
            return fallen_off(record, m["pci"])
        if found := self._probed(record):
            return found
        if m := PROBE_FAILED.match(text):
            named, self.named_in_probe = self.named_in_probe, False
            return None if named else fallen_off(record, None, text.strip())
        return self._start_failed(record)

    def loaded(self) -> None:
        """The driver's load line: a probe's lines are behind it."""
        self.named_in_probe = False

    def _probed(self, record: Record) -> dict[str, Any] | None:
        """Xid 79 from the probe's three-line "fallen off the bus" record, its GPU named on
        the first line (on a line of its own in dmesg -t: the next lines are looked at)."""
        if m := PROBE_GPU.match(record.text):
            self.probe = (m["pci"], 3)
            return None
        if self.probe is None:
            return None
        pci, left = self.probe
        self.probe = (pci, left - 1) if left > 1 else None
        if PROBE_FALLEN.match(record.text):
            self.probe = None
            self.named_in_probe = True
            return fallen_off(record, pci)
        return None

    def _start_failed(self, record: Record) -> dict[str, Any] | None:
        if "ailed" not in record.text:
            return None
        m = next((m for p in INIT_FAILED if (m := p.match(record.text))), None)
        if m is None:
            return None
        pci = address(m.groupdict().get("pci"))
        last = self.last_start
        if last is not None and last["pci"] == pci and _close(last, record):
            return None
        self.last_start = fallen_off(record, pci, record.text.strip())
        return self.last_start


def _close(last: dict[str, Any], record: Record) -> bool:
    """Whether the line is of the same failed start as the last one: within a second, or
    (a log without times) at most four records later, or next to it (no numbers either)."""
    usec: int | None = last["usec"]
    seq: int | None = last["seq"]
    if usec is not None and record.usec is not None:
        return abs(record.usec - usec) < SAME_START_US
    return seq is None or record.seq is None or record.seq - seq <= 4
