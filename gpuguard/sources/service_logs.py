"""A supervised service's own log, read incrementally and with a bound (issue 23): the
lines written since the last read, for the CUDA errors service.gpu_errors ties to Xids.

- a file (the exec backend's `log_file_gpu` / `log_file_cpu`): read forward from where the
  last read ended, in chunks. The file is held open between reads, so a rename rotation
  (another inode at the path) is first finished through the old descriptor, then the new
  file is read from its start; a file cut shorter than the offset, or whose bytes just
  before the offset changed (copytruncate, then grown past the old offset), is read from
  its start;
- Docker: the container's logs (stdout and stderr) through the engine's API, as its own
  time-stamped lines, the newest TAIL_LINES each read; a line already seen (its stamp and
  text) is not taken again, so no cursor on the wall clock is kept; a line without
  Docker's stamp (the first line of a cut) is never taken; a container recreated under
  the name is read from its first line;
- the journal (systemd): `journalctl -u UNIT --after-cursor`, the cursor the last read
  ended at, one JSON entry a line (each has its own cursor): the first TAIL_LINES entries
  after it, the rest at the next read (a backlog, never skipped).

The first read of a log only marks where it ends: what it held before gpuguard watched is
not news. Each read scans at most MAX_SCAN bytes (every byte up to that, not the newest
ones), within its deadline; a line is matched whole up to MAX_LINE bytes (a longer one in
overlapping pieces). What a bound or the deadline leaves unread is skipped and said
(`skipped`: service.gpu_errors is unknown, never a silent ok). Whatever goes wrong is an
error of that read (LogError), never the cycle's.
"""

from __future__ import annotations

import io
import json
import os
import re
import stat
import subprocess
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

from gpuguard.sources.log_scan import MAX_LINE, SHOWN, LogError, Patterns, Scan

__all__ = ["MAX_LINE", "SHOWN", "DockerTail", "FileTail", "JournalTail", "LogError",
           "Patterns", "matches", "tail_for"]

