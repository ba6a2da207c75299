"""Reading a file with a size bound and a deadline, whatever the path turns out to be.

A path given on the command line or in a configuration may be a FIFO with no writer
(an open or a read blocks forever), a character device that never ends (`/dev/zero`),
or a file far larger than anything gpuguard reads. Opened with O_NONBLOCK, a FIFO is
waited on with select() until the deadline, a stream is cut at the size bound, and
each case is a BoundedReadError with a message that says which, never a hang or a
MemoryError. Standard library only: used before `gpuguard check` forks.
"""

from __future__ import annotations

import errno
import os
import select
import stat
import time

MIB = 1024 * 1024


class BoundedReadError(OSError):
    """The path could not be read within its bounds; str() says why, naming the path."""

    def __str__(self) -> str:
        return str(self.strerror)


def read_bytes(path: str | os.PathLike[str], max_bytes: int, deadline_s: float) -> bytes:
    """All of the file at `path`, at most `max_bytes`, within `deadline_s` seconds."""
    name = os.fspath(path)
    end = time.monotonic() + deadline_s
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise BoundedReadError(exc.errno, f"cannot read {name}: {exc.strerror or exc}") from exc
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise BoundedReadError(errno.EISDIR, f"cannot read {name}: it is a directory")
        regular = stat.S_ISREG(mode)
        if regular and os.fstat(fd).st_size > max_bytes:
            raise BoundedReadError(errno.EFBIG, _too_large(name, max_bytes))
        return _read_all(fd, name, regular, max_bytes, end, deadline_s)
    finally:
        os.close(fd)


def read_text(path: str | os.PathLike[str], max_bytes: int, deadline_s: float) -> str:
    """read_bytes() decoded as UTF-8; bad bytes are a BoundedReadError too."""
    raw = read_bytes(path, max_bytes, deadline_s)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BoundedReadError(errno.EILSEQ, f"{os.fspath(path)}: not a text file (not UTF-8: "
                               f"{exc.reason} at byte {exc.start})") from exc


def _read_all(fd: int, name: str, regular: bool, max_bytes: int, end: float,
              deadline_s: float) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        if not regular:
            # A FIFO whose writer has not come yet reads as end-of-file at once; select()
            # waits for data or for a writer that came and went.
            remaining = end - time.monotonic()
            ready = select.select([fd], [], [], remaining)[0] if remaining > 0 else []
            if not ready:
                raise BoundedReadError(errno.ETIMEDOUT, f"cannot read {name}: no end of "
                                       f"data within {deadline_s:g} s (a pipe or device "
                                       "that nothing writes to?)")
        elif time.monotonic() > end:
            raise BoundedReadError(errno.ETIMEDOUT,
                                   f"cannot read {name} within {deadline_s:g} s")
        try:
            data = os.read(fd, min(1 * MIB, max_bytes + 1 - total))
        except BlockingIOError:
            continue
        except OSError as exc:
            raise BoundedReadError(exc.errno, f"cannot read {name}: {exc.strerror or exc}"
                                   ) from exc
        if not data:
            return b"".join(chunks)
        total += len(data)
        if total > max_bytes:
            raise BoundedReadError(errno.EFBIG, _too_large(name, max_bytes))
        chunks.append(data)


def _too_large(name: str, max_bytes: int) -> str:
    size = f"{max_bytes // MIB} MiB" if max_bytes >= MIB else f"{max_bytes // 1024} KiB"
    return f"{name} is larger than {size}: not a file gpuguard reads"
