"""A daemon restarted after the kernel's ring buffer wrapped (review 4): its memory of the
kernel log (kmsg_memory.py) was in memory only, so the Xid line the buffer overwrote was
gone with it and xid.recent said ok. The event store keeps every Xid and repair line the
daemon read, one per sequence number and boot: the lines of this boot the buffer no longer
holds (a sequence number below its first) are read back from it, once, at the first cycle.

Bounded (at most MAX_ROWS rows, the newest), and read-only: a store that cannot be read
leaves the memory as it is (the narrowed "since [t]" message says what was seen). The
line's time since boot is not stored; it is its stored wall time carried to the kernel
log's clock, close enough for an age and a window (a wall-clock step in between moves it,
never drops it)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from gpuguard.events import store as eventstore
from gpuguard.events.store import StoreUnreadable
from gpuguard.model.pci import normalise_pci

MAX_ROWS = 4096

Event = dict[str, Any]


def from_store(path: Path, boot_id: str | None, before_seq: int, now_usec: int | None
               ) -> tuple[list[Event], list[Event]]:
    """This boot's Xid and repair lines with a sequence number below `before_seq`, as the
    kernel-log summary shapes them (without `n`): (xids, repairs), in log order."""
    if boot_id is None or before_seq <= 0:
        return [], []
    try:
        conn = eventstore.open_reader(path)
    except StoreUnreadable:
        return [], []
    try:
        rows = conn.execute(
            "SELECT kind, code, seq, time, gpu_uuid, gpu_bus_id, status, message FROM events "
            "WHERE boot_id = ? AND kind IN ('xid', 'repair') AND source = 'kmsg' "
            "AND seq IS NOT NULL AND seq < ? ORDER BY seq DESC LIMIT ?",
            (boot_id, before_seq, MAX_ROWS)).fetchall()
    except sqlite3.Error:
        return [], []
    finally:
        conn.close()
    now = time.time()
    xids: list[Event] = []
    repairs: list[Event] = []
    for kind, code, seq, when, uuid, bus, status, message in reversed(rows):
        if not isinstance(seq, int) or not isinstance(when, int | float):
            continue  # a bad row (events/rows.py counts them where it reads)
        usec = None if now_usec is None else max(0, int(now_usec - (now - when) * 1e6))
        pci = _pci(bus)
        text = message if isinstance(message, str) else ""
        if kind == "xid" and isinstance(code, int):
            xids.append({"xid": code, "pci": pci, "pid": None, "process": None,
                         "text": text, "seq": seq, "usec": usec})
        elif kind == "repair" and status in ("gpu_reset", "driver_reload"):
            repairs.append({"kind": status, "uuid": uuid if isinstance(uuid, str) else None,
                            "pci": pci, "text": text, "seq": seq, "usec": usec})
    return xids, repairs


def _pci(bus: object) -> str | None:
    if not isinstance(bus, str) or not bus:
        return None
    try:
        return normalise_pci(bus)
    except (ValueError, IndexError):
        return None
