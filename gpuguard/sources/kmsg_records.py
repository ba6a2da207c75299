"""Kernel-log records as gpuguard reads them, and whose each one is (issue 28, item 1).

One header is stripped from each line, of the first of these forms it has:

- /dev/kmsg (and `dmesg -r` with the kmsg prefix): `6,353,579388,-;text`; a multi-line
  record holds its newlines escaped (`\\x0a`): each further line is a continuation
- `dmesg -r`: `<6>[   12.345678] text`
- `dmesg`: `[   12.345678] text`; `dmesg -T`: `[Fri Aug 30 11:43:09 2024] text`;
  `dmesg --time-format iso`: `2025-01-25T10:34:54,859532+00:00 text`; any of these behind
  `dmesg -x`'s `kern  :err   : ` (facility and level by name)
- `journalctl -k`: `Aug 30 19:01:01 host kernel: text` (or the stamp of `-o short-precise`,
  `short-iso`, `short-full` or `short-monotonic`, whose `[  12.345678]` is kept as dmesg's);
  syslog's kern.log: `Aug 30 19:01:01 host kernel: [   12.345678] text`
- plain `text` (`dmesg -t`)

A line that begins with a space or a tab continues the record before it (dmesg, journalctl
and syslog indent a record's further lines); /dev/kmsg's dictionary lines (` KEY=value`) are
skipped. Lines end at "\n" only. `journalctl -k` and kern.log hold only the kernel's records:
their `host kernel: ` is journald's or syslog's tag, not the record's text.

Whose a record is (`writer`): the NVIDIA driver's where its first line begins with its own
prefix (`NVRM:`; `nvidia-nvswitch<N>: ` for the NVSwitch driver), and only then. Text that
merely quotes the driver inside another subsystem's message (an input device named
`NVRM: loading NVIDIA UNIX ...`, a USB product string, an audit record, a container's log
echoed to the kernel log) is another's record, whatever it says. Where the format carries
the facility (/dev/kmsg, `dmesg -r`, `dmesg -x`), a record whose facility is not the
kernel's (0) was written by userspace through /dev/kmsg, which cannot write a kernel-facility
record (the kernel turns facility 0 into LOG_USER): it is never the driver's nor the kernel's.
The facility only ever rejects: a format without it, or a `dmesg -r` that prints a user
record's priority without its facility (util-linux with glibc's newer LOG_MAKEPRI), falls
back on the prefix alone. In a format with no record boundary (`dmesg -t`), each line is
a record of its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

KERNEL_FACILITY = 0
USER_FACILITY = 1

# Numbers are bounded (a 64-bit sequence, microseconds since boot): a line with a
# longer "number" is text, not a record header, and never a huge int to convert.
_KMSG = re.compile(r"^(?P<prio>\d{1,4}),(?P<seq>\d{1,19}),(?P<usec>\d{1,19}),[^;]*;(?P<text>.*)$")
_RAW = re.compile(
    r"^<(?P<prio>\d{1,4})>(?:\[\s*(?P<sec>\d{1,12})\.(?P<frac>\d{1,9})\]\s?)?(?P<text>.*)$")
_DICTIONARY = re.compile(r"^ [A-Z_]+=")
_HUMAN = re.compile(r"^\[\s*(?P<sec>\d{1,12})\.(?P<frac>\d{1,9})\]\s?(?P<text>.*)$")
_DAY = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:[+-]\d\d:?\d\d|Z)?"
# the wall-clock stamps: no time since boot in them
_CTIME = re.compile(rf"^\[{_DAY} {_MONTH} [ \d]\d \d\d:\d\d:\d\d \d{{4}}\]\s?(?P<text>.*)$")
_ISO_STAMP = re.compile(rf"^{_ISO} (?P<text>.*)$")
_DECODE = re.compile(r"^(?P<facility>[a-z0-9]{2,8}) *:(?P<level>[a-z]{3,6}) *: (?P<rest>.*)$")
# journalctl -k -o short (the default), short-precise, short-iso(-precise), short-full,
# short-monotonic (the time since boot, as dmesg's: kept); and syslog's kern.log (rsyslog:
# `Dec  1 10:00:00 host kernel: [ 1234.567890] text`, the kernel's time kept)
_JOURNAL = re.compile(
    rf"^(?:{_MONTH} [ \d]\d \d\d:\d\d:\d\d(?:\.\d{{1,9}})?|{_ISO}|"
    rf"{_DAY} \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{{1,9}})? [A-Za-z0-9+_/-]{{1,32}}|"
    r"\[\s*(?P<sec>\d{1,12})\.(?P<frac>\d{1,9})\]) [^\s:\[\]]{1,255} kernel: "
    r"(?:\[\s*(?P<ksec>\d{1,12})\.(?P<kfrac>\d{1,9})\] ?)?(?P<text>.*)$")
# The driver's own prefixes (issue 28): the Xid, load, GSP and fallen-off-the-bus lines
# begin with the first, the SXid lines with the second.
NVRM_PREFIX = "NVRM:"
_NVSWITCH = re.compile(r"^nvidia-nvswitch\d{1,4}: ")


@dataclass(frozen=True)
class Record:
    """One line of the log: a record's first line, or (with `head`, the record's first line)
    a continuation of it, with the record's sequence number, time and facility."""

    text: str
    seq: int | None = None
    usec: int | None = None
    facility: int | None = None
    head: str | None = None
    # a further line of a /dev/kmsg record (its escaped newline): not a line of the file
    split: bool = False


