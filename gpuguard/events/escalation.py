"""History changes what to do: escalation, acknowledgements and auto-clear, read from the
event store (docs/events.md).

- The same fatal hardware finding on the same board (critical, same rule, a rule of
  `kind: hardware`; for Xids the same Xid on the same GPU) recorded in an earlier boot:
  `inspect_hardware`, "also seen on boot X at T". A setting against the profile (MIG
  mode, persistence, clocks, power limit), software or a host resource is not the
  board's fault: it keeps its own action however often it comes back after a reboot.
- After a repair (issue 21, item 3): the same fatal hardware finding on the same board
  after a GPU reset of it or a driver reload in this boot, that the finding had asked for:
  an Xid logged again after the repair's line, a GPU rule that was critical before it, ok
  after it and is critical again: `inspect_hardware`, "also seen before the GPU reset at T".
- A burst: the same fatal Xid on one board `escalate.count` times within
  `escalate.window` (rules/xid.yaml): `inspect_hardware`.
- An acknowledgement (`gpuguard ack`), or a rule's `auto_clear:` span: the action becomes
  `none` (gpuguard.events.acks). It never hides an escalation: a fault that came back
  after a reboot, or keeps coming, goes to a person whatever was acknowledged.

Every row read is checked (gpuguard.events.rows): a bad one is skipped and counted.
"""

from __future__ import annotations

import dataclasses
import re
import sqlite3
import time
from typing import Any

from gpuguard.events.acks import acknowledged, active_acks
from gpuguard.events.rows import MAX_TIME, REPAIR_KINDS, Skipped, a_time
from gpuguard.io.clock import utc
from gpuguard.judge.actions import FAILING, Action, with_action
from gpuguard.judge.xids import ACTION_WORDS, REPAIRS, span
from gpuguard.model.identity import GpuId
from gpuguard.model.results import Result, Status
from gpuguard.model.rule import Rule, RuleSet

# Rows looked at for the earlier boot of a finding: the newest that reads well wins.
EARLIER_ROWS = 20
# xid.recent's words for one code (gpuguard/checks/xid.py): "Xid 79 x5 (meaning), last 2m
# ago: " and then the catalog's action words, one or several joined by "; "
_WORDS = "|".join(re.escape(w) for w in sorted(ACTION_WORDS.values(), key=len, reverse=True))
_XID_PART = re.compile(rf"^(Xid (\d+)(?: x\d+)? \(.*?\)(?:, last \S+ ago)?: )"
                       rf"((?:{_WORDS})(?:; (?:{_WORDS}))*)")


def apply_history(results: list[Result], conn: sqlite3.Connection, boot_id: str | None,
                  ruleset: RuleSet, known: dict[int, GpuId], now: float | None = None,
                  skipped: Skipped | None = None) -> list[Result]:
    """The results with their actions changed by history; a store that cannot be read
    changes nothing (the actions stand as the rules gave them). Bad rows are left out,
    counted in `skipped`."""
    now = time.time() if now is None else now
    skipped = Skipped() if skipped is None else skipped
    try:
        acks = active_acks(conn, boot_id, now, skipped)
        out = []
        for r in results:
            if r.status in FAILING:
                escalated = _escalate(r, conn, boot_id, ruleset, known, now, skipped)
                # an escalation is history's strongest word: no ack or auto-clear hides it
                r = escalated if escalated is not r else acknowledged(r, conn, acks,
                                                                       ruleset, now, skipped)
            out.append(r)
        return out
    except sqlite3.Error:
        return results


def _earlier_boot(rows: list[tuple[Any, ...]], skipped: Skipped) -> tuple[str, float] | None:
    """The newest (row id, boot id, time) row that reads well, as (boot id, time)."""
    for row_id, boot, when in rows:
        when = a_time(when)
        if when is None or not isinstance(boot, str):
            skipped.add(row_id)
            continue
        return boot, when
    return None


