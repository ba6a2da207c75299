"""`gpuguard ack` and the record `gpuguard xid ack` leaves: an acknowledgement written to
the event store (docs/events.md, "Clear semantics").

An ack names a finding the store recorded: the rule's last transition on that board
(or the host) gives its status and the set it names, and the ack covers exactly those
(gpuguard.events.acks). So the host's GPUs, and what is wrong with them, come from the
store, not from a fresh read of the driver: the ack must name the finding as the history
it is compared with holds it, a read of NVML can hang on the very GPU being acknowledged
(and takes seconds), and the daemon and `check --record` record every failing finding.
A rule that is ok (or was never recorded failing), or a GPU the store never recorded, has
nothing to acknowledge: refused (exit 3), nothing written.
"""

from __future__ import annotations

import math
import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from gpuguard.events import store as eventstore
from gpuguard.events.acks import ACK_MAX_S, COVERS, FAILING_VALUES
from gpuguard.events.rows import Skipped
from gpuguard.events.store import Event, StoreUnreadable
from gpuguard.events.writer import EventWriter
from gpuguard.io.clock import utc
from gpuguard.io.paths import Paths
from gpuguard.model.identity import finding_key, stored
from gpuguard.sources.boot_state import boot_id

# How long a command waits for the daemon's write lock before giving up (it retries every
# busy_timeout); a CLI can wait longer than a cycle.
CLI_WRITE_WAIT_S = 3.0


class AckRefused(Exception):
    """The ack names no finding the store recorded, or cannot be written."""


def flush_within(writer: EventWriter, wait_s: float) -> bool:
    """Flush until the queue is empty or `wait_s` has passed; True when all was written."""
    end = time.monotonic() + wait_s
    while True:
        writer.flush()
        if writer.stats.queued == 0:
            return not writer.stats.dropped
        if time.monotonic() > end:
            return False


def record_ack(state_dir: Path, paths: Paths, kmsg: Path | None, rule: str, gpu: str | None,
               reason: str, duration_s: float) -> str:
    """An ack in the store of the finding of the rule on that GPU (or the host rule) as
    the store last recorded it, until `duration_s` from now or the finding changes."""
    if not math.isfinite(duration_s) or not 0 < duration_s <= ACK_MAX_S:
        raise AckRefused(f"an ack holds for a time between 0 and {ACK_MAX_S / 86400:.0f} "
                         f"days, not {duration_s!r} s")
    boot = boot_id(paths)  # first: an ack is bound to this boot (and the guard says so)
    path = eventstore.path_in(state_dir)
    identity, status, names = _recorded_finding(path, rule, gpu)
    now = time.time()
    writer = EventWriter(path, boot, integrity_check=False)
    writer.record(Event(kind="ack", source="cli", time=now, rule=rule, status=status,
                        action="none", message=reason,
                        data={"reason": reason, "until": now + duration_s, "by": _user(),
                              COVERS: list(names)}, **identity))
    written = flush_within(writer, CLI_WRITE_WAIT_S)
    writer.close()
    if not written:
        raise AckRefused(f"cannot write the ack to {path}: "
                         f"{', '.join(writer.stats.dropped) or 'the store stayed locked'}")
    where = "" if gpu is None else f" on GPU {gpu}"
    named = f": {', '.join(names)}" if names else ""
    notes = [f"acknowledged {rule}{where} until {utc(now + duration_s, suffix=False)} UTC",
             f"(covers its {status} finding{named}; it ends when that changes)"]
    if kmsg is not None:
        notes.append(_ack_kernel_log(state_dir, paths, kmsg))
    return " ".join(notes) + "\n"