def writer(record: Record) -> str:
    """Whose the record is: "nvrm" (the GPU driver's), "nvswitch" (the NVSwitch driver's),
    "user" (written from userspace: its facility is not the kernel's), or "kernel" (another
    part of the kernel, or a format that cannot tell)."""
    if record.facility is not None and record.facility != KERNEL_FACILITY:
        return "user"
    first = record.text if record.head is None else record.head
    if first.startswith(NVRM_PREFIX):
        return "nvrm"
    if _NVSWITCH.match(first):
        return "nvswitch"
    return "kernel"


def parse_lines(lines: Iterable[str]) -> Iterator[Record]:
    return LineParser().feed(lines)


class LineParser:
    """The records of a log read in pieces (the daemon reads only what came since its last
    read: sources/kmsg_tail.py): the record a continuation line continues is carried from
    one piece to the next, so the pieces give the records the whole log gives."""

    def __init__(self) -> None:
        self.head: Record | None = None

    def feed(self, lines: Iterable[str]) -> Iterator[Record]:
        for line in lines:
            line = line.rstrip("\r\n")
            if not line.strip() or _DICTIONARY.match(line):
                continue
            if line[0] in " \t":
                # a continuation (dmesg and journalctl indent with spaces: another white
                # space character, U+2028 say, begins a record's text, not a continuation);
                # before any record (the log's start was cut), nobody's
                yield continued(self.head, line.strip()) if self.head is not None else \
                    Record(line.strip(), head="")
                continue
            head = self.head = _header(line)
            if head.seq is not None and "\\x0a" in head.text:
                first, *rest = head.text.split("\\x0a")
                head = self.head = Record(first, head.seq, head.usec, head.facility)
                yield head
                for part in rest:
                    if part.strip():
                        yield Record(part.strip(), head.seq, head.usec, head.facility,
                                     head=first, split=True)
                continue
            yield head


def continued(head: Record, text: str) -> Record:
    return Record(text, head.seq, head.usec, head.facility, head=head.text)


def _header(line: str) -> Record:
    """The line without its one header, and what that header says. Each form is tried only
    where the line's first character (or a word in it) allows it: a log is mostly lines of
    one form, read every cycle."""
    first = line[0]
    if first.isdigit() and (m := _KMSG.match(line)):
        return Record(m["text"], int(m["seq"]), int(m["usec"]), int(m["prio"]) >> 3)
    if first == "<" and (m := _RAW.match(line)):
        usec = _usec(m["sec"], m["frac"]) if m["sec"] is not None else None
        return Record(m["text"], None, usec, int(m["prio"]) >> 3)
    if first.islower() and (m := _DECODE.match(line)):
        return _stamped(m["rest"], KERNEL_FACILITY if m["facility"] == "kern" else USER_FACILITY)
    return _stamped(line, None)


def _stamped(line: str, facility: int | None) -> Record:
    """The line without its time stamp (dmesg's, journalctl's, syslog's), if it has one."""
    first = line[:1]
    if " kernel: " in line and (m := _JOURNAL.match(line)):
        sec, frac = (m["sec"], m["frac"]) if m["sec"] is not None else (m["ksec"], m["kfrac"])
        return Record(m["text"], None, _usec(sec, frac) if sec is not None else None, facility)
    if first == "[":
        if m := _HUMAN.match(line):
            return Record(m["text"], None, _usec(m["sec"], m["frac"]), facility)
        if m := _CTIME.match(line):
            return Record(m["text"], None, None, facility)
    elif first.isdigit() and (m := _ISO_STAMP.match(line)):
        return Record(m["text"], None, None, facility)
    return Record(line, None, None, facility)


def _usec(sec: str, frac: str) -> int:
    return int(sec) * 1_000_000 + int(frac.ljust(6, "0")[:6])
