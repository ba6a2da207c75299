"""The event store on real files: it never blocks or breaks its writer, and what it holds
stays readable (docs/events.md)."""

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuguard.events import corrupt_store
from gpuguard.events import store as eventstore
from gpuguard.events.store import Event, StoreUnreadable
from gpuguard.events.writer import EventWriter
from tests.conftest import REPO, mounted_tmpfs

ROOT = os.geteuid() == 0


def flap(i: int, when: float, gpu: int = 0) -> Event:
    status = "warning" if i % 2 == 0 else "ok"
    return Event(kind="rule", source="daemon", time=when, rule="pcie.replays",
                 gpu_index=gpu, gpu_uuid=f"GPU-{gpu:08d}-0000-0000-0000-000000000000",
                 gpu_serial=f"165000000{gpu:04d}", gpu_bus_id=f"00000000:{gpu + 0x10:02X}:00.0",
                 old_status="ok" if status == "warning" else "warning", status=status,
                 action="none", message=f"{1000 + i} PCIe replays in the last 10m (limit 100)",
                 boot_id="b1")


def rows(path: Path) -> int:
    conn = eventstore.open_reader(path)
    try:
        return int(conn.execute("SELECT count(*) FROM events").fetchone()[0])
    finally:
        conn.close()


def test_written_events_read_back_filtered(tmp_path):
    writer = EventWriter(tmp_path / "events.db", boot_id="b1")
    now = time.time()
    writer.record_all([flap(0, now - 7200, 0), flap(1, now - 60, 1),
                       Event(kind="xid", source="kmsg", time=now, rule="xid.recent", code=79,
                             seq=5, status="critical", gpu_index=1, gpu_uuid="GPU-x",
                             gpu_serial="S1")])
    assert writer.flush() == 3
    conn = eventstore.open_reader(tmp_path / "events.db")
    newest = list(eventstore.query(conn))
    assert [e.kind for e in newest] == ["xid", "rule", "rule"]
    assert [e.code for e in eventstore.query(conn, kinds=["xid"])] == [79]
    assert len(list(eventstore.query(conn, since=now - 3600))) == 2
    assert len(list(eventstore.query(conn, gpu="S1"))) == 1  # by serial
    assert len(list(eventstore.query(conn, gpu="1"))) == 2  # by index
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    # the reader is read-only
    with pytest.raises(sqlite3.OperationalError):
        conn.execute("DELETE FROM events")
    conn.close()
    # the same kernel-log line (boot, sequence) is kept once, however often it is read
    writer.record(Event(kind="xid", source="kmsg", time=now, rule="xid.recent", code=79, seq=5,
                        status="critical"))
    writer.flush()
    assert rows(tmp_path / "events.db") == 3
    writer.close()


def test_a_locked_store_does_not_block_the_writer(tmp_path):
    path = tmp_path / "events.db"
    writer = EventWriter(path, boot_id="b1")
    writer.record(flap(0, time.time()))
    writer.flush()
    holder = sqlite3.connect(path)
    holder.execute("BEGIN EXCLUSIVE")  # another process holds the write lock
    try:
        writer.record(flap(1, time.time()))
        started = time.monotonic()
        assert writer.flush() == 0
        assert time.monotonic() - started < 2.0  # bounded: busy_timeout, then back
        assert writer.stats.busy == 1 and writer.stats.queued == 1
    finally:
        holder.rollback()
        holder.close()
    assert writer.flush() == 1  # the queued event goes in with the next flush
    assert rows(path) == 2 and not writer.stats.dropped
    writer.close()


def test_the_queue_is_bounded_and_counts_what_it_drops(tmp_path):
    writer = EventWriter(tmp_path / "sub" / "events.db", queue_max=5)
    writer.record_all(flap(i, time.time()) for i in range(8))
    assert writer.stats.queued == 5 and writer.stats.dropped == {"queue_full": 3}
    assert writer.flush() == 5
    writer.close()