def _recorded_finding(path: Path, rule: str, gpu: str | None
                      ) -> tuple[dict[str, Any], str, tuple[str, ...]]:
    """The GPU's columns, and the status and names of the rule's last recorded finding
    there; AckRefused when there is none failing to acknowledge."""
    try:
        conn = eventstore.open_reader(path)
    except StoreUnreadable as exc:
        raise AckRefused(f"{exc}: an ack covers a finding the store recorded (the daemon "
                         "records them, or `gpuguard check --record`)") from exc
    skipped = Skipped()
    try:
        identity = _identify(conn, gpu)
        findings = eventstore.last_findings(conn, skipped)
    except sqlite3.Error as exc:
        raise AckRefused(f"{path}: {exc}") from exc
    finally:
        conn.close()
    if skipped.count:
        print(f"gpuguard: event store {path}: {skipped.count} bad row(s) skipped",
              file=sys.stderr)
    where = "" if gpu is None else f" on GPU {gpu}"
    found = findings.get(finding_key(rule, stored(identity.get("gpu_uuid"),
                                                  identity.get("gpu_index"))))
    if found is None:
        raise AckRefused(f"{rule}{where} has no failing finding in {path} (it is ok, or it "
                         "never failed where the daemon or `check --record` saw it): "
                         "nothing to acknowledge")
    if found[0] not in FAILING_VALUES:
        raise AckRefused(f"{rule}{where} is {found[0]} as {path} last recorded it: nothing "
                         "to acknowledge")
    return identity, found[0], found[1]


def _identify(conn: sqlite3.Connection, gpu: str | None) -> dict[str, Any]:
    """The GPU's columns for an ack (its UUID and serial as the store has them); {} for a
    host rule; AckRefused for a GPU the store never recorded."""
    if gpu is None:
        return {}
    row = conn.execute(
        "SELECT gpu_index, gpu_uuid, gpu_serial, gpu_bus_id FROM events WHERE "
        "(gpu_index = ? OR gpu_uuid = ? OR gpu_serial = ?) ORDER BY gpu_uuid IS NULL, id DESC "
        "LIMIT 1", (int(gpu) if gpu.isdigit() else -1, gpu, gpu)).fetchone()
    if row is None or not all(v is None or isinstance(v, int | str) for v in row):
        known = sorted({i for (i,) in conn.execute(
            "SELECT DISTINCT gpu_index FROM events WHERE kind = 'rule' AND "
            "gpu_index IS NOT NULL LIMIT 64") if isinstance(i, int)})
        knows = ", ".join(map(str, known)) or "none"
        raise AckRefused(f"the event store has recorded no GPU {gpu} (it knows GPUs: "
                         f"{knows}): its rules were ok so far, or this host has no such GPU; "
                         "nothing to acknowledge")
    if row[1] is None:  # an index alone: the store never read this board's UUID
        return {"gpu_index": row[0]}
    return {"gpu_index": row[0], "gpu_uuid": row[1], "gpu_serial": row[2],
            "gpu_bus_id": row[3]}


def _ack_kernel_log(state_dir: Path, paths: Paths, kmsg: Path) -> str:
    """`ack xid.recent` also does what `gpuguard xid ack` does: the lines logged so far
    stop counting (this boot)."""
    from gpuguard.sources import boot_state
    from gpuguard.sources import host as host_sources

    log = host_sources.read_kmsg_at(kmsg, 5.0)
    if not log.is_ok or log.value is None:
        return f"; the kernel log was not read ({log.describe()}): its lines still count"
    seqs = [e["seq"] for e in log.value["xids"] + (log.value.get("sxids") or [])
            if e.get("seq") is not None]
    if not seqs:
        return "; no Xid line in the kernel log"
    try:
        boot_state.write_xid_ack(state_dir, paths, max(seqs))
    except OSError as exc:
        return f"; cannot write the kernel-log ack: {exc.strerror or exc}"
    return f"; kernel-log lines up to sequence {max(seqs)} no longer count"


def record_xid_ack(state_dir: Path, paths: Paths, seq: int, lines: int) -> None:
    """`gpuguard xid ack` leaves a line in the store (shown by `events`); the ack itself is
    the kmsg sequence, so this record changes no action (it has no status: it covers no
    finding). A store that cannot be written changes nothing: the kmsg ack is done."""
    writer = EventWriter(eventstore.path_in(state_dir), boot_id(paths),
                         integrity_check=False)
    now = time.time()
    writer.record(Event(kind="ack", source="cli", time=now, rule="xid.recent",
                        message=f"gpuguard xid ack: {lines} line(s) up to kmsg sequence {seq}",
                        data={"reason": f"gpuguard xid ack up to kmsg sequence {seq}",
                              "until": now, "kmsg_seq": seq, "by": _user()}))
    if not flush_within(writer, CLI_WRITE_WAIT_S):
        print(f"gpuguard: the ack was not recorded in {writer.path}", file=sys.stderr)
    writer.close()


def _user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())
