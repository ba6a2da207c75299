"""The event store: what happened on this host, on disk, across reboots (docs/events.md).

One SQLite file (standard library) in the state directory, `events.db`: rule transitions,
Xids, supervisor transitions, acknowledgements and probe results, each with its time, the
boot id and the GPU's lasting identity (serial and UUID besides index and bus id, so that
history follows the board).

This module holds the file's shape (its schema, an Event as a row) and the reading side:
readers open the file read-only (`mode=ro`), so any user can read and no reader blocks
the writer (WAL). Every row read is checked (gpuguard.events.rows): a bad one is skipped
and counted, never trusted. The one writer is gpuguard.events.writer; a corrupt file is
moved aside by gpuguard.events.corrupt_store.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuguard.events.kinds import KINDS
from gpuguard.events.rows import Skipped, names_in, valid_event
from gpuguard.model.identity import finding_key, stored
from gpuguard.model.results import NAMES

FILENAME = "events.db"
# 2: the index of the acks of a boot (issue 20: the ack query scanned the whole table).
SCHEMA_VERSION = 2
# What a reader reads: a store of schema 1 is read as it is until its writer migrates it
# (the queries are the same, only slower).
READABLE_VERSIONS = (1, 2)
BUSY_TIMEOUT_MS = 100

SCHEMA = """
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
-- schema 2: the acks of a boot (gpuguard.events.acks), which every `check` with a store
-- reads, without a scan of the table; partial: it costs a row per ack, not per event
CREATE INDEX IF NOT EXISTS events_acks ON events(boot_id, time) WHERE kind = 'ack';
"""
COLUMNS = ("time", "boot_id", "kind", "source", "rule", "code", "seq", "gpu_index", "gpu_uuid",
           "gpu_serial", "gpu_bus_id", "old_status", "status", "action", "message", "data")


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
        if version not in READABLE_VERSIONS:
            conn.close()
            raise StoreUnreadable(f"{path}: schema {version}, this gpuguard reads "
                                  f"{', '.join(map(str, READABLE_VERSIONS))}")
        return conn
    raise StoreUnreadable(f"{path}: {last}")


def board_where(uuid: str | None, index: int | None) -> tuple[str, tuple[Any, ...]]:
    """The rows of one board (identity.board_key): its UUID, the index where none was
    read, neither for a host finding. IS lets the (kind, rule, gpu_uuid, ...) index serve."""
    if uuid is not None:
        return "gpu_uuid = ?", (uuid,)
    return "gpu_uuid IS NULL AND gpu_index IS ?", (index,)


# A finding as the store last recorded it: its status and the set it names (NAMES).
Finding = tuple[str, tuple[str, ...]]


def last_findings(conn: sqlite3.Connection,
                  skipped: Skipped | None = None) -> dict[tuple[str, str], Finding]:
    """The last recorded transition of each rule on each board (identity.finding_key): its
    status and names. A last row that is bad leaves its finding out (counted in
    `skipped`): the next result of it is news, recorded again."""
    skipped = Skipped() if skipped is None else skipped
    rows = conn.execute(
        f"SELECT id, {', '.join(COLUMNS)} FROM events WHERE id IN "
        "(SELECT max(id) FROM events WHERE kind = 'rule' GROUP BY rule, gpu_uuid, gpu_index)"
    ).fetchall()
    out: dict[tuple[str, str], Finding] = {}
    for row_id, *columns in rows:
        values = valid_event(dict(zip(COLUMNS, columns, strict=True)), ("rule",))
        names = None if values is None else names_in(values["data"], NAMES)
        if values is None or names is None or values["rule"] is None:
            skipped.add(row_id)
            continue
        key = finding_key(values["rule"], stored(values["gpu_uuid"], values["gpu_index"]))
        out[key] = (values["status"], names)
    return out


def query(conn: sqlite3.Connection, since: float | None = None, kinds: Iterable[str] = (),
          rule: str | None = None, gpu: str | None = None, limit: int = 1000,
          skipped: Skipped | None = None) -> list[Event]:
    """Events, newest first. `gpu`: an index, a UUID or a serial. Every row is fetched
    before this returns (a reader holds no read transaction past its query, which would
    pin the WAL); a bad one is left out and counted in `skipped`."""
    where, args = _where(since, kinds, rule, gpu)
    sql = (f"SELECT id, {', '.join(COLUMNS)} FROM events WHERE {' AND '.join(where)} "
           "ORDER BY time DESC, id DESC LIMIT ?")
    return _events(conn.execute(sql, [*args, limit]).fetchall(), skipped)


# Rows per statement of batches(): a batch's Events and its output are all a reader
# holds at once, however many rows it shows.
BATCH = 500


def batches(conn: sqlite3.Connection, since: float, kinds: Iterable[str] = (),
            rule: str | None = None, gpu: str | None = None, limit: int = 1000,
            skipped: Skipped | None = None, size: int = BATCH) -> Iterator[list[Event]]:
    """query()'s events in batches of at most `size` rows, for a reader that shows them
    as they come (`gpuguard events`). Each batch is a statement of its own, run to its
    end before the batch is yielded (keyset paging on (time, id), the query's order), so
    no read transaction is open while the caller writes a batch to a pager that waits;
    a row written meanwhile is newer than the cursor and not shown, as it would not
    have been by one query. `since` is required: it keeps rows of no time (which sort
    last and compare to nothing) out, as the cursor needs."""
    where, args = _where(since, kinds, rule, gpu)
    columns = f"SELECT id, {', '.join(COLUMNS)} FROM events WHERE {' AND '.join(where)}"
    after: tuple[Any, Any] | None = None
    left = limit
    while left > 0:
        # `time <= ?` alone is what the time index can range over: the OR is then
        # judged on that range only, not on every row of the store each batch
        page = " AND time <= ? AND (time < ? OR id < ?)" if after is not None else ""
        cursor = [] if after is None else [after[0], after[0], after[1]]
        rows = conn.execute(f"{columns}{page} ORDER BY time DESC, id DESC LIMIT ?",
                            [*args, *cursor, min(size, left)]).fetchall()
        if not rows:
            return
        left -= len(rows)
        after = (rows[-1][1 + COLUMNS.index("time")], rows[-1][0])
        yield _events(rows, skipped)


def _where(since: float | None, kinds: Iterable[str], rule: str | None,
           gpu: str | None) -> tuple[list[str], list[Any]]:
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
    return where, args


def _events(rows: list[Any], skipped: Skipped | None) -> list[Event]:
    found = []
    for row_id, *columns in rows:
        values = valid_event(dict(zip(COLUMNS, columns, strict=True)), KINDS)
        if values is None:
            (skipped if skipped is not None else Skipped()).add(row_id)
            continue
        found.append(Event(**values))
    return found