def test_a_corrupt_store_is_moved_aside_and_a_new_one_started(tmp_path):
    path = tmp_path / "events.db"
    writer = EventWriter(path)
    writer.record(flap(0, time.time()))
    writer.flush()
    writer.close()
    # scribble over the middle of the file (the header stays: quick_check finds it)
    data = bytearray(path.read_bytes())
    data[100:] = b"\xff" * (len(data) - 100)
    path.write_bytes(bytes(data))
    writer = EventWriter(path)
    writer.record(flap(1, time.time()))
    writer.flush()
    assert writer.stats.corrupt_moved == 1
    writer.flush()  # the event it kept goes to the new file
    aside = list(tmp_path.glob("events.db.corrupt-*"))
    assert len(aside) == 1
    assert rows(path) == 1
    writer.close()
    # not a database at all
    path.write_bytes(b"this is not sqlite" * 100)
    writer = EventWriter(path)
    writer.record(flap(2, time.time()))
    writer.flush()
    writer.flush()
    assert writer.stats.corrupt_moved == 1 and rows(path) == 1
    writer.close()
    with pytest.raises(StoreUnreadable):
        eventstore.open_reader(tmp_path / "missing.db")


WRITER = """
import sys, time
sys.path.insert(0, {repo!r})
from gpuguard.events.store import Event
from gpuguard.events.writer import EventWriter
w = EventWriter(__import__("pathlib").Path({path!r}), boot_id="b1")
i = 0
while True:
    for _ in range(50):
        w.record(Event(kind="rule", source="t", rule="r.x", status="ok" if i % 2 else "warning",
                       message="m" * 200, gpu_index=i % 8))
        i += 1
    w.flush()
    print(i, flush=True)
"""


