"""Where in the kernel log the GPU driver last spoke: the sequence numbers of the records
that may mean a GPU or the driver changed (issue 32: the InfoROM validity `check` keeps).

A kept fact about a GPU is only as good as the quiet since it was learnt. Any record of
the driver ("NVRM: ...": a driver load, an Xid, a GPU off the bus, an adapter-init
failure, an InfoROM message) or a reset line ("GPU reset occurred: ...", written by a
reset job: sources/kmsg_gpu.py) marks a moment after which the fact is learnt again.
This is wider than the rules' own readings on purpose: a record that is not a repair
costs one validation, a repair missed would keep an old ok.

Only the kernel log's own record form is read ("prio,seq,usec,flags;text", from
/dev/kmsg or a file of its records): the sequence numbers are what tell "since". A log
without them (a `dmesg` dump), one whose records were overwritten while it was read, or
one over the size bound or the deadline says nothing (None), and nothing is kept.
"""

from __future__ import annotations

import os
import stat
import time

# kmsg_io.MAX_LOG_BYTES's bound, and a drain of its own rather than kmsg_io.drain: that
# module brings pathlib (5-13 ms in the early process, before its answer), and a record
# overwritten mid-read is here a reason to keep nothing, not a gap to count
MAX_LOG_BYTES = 64 * 1024 * 1024  # twice the kernel's largest ring (log_buf_len=32M)
_MARKS = (b"NVRM:", b"GPU reset occurred")


class DriverMarks:
    """A plain class, not a dataclass: dataclasses imports inspect, 16 ms before the early
    process's first NVML call (nvml_early.py)."""

    def __init__(self, first_seq: int, last_seq: int, last_mark: int) -> None:
        self.first_seq = first_seq  # the oldest record still in the log
        self.last_seq = last_seq  # the newest
        self.last_mark = last_mark  # the newest driver record or reset line; -1: none

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DriverMarks) and vars(self) == vars(other)

    def __repr__(self) -> str:
        return f"DriverMarks({self.first_seq}, {self.last_seq}, {self.last_mark})"

    def quiet_since(self, seq: int) -> bool:
        """No driver record after `seq`, and the log still holds every record after it
        (a ring that wrapped past it cannot tell)."""
        return self.first_seq <= seq + 1 and self.last_mark <= seq <= self.last_seq


def read_marks(path: str, deadline_s: float) -> DriverMarks | None:
    """The log's driver marks, or None when it cannot tell (see the module's doc)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if stat.S_ISCHR(info.st_mode):
            records = _device_records(fd, time.monotonic() + deadline_s)
        elif stat.S_ISREG(info.st_mode) and info.st_size <= MAX_LOG_BYTES:
            records = _file_records(fd, info.st_size)
        else:
            return None
    finally:
        os.close(fd)
    return None if records is None else _marks(records)


def _device_records(fd: int, end: float) -> list[bytes] | None:
    """Every record of /dev/kmsg (one per read), or None: overwritten while read (EPIPE),
    another error, over the bound or past the deadline (a device that never ends)."""
    records: list[bytes] = []
    total = 0
    while True:
        if total > MAX_LOG_BYTES or time.monotonic() > end:
            return None
        try:
            record = os.read(fd, 16384)
        except BlockingIOError:
            return records
        except OSError:  # EPIPE: overwritten while read; EINVAL: a record too long
            return None
        if not record:
            return records
        total += len(record)
        records.append(record)


def _file_records(fd: int, size: int) -> list[bytes] | None:
    chunks: list[bytes] = []
    total = 0
    while total <= size:  # a file that grows while it is read: its size then bounds it
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    data = b"".join(chunks)[:size]
    # a record's continuation lines (" KEY=value", from /dev/kmsg) start with a space
    return [line for line in data.split(b"\n") if line and not line.startswith(b" ")]


def _marks(records: list[bytes]) -> DriverMarks | None:
    first = last = None
    mark = -1
    for record in records:
        head, sep, text = record.partition(b";")
        fields = head.split(b",")
        if not sep or len(fields) < 4 or not fields[1].isdigit():
            return None  # not the kernel log's record form: no sequence to order by
        seq = int(fields[1])
        if last is not None and seq <= last:
            return None  # out of order: not one log read once
        first = seq if first is None else first
        last = seq
        line = text.split(b"\n", 1)[0]
        if any(word in line for word in _MARKS):
            mark = seq
    if first is None or last is None:
        return None  # an empty log has no sequence: nothing can be said since
    return DriverMarks(first, last, mark)
