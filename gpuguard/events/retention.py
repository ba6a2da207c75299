"""What the store's writer deletes, and when: by age and by size, the WAL counted in the
size (docs/events.md, "Retention").

By age: events older than the retention age (90 days) go, checked hourly by the
monotonic clock. The wall clock can jump (an NTP step, a VM restored, a clock 100 days
ahead for a few seconds), and a jump must not delete the store: the age counts from the
earliest of three witnesses of the present, the wall clock now, the wall clock when the
writer opened the store carried forward by the monotonic clock, and the newest event
stored. So retention never deletes past the newest stored event minus the retention age,
and a jump that fools one witness deletes nothing the others call recent.

By size: the main file and its WAL together stay under the bound (64 MiB). The WAL is
checkpointed and truncated whenever no reader pins it (PRAGMA journal_size_limit, and a
TRUNCATE checkpoint once it passes WAL_CHECKPOINT_BYTES). A reader that holds a read
transaction pins it, and gpuguard cannot end another user's transaction: then the writer
holds its events back (queued, bounded) rather than grow the WAL past the bound, and
says so (WriterStats.wal_pinned, the size metric, the GPUGuardEventStoreOverBound alert).
"""

from __future__ import annotations

import contextlib
import math
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuguard.events.rows import MAX_TIME

# How often the age bound is applied (monotonic seconds); the size bound, every flush
AGE_PRUNE_EVERY_S = 3600.0
# The WAL is checkpointed and truncated (when no reader pins it) once it is this large;
# SQLite truncates it to this size after each checkpoint that resets it
WAL_CHECKPOINT_BYTES = 4 * 2**20


def on_disk(path: Path) -> tuple[int, int]:
    """The main file's size and the WAL's, as the disk holds them."""
    sizes = []
    for name in (path, Path(f"{path}-wal")):
        try:
            sizes.append(name.stat().st_size)
        except OSError:
            sizes.append(0)
    return sizes[0], sizes[1]


def checkpoint(conn: sqlite3.Connection) -> bool:
    """Copy the WAL into the main file and truncate it; False when a reader pins it
    (or the file cannot be written: the next write says why)."""
    try:
        busy, log, done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    except sqlite3.Error:
        return False
    return not busy and log == done


def vacuum_freed(conn: sqlite3.Connection) -> None:
    """The free pages given back to the file system. executescript steps the pragma to
    its end: execute() steps it once, which frees one page."""
    conn.executescript("PRAGMA incremental_vacuum;")


def _logical_size(conn: sqlite3.Connection) -> int:
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    size = conn.execute("PRAGMA page_size").fetchone()[0]
    return int(pages) * int(size)


@dataclass
class Retention:
    max_age_s: float
    max_bytes: int
    clock: Callable[[], float]  # the wall clock
    every_s: float = AGE_PRUNE_EVERY_S
    monotonic: Callable[[], float] = time.monotonic
    _opened: tuple[float, float] | None = None  # (wall, monotonic) when the store opened
    _last_prune: float | None = None  # monotonic

    def opened(self) -> None:
        """The store was (re)opened: the wall clock now is one witness of the present."""
        if self._opened is None:
            self._opened = (self.clock(), self.monotonic())

    def age_due(self) -> bool:
        now = self.monotonic()
        return self._last_prune is None or now - self._last_prune >= self.every_s

    def cutoff(self, conn: sqlite3.Connection) -> float | None:
        """Events before this time go; None: nothing to go (no event, no witness)."""
        newest = conn.execute(
            "SELECT max(time) FROM events WHERE typeof(time) IN ('real', 'integer') "
            "AND time <= ?", (MAX_TIME,)).fetchone()[0]
        if newest is None:
            return None
        present = [self.clock(), float(newest)]
        if self._opened is not None:
            wall, mono = self._opened
            present.append(wall + (self.monotonic() - mono))
        earliest = min(present)
        return earliest - self.max_age_s if math.isfinite(earliest) else None

    def prune_age(self, conn: sqlite3.Connection) -> int:
        """The age bound, when due (before a batch is written: the newest event it
        counts from is one written before)."""
        if not self.age_due():
            return 0
        self._last_prune = self.monotonic()
        cutoff = self.cutoff(conn)
        if cutoff is None:
            return 0
        with conn:
            deleted = conn.execute("DELETE FROM events WHERE time < ?", (cutoff,)).rowcount
        vacuum_freed(conn)
        return int(deleted)

    def over_bound(self, conn: sqlite3.Connection, path: Path) -> bool:
        """Before a write: True when the files are above the bound and a reader pins the
        WAL (a checkpoint could not truncate it), so the write would only grow it."""
        main, wal = on_disk(path)
        if main + wal <= self.max_bytes or wal == 0:
            return False
        if checkpoint(conn):
            return False
        main, wal = on_disk(path)
        return main + wal > self.max_bytes

    def bound_size(self, conn: sqlite3.Connection, path: Path) -> tuple[int, int, bool]:
        """After a write: the WAL truncated when large, then the oldest events deleted
        while the store is above the bound. Returns the size on disk (main file and WAL),
        the WAL's, and whether a reader pins the WAL."""
        main, wal = on_disk(path)
        pinned = False
        if wal > WAL_CHECKPOINT_BYTES or main + wal > self.max_bytes:
            pinned = not checkpoint(conn)
        size = _logical_size(conn)
        # with the WAL pinned, deleting would only grow it: the next flush does it
        while not pinned and size > self.max_bytes:
            total = conn.execute("SELECT count(*) FROM events").fetchone()[0]
            if not total:
                break
            # a tenth of what is there, oldest first, then the freed pages go back
            with conn:
                conn.execute("DELETE FROM events WHERE id IN (SELECT id FROM events "
                             "ORDER BY id LIMIT ?)", (max(100, total // 10),))
            vacuum_freed(conn)
            pinned = not checkpoint(conn)
            new = _logical_size(conn)
            if new >= size:
                break
            size = new
        main, wal = on_disk(path)
        return main + wal, wal, pinned


def close_quietly(conn: sqlite3.Connection) -> None:
    with contextlib.suppress(sqlite3.Error):
        conn.close()