def test_sigkill_in_the_middle_of_writes_leaves_a_readable_store(tmp_path):
    path = tmp_path / "events.db"
    proc = subprocess.Popen([sys.executable, "-c", WRITER.format(repo=str(REPO), path=str(path))],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        for _ in range(40):  # some 2,000 events written, writes going on
            proc.stdout.readline()
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    conn = eventstore.open_reader(path)
    assert conn.execute("PRAGMA quick_check").fetchone()[0] == "ok"
    assert conn.execute("SELECT count(*) FROM events").fetchone()[0] >= 2000
    conn.close()
    # and a new writer goes on with it
    writer = EventWriter(path)
    writer.record(flap(0, time.time()))
    assert writer.flush() == 1 and writer.stats.corrupt_moved == 0
    writer.close()


def test_a_year_of_a_flapping_rule_on_8_gpus_stays_under_the_size_bound(tmp_path):
    """pcie.replays flapping warning/ok every 30 minutes on each of 8 GPUs for a year:
    140,160 transitions; the age bound set past a year, so the size bound alone holds it."""
    path = tmp_path / "events.db"
    bound = 16 * 2**20  # a smaller bound than the default 64 MiB, so the test is quick
    writer = EventWriter(path, max_age_s=400 * 86400, max_bytes=bound)
    start = time.time() - 365 * 86400
    step = 1800.0
    per_day = int(86400 / step)
    i = 0
    for _day in range(365):
        for _ in range(per_day):
            for gpu in range(8):
                writer.record(flap(i, start + i / 8 * step, gpu))
            i += 8
        writer.flush()
    assert not writer.stats.dropped and writer.stats.queued == 0
    writer.close()
    size = path.stat().st_size
    assert size <= bound, size
    kept = rows(path)
    assert 0 < kept < i  # the oldest went
    conn = eventstore.open_reader(path)
    newest = max(r[0] for r in conn.execute("SELECT time FROM events"))
    conn.close()
    assert newest >= start + (i - 8) / 8 * step  # the newest stayed


@pytest.fixture
def small_mount(tmp_path):
    """A 1 MiB tmpfs of our own, removed whatever happens."""
    if not ROOT:
        pytest.skip("needs root to mount a tmpfs")
    with mounted_tmpfs(tmp_path / "mnt", "size=1m") as mnt:
        yield mnt


def test_a_full_disk_drops_events_counted_and_the_writer_goes_on(small_mount):
    path = small_mount / "events.db"
    writer = EventWriter(path)
    writer.record(flap(0, time.time()))
    assert writer.flush() == 1
    # fill what is left of the file system
    with open(small_mount / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    for i in range(300):
        writer.record(flap(i, time.time()))
    writer.flush()  # must not raise
    assert writer.stats.dropped.get("disk_full", 0) > 0 or \
        writer.stats.dropped.get("io_error", 0) > 0, writer.stats
    assert writer.stats.queued == 0
    (small_mount / "filler").unlink()
    writer.record(flap(1, time.time()))
    assert writer.flush() == 1  # room again: it writes again
    writer.close()


def test_a_read_only_store_drops_events_counted(small_mount):
    path = small_mount / "events.db"
    writer = EventWriter(path)
    writer.record(flap(0, time.time()))
    writer.flush()
    writer.close()
    subprocess.run(["mount", "-o", "remount,ro", str(small_mount)], check=True)
    writer = EventWriter(path)
    writer.record(flap(1, time.time()))
    assert writer.flush() == 0
    assert sum(writer.stats.dropped.values()) == 1, writer.stats
    writer.close()
    # a reader still reads it (any user, a read-only folder)
    assert rows(path) == 1


def test_a_cycle_never_waits_for_a_slow_disk(tmp_path, default_rules):
    """The recorder's thread does the disk work; a cycle hands its results over in memory.
    Here every flush takes 3 s (a slow disk): a cycle still returns at once."""
    import threading

    from gpuguard.daemon.recorder import EventRecorder
    from gpuguard.model.identity import GpuId
    from gpuguard.model.results import Result, Status

    recorder = EventRecorder(tmp_path / "events.db", "b1", flush_every_s=0.05)
    slow = threading.Event()

    def slow_disk() -> None:
        slow.set()
        time.sleep(3)

    recorder.before_flush = slow_disk
    recorder.start()
    try:
        gpu = GpuId(0, "GPU-0", "00000000:18:00.0")
        bad = [Result("recovery.action", Status.CRITICAL, Status.CRITICAL, "m", gpu,
                      action="reset_gpu")]
        recorder.on_cycle(bad, {}, default_rules)
        assert slow.wait(5)  # the thread is inside its slow flush now
        started = time.monotonic()
        for _ in range(20):
            recorder.on_cycle(bad, {}, default_rules)
        assert time.monotonic() - started < 1.0  # 20 cycles, none waiting 3 s
    finally:
        recorder.stop(wait_s=10)
    assert rows(tmp_path / "events.db") == 1  # one transition, written in the end


def test_history_verdicts_of_one_cadence_survive_the_other_cadence(tmp_path, default_rules):
    """The daemon's fast and slow cycles judge different rules: an ack worked out for a
    fast rule holds while a slow cycle (nothing failing) is recorded in between."""
    from gpuguard.daemon.recorder import EventRecorder
    from gpuguard.model.identity import GpuId
    from gpuguard.model.results import Result, Status

    gpu = GpuId(0, "GPU-0", "00000000:18:00.0")
    bad = [Result("recovery.action", Status.CRITICAL, Status.CRITICAL, "m", gpu,
                  action="reset_gpu")]
    slow = [Result("vbios.consistent", Status.OK, Status.CRITICAL, "fine")]
    writer = EventWriter(tmp_path / "events.db", boot_id="b1")
    writer.record(Event(kind="ack", source="cli", rule="recovery.action", gpu_index=0,
                        gpu_uuid="GPU-0", status="critical",
                        data={"reason": "RMA", "until": time.time() + 3600}))
    writer.flush()
    writer.close()
    recorder = EventRecorder(tmp_path / "events.db", "b1")
    recorder.on_cycle(bad, {}, default_rules)
    recorder.work()
    recorder.on_cycle(slow, {}, default_rules)
    recorder.work()
    [applied] = recorder.on_cycle(bad, {}, default_rules)
    assert applied.action == "none" and "RMA" in (applied.action_reason or "")
    recorder.writer.close()


def test_a_probe_result_is_recorded_with_its_board(tmp_path):
    from gpuguard.events.recording import probe_event
    from gpuguard.model.identity import GpuId

    writer = EventWriter(tmp_path / "events.db", boot_id="b1")
    writer.record(probe_event("gpu.compute", "critical", GpuId(2, "GPU-2", "0:2", "S2"),
                              "matmul mismatch", "reset_gpu", {"gflops": 1.5}))
    assert writer.flush() == 1
    writer.close()
    conn = eventstore.open_reader(tmp_path / "events.db")
    [event] = list(eventstore.query(conn, kinds=["probe"], gpu="S2"))
    conn.close()
    assert (event.rule, event.status, event.gpu_index, event.data) == \
        ("gpu.compute", "critical", 2, {"gflops": 1.5})


def test_any_user_may_read_the_store_whatever_the_umask(tmp_path):
    """The unit runs with UMask=0077: the store and its -wal/-shm are still 0644."""
    old = os.umask(0o077)
    try:
        writer = EventWriter(tmp_path / "events.db")
        writer.record(flap(0, time.time()))
        writer.flush()
        modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
        writer.close()
    finally:
        os.umask(old)
    assert modes == {"events.db": 0o644, "events.db-wal": 0o644, "events.db-shm": 0o644}


def test_an_ack_by_index_ends_when_that_slot_changes(tmp_path, default_rules):
    from gpuguard.events.escalation import apply_history
    from gpuguard.model.identity import GpuId
    from gpuguard.model.results import Result, Status

    path = tmp_path / "events.db"
    writer = EventWriter(path, boot_id="b1")
    # an ack given before the store knew the board's UUID
    writer.record(Event(kind="ack", source="cli", rule="recovery.action", gpu_index=0,
                        status="critical", data={"reason": "r", "until": time.time() + 3600}))
    writer.flush()
    bad = [Result("recovery.action", Status.CRITICAL, Status.CRITICAL, "m",
                  GpuId(0, "GPU-0", "00000000:18:00.0"), action="reset_gpu")]

    def action() -> str:
        conn = eventstore.open_reader(path)
        try:
            return apply_history(bad, conn, "b1", default_rules, {})[0].action
        finally:
            conn.close()

    assert action() == "none"
    writer.record(Event(kind="rule", source="daemon", rule="recovery.action", gpu_index=0,
                        gpu_uuid="GPU-0", old_status="critical", status="ok"))
    writer.flush()
    writer.close()
    assert action() == "reset_gpu"  # the finding changed after the ack: it holds no more


def _ack_then_reboot(tmp_path, default_rules, ack_boot: str):
    """ecc.uncorrected critical on a board in boot A, acked for 30 days (in `ack_boot`);
    then boot B, the same fault: what the daemon's recorder makes of it."""
    from gpuguard.daemon.recorder import EventRecorder
    from gpuguard.model.identity import GpuId
    from gpuguard.model.results import Result, Status

    path = tmp_path / "events.db"
    board = {0: GpuId(0, "GPU-aaaa", "00000000:01:00.0", "S123")}
    bad = [Result("ecc.uncorrected", Status.CRITICAL, Status.CRITICAL, "DBE",
                  board[0], action="reset_gpu")]
    first = EventRecorder(path, "boot-A")
    first.on_cycle(bad, board, default_rules)
    first.work()
    first.writer.close()
    writer = EventWriter(path, ack_boot)
    now = time.time()
    writer.record(Event(kind="ack", source="cli", time=now, rule="ecc.uncorrected",
                        status="critical", gpu_index=0, gpu_uuid="GPU-aaaa",
                        data={"reason": "known", "until": now + 30 * 86400, "by": "op"}))
    writer.flush()
    writer.close()
    second = EventRecorder(path, "boot-B")
    second.on_cycle(bad, board, default_rules)
    second.work()
    [applied] = second.on_cycle(bad, board, default_rules)
    second.writer.close()
    return applied


def test_an_ack_never_hides_a_fault_that_came_back_after_a_reboot(tmp_path, default_rules):
    """The ack was given in boot A; after the reboot the same fault is back: the
    escalation stands (an ack ends with its boot)."""
    applied = _ack_then_reboot(tmp_path, default_rules, "boot-A")
    assert applied.action == "inspect_hardware", applied.action_reason
    assert "came back after a reboot" in (applied.action_reason or "")
    assert "acknowledged" not in applied.observed


def test_an_escalation_wins_over_an_ack_of_this_boot(tmp_path, default_rules):
    """Even an ack given after the reboot (this boot) does not hide inspect_hardware."""
    applied = _ack_then_reboot(tmp_path, default_rules, "boot-B")
    assert applied.action == "inspect_hardware", applied.action_reason


def test_an_ack_ends_when_the_boot_changes(tmp_path, default_rules):
    """No escalation (a board without a lasting identity): an ack of boot A holds in
    boot A and not in boot B."""
    from gpuguard.events.escalation import apply_history
    from gpuguard.model.identity import GpuId
    from gpuguard.model.results import Result, Status

    path = tmp_path / "events.db"
    writer = EventWriter(path, "boot-A")
    writer.record(Event(kind="ack", source="cli", rule="recovery.action", gpu_index=0,
                        gpu_uuid="GPU-0", status="critical",
                        data={"reason": "r", "until": time.time() + 3600}))
    writer.flush()
    writer.close()
    bad = [Result("recovery.action", Status.CRITICAL, Status.CRITICAL, "m",
                  GpuId(0, "GPU-0", "00000000:18:00.0"), action="reset_gpu")]
    conn = eventstore.open_reader(path)
    try:
        assert apply_history(bad, conn, "boot-A", default_rules, {})[0].action == "none"
        assert apply_history(bad, conn, "boot-B", default_rules, {})[0].action == "reset_gpu"
    finally:
        conn.close()


def test_corrupt_copies_are_bounded_the_newest_kept(tmp_path):
    """A store that keeps getting corrupt (a failing disk) must not fill the state
    directory with copies: the newest few stay for a post-mortem, older ones go."""
    path = tmp_path / "events.db"
    for year in range(2020, 2025):
        (tmp_path / f"events.db.corrupt-{year}0101T000000").write_bytes(b"old" * 1000)
        (tmp_path / f"events.db.corrupt-{year}0101T000000-wal").write_bytes(b"w")
    (tmp_path / "events.db.corrupt-notes.txt-keep").write_bytes(b"")  # not ours: kept
    path.write_bytes(b"this is not sqlite" * 100)
    writer = EventWriter(path)
    writer.record(flap(0, time.time()))
    writer.flush()
    writer.flush()
    writer.close()
    assert writer.stats.corrupt_moved == 1 and rows(path) == 1
    left = sorted(p.name for p in tmp_path.glob("events.db.corrupt-*"))
    kept = corrupt_store.CORRUPT_KEPT
    assert len([n for n in left if n.startswith("events.db.corrupt-20")]) == \
        2 * (kept - 1) + 1  # the newest older ones with their -wal, and the new one
    assert "events.db.corrupt-20240101T000000" in left
    assert "events.db.corrupt-20240101T000000-wal" in left
    assert "events.db.corrupt-20200101T000000" not in left
    assert "events.db.corrupt-20200101T000000-wal" not in left
    assert "events.db.corrupt-notes.txt-keep" in left
