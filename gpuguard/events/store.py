"""The event store: what happened on this host, on disk, across reboots (docs/events.md).

One SQLite file (standard library) in the state directory, `events.db`: rule transitions,
Xids, supervisor transitions, acknowledgements and probe results, each with its time, the
boot id and the GPU's lasting identity (serial and UUID besides index and bus id, so that
history follows the board).

The store never blocks or breaks a cycle. The writer keeps events in a bounded queue in
memory and writes them in one short transaction (`flush`), which the daemon calls from
its own thread: a lock held by someone else (busy_timeout 100 ms) leaves them queued for
the next flush; a full disk or a read-only file drops them, counted; a corrupt file is
moved aside (`events.db.corrupt-<time>`, the newest 3 kept), a new one started, logged
once and counted.
Readers open the file read-only (`mode=ro`), so any user can read and no reader blocks
the writer (WAL). Retention: by age (90 days) and by size (64 MiB of the main file: the
oldest events go first, then an incremental vacuum gives the pages back).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from gpuguard.model.identity import finding_key, stored

log = structlog.get_logger("gpuguard.events")

FILENAME = "events.db"
SCHEMA_VERSION = 1
DEFAULT_MAX_AGE_S = 90 * 86400.0
DEFAULT_MAX_BYTES = 64 * 2**20
BUSY_TIMEOUT_MS = 100
QUEUE_MAX = 10_000
KINDS = ("rule", "xid", "supervisor", "ack", "probe")  # `gpuguard events --kind`
# How often a writer applies the retention (it checks the size on every flush)
AGE_PRUNE_EVERY_S = 3600.0
# Corrupt stores moved aside (events.db.corrupt-<time>) kept for a post-mortem, newest first
CORRUPT_KEPT = 3

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    time REAL NOT NULL,
    boot_id TEXT,
    kind TEXT NOT NULL,
    source TEXT NOT NULL,
    rule TEXT,
    code INTEGER,
    seq INTEGER,
    gpu_index INTEGER,
    gpu_uuid TEXT,
    gpu_serial TEXT,
    gpu_bus_id TEXT,
    old_status TEXT,
    status TEXT,
    action TEXT,
    message TEXT NOT NULL DEFAULT '',
    data TEXT
);
CREATE INDEX IF NOT EXISTS events_time ON events(time);
CREATE INDEX IF NOT EXISTS events_rule_gpu ON events(rule, gpu_uuid, kind, time);
-- a kernel-log line is recorded once per boot, however many runs read it
CREATE UNIQUE INDEX IF NOT EXISTS events_kmsg_line ON events(kind, boot_id, seq)
    WHERE seq IS NOT NULL;
"""
COLUMNS = ("time", "boot_id", "kind", "source", "rule", "code", "seq", "gpu_index", "gpu_uuid",
           "gpu_serial", "gpu_bus_id", "old_status", "status", "action", "message", "data")
