"""The command line's side of the event store: `check --record` (and history in `check`),
`gpuguard events`, `gpuguard ack`, and the record `gpuguard xid ack` leaves. Apart from
cli.py so that `check` without a store imports none of it."""

from __future__ import annotations

import json
import shutil
import sqlite3
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from gpuguard.events import store as eventstore
from gpuguard.events.escalation import apply_history
from gpuguard.events.recording import kernel_log_xids, rule_transitions
from gpuguard.events.store import Event, StoreUnreadable
from gpuguard.events.writer import EventWriter
from gpuguard.io.clock import utc
from gpuguard.io.paths import Paths
from gpuguard.judge.actions import of_xid
from gpuguard.judge.xids import grade
from gpuguard.model.identity import finding_key, stored
from gpuguard.model.results import Result
from gpuguard.model.rule import RuleSet
from gpuguard.model.snapshot import Snapshot
from gpuguard.sources.host import boot_id

# The longest message `events` prints in its table (JSON has it whole).
MAX_MESSAGE = 1000

# How long a command waits for the daemon's write lock before giving up (it retries every
# busy_timeout); a CLI can wait longer than a cycle.
CLI_WRITE_WAIT_S = 3.0


class CannotRead(Exception):
    pass


def _flush_within(writer: EventWriter, wait_s: float) -> bool:
    end = time.monotonic() + wait_s
    while True:
        writer.flush()
        if writer.stats.queued == 0:
            return not writer.stats.dropped
        if time.monotonic() > end:
            return False


def with_history(results: list[Result], snapshot: Snapshot, ruleset: RuleSet,
                 state_dir: Path, paths: Paths, record: bool) -> list[Result]:
    """The results with their actions changed by the store's history; with `record`, this
    run's Xids and rule transitions written first (Xids) and after (transitions). A store
    that cannot be read or written changes nothing and says so on stderr."""
    boot = boot_id(paths)
    known = snapshot.gpu_ids()
    path = eventstore.path_in(state_dir)
    writer = EventWriter(path, boot, integrity_check=False) if record else None
    if writer is not None:
        last = writer.last_statuses()
        catalog = ruleset.xid_catalog
        writer.record_all(kernel_log_xids(
            snapshot, "check",
            lambda xid, text: (grade(xid, text, catalog).severity,
                               of_xid(xid, text, catalog).value)))
        _flush_within(writer, CLI_WRITE_WAIT_S)
    try:
        conn = eventstore.open_reader(path)
    except StoreUnreadable as exc:
        if record:
            print(f"gpuguard: event store: {exc}", file=sys.stderr)
        conn = None
    if conn is not None:
        with conn:
            results = apply_history(results, conn, boot, ruleset, known)
        conn.close()
    if writer is not None:
        writer.record_all(rule_transitions(results, last, "check"))
        if not _flush_within(writer, CLI_WRITE_WAIT_S):
            dropped = sum(writer.stats.dropped.values()) + writer.stats.queued
            print(f"gpuguard: event store {path}: {dropped} event(s) not written "
                  f"({', '.join(writer.stats.dropped) or 'locked'})", file=sys.stderr)
        writer.close()
    return results


def _reader(state_dir: Path) -> sqlite3.Connection:
    try:
        return eventstore.open_reader(eventstore.path_in(state_dir))
    except StoreUnreadable as exc:
        raise CannotRead(str(exc)) from exc


def list_events(state_dir: Path, since_s: float, gpu: str | None, rule: str | None,
                kinds: tuple[str, ...], fmt: str, limit: int) -> str:
    conn = _reader(state_dir)
    try:
        found = list(eventstore.query(conn, time.time() - since_s, kinds, rule, gpu, limit))
    except sqlite3.Error as exc:
        raise CannotRead(f"{eventstore.path_in(state_dir)}: {exc}") from exc
    finally:
        conn.close()
    if fmt == "json":
        return json.dumps({"schema": 1, "events": [e.to_json() for e in found]},
                          indent=2) + "\n"
    if not found:
        return "no events\n"
    width = shutil.get_terminal_size((120, 24)).columns
    lines = [f"{'TIME (UTC)':<19}  {'KIND':<10}  {'WHAT':<20}  {'GPU':<5}  {'CHANGE':<20}  "
             f"{'ACTION':<16}  MESSAGE"]
    for e in found:
        lines.extend(_table_row(e, width))
    return "\n".join(lines) + "\n"


