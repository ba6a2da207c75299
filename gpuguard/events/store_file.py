"""The store's files, as its writer opens and watches them (docs/events.md).

In a state directory others may write (a group-writable one: an admin's mistake, or a
shared mount), a member could swap events.db, or plant events.db-wal or -shm, as a link
to a file of root's: root would then change that file's mode, or SQLite write into it.
So the writer opens a store file only when it is a regular file of its own user with one
link: checked with lstat, then opened with O_NOFOLLOW and checked again with fstat (the
same inode); permissions change only through that descriptor (fchmod), never by path. A
file that fails is refused (`UnsafeFile`), left as it is for the admin, and logged.

SQLite opens the files by name after these checks (its Python module takes no descriptor),
so a swap in that instant is caught by the check after it (the same inodes, lstat) and by
`Watch.changed` at every flush: a file deleted or replaced under a running writer (its
-wal removed by hand) is noticed, and the writer saves what it can and opens again.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

SUFFIXES = ("-wal", "-shm")
MODE = 0o644  # any user may read (`gpuguard events`), whatever the unit's umask


class UnsafeFile(Exception):
    """A store file the writer will not open (a link, another user's, not a regular
    file, more than one link)."""


def _refuse_unless_safe(path: Path, info: os.stat_result) -> None:
    if stat.S_ISLNK(info.st_mode):
        raise UnsafeFile(f"{path} is a symbolic link")
    if not stat.S_ISREG(info.st_mode):
        raise UnsafeFile(f"{path} is not a regular file")
    if info.st_uid != os.geteuid():
        raise UnsafeFile(f"{path} belongs to uid {info.st_uid}, not to this writer's "
                         f"{os.geteuid()}")
    if info.st_nlink != 1:
        raise UnsafeFile(f"{path} has {info.st_nlink} links (a hard link shares its inode "
                         "with another name)")


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def prepare_main(path: Path) -> tuple[int, int]:
    """Before SQLite opens the store: the main file checked (made here, 0644, when
    absent), its mode set through an O_NOFOLLOW descriptor, and -wal and -shm checked
    where present. Returns the main file's (device, inode) for `check_opened`. The
    descriptor is closed before SQLite opens the file: closing a descriptor of a file
    drops the process's POSIX locks on it, SQLite's included."""
    before = _lstat(path)
    if before is not None:
        _refuse_unless_safe(path, before)
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags if before is not None else flags | os.O_CREAT | os.O_EXCL,
                     MODE)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EEXIST):  # swapped for a link, or made, meanwhile
            raise UnsafeFile(f"{path} changed while it was opened") from exc
        raise
    try:
        opened = os.fstat(fd)
        _refuse_unless_safe(path, opened)
        if before is not None and (before.st_dev, before.st_ino) != (opened.st_dev,
                                                                      opened.st_ino):
            raise UnsafeFile(f"{path} changed while it was opened")
        if opened.st_mode & 0o777 != MODE:
            # SQLite gives -wal and -shm the main file's mode: this one goes first
            os.fchmod(fd, MODE)
    finally:
        os.close(fd)
    for suffix in SUFFIXES:
        extra = Path(f"{path}{suffix}")
        info = _lstat(extra)
        if info is not None:
            _refuse_unless_safe(extra, info)
    return opened.st_dev, opened.st_ino


@dataclass(frozen=True)
class Watch:
    """The (device, inode) of the main file, -wal and -shm as SQLite opened them."""

    main: tuple[int, int]
    wal: tuple[int, int] | None
    shm: tuple[int, int] | None

    def changed(self, path: Path) -> list[str]:
        """The files that are no longer the ones opened (deleted, replaced, a link)."""
        now = watch_of(path, check=False)
        return [name for name, was, is_ in (("events.db", self.main, now.main),
                                            ("-wal", self.wal, now.wal),
                                            ("-shm", self.shm, now.shm))
                if was is not None and was != is_]


def watch_of(path: Path, check: bool = True) -> Watch:
    """The files as they are now (lstat: a link is not its target); with `check`, each
    present one must be safe (UnsafeFile)."""
    ids: list[tuple[int, int] | None] = []
    for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        info = _lstat(name)
        if info is not None and check:
            _refuse_unless_safe(name, info)
        ids.append(None if info is None or stat.S_ISLNK(info.st_mode)
                   else (info.st_dev, info.st_ino))
    return Watch(ids[0] or (0, 0), ids[1], ids[2])


def check_opened(path: Path, main: tuple[int, int]) -> Watch:
    """After SQLite opened the store: the main file is still the one checked, and -wal
    and -shm (which SQLite made with the main file's mode) are safe."""
    now = watch_of(path)
    if now.main != main:
        raise UnsafeFile(f"{path} changed while it was opened")
    return now
