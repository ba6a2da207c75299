"""The event store's one writer (the daemon, or one `check --record`): docs/events.md.

The store never blocks or breaks a cycle. The writer keeps events in a bounded queue in
memory and writes them in one short transaction (`flush`), which the daemon calls from
its own thread: a lock held by someone else (busy_timeout 100 ms) leaves them queued for
the next flush; a full disk or a read-only file drops them, counted; a corrupt file is
moved aside (gpuguard.events.corrupt_store), a new one started, logged once and counted.
Its files are opened only when they are its own regular files (gpuguard.events.store_file)
and watched at every flush: a WAL deleted under it is noticed, what it held saved into the
main file where it can be, and what could not be counted as lost. Retention by age and by
size, the WAL counted: gpuguard.events.retention.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from gpuguard.events import store_file
from gpuguard.events.corrupt_store import move_aside
from gpuguard.events.retention import (
    AGE_PRUNE_EVERY_S,
    WAL_CHECKPOINT_BYTES,
    Retention,
    checkpoint,
    close_quietly,
    on_disk,
)
from gpuguard.events.rows import Skipped
from gpuguard.events.store import (
    BUSY_TIMEOUT_MS,
    COLUMNS,
    SCHEMA,
    SCHEMA_VERSION,
    Event,
    Finding,
    last_findings,
)

log = structlog.get_logger("gpuguard.events")

DEFAULT_MAX_AGE_S = 90 * 86400.0
DEFAULT_MAX_BYTES = 64 * 2**20
QUEUE_MAX = 10_000
# At most this many events in one transaction: the rest wait for the next flush, so one
# write grows the WAL past the size bound by a bounded amount (messages are <= 2,000
# characters)
BATCH_MAX = 2_000
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
    size_bytes: int = 0  # the main file and its WAL, on disk, after the last flush
    wal_bytes: int = 0
    wal_pinned: int = 0  # flushes held back: above the bound, a reader pins the WAL
    wal_replaced: int = 0  # times its files were deleted or replaced under it
    unsafe: int = 0  # opens refused: a store file that is a link, another user's, ...


class EventWriter:
    """The one writer of a store (the daemon, or one `check --record`). `record()` only
    queues (bounded); `flush()` writes, in at most about busy_timeout plus the write."""

    def __init__(self, path: Path, boot_id: str | None = None,
                 max_age_s: float = DEFAULT_MAX_AGE_S, max_bytes: int = DEFAULT_MAX_BYTES,
                 queue_max: int = QUEUE_MAX,
                 clock: Callable[[], float] = time.time,
                 integrity_check: bool = True,
                 age_prune_every_s: float = AGE_PRUNE_EVERY_S) -> None:
        self.path = path
        # PRAGMA quick_check on open: the daemon's thread affords it (a full 64 MiB store
        # takes a fraction of a second); a command leaves corruption to its first write
        self.integrity_check = integrity_check
        self.boot_id = boot_id
        # the wall clock (a simulation's own, or a test's shifted one): what event times
        # and the age bound count from; intervals are the monotonic clock's
        self.retention = Retention(max_age_s, max_bytes, clock, age_prune_every_s)
        self.stats = WriterStats()
        self.skipped = Skipped()  # bad rows met by this writer's reads
        self._queue: deque[Event] = deque()
        self._queue_max = queue_max
        self._lock = threading.Lock()  # the queue and the stats
        self._flush_lock = threading.Lock()  # one flush at a time
        self._conn: sqlite3.Connection | None = None
        self._watch: store_file.Watch | None = None
        self._since_checkpoint = 0  # events written since the WAL was last emptied
        self._logged: set[str] = set()

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

    def _log_once(self, what: str, **details: object) -> None:
        if what not in self._logged:
            self._logged.add(what)
            log.error(what, path=str(self.path), **details)

    # --- writing ---------------------------------------------------------------------

    def flush(self) -> int:
        """Write what is queued (up to BATCH_MAX); return how many were written. Never
        raises."""
        if not self._flush_lock.acquire(blocking=False):
            return 0  # another flush is under way: its events are ours too
        started = time.monotonic()
        try:
            with self._lock:
                batch = list(self._queue)[:BATCH_MAX]
            return self._flush(batch)
        finally:
            self.stats.last_flush_s = time.monotonic() - started
            self._flush_lock.release()

    def _flush(self, batch: list[Event]) -> int:
        if not batch and self._conn is None:
            return 0  # nothing to write, and no store opened to look after
        try:
            conn = self._connection()
            self._retain_by_age(conn)
            if not batch:
                self._bound_size(conn)
                return 0
            if self.retention.over_bound(conn, self.path):
                self._held_back()
                return 0
            with conn:  # one transaction
                conn.executemany(
                    f"INSERT OR IGNORE INTO events ({', '.join(COLUMNS)}) VALUES "
                    f"({', '.join('?' * len(COLUMNS))})", [e.row() for e in batch])
        except store_file.UnsafeFile as exc:
            self._refuse(batch, exc)
            return 0
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
        self._since_checkpoint += len(batch)
        self._bound_size(conn)
        return len(batch)

    def _held_back(self) -> None:
        """Above the bound with the WAL pinned: the events stay queued (bounded)."""
        main, wal = on_disk(self.path)
        with self._lock:
            self.stats.wal_pinned += 1
            self.stats.size_bytes, self.stats.wal_bytes = main + wal, wal
        self._log_once("event_store_wal_pinned", bound=self.retention.max_bytes,
                       action="events held in memory until the reader lets go",
                       hint="a reader holds a read transaction (fuser -v events.db*)")

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

    def _refuse(self, batch: list[Event], exc: store_file.UnsafeFile) -> None:
        """A store file that is not the writer's own regular file: never opened, never
        changed, left for the admin to see; the events are dropped, counted."""
        with self._lock:
            for _ in batch:
                if self._queue:
                    self._queue.popleft()
            self._drop("unsafe_file", len(batch))
            self.stats.unsafe += 1
            self.stats.queued = len(self._queue)
        self._log_once("event_store_unsafe_file", error=str(exc),
                       action="refused: events are dropped while this holds")
        self.close()

    def _corrupt(self, exc: Exception) -> None:
        self.close()
        aside = move_aside(self.path)
        with self._lock:
            self.stats.corrupt_moved += 1
        log.error("event_store_corrupt", path=str(self.path), error=str(exc),
                  moved_to=str(aside) if aside else None, action="started a new store")

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None:
            self._watch_files(self._conn)
        if self._conn is not None:
            return self._conn
        self.path.parent.mkdir(parents=True, exist_ok=True)
        main = store_file.prepare_main(self.path)
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000,
                               isolation_level="DEFERRED", check_same_thread=False)
        try:
            _prepare(conn, self.integrity_check)
            self._watch = store_file.check_opened(self.path, main)
        except (sqlite3.Error, store_file.UnsafeFile):
            conn.close()
            raise
        self._conn = conn
        self._since_checkpoint = 0
        self.retention.opened()
        return conn

    def _watch_files(self, conn: sqlite3.Connection) -> None:
        """The files deleted or replaced since they were opened (a -wal removed by hand):
        what the old WAL holds is copied into the main file through the connection that
        still has it open, then the store is opened again. What could not be saved is
        counted (`wal_lost`), never claimed written."""
        changed = [] if self._watch is None else self._watch.changed(self.path)
        if not changed:
            return
        saved = checkpoint(conn)
        # at most: SQLite's own checkpoints may have saved some of them already
        lost = 0 if saved else self._since_checkpoint
        with self._lock:
            self.stats.wal_replaced += 1
            if lost:
                self._drop("wal_lost", lost)
        log.error("event_store_files_replaced", path=str(self.path), files=changed,
                  saved=saved, lost=lost, action="opened the store again")
        self.close()

    def _retain_by_age(self, conn: sqlite3.Connection) -> None:
        with contextlib.suppress(sqlite3.Error):  # the next write says why
            self.retention.prune_age(conn)

    def _bound_size(self, conn: sqlite3.Connection) -> None:
        try:
            size, wal, pinned = self.retention.bound_size(conn, self.path)
        except sqlite3.Error:
            return
        if wal == 0 and not pinned:
            self._since_checkpoint = 0  # everything written is in the main file
        with self._lock:
            self.stats.size_bytes, self.stats.wal_bytes = size, wal

    def close(self) -> None:
        if self._conn is not None:
            close_quietly(self._conn)
            self._conn = None
            self._watch = None

    def last_findings(self) -> dict[tuple[str, str], Finding]:
        """The last recorded finding (status, names) of each rule and GPU
        (identity.finding_key), to compare a run with; {} when the store cannot be read
        (every non-ok result is then news)."""
        try:
            conn = self._connection()
            return last_findings(conn, self.skipped)
        except store_file.UnsafeFile as exc:
            self._refuse([], exc)
            return {}
        except sqlite3.DatabaseError as exc:
            if not isinstance(exc, sqlite3.OperationalError):
                self._corrupt(exc)
            return {}
        except OSError:
            return {}


_REASONS = {13: "disk_full", 8: "read_only", 10: "io_error", 14: "cannot_open"}
DROP_REASONS = (*_REASONS.values(), "write_error", "os_error", "queue_full", "unsafe_file",
                "wal_lost")


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
    # after a checkpoint that resets the WAL, SQLite truncates it to this size
    conn.execute(f"PRAGMA journal_size_limit = {WAL_CHECKPOINT_BYTES}")
    ok = "ok" if version == 0 or not integrity_check else \
        conn.execute("PRAGMA quick_check").fetchone()[0]
    if ok != "ok":
        raise sqlite3.DatabaseError(f"quick_check: {ok}")
    if version > SCHEMA_VERSION:
        raise sqlite3.OperationalError(f"schema {version} is newer than this gpuguard's "
                                       f"{SCHEMA_VERSION}")
    if version < SCHEMA_VERSION:
        # 0 -> 2 makes the table; 1 -> 2 adds the indexes of schema 2 (IF NOT EXISTS)
        with conn:
            conn.executescript(SCHEMA)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