def _escalate(r: Result, conn: sqlite3.Connection, boot_id: str | None, ruleset: RuleSet,
              known: dict[int, GpuId], now: float, skipped: Skipped) -> Result:
    rule = ruleset.rules.get(r.rule)
    if rule is None or rule.kind != "hardware":
        return r  # a setting, software or the host's resources: not the board's fault
    if r.rule == "xid.recent":
        return _escalate_xids(r, conn, boot_id, rule, known, now, skipped)
    if r.status is not Status.CRITICAL or r.gpu is None or boot_id is None:
        return r
    board = r.gpu
    if not (board.uuid or board.serial):
        return r  # no lasting identity: an index says nothing about the board
    rows = conn.execute(
        "SELECT id, boot_id, time FROM events WHERE rule = ? AND kind = 'rule' AND "
        "(gpu_uuid = ? OR gpu_serial = ?) AND status = 'critical' AND boot_id IS NOT NULL "
        "AND boot_id != ? ORDER BY time DESC LIMIT ?",
        (r.rule, board.uuid or "", board.serial or "", boot_id, EARLIER_ROWS)).fetchall()
    earlier = _earlier_boot(rows, skipped)
    if earlier is None:
        why = _back_after_a_repair(r, conn, boot_id, board.uuid, skipped)
        return r if why is None else with_action(r, Action.INSPECT_HARDWARE, why)
    return with_action(r, Action.INSPECT_HARDWARE,
                       f"also seen on boot {earlier[0]} at {utc(earlier[1])}: the same fault "
                       "came back after a reboot")


def _last_repair(conn: sqlite3.Connection, boot_id: str, uuid: str, skipped: Skipped
                 ) -> tuple[str, float, int | None] | None:
    """The newest repair of this board in this boot (a reset of it, a driver reload) that
    reads well: (kind, time, kernel-log sequence number)."""
    rows = conn.execute(
        "SELECT id, status, time, seq FROM events WHERE kind = 'repair' AND boot_id = ? AND "
        "(gpu_uuid = ? OR status = 'driver_reload') AND typeof(time) IN ('real', 'integer') "
        "ORDER BY time DESC LIMIT ?", (boot_id, uuid, EARLIER_ROWS)).fetchall()
    for row_id, kind, when, seq in rows:
        when = a_time(when)
        if when is None or kind not in REPAIR_KINDS or not (seq is None or isinstance(seq, int)):
            skipped.add(row_id)
            continue
        return kind, when, seq
    return None


def _repair_words(kind: str, when: float) -> str:
    return f"{'the GPU reset' if kind == 'gpu_reset' else 'the driver reload'} at {utc(when)}"


def _back_after_a_repair(r: Result, conn: sqlite3.Connection, boot_id: str,
                         uuid: str | None, skipped: Skipped) -> str | None:
    """Why a GPU rule's critical finding escalates: critical before the board's last repair
    (with an action the repair answers), cleared after it, critical again now. A finding
    that never cleared is left alone: the cycle that saw the repair may have read the GPU
    before it."""
    repair = _last_repair(conn, boot_id, uuid, skipped) if uuid else None
    if repair is None:
        return None
    kind, when, _ = repair
    answered = REPAIRS[kind]
    marks = ",".join("?" * len(answered))
    before, cleared = conn.execute(
        "SELECT sum(time < ? AND status = 'critical' AND action IN (" + marks + ")), "
        "sum(time >= ? AND status NOT IN ('critical', 'unknown')) FROM events WHERE "
        "kind = 'rule' AND rule = ? AND gpu_uuid = ? AND boot_id = ? AND "
        "typeof(time) IN ('real', 'integer')",
        (when, *answered, when, r.rule, uuid, boot_id)).fetchone()
    if not before or not cleared:
        return None
    return (f"also critical before {_repair_words(kind, when)}: the same fault came back "
            "after the repair")


def _escalate_xids(r: Result, conn: sqlite3.Connection, boot_id: str | None, rule: Rule,
                   known: dict[int, GpuId], now: float, skipped: Skipped) -> Result:
    reasons: list[str] = []
    escalated: list[dict[str, Any]] = []
    for e, uuid in _fatal_xids_by_board(r, known):
        why = _xid_seen_in_an_earlier_boot(conn, e, uuid, boot_id, skipped)
        if why is None:
            why = _xid_back_after_a_repair(conn, e, uuid, boot_id, skipped)
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
    r = dataclasses.replace(r, observed={**r.observed, "events": events_out},
                            message=_escalated_message(r.message, {x["xid"] for x in escalated}))
    return with_action(r, Action.INSPECT_HARDWARE, "; ".join(reasons))


