"""The store's content is not trusted (issue 20, item 8): every row read is validated; a
bad one is skipped and counted (a stderr line from a command, a counter in the daemon's
recorder), never fatal. Bad durations are refused at the command line."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from gpuguard.events import store as eventstore
from gpuguard.events.store import Event
from gpuguard.events.writer import EventWriter
from gpuguard.model.identity import GpuId
from gpuguard.model.results import Result, Status
from tests.conftest import gpuguard, own_host
from tests.events.conftest import BOOT_A, NONE, ack, events, procfs, result


def flip_a_byte(path: Path, marker: bytes) -> None:
    """One bit of the file flipped at the first byte of `marker` (a failing disk)."""
    data = bytearray(path.read_bytes())
    at = data.index(marker)
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_flipped_byte_in_an_ack_row_never_breaks_check_on_a_healthy_host(
        tmp_path, run, fake_env):
    state, proc = tmp_path / "state", procfs(tmp_path, BOOT_A)
    run(state, proc)
    assert ack(state, proc, "recovery.action", "--gpu", "0").returncode == 0
    flip_a_byte(eventstore.path_in(state), b'{"reason": ')
    # the preflight an ExecStartPre= runs: a plain check on a healthy host
    healthy = gpuguard("check", *own_host(tmp_path / "host"), "--state-dir", str(state),
                       "--path.procfs", str(proc), "--only", "recovery.action",
                       env=fake_env(gpus=2, recovery=NONE))
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert "1 bad row(s) skipped" in healthy.stderr
    # and a faulty one still says critical, the unreadable ack covering nothing
    doc = run(state, proc)
    faulty = result(doc, "recovery.action", 0)
    assert (faulty["status"], faulty["action"]) == ("critical", "reset_gpu")
    assert "bad row(s) skipped" in doc["stderr"]
    # events lists the rest, and says so
    out = gpuguard("events", "--state-dir", str(state))
    assert out.returncode == 0, out.stderr
    assert "recovery.action" in out.stdout and "1 bad row(s) skipped" in out.stderr


@pytest.mark.parametrize("span", ["infd", "1e400d", "nanh", "-5m", "0s", "400d"])
def test_a_duration_that_is_not_a_finite_span_is_refused(tmp_path, run, span):
    state, proc = tmp_path / "state", procfs(tmp_path, BOOT_A)
    run(state, proc)
    out = ack(state, proc, "recovery.action", "--gpu", "0", "--for", span)
    assert out.returncode == 3, out.stdout + out.stderr
    assert "--for" in out.stderr
    assert events(state, "--kind", "ack") == []  # refused: nothing written
    out = gpuguard("events", "--state-dir", str(state), "--since", span)
    assert out.returncode == (0 if span == "400d" else 3), out.stdout + out.stderr


BAD_ROWS: list[tuple[str, object]] = [
    # (column, value) written over one good row each: what a corrupt file or an older,
    # buggier writer can leave
    ("data", '{"reason": "r", "until": Infinity}'),
    ("data", '{"reason": "r", "until": 1e308}'),
    ("data", '{"reason": "r", "until": "tomorrow"}'),
    ("data", "[1, 2, 3]"),
    ("data", '{"reason": "r", "unt'),
    ("time", "not a time"),
    ("time", 1e300),
    ("status", "crit\x01cal"),
    ("gpu_index", "zero"),
    ("kind", "nonsense"),
    ("message", b"\xff\x00\xff"),
]


def bad_store(path: Path) -> int:
    """A store of good acks and transitions, then one bad value in each of len(BAD_ROWS)
    of its ack rows (the way a flipped bit or another writer would leave them)."""
    now = time.time()
    writer = EventWriter(path, BOOT_A)
    for i in range(len(BAD_ROWS)):
        writer.record(Event(kind="ack", source="cli", time=now - 10, rule="recovery.action",
                            gpu_index=0, gpu_uuid="GPU-0", status="critical",
                            data={"reason": f"ack {i}", "until": now + 3600}))
    writer.record(Event(kind="rule", source="daemon", time=now - 20, rule="recovery.action",
                        gpu_index=1, gpu_uuid="GPU-1", status="critical", action="reset_gpu"))
    assert writer.flush() == len(BAD_ROWS) + 1
    writer.close()
    conn = sqlite3.connect(path)
    with conn:
        for row_id, (column, value) in enumerate(BAD_ROWS, start=1):
            conn.execute(f"UPDATE events SET {column} = ? WHERE id = ?", (value, row_id))
    conn.close()
    return len(BAD_ROWS)


def test_bad_rows_are_skipped_and_counted_by_events(tmp_path):
    state = tmp_path / "state"
    bad = bad_store(eventstore.path_in(state))
    for fmt in ("table", "json"):
        out = gpuguard("events", "--state-dir", str(state), "--format", fmt)
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"{bad} bad row(s) skipped" in out.stderr
        assert "recovery.action" in out.stdout


def test_the_daemons_recorder_skips_bad_rows_counts_them_and_records_on(tmp_path,
                                                                        default_rules):
    from gpuguard.daemon.recorder import EventRecorder

    path = tmp_path / "events.db"
    bad = bad_store(path)
    recorder = EventRecorder(path, BOOT_A)
    board = GpuId(0, "GPU-0", "00000000:18:00.0")
    failing = [Result("recovery.action", Status.CRITICAL, Status.CRITICAL, "m", board,
                      action="reset_gpu")]
    recorder.on_cycle(failing, {0: board}, default_rules)
    recorder.work()  # must not raise
    [applied] = recorder.on_cycle(failing, {0: board}, default_rules)
    recorder.work()
    recorder.writer.close()
    assert applied.action == "reset_gpu"  # no bad ack covers it
    conn = eventstore.open_reader(path)
    recorded = conn.execute("SELECT count(*) FROM events WHERE kind = 'rule' AND "
                            "gpu_uuid = 'GPU-0'").fetchone()[0]
    conn.close()
    assert recorded == 1  # the transition was written: the recording went on
    # every bad ack row, once; the one whose kind became "nonsense" is no ack any more
    # (its query never reads it; `events`, which reads every kind, counts it)
    assert recorder.metrics()["rows_skipped"] == bad - 1