# SQLite's primary result codes that mean "try again later" rather than "cannot write"
_BUSY = (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED


@dataclass
class Event:
    kind: str  # one of KINDS
    source: str  # daemon, check, cli, supervisor, kmsg, nvml, probe
    time: float = field(default_factory=time.time)
    boot_id: str | None = None
    rule: str | None = None
    code: int | None = None  # the Xid or SXid number
    seq: int | None = None  # the kernel log's sequence number of the line
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    gpu_serial: str | None = None
    gpu_bus_id: str | None = None
    old_status: str | None = None
    status: str | None = None
    action: str | None = None
    message: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def row(self) -> tuple[Any, ...]:
        values = {**self.__dict__, "data": json.dumps(self.data) if self.data else None,
                  "message": self.message[:2000]}
        return tuple(values[c] for c in COLUMNS)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def path_in(state_dir: Path) -> Path:
    return state_dir / FILENAME


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
            conn.executescript(_SCHEMA)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _size(conn: sqlite3.Connection) -> int:
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    size = conn.execute("PRAGMA page_size").fetchone()[0]
    return int(pages) * int(size)


def move_aside(path: Path) -> Path | None:
    """A corrupt store keeps its bytes for a post-mortem, out of the way; only the newest
    CORRUPT_KEPT copies stay (a failing disk corrupts again and again: up to 64 MiB each)."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    try:
        os.replace(path, aside)
    except FileNotFoundError:
        return None
    except OSError:
        return None
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(OSError):
            os.replace(f"{path}{suffix}", f"{aside}{suffix}")
    remove_old_copies(path)
    return aside


def remove_old_copies(path: Path, keep: int = CORRUPT_KEPT) -> None:
    """All but the newest `keep` corrupt copies of `path` (and their -wal/-shm) go. Only
    names move_aside makes are touched; the UTC stamp sorts by time."""
    pattern = re.compile(re.escape(path.name) + r"\.corrupt-(\d{8}T\d{6})(-wal|-shm)?")
    try:
        names = [p.name for p in path.parent.iterdir()]
    except OSError:
        return
    stamps = sorted({m.group(1) for m in map(pattern.fullmatch, names) if m}, reverse=True)
    old = set(stamps[keep:])
    for name in names:
        found = pattern.fullmatch(name)
        if found and found.group(1) in old:
            with contextlib.suppress(OSError):
                (path.parent / name).unlink()


# --- reading ---------------------------------------------------------------------------


class StoreUnreadable(Exception):
    pass


def open_reader(path: Path) -> sqlite3.Connection:
    """A read-only connection: any user, never a writer's lock. A store whose writer has
    closed it (no -wal file) and whose folder this user cannot write is read as immutable."""
    if not path.is_file():
        raise StoreUnreadable(f"{path}: no event store (the daemon or `check --record` "
                              "makes one)")
    for extra in ("mode=ro", "immutable=1"):
        try:
            conn = sqlite3.connect(f"file:{path}?{extra}", uri=True,
                                   timeout=BUSY_TIMEOUT_MS / 1000)
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.OperationalError as exc:
            last: Exception = exc
            continue
        except sqlite3.DatabaseError as exc:
            raise StoreUnreadable(f"{path}: not a readable event store ({exc})") from exc
        if version != SCHEMA_VERSION:
            conn.close()
            raise StoreUnreadable(f"{path}: schema {version}, this gpuguard reads "
                                  f"{SCHEMA_VERSION}")
        return conn
    raise StoreUnreadable(f"{path}: {last}")


def last_statuses(conn: sqlite3.Connection) -> dict[tuple[str, str], str]:
    rows = conn.execute(
        "SELECT rule, gpu_uuid, gpu_index, status FROM events WHERE id IN "
        "(SELECT max(id) FROM events WHERE kind = 'rule' GROUP BY rule, gpu_uuid, gpu_index)")
    return {finding_key(r, stored(u, i)): s for r, u, i, s in rows}


def query(conn: sqlite3.Connection, since: float | None = None, kinds: Iterable[str] = (),
          rule: str | None = None, gpu: str | None = None, limit: int = 1000) -> Iterator[Event]:
    """Events, newest first. `gpu`: an index, a UUID or a serial."""
    where: list[str] = ["1"]
    args: list[Any] = []
    if since is not None:
        where.append("time >= ?")
        args.append(since)
    kinds = list(kinds)
    if kinds:
        where.append(f"kind IN ({', '.join('?' * len(kinds))})")
        args.extend(kinds)
    if rule is not None:
        where.append("rule = ?")
        args.append(rule)
    if gpu is not None:
        if gpu.isdigit():  # an index, or a serial (all digits on NVIDIA boards)
            where.append("(gpu_index = ? OR gpu_serial = ?)")
            args.extend([int(gpu), gpu])
        else:
            where.append("(gpu_uuid = ? OR gpu_serial = ?)")
            args.extend([gpu, gpu])
    sql = (f"SELECT {', '.join(COLUMNS)} FROM events WHERE {' AND '.join(where)} "
           "ORDER BY time DESC, id DESC LIMIT ?")
    for row in conn.execute(sql, [*args, limit]):
        values = dict(zip(COLUMNS, row, strict=True))
        values["data"] = json.loads(values["data"]) if values["data"] else {}
        values["message"] = values["message"] or ""
        yield Event(**values)
