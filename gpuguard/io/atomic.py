"""Atomic file writes: readers (node_exporter's textfile collector) never see half a file.

Only regular files are written. The write renames a new file over the path, so whatever
was there is replaced: as root, `-o /dev/null` would put a regular file where the device
was, and a symlink would be replaced by a file instead of its target being written.
Anything that is not a regular file is therefore refused before a byte is written.
(A path swapped for a device between the check and the rename needs write access to the
directory, which already allows replacing the device.)
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path

_KINDS = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket"}


def check_writable_target(path: Path) -> None:
    """Raise OSError (strerror says why, filename is the path) unless `path` is missing
    or a regular file."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISREG(info.st_mode):
        return
    if stat.S_ISLNK(info.st_mode):
        raise OSError(errno.ELOOP, f"is a symbolic link (to {os.readlink(path)}); "
                      "gpuguard writes only regular files", str(path))
    if stat.S_ISDIR(info.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
    kind = _KINDS.get(stat.S_IFMT(info.st_mode), "an unusual kind of file")
    raise OSError(errno.EINVAL, f"not a regular file ({kind}); gpuguard writes only "
                  "regular files", str(path))


def write_text(path: Path, text: str, mode: int = 0o644, durable: bool = True) -> None:
    """`text` at `path`, whole or not at all for every reader; `durable`: on the disk
    before this returns (fsync of the file and its directory). A file that means
    nothing after a reboot needs only the rename: its readers are atomic either way."""
    check_writable_target(path)
    directory = path.parent
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if not durable:
        return
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
