"""History changes what to do: escalation, acknowledgements and auto-clear, read from the
event store (docs/events.md).

- The same fatal finding on the same board (critical, same rule; for Xids the same Xid on
  the same GPU) recorded in an earlier boot: `inspect_hardware`, "also seen on boot X at T".
- A burst: the same fatal Xid on one board `escalate.count` times within
  `escalate.window` (rules/xid.yaml): `inspect_hardware`.
- An acknowledgement (`gpuguard ack`) of a rule on a GPU, in force: the status stays (the
  finding is still there: never an ok gpuguard did not see), the action becomes `none`
  and the result names the ack. It ends when the rule's status on that GPU changes (a
  transition recorded after it), when the boot changes (it was given about the fault as
  it was before the reboot; a boot that cannot be told, either side, ends it too) or
  when its time is up. It never hides an escalation: a fault that came back after a
  reboot, or keeps coming, goes to a person whatever was acknowledged.
- A rule's `auto_clear:` span: a failing status unchanged for longer is acknowledged on
  its own, the same way.

Every query uses the (rule, gpu_uuid, kind, time) index: bounded work per result.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import time
from typing import Any

from gpuguard.io.clock import utc
from gpuguard.judge.actions import FAILING, Action, with_action
from gpuguard.model.identity import GpuId, finding_key, stored
from gpuguard.model.results import Result, Status
from gpuguard.model.rule import Rule, RuleSet


def apply_history(results: list[Result], conn: sqlite3.Connection, boot_id: str | None,
                  ruleset: RuleSet, known: dict[int, GpuId],
                  now: float | None = None) -> list[Result]:
    """The results with their actions changed by history; a store that cannot be read
    changes nothing (the actions stand as the rules gave them)."""
    now = time.time() if now is None else now
    try:
        acks = _active_acks(conn, boot_id, now)
        out = []
        for r in results:
            if r.status in FAILING:
                escalated = _escalate(r, conn, boot_id, ruleset, known, now)
                # an escalation is history's strongest word: no ack or auto-clear hides it
                r = escalated if escalated is not r else _acknowledged(r, conn, acks,
                                                                        ruleset, now)
            out.append(r)
        return out
    except sqlite3.Error:
        return results


def _when(t: float) -> str:
    return utc(t)


def _escalate(r: Result, conn: sqlite3.Connection, boot_id: str | None, ruleset: RuleSet,
              known: dict[int, GpuId], now: float) -> Result:
    if r.rule == "xid.recent":
        return _escalate_xids(r, conn, boot_id, ruleset, known, now)
    if r.status is not Status.CRITICAL or r.gpu is None or boot_id is None:
        return r
    board = r.gpu
    if not (board.uuid or board.serial):
        return r  # no lasting identity: an index says nothing about the board
    row = conn.execute(
        "SELECT boot_id, time FROM events WHERE rule = ? AND kind = 'rule' AND "
        "(gpu_uuid = ? OR gpu_serial = ?) AND status = 'critical' AND boot_id IS NOT NULL "
        "AND boot_id != ? ORDER BY time DESC LIMIT 1",
        (r.rule, board.uuid or "", board.serial or "", boot_id)).fetchone()
    if row is None:
        return r
    return with_action(r, Action.INSPECT_HARDWARE,
                       f"also seen on boot {row[0]} at {_when(row[1])}: the same fault "
                       "came back after a reboot")


def _escalate_xids(r: Result, conn: sqlite3.Connection, boot_id: str | None,
                   ruleset: RuleSet, known: dict[int, GpuId], now: float) -> Result:
    rule = ruleset.rules.get(r.rule)
    reasons: list[str] = []
    escalated: list[dict[str, Any]] = []
    for e, uuid in _fatal_xids_by_board(r, known):
        why = _xid_seen_in_an_earlier_boot(conn, e, uuid, boot_id)
        if why is None:
            why = _xid_burst(conn, e, uuid, rule, now)
        if why is not None:
            reasons.append(why)
            escalated.append(e)
    if not reasons:
        return r
    # the GPUs it names take the escalated action too (gpuguard_suggested_action)
    events_out = [{**e, "suggested": Action.INSPECT_HARDWARE.value}
                  if any(e.get("xid") == x["xid"] and e.get("gpu") == x["gpu"]
                         for x in escalated) else e
                  for e in r.observed.get("events") or []]
    r = dataclasses.replace(r, observed={**r.observed, "events": events_out})
    return with_action(r, Action.INSPECT_HARDWARE, "; ".join(reasons))


def _fatal_xids_by_board(r: Result, known: dict[int, GpuId]) -> list[tuple[dict[str, Any], str]]:
    """xid.recent's critical Xids, each (Xid, GPU) once, with the UUID of its board; an
    Xid on a GPU without one is left out (an index says nothing about the board)."""
    events = [e for e in r.observed.get("events") or [] if isinstance(e, dict)
              and e.get("severity") == "critical" and isinstance(e.get("gpu"), int)]
    seen: set[tuple[int, int]] = set()
    out: list[tuple[dict[str, Any], str]] = []
    for e in events:
        board = known.get(e["gpu"])
        if board is None or not board.uuid or (e["xid"], e["gpu"]) in seen:
            continue
        seen.add((e["xid"], e["gpu"]))
        out.append((e, board.uuid))
    return out


def _xid_seen_in_an_earlier_boot(conn: sqlite3.Connection, e: dict[str, Any], uuid: str,
                                 boot_id: str | None) -> str | None:
    """Why the Xid escalates when the same board logged it in an earlier boot; else None."""
    if boot_id is None:
        return None
    row = conn.execute(
        "SELECT boot_id, time FROM events WHERE rule = 'xid.recent' AND gpu_uuid = ? "
        "AND kind = 'xid' AND code = ? AND status = 'critical' AND boot_id IS NOT NULL "
        "AND boot_id != ? ORDER BY time DESC LIMIT 1",
        (uuid, e["xid"], boot_id)).fetchone()
    if row is None:
        return None
    return f"Xid {e['xid']} on GPU {e['gpu']} also seen on boot {row[0]} at {_when(row[1])}"


def _xid_burst(conn: sqlite3.Connection, e: dict[str, Any], uuid: str, rule: Rule | None,
               now: float) -> str | None:
    """Why the Xid escalates when the board logged it `escalate.count` times within
    `escalate.window`; else None (also for a rule that sets no escalation)."""
    if rule is None or not rule.escalate_count or not rule.escalate_window_s:
        return None
    count = conn.execute(
        "SELECT count(*) FROM events WHERE rule = 'xid.recent' AND gpu_uuid = ? "
        "AND kind = 'xid' AND time >= ? AND code = ? AND status = 'critical'",
        (uuid, now - rule.escalate_window_s, e["xid"])).fetchone()[0]
    if count < rule.escalate_count:
        return None
    return (f"Xid {e['xid']} on GPU {e['gpu']} {count} times within "
            f"{_span(rule.escalate_window_s)} (escalate.count {rule.escalate_count})")


def _span(seconds: float) -> str:
    from gpuguard.judge.xids import span

    return span(seconds)


@dataclasses.dataclass
class Ack:
    id: int
    time: float
    until: float
    status: str | None
    reason: str
    by: str


def _active_acks(conn: sqlite3.Connection, boot_id: str | None,
                 now: float) -> dict[tuple[str, str], Ack]:
    """Acks given in this boot whose time is not up and after which the rule on that GPU
    did not change."""
    import json

    out: dict[tuple[str, str], Ack] = {}
    if boot_id is None:
        return out  # which boot an ack belongs to cannot be told: none holds
    rows = conn.execute(
        "SELECT id, time, rule, gpu_uuid, gpu_index, status, data FROM events "
        "WHERE kind = 'ack' AND boot_id = ? AND time >= ? ORDER BY id",
        (boot_id, now - 366 * 86400)).fetchall()
    for ack_id, when, rule, uuid, index, status, data in rows:
        info = json.loads(data) if data else {}
        until = float(info.get("until") or 0)
        if until <= now or rule is None:
            continue
        if uuid is None and index is not None:  # an ack by index: that slot's changes
            changed = conn.execute(
                "SELECT 1 FROM events WHERE rule = ? AND kind = 'rule' AND id > ? AND "
                "gpu_index = ? LIMIT 1", (rule, ack_id, index)).fetchone()
        else:
            changed = conn.execute(
                "SELECT 1 FROM events WHERE rule = ? AND kind = 'rule' AND id > ? AND "
                "coalesce(gpu_uuid, '') = coalesce(?, '') LIMIT 1",
                (rule, ack_id, uuid)).fetchone()
        if changed is not None:
            continue
        out[finding_key(rule, stored(uuid, index))] = Ack(ack_id, when, until, status,
                                                     str(info.get("reason") or ""),
                                                     str(info.get("by") or ""))
    return out


def _acknowledged(r: Result, conn: sqlite3.Connection, acks: dict[tuple[str, str], Ack],
                  ruleset: RuleSet, now: float) -> Result:
    key = finding_key(r.rule, r.gpu)
    # an ack given by index (no UUID in the store for it yet) finds its GPU by index
    ack = acks.get(key) or (acks.get(finding_key(r.rule, GpuId(r.gpu.index)))
                            if r.gpu else None)
    if ack is not None and (ack.status is None or ack.status == r.status.value):
        why = (f"acknowledged at {_when(ack.time)} until {_when(ack.until)}"
               f"{' by ' + ack.by if ack.by else ''}: {ack.reason}")
        return dataclasses.replace(with_action(r, Action.NONE, why),
                                   observed={**r.observed, "acknowledged": why})
    rule = ruleset.rules.get(r.rule)
    if rule is None or rule.auto_clear_s is None:
        return r
    uuid = r.gpu.uuid if r.gpu else None
    row = conn.execute(
        "SELECT status, time FROM events WHERE rule = ? AND kind = 'rule' AND "
        "coalesce(gpu_uuid, '') = coalesce(?, '') ORDER BY id DESC LIMIT 1",
        (r.rule, uuid)).fetchone()
    if row is not None and row[0] == r.status.value and now - row[1] > rule.auto_clear_s:
        why = (f"auto-cleared: {r.status.value} unchanged since {_when(row[1])}, longer "
               f"than the rule's auto_clear {_span(rule.auto_clear_s)}")
        return dataclasses.replace(with_action(r, Action.NONE, why),
                                   observed={**r.observed, "acknowledged": why})
    return r
