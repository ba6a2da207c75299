"""The command line's side of the event store: `check --record` (and history in `check`),
`gpuguard events`, and `failover status`'s tail (`gpuguard ack`: ack_command.py). Apart
from cli.py so that `check` without a store imports none of it. A bad row met on the way
is skipped and said once on stderr (`N bad row(s) skipped`), never fatal."""

from __future__ import annotations

import json
import shutil
import sqlite3
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from gpuguard.events import store as eventstore
from gpuguard.events.ack_command import CLI_WRITE_WAIT_S, flush_within
from gpuguard.events.escalation import apply_history
from gpuguard.events.recording import kernel_log_repairs, kernel_log_xids, rule_transitions
from gpuguard.events.rows import Skipped, a_time
from gpuguard.events.store import Event, StoreUnreadable
from gpuguard.events.writer import EventWriter
from gpuguard.io.clock import utc
from gpuguard.io.paths import Paths
from gpuguard.io.text import printable
from gpuguard.judge.actions import of_xid
from gpuguard.judge.xids import grade
from gpuguard.model.results import Result
from gpuguard.model.rule import RuleSet
from gpuguard.model.snapshot import Snapshot
from gpuguard.sources.boot_state import boot_id

# The longest message `events` prints in its table (JSON has it whole).
MAX_MESSAGE = 1000


class CannotRead(Exception):
    pass


def say_skipped(path: Path, skipped: Skipped) -> None:
    """The bad rows a command met, once, on stderr."""
    if skipped.count:
        print(f"gpuguard: event store {path}: {skipped.count} bad row(s) skipped (unreadable "
              "or out of range; the rest was used)", file=sys.stderr)


def with_history(results: list[Result], snapshot: Snapshot, ruleset: RuleSet,
                 state_dir: Path, paths: Paths, record: bool) -> list[Result]:
    """The results with their actions changed by the store's history; with `record`, this
    run's Xids and rule transitions written first (Xids) and after (transitions). A store
    that cannot be read or written changes nothing and says so on stderr."""
    boot = boot_id(paths)
    known = snapshot.gpu_ids()
    path = eventstore.path_in(state_dir)
    writer = EventWriter(path, boot, integrity_check=False) if record else None
    skipped = writer.skipped if writer is not None else Skipped()
    if writer is not None:
        last = writer.last_findings()
        catalog = ruleset.xid_catalog
        writer.record_all(kernel_log_xids(
            snapshot, "check",
            lambda xid, text: (grade(xid, text, catalog).severity,
                               of_xid(xid, text, catalog).value)))
        # the repairs before the history is read: a fault back after one escalates
        writer.record_all(kernel_log_repairs(snapshot, "check"))
        flush_within(writer, CLI_WRITE_WAIT_S)
    try:
        conn = eventstore.open_reader(path)
    except StoreUnreadable as exc:
        if record:
            print(f"gpuguard: event store: {exc}", file=sys.stderr)
        conn = None
    if conn is not None:
        try:
            results = apply_history(results, conn, boot, ruleset, known, skipped=skipped)
        finally:
            conn.close()
    if writer is not None:
        writer.record_all(rule_transitions(results, last, "check"))
        if not flush_within(writer, CLI_WRITE_WAIT_S):
            dropped = sum(writer.stats.dropped.values()) + writer.stats.queued
            why = ", ".join(writer.stats.dropped) or (
                "a reader pins the WAL" if writer.stats.wal_pinned else "locked")
            print(f"gpuguard: event store {path}: {dropped} event(s) not written ({why})",
                  file=sys.stderr)
        writer.close()
    say_skipped(path, skipped)
    return results


def _reader(state_dir: Path) -> sqlite3.Connection:
    try:
        return eventstore.open_reader(eventstore.path_in(state_dir))
    except StoreUnreadable as exc:
        raise CannotRead(str(exc)) from exc


def list_events(state_dir: Path, since_s: float, gpu: str | None, rule: str | None,
                kinds: tuple[str, ...], fmt: str, limit: int) -> str:
    """The table or JSON of `gpuguard events`, whole (stream_events' chunks joined)."""
    chunks: list[str] = []
    stream_events(state_dir, since_s, gpu, rule, kinds, fmt, limit, chunks.append)
    return "".join(chunks)


def stream_events(state_dir: Path, since_s: float, gpu: str | None, rule: str | None,
                  kinds: tuple[str, ...], fmt: str, limit: int,
                  write: Callable[[str], object]) -> None:
    """The table or JSON of `gpuguard events`, written a batch of rows at a time (issue
    32: 100 000 rows were 237 MiB held at once). The store's batches are each a
    statement run to its end (events/store.batches), so a reader whose output waits (a
    pager) holds no read transaction, which would pin the WAL. The bytes are those of
    one query rendered whole; the bad rows met are said on stderr after the rows."""
    path = eventstore.path_in(state_dir)
    conn = _reader(state_dir)
    skipped = Skipped()
    rows = eventstore.batches(conn, time.time() - since_s, kinds, rule, gpu, limit, skipped)
    try:
        if fmt == "json":
            _json(rows, write)
        else:
            _table(rows, write)
    except sqlite3.Error as exc:
        raise CannotRead(f"{path}: {exc}") from exc
    finally:
        conn.close()
    say_skipped(path, skipped)


