"""A supervised service's own log, read incrementally and with a bound (issue 23): the
lines written since the last read, for the CUDA errors service.gpu_errors ties to Xids.

- a file (the exec backend's `log_file_gpu` / `log_file_cpu`): from where the last read
  ended; a file replaced (another inode) or cut shorter (truncated) is read from its start;
- Docker: the container's logs (stdout and stderr) through the engine's API, as its own
  time-stamped lines, the newest TAIL_LINES each read; a line already seen (its stamp and
  text) is not taken again, so no cursor on the wall clock is kept;
- the journal (systemd): `journalctl -u UNIT --after-cursor`, the cursor the last read
  ended at.

The first read of a log only marks where it ends: what it held before gpuguard watched is
not news. Each read takes at most MAX_BYTES (a file's newest bytes when more came) and
lines of at most MAX_LINE characters, within its deadline; whatever goes wrong is an error
of that read (LogError), never the cycle's.
"""

from __future__ import annotations

import os
import stat
import subprocess
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

MAX_BYTES = 1024 * 1024
MAX_LINE = 2000
TAIL_LINES = 2000


class LogError(OSError):
    """The log could not be read this time."""


class FileTail:
    def __init__(self, path: str) -> None:
        self.path = path
        self._inode: tuple[int, int] | None = None
        self._offset = 0
        self._started = False

    def read(self, deadline_s: float) -> list[str]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except FileNotFoundError:
            self._started = True  # a file made later is read from its start
            self._inode = None
            return []
        except OSError as exc:
            raise LogError(f"cannot open {self.path}: {exc}") from exc
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise LogError(f"{self.path} is not a regular file")
            inode = (info.st_dev, info.st_ino)
            if not self._started:
                self._started, self._inode, self._offset = True, inode, info.st_size
                return []
            if inode != self._inode or info.st_size < self._offset:
                self._inode, self._offset = inode, 0  # rotated or truncated
            start = max(self._offset, info.st_size - MAX_BYTES)
            data = _pread_all(fd, start, info.st_size - start, time.monotonic() + deadline_s)
        finally:
            os.close(fd)
        # a line not ended yet is left for the next read
        complete = data.rfind(b"\n") + 1
        self._offset = start + complete
        return _lines(data[:complete])


def _pread_all(fd: int, offset: int, size: int, end: float) -> bytes:
    chunks: list[bytes] = []
    while size > 0:
        if time.monotonic() > end:
            raise LogError("the log was not read before the deadline")
        chunk = os.pread(fd, min(size, 256 * 1024), offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
        size -= len(chunk)
    return b"".join(chunks)


class DockerTail:
    def __init__(self, container: str) -> None:
        self.container = container
        self._seen: deque[bytes] = deque(maxlen=TAIL_LINES * 2)
        self._seen_set: set[bytes] = set()
        self._id: str | None = None

    def read(self, deadline_s: float) -> list[str]:
        import docker

        client = None
        try:
            client = docker.from_env(timeout=max(1, int(deadline_s)))
            container = client.containers.get(self.container)
            raw = container.logs(stdout=True, stderr=True, timestamps=True,
                                 tail=TAIL_LINES)
        except (docker.errors.DockerException, OSError) as exc:
            raise LogError(f"Docker: {exc}") from exc
        finally:
            if client is not None:
                client.close()
        first = self._id != container.id
        if first:
            self._id = container.id
            self._seen.clear()
            self._seen_set.clear()
        new = []
        for line in raw[-MAX_BYTES:].splitlines():
            if line in self._seen_set:
                continue
            self._remember(line)
            if not first:
                # "2026-08-20T10:00:00.123456789Z text": the stamp is Docker's, only a key
                new.append(line.split(b" ", 1)[-1])
        return _lines(b"\n".join(new))

    def _remember(self, line: bytes) -> None:
        if len(self._seen) == self._seen.maxlen:
            self._seen_set.discard(self._seen[0])
        self._seen.append(line)
        self._seen_set.add(line)


class JournalTail:
    def __init__(self, unit: str) -> None:
        self.unit = unit
        self._cursor: str | None = None
        # the first read found the unit's journal empty: the next takes all it holds
        self._empty = False

    def read(self, deadline_s: float) -> list[str]:
        args = ["journalctl", "--no-pager", "--quiet", "-o", "cat", "--show-cursor",
                "-u", self.unit]
        if self._cursor is not None:
            args += ["--after-cursor", self._cursor, "-n", str(TAIL_LINES)]
        else:
            args += ["-n", str(TAIL_LINES) if self._empty else "0"]
        try:
            proc = subprocess.run(args, capture_output=True, timeout=deadline_s, check=False,
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise LogError(f"journalctl: {exc}") from exc
        if proc.returncode != 0:
            raise LogError(f"journalctl exited {proc.returncode}: "
                           f"{proc.stderr.decode(errors='replace')[-200:]}")
        out = proc.stdout[-MAX_BYTES:]
        body, _, last = out.rstrip(b"\n").rpartition(b"\n")
        if last.startswith(b"-- cursor: "):
            first = self._cursor is None and not self._empty
            self._cursor = last[len(b"-- cursor: "):].decode(errors="replace")
            return [] if first else _lines(body)
        self._empty = self._cursor is None
        return _lines(out)


def _lines(data: bytes) -> list[str]:
    return [line.decode("utf-8", errors="replace")[:MAX_LINE]
            for line in data.splitlines() if line.strip()]


def tail_for(backend: str, config: dict[str, Any], variant: str) -> Any:
    """The tail of a variant's log, or None where the backend names none."""
    if backend == "exec":
        path = config.get(f"log_file_{variant}")
        return FileTail(str(path)) if path else None
    if backend == "docker":
        return DockerTail(str(config[variant]["name"]))
    if backend == "systemd":
        return JournalTail(str(config[variant]))
    return None


def matches(lines: Iterable[str], kind_of: Any) -> list[tuple[str, str]]:
    """(kind, line) of each line that reports a GPU error."""
    found = []
    for line in lines:
        kind = kind_of(line)
        if kind is not None:
            found.append((kind, line))
    return found
