"""Schema 2 (issue 20, item 16): an index for the ack query, which scanned the whole table
(an 83 MB store made `check` four times slower). A store written by the code before
(tests/fixtures/events/v1.db, made with schema 1) is migrated by its first writer and read
by readers before and after."""

from __future__ import annotations

import shutil
import sqlite3

from gpuguard.events import store as eventstore
from gpuguard.events.store import Event
from gpuguard.events.writer import EventWriter
from tests.conftest import FIXTURES, gpuguard

V1 = FIXTURES / "events" / "v1.db"


def indexes(path) -> set[str]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = "
                                           "'index'")}
    finally:
        conn.close()


def test_a_schema_1_store_is_read_then_migrated_by_its_first_writer(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    path = eventstore.path_in(state)
    shutil.copy(V1, path)
    # read as it is (a daemon of the new version has not opened it yet)
    before = gpuguard("events", "--state-dir", str(state), "--since", "100000d",
                      "--format", "json")
    assert before.returncode == 0, before.stderr
    assert '"kind": "ack"' in before.stdout
    writer = EventWriter(path, "b-v2")
    writer.record(Event(kind="rule", source="daemon", rule="pcie.replays", status="warning",
                        gpu_index=0, message="new"))
    assert writer.flush() == 1
    writer.close()
    conn = eventstore.open_reader(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == eventstore.SCHEMA_VERSION
        assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == 7  # 6 + 1
        assert conn.execute("PRAGMA quick_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    assert "events_acks" in indexes(path)
    after = gpuguard("events", "--state-dir", str(state), "--since", "100000d",
                     "--format", "json")
    assert after.returncode == 0, after.stderr
    assert after.stdout.count('"kind"') == 7


def test_the_ack_query_uses_an_index(tmp_path):
    from gpuguard.events.acks import ACKS_SQL

    path = tmp_path / "events.db"
    writer = EventWriter(path, "b1")
    writer.record(Event(kind="rule", source="daemon", rule="pcie.replays", message="m"))
    writer.flush()
    writer.close()
    conn = eventstore.open_reader(path)
    try:
        plan = " ".join(str(r[-1]) for r in conn.execute(
            f"EXPLAIN QUERY PLAN {ACKS_SQL}", ("b1", 0.0)))
    finally:
        conn.close()
    assert "USING INDEX events_acks" in plan, plan