MAX_SCAN = 8 * 1024 * 1024  # bytes one read scans (0.3 s on one core); the rest is said
CHUNK = 1024 * 1024  # what one read holds in memory at once (file)
OVERLAP = 4096  # bytes two pieces of a line longer than MAX_LINE share
TAIL_LINES = 2000  # Docker lines and journal entries one read asks for
MARK = 64  # bytes before the offset that tell the same file from a rewritten one
_DOCKER_STAMP = re.compile(rb"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


class FileTail:
    def __init__(self, path: str) -> None:
        self.path = path
        self._file: io.FileIO | None = None  # held between reads: a rotation is finished
        self._inode: tuple[int, int] | None = None
        self._offset = 0
        self._mark = b""  # the MARK bytes before _offset
        self._mid_line = False  # after a skip: the bytes at _offset end a line not read
        self._started = False
        self.skipped: str | None = None  # what the last read could not take
        self.count = 0  # the lines the last read scanned

    def read(self, deadline_s: float, keep: Patterns | None = None) -> list[str]:
        end = time.monotonic() + deadline_s
        self.skipped, self.count = None, 0
        scan = Scan(keep)
        new = self._open()
        try:
            if not self._started:
                self._started = True
                if new is not None:  # what it held before gpuguard watched is not news
                    self._hold(new, os.fstat(new.fileno()).st_size)
                    new = None
                return []
            if self._file is not None and (new is None or _inode(new) != self._inode):
                # renamed away (rotated) or removed: its unread tail, by the old descriptor
                self._advance(scan, end)
                self._file.close()
                self._file = None
            if new is not None and self._file is None:
                self._hold(new, 0)  # a new file, or one made later: from its start
                new = None
            elif new is not None and self._rewritten(os.fstat(new.fileno()).st_size):
                self._offset, self._mark, self._mid_line = 0, b"", False
            if self._file is not None:
                self._advance(scan, end)
        finally:
            if new is not None:
                new.close()
        self.count = scan.count
        return scan.lines

    def _open(self) -> io.FileIO | None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except FileNotFoundError:
            self._started = True  # a file made later is read from its start
            return None
        except OSError as exc:
            raise LogError(f"cannot open {self.path}: {exc}") from exc
        file = io.FileIO(fd, "rb", closefd=True)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            file.close()
            raise LogError(f"{self.path} is not a regular file")
        return file

    def _hold(self, new: io.FileIO, offset: int) -> None:
        """Keep `new` as the file read from now on."""
        self._file, self._inode, self._offset = new, _inode(new), offset
        self._mid_line = False
        self._mark = _mark(new.fileno(), offset)

    def _rewritten(self, size: int) -> bool:
        """Truncated, or the bytes before the offset are not those read (copytruncate and
        written past the old offset before this read)."""
        assert self._file is not None
        return size < self._offset or _mark(self._file.fileno(), self._offset) != self._mark

    def _advance(self, scan: Scan, end: float) -> None:
        """Scan forward from the offset: every byte up to MAX_SCAN (this read's) and the
        deadline; what is left past them is skipped, and said."""
        assert self._file is not None
        fd = self._file.fileno()
        size = os.fstat(fd).st_size
        stop = min(size, self._offset + max(MAX_SCAN - scan.bytes, 0))
        pos, carry = self._offset, b""
        while pos < stop and time.monotonic() < end:
            chunk = os.pread(fd, min(CHUNK, stop - pos), pos)
            if not chunk:
                break
            pos += len(chunk)
            buf = carry + chunk
            if self._mid_line:  # the rest of a line whose start was skipped
                cut = buf.find(b"\n")
                self._mid_line = cut < 0
                buf = b"" if cut < 0 else buf[cut + 1:]
            cut = buf.rfind(b"\n") + 1
            scan.add(buf[:cut])
            carry = buf[cut:]
            while len(carry) > MAX_LINE:
                scan.add(carry[:MAX_LINE], whole=False)
                carry = carry[MAX_LINE - OVERLAP:]
        done = pos - len(carry)  # a line not ended yet is left for the next read
        if pos < size:  # cut by MAX_SCAN or the deadline (a partial last line is not)
            self.skipped = _said(self.skipped, f"{size - done} bytes of {self.path} not "
                                 f"read (more than {MAX_SCAN} bytes in one read, or past "
                                 "its deadline)")
            done = size
            self._mid_line = _mark(fd, size)[-1:] != b"\n"
        self._offset, self._mark = done, _mark(fd, done)


def _inode(file: io.FileIO) -> tuple[int, int]:
    info = os.fstat(file.fileno())
    return info.st_dev, info.st_ino


def _mark(fd: int, offset: int) -> bytes:
    start = max(0, offset - MARK)
    return os.pread(fd, offset - start, start)


def _said(before: str | None, what: str) -> str:
    return what if before is None else f"{before}; {what}"


class DockerTail:
    def __init__(self, container: str) -> None:
        self.container = container
        # hashes of the lines seen (stamp and text): memory bounded whatever a line holds
        self._seen: deque[int] = deque(maxlen=TAIL_LINES * 2)
        self._seen_set: set[int] = set()
        self._last: int | None = None  # the newest line of the last read
        self._id: str | None = None
        self.skipped: str | None = None
        self.count = 0

    def read(self, deadline_s: float, keep: Patterns | None = None) -> list[str]:
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
        # the tail's first read marks the end; another container later (recreated under
        # the name) is a new run: every line it holds is its own, none is old news
        first = self._id is None
        if self._id != container.id:
            self._id, self._last = container.id, None
            self._seen.clear()
            self._seen_set.clear()
        self.skipped = None
        if len(raw) > MAX_SCAN:
            self.skipped = (f"{len(raw) - MAX_SCAN} bytes of the container's newest "
                            f"{TAIL_LINES} lines not read (more than {MAX_SCAN} bytes)")
            raw = raw[-MAX_SCAN:]
        return self._new_lines(raw.splitlines(), first, keep)

    def _new_lines(self, lines: list[bytes], first: bool, keep: Patterns | None
                   ) -> list[str]:
        # "2026-08-20T10:00:00.123456789Z text": the stamp is Docker's, only a key; a line
        # without one is the rest of a line cut before it, never taken as new
        stamped = [line for line in lines if _DOCKER_STAMP.match(line.split(b" ", 1)[0])]
        keys = [hash(line) for line in stamped]
        if not first and self._last is not None and len(lines) >= TAIL_LINES \
                and self._last not in keys:
            self.skipped = _said(self.skipped, f"more than {TAIL_LINES} lines of the "
                                 "container's log since the last read: the older not read")
        new = []
        for line, key in zip(stamped, keys, strict=True):
            if key in self._seen_set:
                continue
            self._remember(key)
            if not first:
                new.append(line.split(b" ", 1)[-1])
        if keys:
            self._last = keys[-1]
        scan = Scan(keep)
        scan.add(b"".join(line + b"\n" for line in new))
        self.count = scan.count
        return scan.lines

    def _remember(self, key: int) -> None:
        if len(self._seen) == self._seen.maxlen:
            self._seen_set.discard(self._seen[0])
        self._seen.append(key)
        self._seen_set.add(key)


class JournalTail:
    """journalctl with a cursor shows the FIRST entries after it (`-n` counts from the
    cursor; only without one does it count back from the end): a read takes at most
    TAIL_LINES entries and MAX_SCAN bytes, and the next continues after the last taken,
    so a burst is read over a few cycles, never skipped (journald's default rate limit,
    10,000 a unit in 30 s, keeps a unit below 2,000 entries in a 5 s cycle)."""

    def __init__(self, unit: str) -> None:
        self.unit = unit
        self._cursor: str | None = None
        # the first read found the unit's journal empty: the next takes all it holds
        self._empty = False
        self.skipped: str | None = None
        self.count = 0

    def read(self, deadline_s: float, keep: Patterns | None = None) -> list[str]:
        # --all: without it `-o json` gives a field over 4096 bytes as null (a long line's
        # error lost); MESSAGE only (and the cursor, always there): less to move and parse
        args = ["journalctl", "--no-pager", "--quiet", "-o", "json", "--all",
                "--output-fields=MESSAGE", "--show-cursor", "-u", self.unit]
        if self._cursor is not None:
            args += ["--after-cursor", self._cursor, "-n", str(TAIL_LINES)]
        else:  # the newest entries (one more: when it comes, older ones were not read)
            args += ["-n", str(TAIL_LINES + 1) if self._empty else "0"]
        try:
            proc = subprocess.run(args, capture_output=True, timeout=deadline_s, check=False,
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise LogError(f"journalctl: {exc}") from exc
        if proc.returncode != 0:
            raise LogError(f"journalctl exited {proc.returncode}: "
                           f"{proc.stderr.decode(errors='replace')[-200:]}")
        self.skipped, self.count = None, 0
        entries, end = _journal_entries(proc.stdout)
        first = self._cursor is None and not self._empty
        if self._cursor is None and len(entries) > TAIL_LINES:
            self.skipped = (f"more than {TAIL_LINES} entries of the journal of {self.unit} "
                            "since the first read: the older not read")
            entries = entries[-TAIL_LINES:]
        taken = _within_bound(entries)
        if taken < len(entries):
            end = entries[taken - 1][1] or end
        if end is None:
            self._empty = self._cursor is None
        else:
            self._cursor = end
        if first:
            return []
        scan = Scan(keep)
        scan.add(b"".join(message + b"\n" for message, _ in entries[:taken]))
        self.count = scan.count
        return scan.lines


def _within_bound(entries: list[tuple[bytes, str | None]]) -> int:
    """How many of the entries fit in MAX_SCAN bytes (one at least): the rest are read
    at the next read, after the last one taken."""
    taken, size = 0, 0
    for message, _ in entries:
        size += len(message) + 1
        if size > MAX_SCAN and taken:
            break
        taken += 1
    return taken


def _journal_entries(out: bytes) -> tuple[list[tuple[bytes, str | None]], str | None]:
    """Each entry's MESSAGE and cursor (`-o json`, one a line), and the cursor after the
    last (`--show-cursor`)."""
    entries: list[tuple[bytes, str | None]] = []
    end = None
    for line in out.splitlines():
        if line.startswith(b"-- cursor: "):
            end = line[len(b"-- cursor: "):].decode(errors="replace")
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        message = entry.get("MESSAGE")
        if isinstance(message, list):  # not UTF-8: journalctl gives its bytes
            message = bytes(b & 0xFF for b in message if isinstance(b, int))
        elif isinstance(message, str):
            message = message.encode()
        else:
            message = b""
        cursor = entry.get("__CURSOR")
        # a message of several lines is one entry: each of its lines is matched
        entries.append((message.rstrip(b"\n"), cursor if isinstance(cursor, str) else None))
        end = entries[-1][1] or end
    return entries, end


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
