"""What a row of the event store may hold, checked on every read: the store's content is
not trusted (a flipped bit on a failing disk, an older or buggier writer, a hand edit).

A row that fails is skipped and counted (`Skipped`), never fatal: a `check` on a healthy
host must not crash because one ack row is unreadable, and the daemon records on. Where
the count shows: a line on stderr from a command (`N bad row(s) skipped`), the recorder's
`rows_skipped` in the daemon.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from gpuguard.model.results import NAME_MAX, NAMES_MAX, Status

# Unix times a row may hold: datetime and gmtime print any of them (up to the year 9999).
MAX_TIME = 253402300799.0
# A row's JSON extras are small (an ack's reason, a transition's names): larger is damage.
MAX_DATA = 64 * 1024
MAX_TEXT = 4096
STATUSES = frozenset(s.value for s in Status)
# What a `repair` row holds as its status (events/recording.py)
REPAIR_KINDS = ("gpu_reset", "driver_reload")
# An Xid's grade (gpuguard.judge.xids), what a kind `xid` row holds as its status
XID_GRADES = frozenset(("critical", "warning", "ignore"))
# How many bad rows a reader remembers by id (so that one read twice counts once)
REMEMBERED = 10_000


@dataclass
class Skipped:
    """Bad rows met by the reads of one command or one daemon: counted once each."""

    ids: set[int] = field(default_factory=set)
    beyond: int = 0  # bad rows past REMEMBERED, counted without their id

    def add(self, row_id: Any) -> None:
        if isinstance(row_id, int) and (row_id in self.ids or len(self.ids) < REMEMBERED):
            self.ids.add(row_id)
        else:
            self.beyond += 1

    @property
    def count(self) -> int:
        return len(self.ids) + self.beyond


def a_time(value: Any) -> float | None:
    """A Unix time a row may hold, or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) and 0.0 <= value <= MAX_TIME else None


def data_of(text: Any) -> dict[str, Any] | None:
    """A row's JSON extras: {} for none, None when they are not a small JSON object of
    finite numbers."""
    if text is None:
        return {}
    if not isinstance(text, str) or len(text) > MAX_DATA:
        return None
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a row holds")


def names_in(data: dict[str, Any], key: str) -> tuple[str, ...] | None:
    """The set a transition or an ack holds under `key` (model.results.NAMES, `covers`):
    () when absent, None when it is not a bounded list of short strings."""
    raw = data.get(key)
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > NAMES_MAX \
            or not all(isinstance(n, str) and len(n) <= NAME_MAX for n in raw):
        return None
    return tuple(sorted(set(raw)))


def _text(value: Any, nullable: bool = True) -> bool:
    return (value is None and nullable) or (isinstance(value, str) and len(value) <= MAX_TEXT)


def _integer(value: Any, low: int, high: int) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool)
                             and low <= value <= high)


def _status_fits(kind: str, status: Any, old: Any) -> bool:
    """A transition's and an ack's statuses are gpuguard's; an Xid's its grade."""
    if kind in ("rule", "probe", "ack"):
        return (status is None or status in STATUSES) and (old is None or old in STATUSES) \
            and (kind == "ack" or status is not None)
    if kind == "xid":
        return status in XID_GRADES
    if kind == "repair":
        return status in REPAIR_KINDS and old is None
    return _text(status) and _text(old)


TEXT_COLUMNS = ("boot_id", "rule", "action", "message", "gpu_uuid", "gpu_serial",
                "gpu_bus_id")
INT64 = (-(2**63), 2**63 - 1)


def _columns_fit(values: dict[str, Any]) -> bool:
    """Each column of its type: text (short), whole numbers in their range."""
    return (_text(values.get("source"), nullable=False)
            and all(_text(values.get(column)) for column in TEXT_COLUMNS)
            and _integer(values.get("gpu_index"), 0, 65535)
            and _integer(values.get("code"), *INT64) and _integer(values.get("seq"), *INT64))


def valid_event(values: dict[str, Any], kinds: tuple[str, ...]) -> dict[str, Any] | None:
    """The columns of one row (store.COLUMNS), checked; `data` decoded. None: skip it."""
    kind = values.get("kind")
    data = data_of(values.get("data"))
    if kind not in kinds or data is None or a_time(values.get("time")) is None:
        return None
    if kind == "ack" and "until" in data and a_time(data["until"]) is None:
        return None  # an ack's end is a time too (`events` prints it)
    if not (_columns_fit(values)
            and _status_fits(kind, values.get("status"), values.get("old_status"))):
        return None
    return {**values, "time": float(values["time"]), "data": data,
            "message": values.get("message") or ""}
