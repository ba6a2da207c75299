"""Review 3, through the daemon: the kernel's ring buffer wraps and overwrites a fatal Xid's
line; the daemon, which re-reads the whole buffer each cycle, kept it (daemon/kmsg_memory.py)
and xid.recent stays critical (it used to turn "ok: no Xid since boot", and `slurm health`
resumed a node drained for reset_gpu). A GPU reset line still clears it. The wrap is a file
rewritten between cycles with later sequence numbers (--kmsg-file: the same parser)."""

from __future__ import annotations

from pathlib import Path

from gpuguard.daemon.kmsg_memory import KernelLogMemory
from gpuguard.io.atomic import write_text
from gpuguard.sources import kmsg
from tests.daemon.conftest import host_snapshot, write_snapshot

UUID0 = "GPU-00000000-0000-0000-0000-000000000000"  # host_snapshot's GPU 0, at bus 18
XID_119 = ("NVRM: Xid (PCI:0000:18:00): 119, pid=1, name=x, Timeout after 6s of waiting for "
           "RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL).")


def records(first: int, *texts: str) -> str:
    return "".join(f"4,{first + i},{(1000 + first + i) * 1_000_000},-;{text}\n"
                   for i, text in enumerate(texts))


def flaps(n: int) -> list[str]:
    return [f"eth0: link flap {i}" for i in range(n)]


def test_a_fatal_xid_overwritten_in_the_ring_buffer_stays_until_its_reset(start_daemon,
                                                                         tmp_path):
    snap, log = tmp_path / "host.json", tmp_path / "kmsg.log"
    write_snapshot(snap, host_snapshot(2))
    write_text(log, records(0, XID_119, *flaps(50)))
    daemon = start_daemon("--input", str(snap), "--fast-interval", "0.3", "--kmsg-file",
                          str(log))
    daemon.wait_for(lambda: (daemon.result("xid.recent", 0) or {}).get("status") == "critical",
                    what="GPU 0's Xid 119")
    # the buffer wraps: record 0 (the Xid) and 4,950 after it are gone
    write_text(log, records(5000, *flaps(60)))
    wrapped = daemon.wait_for(
        lambda: (r := daemon.result("xid.recent", 0)) and r["observed"]["records_lost"] and r,
        what="the wrapped log read")
    assert (wrapped["status"], wrapped["action"]) == ("critical", "reset_gpu")
    assert wrapped["message"].startswith("Xid 119 (GSP RPC timeout)")
    assert wrapped["observed"]["records_lost"] == 5000 - 51
    assert daemon.result("xid.recent", 1)["status"] == "ok"
    # its repair, logged after the wrap, clears the remembered Xid as it clears a read one
    write_text(log, records(5000, *flaps(60), f"GPU reset occurred: {UUID0}"))
    cleared = daemon.wait_for(
        lambda: (r := daemon.result("xid.recent", 0)) and r["status"] == "ok" and r,
        what="the reset clearing the remembered Xid")
    assert cleared["message"].startswith("no Xid since [6000.000000] (4949 earlier kernel log "
                                         "record(s) overwritten before they were read) to act "
                                         "on (1 cleared by a GPU reset at [6060.000000])")


def summary(text: str, gaps: bool = False) -> dict:
    return kmsg.summarise(kmsg.parse_lines(text.splitlines()), "f", None, gaps)


def test_the_memory_adds_only_new_lines_and_orders_them_as_read():
    memory = KernelLogMemory()
    first = memory.apply(summary(records(0, XID_119, "x")))
    assert [e["xid"] for e in first["xids"]] == [119] and first["records_lost"] == 0
    again = memory.apply(summary(records(0, XID_119, "x", XID_119)))
    assert [e["seq"] for e in again["xids"]] == [0, 2]  # the first one not twice
    wrapped = memory.apply(summary(records(10, f"GPU reset occurred: {UUID0}")))
    assert [e["seq"] for e in wrapped["xids"]] == [0, 2]
    assert wrapped["xids"][-1]["n"] < wrapped["repairs"][0]["n"]  # the reset came after
    assert (wrapped["records_lost"], wrapped["lost_before_seq"]) == (7, 10)


def test_a_read_without_positions_is_passed_on_as_it_is():
    memory = KernelLogMemory()
    plain = summary("NVRM: Xid (PCI:0000:18:00): 48, pid=1, name=x, DBE\n")
    assert memory.apply(plain) is plain


def test_the_first_reads_lost_records_and_a_gap_a_read_met_itself_count():
    memory = KernelLogMemory()
    assert memory.apply(summary(records(100, "a", "b")))["records_lost"] == 100
    # the next read goes on where the last ended: nothing more lost, still since record 100
    on = memory.apply(summary(records(100, "a", "b", "c")))
    assert (on["records_lost"], on["lost_before_seq"]) == (100, 100)
    on = memory.apply(summary(records(101, "b", "c")))
    assert (on["records_lost"], on["lost_before_seq"]) == (100, 100)
    on = memory.apply(summary(records(103, "d")))  # the record after the last one read
    assert (on["records_lost"], on["lost_before_seq"]) == (100, 100)
    told = memory.apply(summary(records(100, "a", "b") + records(110, "c"), gaps=True))
    assert (told["records_lost"], told["lost_before_seq"]) == (108, 110)


def test_a_flood_after_the_wrap_still_keeps_the_fatal_xid(tmp_path: Path):
    memory = KernelLogMemory()
    memory.apply(summary(records(0, XID_119)))
    thirteen = "NVRM: Xid (PCI:0000:18:00): 13, pid=2, name=y, Graphics Exception"
    flood = memory.apply(summary(records(1, *[thirteen] * (kmsg.MAX_XIDS + 1))))
    assert flood["xids"][0]["xid"] == 119 and len(flood["xids"]) == kmsg.MAX_XIDS + 1


def test_a_daemon_restarted_after_the_wrap_reads_the_lost_xid_back_from_its_store(
        start_daemon, tmp_path, fake_env):
    """Review 4: the memory was in memory only. The daemon saw Xid 119 on GPU 0, the buffer
    wrapped, the daemon restarted: xid.recent said ok and `slurm health` resumed the node.
    The store kept the line (one per sequence number and boot): read back at the start."""
    log = tmp_path / "kmsg.log"
    xid = XID_119.replace("PCI:0000:18:00", "PCI:0000:10:00")  # the fake NVML's GPU 0
    write_text(log, records(0, xid, *flaps(50)))
    args = ("--fast-interval", "0.3", "--kmsg-file", str(log))
    daemon = start_daemon(*args, env=fake_env(gpus=2))
    daemon.wait_for(lambda: (daemon.result("xid.recent", 0) or {}).get("status") == "critical",
                    what="GPU 0's Xid 119")
    daemon.wait_for(lambda: 'gpuguard_event_store_written_total' in daemon.metrics() and
                    xid_rows(tmp_path / "state"), what="the Xid in the store")
    daemon.stop()
    write_text(log, records(5000, *flaps(60)))  # wrapped while the daemon was down
    again = start_daemon(*args, env=fake_env(gpus=2))
    result = again.wait_for(lambda: again.result("xid.recent", 0), what="xid.recent")
    assert (result["status"], result["action"]) == ("critical", "reset_gpu"), result
    assert result["message"].startswith("Xid 119"), result["message"]


def xid_rows(state: Path) -> int:
    import sqlite3

    path = state / "events.db"
    if not path.exists():
        return 0
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return int(conn.execute("SELECT count(*) FROM events WHERE kind = 'xid'").fetchone()[0])
    except sqlite3.Error:
        return 0
    finally:
        conn.close()