def _table_row(e: Event, width: int) -> list[str]:
    """One event in `events`'s table: a line, and more where its message wraps."""
    what = f"Xid {e.code}" if e.kind == "xid" else (e.rule or "-")
    gpu_text = "-" if e.gpu_index is None else str(e.gpu_index)
    change = (f"{e.old_status or 'new'} -> {e.status}" if e.kind == "rule"
              else (e.status or "-"))
    message = e.message
    if e.kind == "ack":
        message = f"{e.data.get('reason', '')} (until {_when(e.data.get('until'))})"
    prefix = (f"{_when(e.time):<19}  {e.kind:<10}  {what:<20}  {gpu_text:<5}  "
              f"{change:<20}  {(e.action or '-'):<16}  ")
    # the message wrapped under its column (as `check`'s table does), never one line
    # of hundreds of characters
    wrapped = textwrap.wrap(message[:MAX_MESSAGE], max(30, width - len(prefix))) or [""]
    return [prefix + wrapped[0], *(" " * len(prefix) + more for more in wrapped[1:])]


def _when(t: object) -> str:
    if not isinstance(t, int | float):
        return "-"
    return utc(t, suffix=False)  # under a column that says UTC


def record_ack(state_dir: Path, paths: Paths, kmsg: Path | None, rule: str, gpu: str | None,
               reason: str, duration_s: float) -> str:
    """An ack in the store: of the rule on that GPU (or the host rule), as its status is
    now (the last recorded one), until `duration_s` from now or the finding changes."""
    path = eventstore.path_in(state_dir)
    identity = _identify(path, rule, gpu)
    now = time.time()
    status = None
    if path.is_file():
        try:
            conn = eventstore.open_reader(path)
            with conn:
                last = eventstore.last_statuses(conn)
            conn.close()
            status = last.get(finding_key(rule, stored(identity.get("gpu_uuid"),
                                                       identity.get("gpu_index"))))
        except (StoreUnreadable, sqlite3.Error):
            status = None
    writer = EventWriter(path, boot_id(paths), integrity_check=False)
    writer.record(Event(kind="ack", source="cli", time=now, rule=rule, status=status,
                        action="none", message=reason,
                        data={"reason": reason, "until": now + duration_s,
                              "by": _user()}, **identity))
    written = _flush_within(writer, CLI_WRITE_WAIT_S)
    writer.close()
    if not written:
        raise CannotRead(f"cannot write the ack to {path}: "
                         f"{', '.join(writer.stats.dropped) or 'the store stayed locked'}")
    where = "" if identity.get("gpu_index") is None and not identity.get("gpu_uuid") \
        else f" on GPU {gpu}"
    notes = [f"acknowledged {rule}{where} until {_when(now + duration_s)} UTC"]
    notes.append(f"(covers its {status} finding; it ends when that changes)" if status
                 else "(no status recorded yet: it ends at the rule's next transition)")
    if kmsg is not None:
        notes.append(_ack_kernel_log(state_dir, paths, kmsg))
    return " ".join(notes) + "\n"


def _ack_kernel_log(state_dir: Path, paths: Paths, kmsg: Path) -> str:
    """`ack xid.recent` also does what `gpuguard xid ack` does: the lines logged so far
    stop counting (this boot)."""
    from gpuguard.sources import host as host_sources

    log = host_sources.read_kmsg_at(kmsg, 5.0)
    if not log.is_ok or log.value is None:
        return f"; the kernel log was not read ({log.describe()}): its lines still count"
    seqs = [e["seq"] for e in log.value["xids"] + (log.value.get("sxids") or [])
            if e.get("seq") is not None]
    if not seqs:
        return "; no Xid line in the kernel log"
    try:
        host_sources.write_xid_ack(state_dir, paths, max(seqs))
    except OSError as exc:
        return f"; cannot write the kernel-log ack: {exc.strerror or exc}"
    return f"; kernel-log lines up to sequence {max(seqs)} no longer count"