def _escalated_message(message: str, xids: set[int]) -> str:
    """The message with the escalated codes' action words replaced by inspect_hardware's
    (the catalog's kept as what it was escalated from), so that what to do in words is the
    action the result gives; where no escalated code is among the codes the message shows,
    the escalated action is added at its end."""
    words = ACTION_WORDS[Action.INSPECT_HARDWARE.value]
    parts = message.split(" | ")
    changed = False
    for i, part in enumerate(parts):
        found = _XID_PART.match(part)
        if found is None or int(found.group(2)) not in xids:
            continue
        changed = True
        if found.group(3) != words:  # the catalog asked for less
            parts[i] = (f"{found.group(1)}{words} (escalated from: {found.group(3)})"
                        f"{part[found.end():]}")
    if not changed:
        return f"{message}; escalated: {words}"
    return " | ".join(parts)


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
                                 boot_id: str | None, skipped: Skipped) -> str | None:
    """Why the Xid escalates when the same board logged it in an earlier boot; else None."""
    if boot_id is None:
        return None
    rows = conn.execute(
        "SELECT id, boot_id, time FROM events WHERE rule = 'xid.recent' AND gpu_uuid = ? "
        "AND kind = 'xid' AND code = ? AND status = 'critical' AND boot_id IS NOT NULL "
        "AND boot_id != ? ORDER BY time DESC LIMIT ?",
        (uuid, e["xid"], boot_id, EARLIER_ROWS)).fetchall()
    earlier = _earlier_boot(rows, skipped)
    if earlier is None:
        return None
    return (f"Xid {e['xid']} on GPU {e['gpu']} also seen on boot {earlier[0]} at "
            f"{utc(earlier[1])}")


def _xid_back_after_a_repair(conn: sqlite3.Connection, e: dict[str, Any], uuid: str,
                             boot_id: str | None, skipped: Skipped) -> str | None:
    """Why the Xid escalates when its line comes after the board's last repair and the same
    Xid, with an action that repair answers, was logged before it (the kernel log's order:
    its sequence numbers); else None."""
    repair = _last_repair(conn, boot_id, uuid, skipped) if boot_id is not None else None
    seq = e.get("seq")
    if repair is None or repair[2] is None or not isinstance(seq, int) or seq <= repair[2]:
        return None
    kind, when, repair_seq = repair
    answered = REPAIRS[kind]
    before = conn.execute(
        "SELECT count(*) FROM events WHERE rule = 'xid.recent' AND gpu_uuid = ? AND "
        "kind = 'xid' AND code = ? AND status = 'critical' AND boot_id = ? AND seq < ? AND "
        "action IN (" + ",".join("?" * len(answered)) + ")",
        (uuid, e["xid"], boot_id, repair_seq, *answered)).fetchone()[0]
    if not before:
        return None
    return (f"Xid {e['xid']} on GPU {e['gpu']} also seen before {_repair_words(kind, when)}: "
            "the same fault came back after the repair")


def _xid_burst(conn: sqlite3.Connection, e: dict[str, Any], uuid: str, rule: Rule | None,
               now: float) -> str | None:
    """Why the Xid escalates when the board logged it `escalate.count` times within
    `escalate.window`; else None (also for a rule that sets no escalation)."""
    if rule is None or not rule.escalate_count or not rule.escalate_window_s:
        return None
    # only times a row may hold count (text sorts above every number in SQLite)
    count = conn.execute(
        "SELECT count(*) FROM events WHERE rule = 'xid.recent' AND gpu_uuid = ? "
        "AND kind = 'xid' AND typeof(time) IN ('real', 'integer') AND time >= ? "
        "AND time <= ? AND code = ? AND status = 'critical'",
        (uuid, now - rule.escalate_window_s, MAX_TIME, e["xid"])).fetchone()[0]
    if count < rule.escalate_count:
        return None
    return (f"Xid {e['xid']} on GPU {e['gpu']} {count} times within "
            f"{span(rule.escalate_window_s)} (escalate.count {rule.escalate_count})")
