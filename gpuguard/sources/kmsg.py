"""Kernel log source: NVRM Xid lines (and what else the driver stack needs) from
/dev/kmsg, or from a saved log (`--kmsg-file`).

Record formats understood, one record per line:

- /dev/kmsg and `dmesg -r`/`--raw` with the kmsg prefix: `6,353,579388,-;text`
- `dmesg -r`: `<6>[   12.345678] text`
- `dmesg`: `[   12.345678] text`, or plain `text` without timestamps (`dmesg -t`)

Dictionary lines of /dev/kmsg (` KEY=value`) are skipped; other indented lines are the
continuation of a multi-line message as dmesg prints it, and are kept as text.

The log is summarised in the snapshot as JSON-native data: the Xid events with their
kmsg sequence number and time since boot, the time the log was read at, and the few
non-Xid facts the driver.* rules use (an unsigned module refused under Secure Boot).
"""

from __future__ import annotations

import errno
import os
import re
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuguard.io.bounded import MIB, BoundedReadError, read_bytes
from gpuguard.model.pci import normalise_pci
from gpuguard.model.snapshot import Reading
from gpuguard.sources.kmsg_gpu import DriverLines, GspLines
from gpuguard.sources.kmsg_kept import Lost, NewestKept, sxid_key, xid_key

# The kernel's ring buffer is at most 32 MiB (log_buf_len); twice that is not a kernel log.
MAX_LOG_BYTES = 64 * MIB

# NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.
# NVRM: Xid (PCI:0000:00:06): 119, pid='<unknown>', name=<unknown>, Timeout after 6s ...
# NVRM: Xid (0000:3b:00): 48, An uncorrectable double bit error ...   (older drivers)
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\): "
    r"(?P<xid>\d{1,10}),\s*(?P<rest>.*)$"
)
_PID = re.compile(r"pid='?(?P<pid><unknown>|\d{1,10})'?,\s*name=(?P<name>[^,]*),\s*(?P<text>.*)$")
# NVRM: GPU at PCI:0000:3b:00: GPU-...   /  NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.
_FALLEN = re.compile(
    r"NVRM: GPU (?:at )?(?:PCI:)?(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}"
    r"(?:\.[0-7])?)?.*fallen off the bus", re.IGNORECASE)
_UNSIGNED = re.compile(
    r"(Loading of unsigned module is rejected|module verification failed|"
    r"Lockdown: .*unsigned module|Key was rejected by service)")

# NVRM: API mismatch: the client has the version 580.95.05, but
# NVRM: this kernel module has the version 570.133.20.  Please ...
_CLIENT_VERSION = re.compile(r"client has the version (\d+\.\d+(?:\.\d+)?)")
_MODULE_VERSION = re.compile(r"kernel module has the version (\d+\.\d+(?:\.\d+)?)")

# NVSwitch errors (SXid), logged by the nvswitch driver of HGX hosts, one event in up to
# three lines of one switch and code:
# nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Data {0x0000002b, 0x0000002b, ...}
# nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 Minion Link DLREQ interrupt
# nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Severity 0 Engine instance 44 Sub-engine ...
_SXID = re.compile(
    r"SXid \((?:PCI:)?(?P<switch>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\): "
    r"(?P<sxid>\d{1,10}),\s*(?P<rest>.*)$")
_SXID_LINK = re.compile(r"\bLink (\d{1,6})\b")

# Out-of-memory kills (mm/oom_kill.c). Since Linux 5.0 one kill logs a summary line, then
# the kill itself, whose prefix says whether the whole host or one cgroup ran out:
# oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,
#   task_memcg=/user.slice/...,task=python3,pid=2345,uid=1000
# Out of memory: Killed process 2345 (python3) total-vm:..kB, anon-rss:..kB, ...
# oom-kill:constraint=CONSTRAINT_MEMCG,...,oom_memcg=/system.slice/docker-ab.scope,
#   task_memcg=/system.slice/docker-ab.scope,task=vllm,pid=4242,uid=0
# Memory cgroup out of memory: Killed process 4242 (vllm) total-vm:..kB, ...
# Before 5.0: "Out of memory: Kill process 2345 (python3) score 912 or sacrifice child",
# then "Killed process 2345 (python3) total-vm:..". "Out of memory (oom_kill_allocating_task):"
# is the same kill under that sysctl. Lines of one kill become one event (same pid).
_OOM_KILL = re.compile(
    r"^(?:(?P<scope>Out of memory|Memory cgroup out of memory)(?: \([a-z_]{1,40}\))?: )?"
    r"Kill(?:ed)? process (?P<pid>\d{1,10}) \((?P<name>[^)]{0,64})\)")
