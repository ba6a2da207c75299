"""The daemon and its event store on real files: it records while `gpuguard events`
reads, and a locked, read-only or missing store leaves cycles and metrics working."""

import json
import re
import sqlite3
import time

import pytest

from gpuguard.events.store import Event
from gpuguard.events.writer import EventWriter
from tests.conftest import FIXTURES, gpuguard, mounted_tmpfs
from tests.daemon.conftest import host_snapshot, metric_lines, write_snapshot

EMPTY_KMSG = FIXTURES / "kmsg" / "dmesg.log"


def counter(text: str, name: str) -> float:
    [line] = metric_lines(text, name)
    return float(line.rsplit(" ", 1)[1])


def test_the_daemon_records_while_events_reads(start_daemon, tmp_path):
    snap = tmp_path / "host.json"
    write_snapshot(snap, host_snapshot(2, {(1, "recovery_action"): "node_reboot"}))
    daemon = start_daemon("--input", str(snap), "--fast-interval", "0.2")
    state = tmp_path / "state"
    text = daemon.wait_for(lambda: (m := daemon.metrics()) and
                           'gpuguard_suggested_action{action="reboot",gpu="1"} 1.0' in m and m,
                           what="the suggested action")
    assert 'gpuguard_suggested_action{action="none",gpu="0"} 1.0' in text
    assert daemon.result("recovery.action", 1)["action"] == "reboot"

    def recorded() -> list[dict]:
        out = gpuguard("events", "--state-dir", str(state), "--format", "json", "--kind", "rule")
        assert out.returncode == 0, out.stderr  # a reader never fails for the writer
        return json.loads(out.stdout)["events"]

    first = daemon.wait_for(recorded, what="the transition in the store")
    assert [(e["rule"], e["gpu_index"], e["status"], e["action"]) for e in first] == \
        [("recovery.action", 1, "critical", "reboot")]
    # fixed: the way back is recorded too, while readers keep reading
    write_snapshot(snap, host_snapshot(2))
    back = daemon.wait_for(lambda: len(r := recorded()) == 2 and r, what="the way back")
    assert (back[0]["old_status"], back[0]["status"]) == ("critical", "ok")
    for _ in range(5):
        recorded()
    assert counter(daemon.metrics(), "gpuguard_event_store_written_total") >= 2
    assert counter(daemon.metrics(), "gpuguard_event_store_dropped_total") == 0


