"""Acknowledgements and auto-clear: an operator's word (or a rule's `auto_clear:`) that a
finding needs nothing done (docs/events.md).

An ack covers exactly the finding it was given for: the rule, the board (UUID; the index
where none was read), the status and the set the finding names (model.results.NAMES,
stored with the ack as `covers`). It holds while all of them are the same and no
transition of that finding was recorded after it, in the boot it was given in, until its
time is up. It changes the suggested action, never the status.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from typing import Any

from gpuguard.events.rows import Skipped, a_time, data_of, names_in, valid_event
from gpuguard.events.store import COLUMNS, board_where
from gpuguard.io.clock import utc
from gpuguard.judge.actions import FAILING, Action, with_action
from gpuguard.judge.xids import span
from gpuguard.model.identity import GpuId, finding_key, stored
from gpuguard.model.results import NAMES, Result, names_of
from gpuguard.model.rule import RuleSet

# An ack holds at most this long (`gpuguard ack --for`), and no older one is read.
ACK_MAX_S = 366 * 86400.0
# The acks of a boot that may still hold, oldest first (partial index events_acks)
ACKS_SQL = (f"SELECT id, {', '.join(COLUMNS)} FROM events "
            "WHERE kind = 'ack' AND boot_id = ? AND time >= ? ORDER BY id")
# Where an ack stores the set its finding named
COVERS = "covers"
FAILING_VALUES = frozenset(s.value for s in FAILING)


@dataclasses.dataclass(frozen=True)
class Ack:
    id: int
    time: float
    until: float
    status: str
    covers: tuple[str, ...]
    reason: str
    by: str


def _ack_of(row_id: int, values: dict[str, Any]) -> Ack | None:
    """One ack row (every column checked, as any row); None when it is not one (counted
    by the caller)."""
    checked = valid_event(values, ("ack",))
    if checked is None or checked["rule"] is None:
        return None
    data, status = checked["data"], checked["status"]
    until = a_time(data.get("until"))
    covers = names_in(data, COVERS)
    if until is None or covers is None or (status is not None
                                           and status not in FAILING_VALUES):
        return None
    reason, by = data.get("reason"), data.get("by")
    return Ack(row_id, checked["time"], until, status or "", covers,
               reason if isinstance(reason, str) else "", by if isinstance(by, str) else "")


def active_acks(conn: sqlite3.Connection, boot_id: str | None, now: float,
                skipped: Skipped) -> dict[tuple[str, str], Ack]:
    """Acks given in this boot whose time is not up and after which no transition of
    their finding was recorded. An ack without a status (one of an older gpuguard, or
    `gpuguard xid ack`'s record) covers no finding."""
    out: dict[tuple[str, str], Ack] = {}
    if boot_id is None:
        return out  # which boot an ack belongs to cannot be told: none holds
    for row_id, *columns in conn.execute(ACKS_SQL, (boot_id, now - ACK_MAX_S)).fetchall():
        values = dict(zip(COLUMNS, columns, strict=True))
        ack = _ack_of(row_id, values)
        if ack is None:
            skipped.add(row_id)
            continue
        rule, uuid, index = values["rule"], values["gpu_uuid"], values["gpu_index"]
        if ack.until <= now or not ack.status:
            continue
        # an ack by index (the store had no UUID for the board): that slot's changes
        where, args = ("gpu_index = ?", (index,)) if uuid is None and index is not None \
            else board_where(uuid, index)
        changed = conn.execute(
            f"SELECT 1 FROM events WHERE kind = 'rule' AND rule = ? AND {where} AND id > ? "
            "LIMIT 1", (rule, *args, ack.id)).fetchone()
        if changed is None:
            out[finding_key(rule, stored(uuid, index))] = ack
    return out


def acknowledged(r: Result, conn: sqlite3.Connection, acks: dict[tuple[str, str], Ack],
                 ruleset: RuleSet, now: float, skipped: Skipped) -> Result:
    """`r` with the action `none` where an ack in force covers its finding, or its rule's
    auto_clear span has passed; else `r` as it is."""
    key = finding_key(r.rule, r.gpu)
    # an ack given by index (no UUID in the store for it yet) finds its GPU by index
    ack = acks.get(key) or (acks.get(finding_key(r.rule, GpuId(r.gpu.index)))
                            if r.gpu else None)
    if ack is not None and ack.status == r.status.value and ack.covers == names_of(r.observed):
        why = (f"acknowledged at {utc(ack.time)} until {utc(ack.until)}"
               f"{' by ' + ack.by if ack.by else ''}: {ack.reason}")
        return dataclasses.replace(with_action(r, Action.NONE, why),
                                   observed={**r.observed, "acknowledged": why})
    return _auto_cleared(r, conn, ruleset, now, skipped)


def _auto_cleared(r: Result, conn: sqlite3.Connection, ruleset: RuleSet, now: float,
                  skipped: Skipped) -> Result:
    """A failing finding unchanged (status and names) for longer than its rule's
    auto_clear span is acknowledged on its own."""
    rule = ruleset.rules.get(r.rule)
    if rule is None or rule.auto_clear_s is None:
        return r
    where, args = board_where(r.gpu.uuid if r.gpu else None, r.gpu.index if r.gpu else None)
    row = conn.execute(
        f"SELECT id, status, time, data FROM events WHERE kind = 'rule' AND rule = ? AND "
        f"{where} ORDER BY id DESC LIMIT 1", (r.rule, *args)).fetchone()
    if row is None:
        return r
    since, data = a_time(row[2]), data_of(row[3])
    names = None if data is None else names_in(data, NAMES)
    if since is None or names is None:
        skipped.add(row[0])
        return r
    if row[1] == r.status.value and names == names_of(r.observed) \
            and now - since > rule.auto_clear_s:
        why = (f"auto-cleared: {r.status.value} unchanged since {utc(since)}, longer "
               f"than the rule's auto_clear {span(rule.auto_clear_s)}")
        return dataclasses.replace(with_action(r, Action.NONE, why),
                                   observed={**r.observed, "acknowledged": why})
    return r