_OOM_SUMMARY = re.compile(r"^oom-kill:constraint=(?P<constraint>[A-Z_]{1,32},)?(?P<rest>.*)$")
_OOM_FIELD = re.compile(r"(?:^|,)(oom_memcg|task_memcg|task|pid)=([^,]{0,512})")
# OOM kills kept in a summary: the newest ones (a host in an OOM loop logs one a second).
MAX_OOMS = 500

# Numbers are bounded (a 64-bit sequence, microseconds since boot): a line with a
# longer "number" is text, not a record header, and never a huge int to convert.
_KMSG = re.compile(r"^(?P<prio>\d{1,4}),(?P<seq>\d{1,19}),(?P<usec>\d{1,19}),[^;]*;(?P<text>.*)$")
_RAW = re.compile(
    r"^<(?P<prio>\d{1,4})>(?:\[\s*(?P<sec>\d{1,12})\.(?P<frac>\d{1,9})\]\s?)?(?P<text>.*)$")
_DICTIONARY = re.compile(r"^ [A-Z_]+=")
_HUMAN = re.compile(r"^\[\s*(?P<sec>\d{1,12})\.(?P<frac>\d{1,9})\]\s?(?P<text>.*)$")


@dataclass(frozen=True)
class Record:
    text: str
    seq: int | None = None
    usec: int | None = None


class KernelLogError(Exception):
    pass


def parse_lines(lines: Iterable[str]) -> Iterator[Record]:
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip() or _DICTIONARY.match(line):
            continue
        if line[0].isspace():
            yield Record(line.strip())
            continue
        if m := _KMSG.match(line):
            yield Record(m["text"], int(m["seq"]), int(m["usec"]))
        elif m := _RAW.match(line):
            usec = _usec(m["sec"], m["frac"]) if m["sec"] is not None else None
            yield Record(m["text"], None, usec)
        elif m := _HUMAN.match(line):
            yield Record(m["text"], None, _usec(m["sec"], m["frac"]))
        else:
            yield Record(line)


def _usec(sec: str, frac: str) -> int:
    return int(sec) * 1_000_000 + int(frac.ljust(6, "0")[:6])


def xid_event(record: Record) -> dict[str, Any] | None:
    """The Xid a record reports, or None; a 'fallen off the bus' line counts as Xid 79."""
    if m := _XID.search(record.text):
        event: dict[str, Any] = {"xid": int(m["xid"]), "pci": normalise_pci(m["pci"]),
                                 "pid": None, "process": None, "text": m["rest"].strip()}
        if p := _PID.match(m["rest"]):
            event["pid"] = None if p["pid"] == "<unknown>" else int(p["pid"])
            event["process"] = None if p["name"] in ("<unknown>", "") else p["name"]
            event["text"] = p["text"].strip()
    elif m := _FALLEN.search(record.text):
        event = {"xid": 79, "pci": normalise_pci(m["pci"]) if m["pci"] else None, "pid": None,
                 "process": None, "text": "GPU has fallen off the bus."}
    else:
        return None
    event["seq"] = record.seq
    event["usec"] = record.usec
    return event


class SxidEvents:
    """SXid events, the newest MAX_XIDS kept and the latest of each (switch, SXid, its
    Fatal word) outside them (sources/kmsg_kept.py). The lines of one event (its Data, its
    description, its Severity line) become one entry: the description's text and link,
    the first line's seq and usec; a part seen twice starts the next event."""

    def __init__(self) -> None:
        self.kept = NewestKept(MAX_XIDS, sxid_key)
        self._parts: set[str] = set()

    def add(self, record: Record) -> None:
        m = _SXID.search(record.text)
        if m is None:
            return
        rest = m["rest"].strip()
        part = "data" if rest.startswith("Data {") else \
            "severity" if rest.startswith("Severity ") else "text"
        key = (m["switch"], int(m["sxid"]))
        last = self.kept.last()
        if last is None or (last["switch"], last["sxid"]) != key or part in self._parts:
            last = {"sxid": key[1], "switch": key[0], "link": None, "text": rest,
                    "seq": record.seq, "usec": record.usec}
            self.kept.append(last)
            self._parts = set()
        self._parts.add(part)
        if part == "text":
            last["text"] = rest
            if link := _SXID_LINK.search(rest):
                last["link"] = int(link.group(1))
            self.kept.rekeyed()


