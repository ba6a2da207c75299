"""The store's write-ahead log (issue 20, items 11 and 12): a reader that pins it cannot
grow it past the bound, the bound and the size metric count it, it is checkpointed and
truncated whenever no reader pins it, and a WAL deleted under the writer is noticed and
its events saved or counted, never claimed written and lost."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuguard.events import store as eventstore
from gpuguard.events.store import Event
from gpuguard.events.writer import EventWriter
from tests.conftest import REPO, gpuguard

NOBODY = 65534
# The reader runs as `nobody`, with the system's Python (the project's may sit where
# nobody cannot reach): it opens the store read-only, begins a transaction and holds it.
PINNING_READER = """
import sqlite3, sys, time
conn = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True, isolation_level=None)
conn.execute("BEGIN")
print(conn.execute("SELECT count(*) FROM events").fetchone()[0], flush=True)
time.sleep(600)
"""


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder another user can read (pytest's own tmp folders are root's alone)."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to read the store as another user")
    folder = Path(tempfile.mkdtemp(prefix="gpuguard-wal-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def on_disk(path: Path) -> int:
    wal = Path(f"{path}-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def batch(n: int = 100) -> list[Event]:
    return [Event(kind="rule", source="daemon", rule="pcie.replays", status="warning",
                  gpu_index=i % 8, message="m" * 1500) for i in range(n)]


def test_a_reader_that_pins_the_wal_cannot_grow_it_past_the_bound(shared_dir):
    path = shared_dir / "events.db"
    bound = 4 * 2**20
    writer = EventWriter(path, "b1", max_bytes=bound)
    writer.record_all(batch(1))
    assert writer.flush() == 1
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    reader = subprocess.Popen([python, "-c", PINNING_READER, str(path)], user=NOBODY,
                              cwd="/", stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout is not None and reader.stdout.readline().strip() == "1"
        largest = 0
        for _ in range(120):  # some 18 MB of events, four times the bound
            writer.record_all(batch())
            writer.flush()
            largest = max(largest, on_disk(path))
        # the bound holds with the WAL in it (one batch over at most), and says so
        assert largest <= bound + 2**20, largest
        assert writer.stats.size_bytes >= Path(f"{path}-wal").stat().st_size
        assert writer.stats.size_bytes > bound - 2**20
        assert writer.stats.wal_pinned > 0  # flushes that found the WAL pinned, held back
        held = writer.stats.queued + sum(writer.stats.dropped.values())
        assert held > 0  # what could not be written is queued or counted, never lost quietly
    finally:
        reader.kill()
        reader.wait(timeout=10)
    # the reader is gone: the next flush checkpoints and truncates the WAL, and the
    # events held back go in, BATCH_MAX a flush, the bound holding
    writer.record_all(batch(1))
    for _ in range(10):
        writer.flush()
        assert on_disk(path) <= bound + 2**20 + 4 * 2**20  # a batch at most over, briefly
    wal = Path(f"{path}-wal")
    assert not wal.exists() or wal.stat().st_size <= 4 * 2**20
    assert on_disk(path) <= bound + 2**20
    assert writer.stats.queued == 0
    writer.close()


def test_events_holds_no_read_transaction_while_its_output_waits(tmp_path):
    """`gpuguard events` whose output nobody reads (a pager left open): its query is done
    and the store let go, so the writer checkpoints and truncates the WAL meanwhile."""
    path = tmp_path / "events.db"
    writer = EventWriter(path, "b1")
    for _ in range(20):
        writer.record_all(batch())
        writer.flush()
    proc = subprocess.Popen([sys.executable, "-m", "gpuguard", "events", "--state-dir",
                             str(tmp_path), "--limit", "2000", "--format", "json"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(3)  # it has written what the pipe holds, and waits on the rest
        assert proc.poll() is None
        conn = sqlite3.connect(path)  # a checkpoint as the writer makes it
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        conn.close()
        assert busy == 0
        assert Path(f"{path}-wal").stat().st_size == 0
    finally:
        proc.kill()
        proc.communicate(timeout=10)
        writer.close()


WRITER = """
import json, sys
sys.path.insert(0, {repo!r})
from pathlib import Path
from gpuguard.events.store import Event
from gpuguard.events.writer import EventWriter
w = EventWriter(Path({path!r}), boot_id="b1")
i = 0
for line in sys.stdin:
    for _ in range(int(line)):
        w.record(Event(kind="rule", source="t", rule="r.x", status="warning", message="m",
                       gpu_index=i % 8))
        i += 1
    w.flush()
    print(json.dumps({{"written": w.stats.written, "dropped": w.stats.dropped,
                      "wal_replaced": getattr(w.stats, "wal_replaced", None)}}), flush=True)
"""


def test_a_wal_deleted_under_the_writer_is_noticed_and_nothing_is_claimed_and_lost(tmp_path):
    path = tmp_path / "events.db"
    proc = subprocess.Popen([sys.executable, "-c", WRITER.format(repo=str(REPO),
                                                                 path=str(path))],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def flush(n: int) -> dict:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(f"{n}\n")
        proc.stdin.flush()
        while True:  # the writer's log lines come on the same stdout
            line = proc.stdout.readline()
            if line.startswith('{"written"'):
                return dict(json.loads(line))

    try:
        flush(50)
        flush(50)
        os.unlink(f"{path}-wal")
        os.unlink(f"{path}-shm")
        flush(50)
        said = flush(50)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert said["wal_replaced"] == 1, said
    conn = eventstore.open_reader(path)
    try:
        kept = conn.execute("SELECT count(*) FROM events").fetchone()[0]
    finally:
        conn.close()
    lost = said["dropped"].get("wal_lost", 0)
    assert kept + lost == said["written"] + lost >= 200 - lost
    assert kept == said["written"] - lost, said
    # and the store reads as any other afterwards
    out = gpuguard("events", "--state-dir", str(tmp_path), "--since", "1h", "--format", "json")
    assert out.returncode == 0, out.stderr
