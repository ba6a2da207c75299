"""The daemon's kernel log (issue 32): read once whole, then only what came since, so a
cycle's cost does not grow with the log's size. `check` reads the whole log every time
(sources/kmsg.py); this gives the summary that whole read would give at this moment:

- /dev/kmsg (a character device): kept open, each read takes the records after the last
  one read. The front of the ring buffer is looked at every read (a second descriptor
  sought to the first record the buffer holds): once it moved (the buffer is full and new
  records pushed old ones out) or the kernel overwrote records before this reader got them
  (EPIPE), what a whole read gives changed at its front, and the log is read whole again.
- a saved log (a regular file, `--kmsg-file`): kept at its size. Unchanged (device, inode,
  size, modification and change times), the last summary stands; grown with the bytes read
  before still in place (its first and its last 4 KiB before the old end compared), only the
  new bytes are read; anything else (truncated, rotated, replaced, rewritten) is read whole.
- anything else (a pipe): read whole, as `check` reads it.

Every read keeps the whole read's bounds: the size bound and the deadline of one read, and
the size bound again over the bytes read since the last whole read (past it, a whole read
says what it says of a log that large). A read that fails leaves the kept state as it was
before it (a line half written is read again, whole, next time)."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuguard.io.bounded import BoundedReadError, read_bytes
from gpuguard.model.snapshot import Reading
from gpuguard.sources import kmsg, kmsg_io
from gpuguard.sources.kmsg_io import MAX_LOG_BYTES, KernelLogError
from gpuguard.sources.kmsg_records import LineParser

# what of a saved log is compared to tell an append from a rewrite
PROBE_BYTES = 4096


class Device:
    """The system calls a device read makes (the tests give a ring buffer of their own)."""

    def open(self, path: Path) -> int:
        return kmsg_io.open_device(path)

    def read(self, fd: int, size: int) -> bytes:
        return os.read(fd, size)

    def seek_first(self, fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)  # /dev/kmsg: to the first record the buffer holds

    def close(self, fd: int) -> None:
        os.close(fd)


@dataclass
class _Fed:
    """A log read so far: its records' summary, and the parser's record in progress."""

    summary: kmsg.LogSummary
    parser: LineParser = field(default_factory=LineParser)
    bytes_read: int = 0

    def feed(self, text: str) -> None:
        self.bytes_read += len(text)
        self.summary.feed(self.parser.feed(text.split("\n")))


class DeviceTail:
    def __init__(self, path: Path, device: Device | None = None) -> None:
        self.path = path
        self.device = device or Device()
        self.fds: tuple[int, int] | None = None  # (the reader, the front's)
        self.fed: _Fed | None = None
        self.first_seq: int | None = None

    def read(self, deadline_s: float) -> Reading[dict[str, Any]]:
        try:
            # a buffer without numbered records (empty) has no front to watch: read whole
            if self.fed is None or self.fds is None or self.first_seq is None or \
                    self._front() != self.first_seq:
                return self._whole(deadline_s)
            text, overwritten = kmsg_io.drain(self.fds[0], self.path, deadline_s, self.device.read)
            if overwritten or self.fed.bytes_read + len(text) > MAX_LOG_BYTES:
                return self._whole(deadline_s)
            self.fed.feed(text)
            return Reading.ok(self.fed.summary.result(str(self.path), kmsg_io.now_usec()))
        except KernelLogError as exc:
            self.close()
            return Reading.failed(str(exc))

    def _whole(self, deadline_s: float) -> Reading[dict[str, Any]]:
        self.close()
        reader = self.device.open(self.path)
        self.fds = (reader, reader)  # closed by close() should the second open fail
        self.fds = (reader, self.device.open(self.path))
        text, overwritten = kmsg_io.drain(reader, self.path, deadline_s, self.device.read)
        fed = _Fed(kmsg.LogSummary(gaps=overwritten))
        fed.feed(text)
        first = fed.summary.lost.first
        self.fed, self.first_seq = fed, None if first is None else first[0]
        return Reading.ok(fed.summary.result(str(self.path), kmsg_io.now_usec()))

    def _front(self) -> int | None:
        """The sequence number of the first record the buffer holds now (None: none)."""
        assert self.fds is not None
        for _ in range(3):  # the first record overwritten between the seek and the read
            self.device.seek_first(self.fds[1])
            try:
                data = self.device.read(self.fds[1], 16384)
            except BlockingIOError:
                return None
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue
                raise KernelLogError(f"cannot read {self.path}: {exc.strerror or exc}"
                                     ) from None
            head = next(LineParser().feed(data.decode("utf-8", "replace").split("\n")), None)
            return None if head is None else head.seq
        return -1  # the front moving faster than it is read: read whole

    def close(self) -> None:
        if self.fds is not None:
            for fd in set(self.fds):
                with contextlib.suppress(OSError):
                    self.device.close(fd)
        self.fds, self.fed, self.first_seq = None, None, None


@dataclass
class _Saved:
    """What a saved log was when last read: its identity and times, its size, its first
    and last PROBE_BYTES, what was fed of it."""

    stamp: tuple[int, ...]
    size: int
    head: bytes
    tail: bytes
    fed: _Fed


def _stamp(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class FileTail:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.saved: _Saved | None = None

    def read(self, deadline_s: float) -> Reading[dict[str, Any]]:
        try:
            st = os.stat(self.path)
        except OSError:
            st = None
        if st is None or not stat.S_ISREG(st.st_mode):
            self.saved = None
            return kmsg.read_file(self.path, deadline_s)  # its own words for what it is
        saved = self.saved
        if saved is not None and _stamp(st) == saved.stamp:
            return Reading.ok(saved.fed.summary.result(str(self.path), None))
        if saved is not None and saved.stamp[:2] == _stamp(st)[:2] and \
                saved.size <= st.st_size <= MAX_LOG_BYTES:
            try:
                grown = self._grown(saved, st, deadline_s)
            except (OSError, KernelLogError) as exc:
                return Reading.failed(str(exc) if isinstance(exc, KernelLogError)
                                      else f"cannot read {self.path}: {exc.strerror or exc}")
            if grown is not None:
                return grown
        return self._whole(st, deadline_s)

    def _whole(self, st: os.stat_result, deadline_s: float) -> Reading[dict[str, Any]]:
        """As kmsg.read_file() reads it (its bounds, its words for a bad log), kept."""
        self.saved = None
        try:
            raw = read_bytes(self.path, MAX_LOG_BYTES, deadline_s)
            text, cut = kmsg_io.log_text_whole(raw, self.path)
        except (BoundedReadError, KernelLogError) as exc:
            return Reading.failed(str(exc))
        fed = _Fed(kmsg.LogSummary())
        fed.feed(text)
        if cut is not None:
            # its last line may be one being written: not kept, so the next read takes the
            # file whole again (and the line with its end) instead of its rest as a line
            return Reading.ok(kmsg.with_cut_line(fed.summary.result(str(self.path), None), cut))
        # the stamp from before the read: a file changed while it was read is looked at
        # again next time (its size or times differ)
        self.saved = _Saved((*_stamp(st)[:2], len(raw), *_stamp(st)[3:]), len(raw),
                            raw[:PROBE_BYTES], raw[-PROBE_BYTES:], fed)
        return Reading.ok(fed.summary.result(str(self.path), None))

    def _grown(self, saved: _Saved, st: os.stat_result,
               deadline_s: float) -> Reading[dict[str, Any]] | None:
        """The bytes appended since the last read, fed; None where the bytes read before
        are not in place any more (read whole)."""
        end = time.monotonic() + deadline_s
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if os.pread(fd, len(saved.head), 0) != saved.head or \
                    os.pread(fd, len(saved.tail), saved.size - len(saved.tail)) != saved.tail:
                return None
            chunks: list[bytes] = []
            offset = saved.size
            while data := os.pread(fd, 1 << 20, offset):
                offset += len(data)
                chunks.append(data)
                if offset > MAX_LOG_BYTES or time.monotonic() > end:
                    return None  # the whole read says why
            after = os.fstat(fd)
        finally:
            os.close(fd)
        raw = b"".join(chunks)
        if raw and not raw.endswith(b"\n"):
            return None  # a line being written: the whole read takes it as cut, keeps nothing
        text = kmsg_io.log_text(raw, self.path, saved.size)  # KernelLogError: nothing kept changes
        saved.fed.feed(text)
        tail = (saved.tail + raw)[-PROBE_BYTES:]
        head = (saved.head + raw)[:PROBE_BYTES] if saved.size < PROBE_BYTES else saved.head
        stamp = _stamp(after) if after.st_size == offset else \
            (*_stamp(after)[:2], offset, -1, -1)  # grown while read: looked at again
        self.saved = _Saved(stamp, offset, head, tail, saved.fed)
        return Reading.ok(saved.fed.summary.result(str(self.path), None))


class KernelLogTail:
    """The daemon's reader of the kernel log at a path (sources/host.py hands it each
    fast cycle's read): the device's or the saved log's tail, kept while the path is one."""

    def __init__(self, device: Device | None = None) -> None:
        self.device = device
        self.tail: DeviceTail | FileTail | None = None

    def read(self, path: Path, deadline_s: float) -> Reading[dict[str, Any]]:
        try:
            char = stat.S_ISCHR(os.stat(path).st_mode)
        except OSError:
            char = False
        kind = DeviceTail if char else FileTail
        if not isinstance(self.tail, kind) or self.tail.path != path:
            self.close()
            self.tail = DeviceTail(path, self.device) if char else FileTail(path)
        return self.tail.read(deadline_s)

    def close(self) -> None:
        if isinstance(self.tail, DeviceTail):
            self.tail.close()
        self.tail = None