class OomKills:
    """Out-of-memory kills, the newest MAX_OOMS kept: {"pid", "process", "scope": host |
    cgroup, "cgroup", "seq", "usec"}; the stamp is that of the kill's first line."""

    def __init__(self) -> None:
        self.events: deque[dict[str, Any]] = deque(maxlen=MAX_OOMS)
        self.seen = 0

    def add(self, record: Record) -> None:
        text = record.text
        if m := _OOM_SUMMARY.match(text):
            fields = dict(_OOM_FIELD.findall(m["rest"]))
            pid = fields.get("pid", "")
            if not pid.isdigit() or len(pid) > 10:
                return
            memcg = fields.get("oom_memcg")
            constraint = (m["constraint"] or "").rstrip(",")
            self._event(record, int(pid), fields.get("task") or None,
                        "cgroup" if constraint == "CONSTRAINT_MEMCG" else "host",
                        memcg or fields.get("task_memcg") or None)
        elif m := _OOM_KILL.match(text):
            scope = "cgroup" if m["scope"] == "Memory cgroup out of memory" else \
                "host" if m["scope"] else None
            self._event(record, int(m["pid"]), m["name"] or None, scope, None)

    def _event(self, record: Record, pid: int, name: str | None, scope: str | None,
               cgroup: str | None) -> None:
        last = self.events[-1] if self.events else None
        if last is not None and last["pid"] == pid:  # another line of the same kill
            last["process"] = last["process"] or name
            last["scope"] = last["scope"] or scope
            last["cgroup"] = last["cgroup"] or cgroup
            return
        self.events.append({"pid": pid, "process": name, "scope": scope, "cgroup": cgroup,
                            "seq": record.seq, "usec": record.usec})
        self.seen += 1

    def dropped(self) -> int:
        return self.seen - len(self.events)


# Xid events kept in a summary: the newest ones, and outside them the latest of each (GPU,
# code) (sources/kmsg_kept.py). A log holding more (a storm of one Xid, or a hostile log)
# keeps the snapshot, the daemon's memory and /status bounded; the number left out is kept
# and shown by xid.recent.
MAX_XIDS = 2000


class NvrmLines:
    """The NVIDIA driver's own lines: Xid events (the newest MAX_XIDS, and the latest of each
    GPU and code), the versions the
    last "API mismatch" named (library (client) and kernel module), GSP errors without an
    Xid, the driver's loads and the repairs (a GPU reset, a driver reload) after which the
    lines before them no longer count (sources/kmsg_gpu.py). Each Xid, GSP line and repair
    carries `n`, its place among these lines: a repair clears what came before it."""

    def __init__(self) -> None:
        self.xids = NewestKept(MAX_XIDS, xid_key)
        self.mismatch: dict[str, str] = {}
        self.gsp = GspLines()
        self.driver = DriverLines()
        self.n = 0

    def add(self, record: Record) -> None:
        self.n += 1
        event = xid_event(record)
        if event is not None:
            event["n"] = self.n
            self.xids.append(event)
        elif self.gsp.add(record.text, record.seq, record.usec, self.n) or \
                self.driver.add(record, self.n,
                                after_lines=bool(self.xids.seen or self.gsp.kept.seen)):
            return
        elif m := _CLIENT_VERSION.search(record.text):
            self.mismatch["client"] = m.group(1)
        if m := _MODULE_VERSION.search(record.text):
            self.mismatch["kernel"] = m.group(1)



def _line_kind(text: str) -> str | None:
    """Which summary a line belongs to: nvrm, sxid, oom or unsigned (a module refused
    under Secure Boot); None for the rest. Plain substring tests first: nearly every line
    of a kernel log is none of them."""
    if "NVRM" in text or "fallen off the bus" in text or "GPU reset occurred" in text:
        return "nvrm"
    if "SXid" in text:
        return "sxid"
    if ("Kill" in text and " process " in text) or text.startswith("oom-kill:"):
        return "oom"
    if _UNSIGNED.search(text) and "nvidia" in text.lower():
        return "unsigned"
    return None