def test_a_locked_store_never_stalls_a_cycle(start_daemon, tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    writer = EventWriter(state / "events.db")
    writer.record(Event(kind="ack", source="test", rule="x.y"))
    writer.flush()
    writer.close()
    holder = sqlite3.connect(state / "events.db")
    holder.execute("BEGIN EXCLUSIVE")  # held for the whole of the test: no write can go in
    try:
        snap = tmp_path / "host.json"
        write_snapshot(snap, host_snapshot(2, {(1, "recovery_action"): "node_reboot"}))
        daemon = start_daemon("--input", str(snap), "--fast-interval", "0.2")
        start = time.monotonic()
        daemon.wait_for(lambda: _fast_cycles(daemon.metrics()) >= 15, timeout=20,
                        what="fifteen fast cycles with the store locked")
        # 15 cycles at 0.2 s: about 3 s; a cycle waiting on the lock would take far longer
        assert time.monotonic() - start < 15
        text = daemon.metrics()
        assert counter(text, "gpuguard_event_store_written_total") == 0
        assert 'gpuguard_suggested_action{action="reboot",gpu="1"} 1.0' in text
    finally:
        holder.rollback()
        holder.close()
    # let go: what was queued is written
    daemon.wait_for(lambda: counter(daemon.metrics(), "gpuguard_event_store_written_total")
                    >= 1, what="the queued transition written")


def _fast_cycles(text: str) -> float:
    match = re.search(r'^gpuguard_cycles_total\{cadence="fast"\} (\S+)$', text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


@pytest.fixture
def read_only_state(tmp_path):
    import os

    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    with mounted_tmpfs(tmp_path / "state", "size=1m", read_only=True) as mnt:
        yield mnt


def test_a_read_only_state_dir_leaves_cycles_and_metrics_working(start_daemon, tmp_path,
                                                                  read_only_state):
    snap = tmp_path / "host.json"
    write_snapshot(snap, host_snapshot(2, {(1, "recovery_action"): "node_reboot"}))
    daemon = start_daemon("--input", str(snap), "--fast-interval", "0.2")
    daemon.wait_for(lambda: counter(daemon.metrics(), "gpuguard_event_store_dropped_total") >= 1,
                    what="the dropped transition counted")
    cycles = _fast_cycles(daemon.metrics())
    daemon.wait_for(lambda: _fast_cycles(daemon.metrics()) >= cycles + 5, what="more cycles")
    assert daemon.result("recovery.action", 1)["status"] == "critical"
    assert "event_store_write_failed" in daemon.log.read_text()


def test_failover_status_shows_the_last_transitions(tmp_path):
    state = tmp_path / "state"
    writer = EventWriter(state / "events.db", boot_id="b")
    writer.record(Event(kind="supervisor", source="supervisor", rule="llm", status="done:cpu",
                        action="reset_gpu", message="recovery.action (GPU 1): reset"))
    writer.record(Event(kind="rule", source="daemon", rule="recovery.action", gpu_index=1,
                        old_status="ok", status="critical", action="reset_gpu"))
    writer.flush()
    writer.close()
    out = gpuguard("failover", "status", "--state-dir", str(state))
    assert out.returncode == 0, out.stderr
    assert "llm: done:cpu (action reset_gpu): recovery.action (GPU 1): reset" in out.stdout
    assert "recovery.action GPU 1: ok -> critical (action reset_gpu)" in out.stdout


def test_an_ack_reaches_the_running_daemon(start_daemon, tmp_path):
    snap = tmp_path / "host.json"
    write_snapshot(snap, host_snapshot(2, {(1, "recovery_action"): "node_reboot"}))
    daemon = start_daemon("--input", str(snap), "--fast-interval", "0.2")
    state = tmp_path / "state"
    daemon.wait_for(lambda: (state / "events.db").exists() and gpuguard(
        "events", "--state-dir", str(state), "--kind", "rule").stdout.count("critical"),
        what="the transition recorded")
    out = gpuguard("ack", "recovery.action", "--gpu", "1", "--reason", "node drained, RMA",
                   "--state-dir", str(state))
    assert out.returncode == 0, out.stderr
    acked = daemon.wait_for(lambda: (r := daemon.result("recovery.action", 1))
                            and r["action"] == "none" and r, what="the ack applied")
    assert acked["status"] == "critical" and "node drained, RMA" in acked["action_reason"]
    assert 'gpuguard_suggested_action{action="none",gpu="1"} 1.0' in daemon.metrics()


def test_the_stores_files_swapped_under_the_daemon_show_in_its_metrics(start_daemon, tmp_path):
    """The WAL deleted under a running daemon (a clean-up script, a full-disk panic) is
    noticed (issue 20) and counted where an operator sees it, not only in the log."""
    snap = tmp_path / "host.json"
    write_snapshot(snap, host_snapshot(2, {(1, "recovery_action"): "node_reboot"}))
    daemon = start_daemon("--input", str(snap), "--fast-interval", "0.2")
    state = tmp_path / "state"
    daemon.wait_for(lambda: counter(daemon.metrics(), "gpuguard_event_store_written_total") >= 1,
                    what="the first event written")
    assert counter(daemon.metrics(), "gpuguard_event_store_replaced_total") == 0
    assert counter(daemon.metrics(), "gpuguard_event_store_wal_bytes") > 0
    for suffix in ("-wal", "-shm"):
        (state / f"events.db{suffix}").unlink()
    write_snapshot(snap, host_snapshot(2))  # a change to record: the writer flushes
    daemon.wait_for(lambda: counter(daemon.metrics(), "gpuguard_event_store_replaced_total")
                    >= 1, what="the swap counted")
    for name in ("unsafe_total", "rows_skipped_total", "wal_pinned_total"):
        assert counter(daemon.metrics(), f"gpuguard_event_store_{name}") == 0
