"""Retention and a wall clock that jumps (issue 20, item 1, the event store's part): a jump
forward of 100 days used to delete the whole store. Retention now deletes only what every
witness of the present calls old: the wall clock, the wall clock at open carried forward
by the monotonic clock, and the newest event stored (retention never deletes past the
newest stored event minus the retention age). Only the wall clock is shifted here (the
writer's `clock`); the monotonic clock runs as it does."""

from __future__ import annotations

import time
from pathlib import Path

from gpuguard.events import store as eventstore
from gpuguard.events.store import Event
from gpuguard.events.writer import EventWriter

DAY = 86400.0
AGE = 90 * DAY


def history(path: Path, now: float) -> None:
    """One event a day for 200 days up to `now` (half a day before it, and so on: none on
    the 90 days' edge), written with the clock right."""
    writer = EventWriter(path, "b1", max_age_s=1000 * DAY)
    writer.record_all(Event(kind="rule", source="daemon", time=now - (d + 0.5) * DAY,
                            rule="pcie.replays", status="warning", gpu_index=0,
                            message=f"day -{d}") for d in range(200))
    assert writer.flush() == 200
    writer.close()


def times(path: Path) -> list[float]:
    conn = eventstore.open_reader(path)
    try:
        return sorted(r[0] for r in conn.execute("SELECT time FROM events"))
    finally:
        conn.close()


def test_a_writer_started_while_the_clock_is_100_days_ahead_keeps_the_last_90_days(tmp_path):
    path = tmp_path / "events.db"
    now = time.time()
    history(path, now)
    ahead = now + 100 * DAY
    writer = EventWriter(path, "b1", clock=lambda: ahead)
    writer.record(Event(kind="rule", source="daemon", time=ahead, rule="pcie.replays",
                        status="ok", gpu_index=0, message="timed by the shifted clock"))
    assert writer.flush() == 1
    writer.close()
    kept = times(path)
    # the 90 days before the newest event written with the clock right (half a day old):
    # 91 daily events, the one on the edge included; the shifted one kept too
    assert len([t for t in kept if t <= now]) == 91
    assert min(kept) >= now - 0.5 * DAY - AGE and max(kept) == ahead


def jump_under(path: Path, now: float, **options: float) -> list[float]:
    """A writer running with the clock right; the clock jumps 100 days ahead for a few
    flushes, each with an event timed by it, and comes back."""
    history(path, now)
    clock = {"now": now}
    writer = EventWriter(path, "b1", clock=lambda: clock["now"], **options)
    writer.record(Event(kind="rule", source="daemon", time=now, rule="pcie.replays",
                        status="ok", gpu_index=0, message="before the jump"))
    assert writer.flush() == 1
    # the 90 days before the newest event (half a day old), the edge included: 91; and
    # the new one
    assert len(times(path)) == 92
    clock["now"] = now + 100 * DAY  # for a few seconds
    for i in range(3):
        writer.record(Event(kind="rule", source="daemon", time=clock["now"] + i,
                            rule="pcie.replays", status="warning", gpu_index=0,
                            message="during the jump"))
        writer.flush()
    clock["now"] = now + 5
    writer.record(Event(kind="rule", source="daemon", time=now + 5, rule="pcie.replays",
                        status="ok", gpu_index=0, message="after"))
    writer.flush()
    writer.close()
    return times(path)


def test_a_jump_under_a_running_writer_deletes_nothing(tmp_path):
    """The hourly retention counts its hour on the monotonic clock: a jump does not make
    it due."""
    now = time.time()
    kept = jump_under(tmp_path / "events.db", now)
    # nothing of the last 90 days went: the 90 daily events, "before" and "after"
    assert len([t for t in kept if now - AGE <= t <= now + 5]) == 92, len(kept)


def test_a_jump_while_the_retention_is_due_deletes_nothing_new(tmp_path):
    """Retention on every flush: the wall clock alone says 100 days later; the wall clock
    at open carried by the monotonic clock, and the newest event before the jump, do
    not."""
    now = time.time()
    kept = jump_under(tmp_path / "events.db", now, age_prune_every_s=0.0)
    assert len([t for t in kept if now - AGE <= t <= now + 5]) == 92, len(kept)


def test_a_store_whose_newest_event_is_old_keeps_its_last_90_days(tmp_path):
    """A host that recorded nothing for 200 days (switched off, or healthy): its last 90
    days of history stay until newer events come (retention is relative to the newest)."""
    path = tmp_path / "events.db"
    now = time.time()
    history(path, now - 200 * DAY)
    writer = EventWriter(path, "b1")
    writer.last_findings()  # what the daemon reads first: the store is open
    writer.flush()  # nothing queued: the retention alone
    writer.close()
    assert len(times(path)) == 91  # the 90 days before the newest, the edge included