def summarise(records: Iterable[Record], source: str, now_usec: int | None,
              gaps: bool = False) -> dict[str, Any]:
    nvrm = NvrmLines()
    sxids = SxidEvents()
    ooms = OomKills()
    lost = Lost(gaps)
    count = 0
    last_usec: int | None = None
    unsigned_rejected = False
    for record in records:
        count += 1
        lost.add(record.seq, record.usec)
        if record.usec is not None:
            # the highest, not the last: a saved log may hold an earlier boot after a later
            # one, and an age is never negative
            last_usec = record.usec if last_usec is None else max(last_usec, record.usec)
        kind = _line_kind(record.text)
        if kind == "nvrm":
            nvrm.add(record)
        elif kind == "sxid":
            sxids.add(record)
        elif kind == "oom":
            ooms.add(record)
        elif kind == "unsigned":
            unsigned_rejected = True
    return {
        "source": source,
        "records": count,
        # A live read knows the time now; a saved log ends when it was saved.
        "now_usec": now_usec if now_usec is not None else last_usec,
        "xids": nvrm.xids.events(),
        "xids_dropped": nvrm.xids.dropped(),
        # NVSwitch errors: {"sxid", "switch" (PCI id), "link", "text", "seq", "usec"}.
        "sxids": sxids.kept.events(),
        "sxids_dropped": sxids.kept.dropped(),
        # Out-of-memory kills (host.memory): {"pid", "process", "scope", "cgroup", "seq", "usec"}.
        "ooms": list(ooms.events),
        "ooms_dropped": ooms.dropped(),
        "unsigned_module_rejected": unsigned_rejected,
        # The last "API mismatch" the driver logged: library (client) and kernel module versions.
        "api_mismatch": nvrm.mismatch or None,
        # GSP errors without an Xid (gsp.firmware): {"kind", "pci", "rm_gpu", "text", "seq",
        # "usec"}; the driver's loads: {"version", "seq", "usec"} (sources/kmsg_gpu.py).
        "gsp": nvrm.gsp.kept.events(),
        "gsp_dropped": nvrm.gsp.kept.dropped(),
        "driver_loads": list(nvrm.driver.loads.events),
        # the repairs seen (issue 21, item 3): {"kind": gpu_reset | driver_reload, "uuid",
        # "pci" (the GPU a reset names; neither for a reload), "text", "seq", "usec", "n"}
        "repairs": list(nvrm.driver.repairs),
        "acked_seq": None,
        # records overwritten before they were read (Lost): how many, and the first record
        # after them (what "since boot" narrows to); the highest sequence number read
        **lost.summary(),
    }


def read_device(path: Path,
                deadline_s: float = 5.0) -> Reading[dict[str, Any]]:
    """Read every record buffered in /dev/kmsg without blocking, within a size bound and
    a deadline (another character device given as the log, such as /dev/zero, never ends)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except PermissionError:
        return Reading.failed(f"cannot read {path}: permission denied (reading the kernel log "
                              "needs CAP_SYSLOG when kernel.dmesg_restrict=1)")
    except OSError as exc:
        return Reading.failed(f"cannot read {path}: {exc.strerror or exc}")
    lines: list[str] = []
    total = 0
    overwritten = False
    end = time.monotonic() + deadline_s
    try:
        while True:
            if total > MAX_LOG_BYTES or time.monotonic() > end:
                why = (f"more than {MAX_LOG_BYTES // MIB} MiB" if total > MAX_LOG_BYTES
                       else f"no end of records within {deadline_s:g} s")
                return Reading.failed(f"cannot read {path}: {why}: not a kernel log device?")
            try:
                data = os.read(fd, 16384)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records overwritten while we read: go on,
                    overwritten = True         # and count the gap in the numbers (Lost)
                    continue
                if exc.errno == errno.EPERM:
                    return Reading.failed(f"cannot read {path}: operation not permitted (needs "
                                          "CAP_SYSLOG when kernel.dmesg_restrict=1)")
                return Reading.failed(f"cannot read {path}: {exc.strerror or exc}")
            if not data:
                break
            total += len(data)
            lines.append(data.decode("utf-8", errors="replace"))
    finally:
        os.close(fd)
    now = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1_000_000)
    return Reading.ok(summarise(parse_lines(lines), str(path), now, gaps=overwritten))


def read_file(path: Path, deadline_s: float = 5.0) -> Reading[dict[str, Any]]:
    """Read a saved kernel log (a file, or a pipe such as `<(dmesg)`), within a size bound
    and a deadline. Binary or unreadable input is an error reading, not a crash."""
    try:
        raw = read_bytes(path, MAX_LOG_BYTES, deadline_s)
    except BoundedReadError as exc:
        return Reading.failed(str(exc))
    if b"\0" in raw[:65536]:
        return Reading.failed(f"{path}: binary data, not a kernel log")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Reading.failed(f"{path}: not UTF-8 text (byte {exc.start}), not a kernel log")
    if text and not text.endswith("\n"):
        last = text.rsplit("\n", 1)[-1]
        return Reading.failed(f"{path}: ends in the middle of a line ({last[:40]!r}...): "
                              "truncated? save it again with `dmesg > file`")
    return Reading.ok(summarise(parse_lines(text.splitlines()), str(path), None))