def record_xid_ack(state_dir: Path, paths: Paths, seq: int, lines: int) -> None:
    """`gpuguard xid ack` leaves a line in the store (shown by `events`); the ack itself is
    the kmsg sequence, so this record changes no action. A store that cannot be written
    changes nothing: the kmsg ack is done."""
    writer = EventWriter(eventstore.path_in(state_dir), boot_id(paths),
                         integrity_check=False)
    now = time.time()
    writer.record(Event(kind="ack", source="cli", time=now, rule="xid.recent",
                        message=f"gpuguard xid ack: {lines} line(s) up to kmsg sequence {seq}",
                        data={"reason": f"gpuguard xid ack up to kmsg sequence {seq}",
                              "until": now, "kmsg_seq": seq, "by": _user()}))
    if not _flush_within(writer, CLI_WRITE_WAIT_S):
        print(f"gpuguard: the ack was not recorded in {writer.path}", file=sys.stderr)
    writer.close()


def acks_in_force(state_dir: Path) -> int:
    """How many acks in the store have not run out (of any boot): for the note that they
    do not apply to a replay. An unreadable store has none to tell of."""
    path = eventstore.path_in(state_dir)
    if not path.is_file():
        return 0
    try:
        conn = eventstore.open_reader(path)
    except StoreUnreadable:
        return 0
    now = time.time()
    count = 0
    try:
        with conn:
            for (data,) in conn.execute("SELECT data FROM events WHERE kind = 'ack'"):
                try:
                    until = json.loads(data or "{}").get("until")
                except (ValueError, AttributeError):
                    continue
                if isinstance(until, int | float) and until >= now:
                    count += 1
    except sqlite3.Error:
        return 0
    finally:
        conn.close()
    return count


def _identify(path: Path, rule: str, gpu: str | None) -> dict[str, Any]:
    """The GPU's columns for an ack: its UUID and serial from the store where it has them."""
    if gpu is None:
        return {}
    identity: dict[str, Any] = {"gpu_index": int(gpu)} if gpu.isdigit() else \
        {"gpu_uuid": gpu}
    if not path.is_file():
        return identity
    try:
        conn = eventstore.open_reader(path)
        with conn:
            row = conn.execute(
                "SELECT gpu_index, gpu_uuid, gpu_serial, gpu_bus_id FROM events WHERE "
                "(gpu_index = ? OR gpu_uuid = ? OR gpu_serial = ?) AND gpu_uuid IS NOT NULL "
                "ORDER BY id DESC LIMIT 1",
                (int(gpu) if gpu.isdigit() else -1, gpu, gpu)).fetchone()
        conn.close()
    except (StoreUnreadable, sqlite3.Error):
        return identity
    if row is None:
        return identity
    return {"gpu_index": row[0], "gpu_uuid": row[1], "gpu_serial": row[2], "gpu_bus_id": row[3]}


def _user() -> str:
    import os
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def last_transitions(state_dir: Path, limit: int = 10) -> list[str]:
    """`failover status`'s tail: the last failovers and rule transitions from the store
    (nothing when there is no store; one line saying so when it cannot be read)."""
    path = eventstore.path_in(state_dir)
    if not path.is_file():
        return []
    try:
        conn = eventstore.open_reader(path)
        try:
            found = list(eventstore.query(conn, kinds=("supervisor", "rule"), limit=limit))
        finally:
            conn.close()
    except (StoreUnreadable, sqlite3.Error) as exc:
        return [f"(event store not readable: {exc})"]
    if not found:
        return []
    lines = ["", f"last {len(found)} transition(s) (gpuguard events for more):"]
    for e in found:
        if e.kind == "supervisor":
            what = f"{e.rule}: {e.status} (action {e.action or 'none'}): {e.message[:120]}"
        else:
            gpu = "" if e.gpu_index is None else f" GPU {e.gpu_index}"
            what = (f"{e.rule}{gpu}: {e.old_status or 'new'} -> {e.status} "
                    f"(action {e.action or 'none'})")
        lines.append(f"  {_when(e.time)}  {what}")
    return lines
