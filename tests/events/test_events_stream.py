"""`gpuguard events` written a batch of rows at a time (issue 32): the bytes of the
table and of the JSON are those of one query rendered whole (events of equal times,
every kind, a filter, a limit that cuts a batch, bad rows), and between two batches the
reader holds no read transaction: a writer's checkpoint truncates the WAL while the
output of a batch waits."""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from pathlib import Path

import pytest

from gpuguard.events import commands
from gpuguard.events import store as eventstore
from gpuguard.events.store import Event
from gpuguard.events.writer import EventWriter


def whole(state: Path, since_s: float, gpu: str | None, rule: str | None,
          kinds: tuple[str, ...], fmt: str, limit: int) -> str:
    """What `events` printed before issue 32: one query, rendered whole."""
    conn = eventstore.open_reader(eventstore.path_in(state))
    try:
        found = eventstore.query(conn, time.time() - since_s, kinds, rule, gpu, limit)
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
        lines.extend(commands.table_row(e, width))
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("state")
    writer = EventWriter(eventstore.path_in(folder), "b1")
    now = time.time()
    events = []
    for i in range(1300):
        # runs of equal times: the cursor must page inside them
        kind = ("rule", "xid", "repair", "supervisor")[i % 4]
        events.append(Event(
            kind=kind, source="daemon", time=now - 3600 + (i // 7), rule="pcie.replays"
            if kind == "rule" else "svc" if kind == "supervisor" else None,
            code=79 if kind == "xid" else None, seq=i if kind == "xid" else None,
            status="warning" if kind != "repair" else "gpu_reset", old_status="ok",
            gpu_index=i % 3, gpu_uuid=f"GPU-{i % 3}", action="reset_gpu",
            message=f"event {i} " + "quoted \u00e9 text " * (i % 9), data={"n": i}))
    writer.record_all(events)
    assert writer.flush() == len(events)
    writer.close()
    conn = sqlite3.connect(eventstore.path_in(folder))  # two bad rows among them
    conn.execute("UPDATE events SET kind = 'nonsense' WHERE id IN (5, 600)")
    conn.commit()
    conn.close()
    return folder


@pytest.mark.parametrize("fmt", ["table", "json"])
@pytest.mark.parametrize("size", [1, 7, 500])
@pytest.mark.parametrize("query", [
    (86400.0, None, None, (), 100_000), (86400.0, None, None, (), 1001),
    (86400.0, "1", None, (), 100_000), (86400.0, None, "pcie.replays", ("rule",), 50),
    (60.0, None, None, ("ack",), 100)])
def test_the_streamed_bytes_are_one_querys(state, monkeypatch, fmt, size, query):
    since_s, gpu, rule, kinds, limit = query
    monkeypatch.setattr(eventstore, "BATCH", size)
    real = eventstore.batches
    monkeypatch.setattr(eventstore, "batches",
                        lambda *a, **k: real(*a, **{**k, "size": size}))
    chunks: list[str] = []
    commands.stream_events(state, since_s, gpu, rule, kinds, fmt, limit, chunks.append)
    assert "".join(chunks) == whole(state, since_s, gpu, rule, kinds, fmt, limit)
    if limit >= 1000 and size == 7 and gpu is None:
        assert len(chunks) > 100  # written as it came, not at the end


def test_no_read_transaction_is_held_while_a_batch_is_written(state, tmp_path):
    path = tmp_path / "events.db"
    shutil.copy(eventstore.path_in(state), path)
    writer = EventWriter(path, "b1")
    busy: list[int] = []

    def write(chunk: str) -> None:
        # a page of output waits on the reader's pager: the writer goes on meanwhile
        writer.record_all([Event(kind="rule", source="daemon", rule="pcie.replays",
                                 status="ok", message="m" * 500)])
        writer.flush()
        conn = sqlite3.connect(path)
        busy.append(conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0])
        conn.close()

    commands.stream_events(tmp_path, 86400.0, None, None, (), "json", 100_000, write)
    writer.close()
    assert len(busy) > 2 and busy == [0] * len(busy)
