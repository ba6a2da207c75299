"""The bounded reads of the kernel log (sources/kmsg.py summarises what they read): the
live device's records, and a saved log's bytes as text. Each has a size bound and a
deadline; KernelLogError says why a read is not a kernel log."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path

from gpuguard.io.bounded import MIB

# The kernel's ring buffer is at most 32 MiB (log_buf_len); twice that is not a kernel log.
MAX_LOG_BYTES = 64 * MIB

class KernelLogError(Exception):
    pass


def open_device(path: Path) -> int:
    """/dev/kmsg opened to read without blocking; KernelLogError says why it cannot be."""
    try:
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except PermissionError:
        raise KernelLogError(f"cannot read {path}: permission denied (reading the kernel log "
                             "needs CAP_SYSLOG when kernel.dmesg_restrict=1)") from None
    except OSError as exc:
        raise KernelLogError(f"cannot read {path}: {exc.strerror or exc}") from None


def drain(fd: int, path: Path, deadline_s: float,
          read: Callable[[int, int], bytes] = os.read) -> tuple[str, bool]:
    """Every record buffered after the descriptor's position, within a size bound and a
    deadline (another character device given as the log, such as /dev/zero, never ends):
    their text, and whether records were overwritten while it read (EPIPE). KernelLogError
    says why not."""
    lines: list[str] = []
    total = 0
    overwritten = False
    end = time.monotonic() + deadline_s
    while True:
        if total > MAX_LOG_BYTES or time.monotonic() > end:
            why = (f"more than {MAX_LOG_BYTES // MIB} MiB" if total > MAX_LOG_BYTES
                   else f"no end of records within {deadline_s:g} s")
            raise KernelLogError(f"cannot read {path}: {why}: not a kernel log device?")
        try:
            data = read(fd, 16384)
        except BlockingIOError:
            break
        except OSError as exc:
            if exc.errno == errno.EPIPE:  # records overwritten while we read: go on,
                overwritten = True         # and count the gap in the numbers (Lost)
                continue
            if exc.errno == errno.EPERM:
                raise KernelLogError(f"cannot read {path}: operation not permitted (needs "
                                     "CAP_SYSLOG when kernel.dmesg_restrict=1)") from None
            raise KernelLogError(f"cannot read {path}: {exc.strerror or exc}") from None
        if not data:
            break
        total += len(data)
        lines.append(data.decode("utf-8", errors="replace"))
    return "".join(lines), overwritten


def now_usec() -> int:
    """The kernel log's clock now (microseconds since boot)."""
    return int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1_000_000)


def log_text(raw: bytes, path: Path, offset: int = 0) -> str:
    """A saved log's bytes as text, or KernelLogError saying why they are not a kernel log;
    `offset`: where in the file they begin (a read of what was appended since the last one,
    which ended at a line's end: the same verdict and words as a read of the whole file).
    Bytes that end in the middle of a line are an error here: the daemon's read of what was
    appended waits for the line's end (log_text_whole() reads a whole file's last line)."""
    text = _decoded(raw, path, offset)
    if text and not text.endswith("\n"):
        last = text.rsplit("\n", 1)[-1]
        raise KernelLogError(f"{path}: ends in the middle of a line ({last[:40]!r}...): "
                             "truncated? save it again with `dmesg > file`")
    return text


def log_text_whole(raw: bytes, path: Path) -> tuple[str, str | None]:
    """A whole saved log's bytes as text (KernelLogError: not a kernel log), and its last
    line where it has no newline (None where the file ends at a line's end). A pasted
    excerpt often ends so; every line before it is whole, and the last one is read as it
    is: the caller says it may have been cut (issue 36, item 4)."""
    text = _decoded(raw, path, 0)
    if text and not text.endswith("\n"):
        return text, text.rsplit("\n", 1)[-1]
    return text, None


def _decoded(raw: bytes, path: Path, offset: int) -> str:
    if b"\0" in raw[:max(0, 65536 - offset)]:
        raise KernelLogError(f"{path}: binary data, not a kernel log")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise KernelLogError(f"{path}: not UTF-8 text (byte {offset + exc.start}), not a "
                             "kernel log") from None
