"""The event store's one writer (the daemon, or one `check --record`): docs/events.md.

The store never blocks or breaks a cycle. The writer keeps events in a bounded queue in
memory and writes them in one short transaction (`flush`), which the daemon calls from
its own thread: a lock held by someone else (busy_timeout 100 ms) leaves them queued for
the next flush; a full disk or a read-only file drops them, counted; a corrupt file is
moved aside (gpuguard.events.corrupt_store), a new one started, logged once and counted.
Retention: by age (90 days) and by size (64 MiB of the main file: the oldest events go
first, then an incremental vacuum gives the pages back).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from gpuguard.events.corrupt_store import move_aside
from gpuguard.events.store import (
    BUSY_TIMEOUT_MS,
    COLUMNS,
    SCHEMA,
    SCHEMA_VERSION,
    Event,
    last_statuses,
)

log = structlog.get_logger("gpuguard.events")

DEFAULT_MAX_AGE_S = 90 * 86400.0
DEFAULT_MAX_BYTES = 64 * 2**20
QUEUE_MAX = 10_000
# How often a writer applies the retention (it checks the size on every flush)
AGE_PRUNE_EVERY_S = 3600.0
# SQLite's primary result codes that mean "try again later" rather than "cannot write"
_BUSY = (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED


@dataclass
class WriterStats:
    written: int = 0
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> events
    busy: int = 0  # flushes that found the file locked (the events stayed queued)
    corrupt_moved: int = 0
    queued: int = 0
    last_flush_s: float = 0.0
    size_bytes: int = 0


class EventWriter:
    """The one writer of a store (the daemon, or one `check --record`). `record()` only
    queues (bounded); `flush()` writes, in at most about busy_timeout plus the write."""

    def __init__(self, path: Path, boot_id: str | None = None,
                 max_age_s: float = DEFAULT_MAX_AGE_S, max_bytes: int = DEFAULT_MAX_BYTES,
                 queue_max: int = QUEUE_MAX,
                 clock: Callable[[], float] = time.time,
                 integrity_check: bool = True) -> None:
        self.path = path
        # PRAGMA quick_check on open: the daemon's thread affords it (a full 64 MiB store
        # takes a fraction of a second); a command leaves corruption to its first write
        self.integrity_check = integrity_check
        self.clock = clock  # what the age bound counts from (a simulation's own clock)
        self.boot_id = boot_id
        self.max_age_s = max_age_s
        self.max_bytes = max_bytes
        self.stats = WriterStats()
        self._queue: deque[Event] = deque()
        self._queue_max = queue_max
        self._lock = threading.Lock()  # the queue and the stats
        self._flush_lock = threading.Lock()  # one flush at a time
        self._conn: sqlite3.Connection | None = None
        self._last_age_prune = 0.0
        self._open_failed_logged = False

    # --- queue -----------------------------------------------------------------------

    def record(self, event: Event) -> None:
        if event.boot_id is None:
            event.boot_id = self.boot_id
        with self._lock:
            if len(self._queue) >= self._queue_max:
                self._queue.popleft()  # the oldest goes: the newest says most about now
                self._drop("queue_full", 1)
            self._queue.append(event)
            self.stats.queued = len(self._queue)

    def record_all(self, events: Iterable[Event]) -> None:
        for event in events:
            self.record(event)

    def _drop(self, reason: str, n: int) -> None:
        self.stats.dropped[reason] = self.stats.dropped.get(reason, 0) + n

    # --- writing ---------------------------------------------------------------------

    def flush(self) -> int:
        """Write what is queued; return how many were written. Never raises."""
        if not self._flush_lock.acquire(blocking=False):
            return 0  # another flush is under way: its events are ours too
        started = time.monotonic()
        try:
            with self._lock:
                batch = list(self._queue)
            if not batch:
                self._retain_if_due()
                return 0
            written = self._write(batch)
            if written:
                self._retain_if_due()
            return written
        finally:
            self.stats.last_flush_s = time.monotonic() - started
            self._flush_lock.release()

    def _write(self, batch: list[Event]) -> int:
        try:
            conn = self._connection()
            with conn:  # one transaction
                conn.executemany(
                    f"INSERT OR IGNORE INTO events ({', '.join(COLUMNS)}) VALUES "
                    f"({', '.join('?' * len(COLUMNS))})", [e.row() for e in batch])
        except sqlite3.OperationalError as exc:
            code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
            if code in _BUSY:
                with self._lock:
                    self.stats.busy += 1  # queued still: the next flush tries again
                return 0
            self._forget(batch, _reason(code), exc)
            return 0
        except sqlite3.DatabaseError as exc:
            self._corrupt(exc)
            return 0  # the batch stays queued for the new file
        except OSError as exc:  # the state directory cannot be made, or moved aside
            self._forget(batch, "os_error", exc)
            return 0
        with self._lock:
            for _ in batch:
                self._queue.popleft()
            self.stats.written += len(batch)
            self.stats.queued = len(self._queue)
        return len(batch)

    def _forget(self, batch: list[Event], reason: str, exc: Exception) -> None:
        """The file cannot take them (full disk, read-only, I/O error): dropped, counted,
        logged once per reason; the cycle goes on."""
        with self._lock:
            for _ in batch:
                if self._queue:
                    self._queue.popleft()
            first = reason not in self.stats.dropped
            self._drop(reason, len(batch))
            self.stats.queued = len(self._queue)
        if first:
            log.error("event_store_write_failed", path=str(self.path), reason=reason,
                      error=str(exc), dropped="events until it can write again")
        self.close()  # reopen next time: the disk may have room again

    def _corrupt(self, exc: Exception) -> None:
        self.close()
        aside = move_aside(self.path)
        with self._lock:
            self.stats.corrupt_moved += 1
        log.error("event_store_corrupt", path=str(self.path), error=str(exc),
                  moved_to=str(aside) if aside else None, action="started a new store")

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000,
                               isolation_level="DEFERRED", check_same_thread=False)
        # Any user may read (`gpuguard events`), whatever the umask (the unit's is 0077):
        # SQLite gives the -wal and -shm files the main file's mode, so it goes first.
        with contextlib.suppress(OSError):
            os.chmod(self.path, 0o644)
        try:
            _prepare(conn, self.integrity_check)
        except sqlite3.Error:
            conn.close()
            raise
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(OSError):
                os.chmod(f"{self.path}{suffix}", 0o644)
        self._conn = conn
        return conn

    def _retain_if_due(self) -> None:
        """Age and size bounds. Errors here are the next write's to report."""
        if self._conn is None:
            return
        try:
            now = self.clock()
            if now - self._last_age_prune >= AGE_PRUNE_EVERY_S:
                with self._conn:
                    self._conn.execute("DELETE FROM events WHERE time < ?",
                                       (now - self.max_age_s,))
                self._last_age_prune = now
                self._conn.execute("PRAGMA incremental_vacuum")
            self._bound_size()
        except sqlite3.Error:
            pass

    def _bound_size(self) -> None:
        assert self._conn is not None
        conn = self._conn
        size = _size(conn)
        while size > self.max_bytes:
            total = conn.execute("SELECT count(*) FROM events").fetchone()[0]
            if not total:
                break
            # a tenth of what is there, oldest first, then the freed pages go back
            with conn:
                conn.execute("DELETE FROM events WHERE id IN (SELECT id FROM events "
                             "ORDER BY id LIMIT ?)", (max(100, total // 10),))
            conn.execute("PRAGMA incremental_vacuum")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            new = _size(conn)
            if new >= size:
                break
            size = new
        self.stats.size_bytes = size

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None

    def last_statuses(self) -> dict[tuple[str, str], str]:
        """The last recorded status of each rule and GPU (identity.finding_key), to compare a
        run with; {} when the store cannot be read (every non-ok result is then news)."""
        try:
            conn = self._connection()
            return last_statuses(conn)
        except sqlite3.DatabaseError as exc:
            if not isinstance(exc, sqlite3.OperationalError):
                self._corrupt(exc)
            return {}
        except OSError:
            return {}


_REASONS = {13: "disk_full", 8: "read_only", 10: "io_error", 14: "cannot_open"}
DROP_REASONS = (*_REASONS.values(), "write_error", "os_error", "queue_full")


def _reason(code: int) -> str:
    return _REASONS.get(code, "write_error")


def _prepare(conn: sqlite3.Connection, integrity_check: bool = True) -> None:
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version == 0:
        # auto_vacuum takes effect only before the first table is made
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    ok = "ok" if version == 0 or not integrity_check else \
        conn.execute("PRAGMA quick_check").fetchone()[0]
    if ok != "ok":
        raise sqlite3.DatabaseError(f"quick_check: {ok}")
    if version > SCHEMA_VERSION:
        raise sqlite3.OperationalError(f"schema {version} is newer than this gpuguard's "
                                       f"{SCHEMA_VERSION}")
    if version < SCHEMA_VERSION:
        with conn:
            conn.executescript(SCHEMA)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _size(conn: sqlite3.Connection) -> int:
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    size = conn.execute("PRAGMA page_size").fetchone()[0]
    return int(pages) * int(size)