def _json(batches: Iterator[list[Event]], write: Callable[[str], object]) -> None:
    """json.dumps({"schema": 1, "events": [...]}, indent=2) + "\n", event by event: an
    event's own dump indented two levels (JSON strings hold no newline)."""
    first = True
    for batch in batches:
        parts = []
        for e in batch:
            body = json.dumps(e.to_json(), indent=2).replace("\n", "\n    ")
            parts.append(("{\n  \"schema\": 1,\n  \"events\": [\n    " if first
                          else ",\n    ") + body)
            first = False
        if parts:
            write("".join(parts))
    write('{\n  "schema": 1,\n  "events": []\n}\n' if first else "\n  ]\n}\n")


def _table(batches: Iterator[list[Event]], write: Callable[[str], object]) -> None:
    width = shutil.get_terminal_size((120, 24)).columns
    first = True
    for batch in batches:
        lines = []
        if first and batch:
            lines.append(f"{'TIME (UTC)':<19}  {'KIND':<10}  {'WHAT':<20}  {'GPU':<5}  "
                         f"{'CHANGE':<20}  {'ACTION':<16}  MESSAGE")
            first = False
        for e in batch:
            lines.extend(table_row(e, width))
        if lines:
            write("\n".join(lines) + "\n")
    if first:
        write("no events\n")


def table_row(e: Event, width: int) -> list[str]:
    """One event in `events`'s table: a line, and more where its message wraps."""
    what = f"Xid {e.code}" if e.kind == "xid" else \
        (e.status or "-").replace("_", " ") if e.kind == "repair" else printable(e.rule or "-")
    gpu_text = "-" if e.gpu_index is None else str(e.gpu_index)
    change = (f"{e.old_status or 'new'} -> {e.status}" if e.kind == "rule"
              else (e.status or "-"))
    message = e.message
    if e.kind == "ack":
        message = f"{e.data.get('reason', '')} (until {_when(e.data.get('until'))})"
    if e.kind == "qualify" and e.data.get("purpose"):  # what it decided: a drain, a failover
        message = f"{message}; for {e.data['purpose']}"
    prefix = (f"{_when(e.time):<19}  {e.kind:<10}  {what:<20}  {gpu_text:<5}  "
              f"{change:<20}  {(e.action or '-'):<16}  ")
    # the message wrapped under its column (as `check`'s table does), never one line
    # of hundreds of characters
    # a stored message quotes the kernel log or an operator: nothing in it reaches the
    # terminal as a control character
    wrapped = textwrap.wrap(printable(message[:MAX_MESSAGE]),
                            max(30, width - len(prefix))) or [""]
    return [prefix + wrapped[0], *(" " * len(prefix) + more for more in wrapped[1:])]


def _when(t: object) -> str:
    when = a_time(t)
    return "-" if when is None else utc(when, suffix=False)  # under a column that says UTC


def last_transitions(state_dir: Path, limit: int = 10) -> list[str]:
    """`failover status`'s tail: the last failovers and rule transitions from the store
    (nothing when there is no store; one line saying so when it cannot be read)."""
    found, problem = recent_transitions(state_dir, limit)
    if problem is not None:
        return [f"(event store not readable: {problem})"]
    if not found:
        return []
    lines = ["", f"last {len(found)} transition(s) (gpuguard events for more):"]
    for e in found:
        if e.kind == "supervisor":
            what = printable(f"{e.rule}: {e.status} (action {e.action or 'none'}): "
                             f"{e.message[:120]}")
        else:
            gpu = "" if e.gpu_index is None else f" GPU {e.gpu_index}"
            what = (f"{e.rule}{gpu}: {e.old_status or 'new'} -> {e.status} "
                    f"(action {e.action or 'none'})")
        lines.append(f"  {_when(e.time)}  {what}")
    return lines


def recent_transitions(state_dir: Path, limit: int = 10) -> tuple[list[Event], str | None]:
    """The last failovers and rule transitions in the store, newest first (none when
    there is no store), and why the store could not be read (None when it could)."""
    path = eventstore.path_in(state_dir)
    if not path.is_file():
        return [], None
    try:
        conn = eventstore.open_reader(path)
        try:
            return eventstore.query(conn, kinds=("supervisor", "rule"), limit=limit), None
        finally:
            conn.close()
    except (StoreUnreadable, sqlite3.Error) as exc:
        return [], str(exc)
