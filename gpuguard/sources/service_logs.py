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
  the name is read from its first line; a variant seen to start, from after its
  previous run's end;
- the journal (systemd): gpuguard/sources/journal_tail.py, after the last cursor: the
  first TAIL_LINES entries after it, the rest at the next read (a backlog, never skipped).

The first read of a log only marks where it ends: what it held before gpuguard watched is
not news. A variant the daemon saw start (`from_start`, a failover) is read from its run's
start where the backend can tell it exactly (the journal; not Docker: tail_for).

Each read scans at most MAX_SCAN bytes (every byte up to that, not the newest ones),
within its deadline; a line is matched whole up to MAX_LINE bytes (a longer one in
overlapping pieces). What a bound or the deadline leaves unread is skipped and said
(`skipped`: service.gpu_errors is unknown, never a silent ok). Whatever goes wrong is an
error of that read (LogError), never the cycle's.
"""

from __future__ import annotations

import io
import os
import re
import stat
import time
from collections import deque
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from gpuguard.sources.journal_tail import JournalTail
from gpuguard.sources.log_scan import (
    MAX_LINE,
    MAX_SCAN,
    SHOWN,
    TAIL_LINES,
    LogError,
    Patterns,
    Scan,
)

__all__ = ["MAX_LINE", "MAX_SCAN", "SHOWN", "TAIL_LINES", "DockerTail", "FileTail",
           "JournalTail", "LogError", "Patterns", "matches", "tail_for"]

CHUNK = 1024 * 1024  # what one read holds in memory at once (file)
OVERLAP = 4096  # bytes two pieces of a line longer than MAX_LINE share
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
    def __init__(self, container: str, from_start: bool = False) -> None:
        self.container = container
        # the first read takes the lines of the container's current run (_run_start), not
        # none: exact for a container's first run only, so the daemon does not ask for it
        # (tail_for: a restarted run's lines are not told apart by Docker's stamps)
        self.from_start = from_start
        # hashes of the lines seen (stamp and text): memory bounded whatever a line holds
        self._seen: deque[int] = deque(maxlen=TAIL_LINES * 2)
        self._seen_set: set[int] = set()
        self._last: int | None = None  # the newest line of the last read
        self._id: str | None = None
        self._seen_before_cut = False
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
        start_ns = None
        if first and self.from_start and container.status == "running":
            start_ns = _run_start(container.attrs.get("State") or {})
        if self._id != container.id:
            self._id, self._last = container.id, None
            self._seen.clear()
            self._seen_set.clear()
        self.skipped = None
        cut = max(len(raw) - MAX_SCAN, 0)
        lines = self._new_lines(raw[cut:].splitlines(), first and start_ns is None, keep,
                                start_ns)
        if cut and not self._seen_before_cut:
            self.skipped = _said(self.skipped, f"{cut} bytes of the container's newest "
                                 f"{TAIL_LINES} lines not read (more than {MAX_SCAN} bytes)")
        return lines

    def _new_lines(self, lines: list[bytes], first: bool, keep: Patterns | None,
                   start_ns: int | None = None) -> list[str]:
        # "2026-08-20T10:00:00.123456789Z text": the stamp is Docker's, only a key; a line
        # without one is the rest of a line cut before it, never taken as new
        stamped = [line for line in lines if _DOCKER_STAMP.match(line.split(b" ", 1)[0])]
        keys = [hash(line) for line in stamped]
        self._note_gap(first, len(lines), keys)
        new = []
        for line, key in zip(stamped, keys, strict=True):
            if key in self._seen_set:
                continue
            self._remember(key)
            stamp, _, text = line.partition(b" ")
            if not first and _in_run(stamp, start_ns):
                new.append(text)  # not before gpuguard watched, nor the previous run's
        if keys:
            self._last = keys[-1]
        scan = Scan(keep)
        scan.add(b"".join(line + b"\n" for line in new))
        self.count = scan.count
        return scan.lines

    def _note_gap(self, first: bool, count: int, keys: list[int]) -> None:
        """Whether lines were left out: the last read's newest line not among the newest
        TAIL_LINES. Still there, a byte cut left out only lines read before it."""
        kept = self._last is not None and self._last in keys
        self._seen_before_cut = first or kept
        if not first and self._last is not None and count >= TAIL_LINES and not kept:
            self.skipped = _said(self.skipped, f"more than {TAIL_LINES} lines of the "
                                 "container's log since the last read: the older not read")

    def _remember(self, key: int) -> None:
        if len(self._seen) == self._seen.maxlen:
            self._seen_set.discard(self._seen[0])
        self._seen.append(key)
        self._seen_set.add(key)


def _run_start(state: dict[str, Any]) -> int | None:
    """Where the container's current run begins in its log: after its previous run's end
    (State.FinishedAt, kept while it runs again; Docker sets it once that run's output
    was copied), 0 for a first run (every line is its own). Not StartedAt: the process
    writes before Docker stamps its start (a first line 'before' it, measured)."""
    started = _stamp_ns(str(state.get("StartedAt", "")))
    finished = _stamp_ns(str(state.get("FinishedAt", "")))
    if finished is None or started is None:
        return started
    return finished if 0 < finished <= started else 0


def _in_run(stamp: bytes, start_ns: int | None) -> bool:
    """Whether a line stamped `stamp` is of the run started at `start_ns` (None: any)."""
    return start_ns is None or (_stamp_ns(stamp.decode(errors="replace")) or 0) >= start_ns


def _stamp_ns(text: str) -> int | None:
    """Docker's RFC 3339 time in UTC (`Z`; nanoseconds, fixed in log stamps, trimmed in
    State.StartedAt) as nanoseconds since the epoch; None when unreadable."""
    match = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?Z$", text)
    if match is None:
        return None
    try:
        seconds = datetime.fromisoformat(match.group(1) + "+00:00").timestamp()
    except ValueError:
        return None
    return int(seconds) * 10**9 + int((match.group(2) or "0").ljust(9, "0"))


def tail_for(backend: str, config: dict[str, Any], variant: str, from_start: bool = False
             ) -> Any:
    """The tail of a variant's log, or None where the backend names none. `from_start`:
    the daemon saw the variant start (a failover), so its first read takes the lines of
    the variant's current run where the backend can tell them exactly (the journal: the
    unit's InvocationID). Docker cannot: it stamps a line when its copier reads it, which
    under load comes after the run's FinishedAt, so the crashed run's error came back as
    new (a false failover; CI saw it): its first read marks the end, as a file's does."""
    if backend == "exec":
        path = config.get(f"log_file_{variant}")
        return FileTail(str(path)) if path else None
    if backend == "docker":
        return DockerTail(str(config[variant]["name"]))
    if backend == "systemd":
        return JournalTail(str(config[variant]), from_start)
    return None


def matches(lines: Iterable[str], kind_of: Any) -> list[tuple[str, str]]:
    """(kind, line) of each line that reports a GPU error."""
    found = []
    for line in lines:
        kind = kind_of(line)
        if kind is not None:
            found.append((kind, line))
    return found
