"""host.memory and host.disk on the real H200 snapshot with host facts set: each status,
each threshold at, just below and just above its line, and overrides moving the lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuguard.model.results import Status
from gpuguard.model.snapshot import Reading, Snapshot
from gpuguard.sources import kmsg
from tests.conftest import FIXTURES, overridden

GIB = 1024**3
OOM_LOG = FIXTURES / "kmsg" / "oom.kmsg"
QUIET_LOG = FIXTURES / "kmsg" / "dmesg.log"


def with_memory(snap: Snapshot, available_percent: float = 60.0, swap_total: int = 0,
                swap_used: int = 0, log: Path | None = QUIET_LOG) -> Snapshot:
    total = 1000 * GIB
    snap.host.host_memory = Reading.ok({
        "total_bytes": total, "available_bytes": int(total * available_percent / 100),
        "swap_total_bytes": swap_total, "swap_used_bytes": swap_used})
    if log is not None:
        snap.host.kernel_log = kmsg.read_file(log)
    snap.host.__post_init__()
    return snap


def test_quiet_log_and_memory_available_is_ok(h200, run_rule):
    [result] = run_rule("host.memory", with_memory(h200, 60.0))
    assert result.status is Status.OK
    assert "600.0 GiB of 1000.0 GiB available (60.0 %)" in result.message
    assert "no OOM kill in the last 1d" in result.message


@pytest.mark.parametrize(("percent", "status"), [
    (10.0, Status.OK), (9.99, Status.WARNING), (5.0, Status.WARNING),
    (4.99, Status.CRITICAL), (0.0, Status.CRITICAL)])
def test_available_memory_lines(h200, run_rule, percent, status):
    [result] = run_rule("host.memory", with_memory(h200, percent))
    assert result.status is status, result.message


def test_available_lines_come_from_the_rule(h200, run_rule, tmp_path):
    rules = overridden(tmp_path, "host.memory", available_warning_percent=30,
                       available_critical_percent=20)
    [result] = run_rule("host.memory", with_memory(h200, 25.0), rules=rules)
    assert result.status is Status.WARNING
    [result] = run_rule("host.memory", with_memory(h200, 19.0), rules=rules)
    assert result.status is Status.CRITICAL


@pytest.mark.parametrize(("used_gib", "status"), [
    (50, Status.OK), (51, Status.WARNING), (100, Status.WARNING)])
def test_swap_in_use_lines(h200, run_rule, used_gib, status):
    # 15 % available: above the 10 % line, below swap's 20 %
    snap = with_memory(h200, 15.0, swap_total=100 * GIB, swap_used=used_gib * GIB)
    [result] = run_rule("host.memory", snap)
    assert result.status is status
    if status is Status.WARNING:
        assert f"swap {used_gib} % in use" in result.message


@pytest.mark.parametrize(("available", "status"), [
    (60.0, Status.OK), (20.0, Status.OK), (19.9, Status.WARNING)])
def test_swap_in_use_warns_only_while_available_memory_is_low(h200, run_rule, available,
                                                              status):
    # a full swap on a host with plenty available: idle pages pushed out once, no shortage
    snap = with_memory(h200, available, swap_total=100 * GIB, swap_used=100 * GIB)
    [result] = run_rule("host.memory", snap)
    assert result.status is status, result.message
    assert result.observed["swap_used_percent"] == 100.0
    assert ("swap 100 % in use" in result.message) is (status is Status.WARNING)
    if status is Status.WARNING:  # the message says why swap counts here
        assert result.message == ("swap 100 % in use (100.0 GiB of 100.0 GiB) with 199.0 GiB "
                                  "of 1000.0 GiB available (19.9 %)")


def test_swap_lines_come_from_the_rule(h200, run_rule, tmp_path):
    rules = overridden(tmp_path, "host.memory", swap_used_warning_percent=10,
                       swap_available_below_percent=70)
    snap = with_memory(h200, 60.0, swap_total=100 * GIB, swap_used=11 * GIB)
    [result] = run_rule("host.memory", snap, rules=rules)
    assert result.status is Status.WARNING
    snap = with_memory(h200, 71.0, swap_total=100 * GIB, swap_used=11 * GIB)
    [result] = run_rule("host.memory", snap, rules=rules)
    assert result.status is Status.OK


def test_no_swap_is_not_judged(h200, run_rule):
    [result] = run_rule("host.memory", with_memory(h200, 60.0, swap_total=0, swap_used=0))
    assert result.status is Status.OK
    assert "swap_used_percent" not in result.observed


def test_oom_kills_in_the_window_warn_and_name_their_victims(h200, run_rule):
    [result] = run_rule("host.memory", with_memory(h200, 60.0, log=OOM_LOG))
    assert result.status is Status.WARNING
    msg = result.message
    # the host-wide kill warns; the container's kill at its own limit is named after it
    assert msg == ("1 OOM kill(s) in the last 1d: python3 (pid 48213, 2h ago); 1 OOM "
                   "kill(s) at a cgroup's own memory limit (not the host's memory) in the "
                   "last 1d: pt_main_thread (pid 52001, cgroup "
                   "/system.slice/docker-4f2a9c.scope, 16m ago)")
    # the kill 26 h before the log's end is outside the default 24 h window
    assert "3111" not in msg
    assert [(k["pid"], k["scope"]) for k in result.observed["oom_kills"]] == [
        (48213, "host"), (52001, "cgroup")]


def test_a_kill_at_a_cgroups_own_limit_is_named_but_does_not_warn(h200, run_rule, tmp_path):
    # the last hour of the fixture holds only the container's kill (CONSTRAINT_MEMCG)
    rules = overridden(tmp_path, "host.memory", oom_window_s=3600)
    [result] = run_rule("host.memory", with_memory(h200, 60.0, log=OOM_LOG), rules=rules)
    assert result.status is Status.OK, result.message
    assert result.message == (
        "600.0 GiB of 1000.0 GiB available (60.0 %), no host OOM kill in the last 1h; "
        "1 OOM kill(s) at a cgroup's own memory limit (not the host's memory) in the last "
        "1h: pt_main_thread (pid 52001, cgroup /system.slice/docker-4f2a9c.scope, 16m ago)")
    assert result.observed["oom_kills"][0]["scope"] == "cgroup"
    # the pre-5.0 line of a memcg kill is a cgroup kill as well
    old = tmp_path / "memcg-4x.log"
    old.write_text("[100.000000] Memory cgroup out of memory: Kill process 700 (vllm) "
                   "score 990 or sacrifice child\n"
                   "[100.000100] Killed process 700 (vllm) total-vm:1kB, anon-rss:1kB\n")
    [result] = run_rule("host.memory", with_memory(h200, 60.0, log=old))
    assert result.status is Status.OK and "vllm (pid 700, 0s ago)" in result.message


def test_a_kill_whose_scope_is_not_said_counts_as_the_hosts(h200, run_rule, tmp_path):
    # the first line of a pre-5.0 pair gone from the ring buffer: only "Killed process"
    bare = tmp_path / "bare.log"
    bare.write_text("[100.000000] Killed process 700 (vllm) total-vm:1kB, anon-rss:1kB\n")
    [result] = run_rule("host.memory", with_memory(h200, 60.0, log=bare))
    assert result.status is Status.WARNING
    assert result.message == "1 OOM kill(s) in the last 1d: vllm (pid 700, 0s ago)"


def test_oom_window_comes_from_the_rule(h200, run_rule, tmp_path):
    rules = overridden(tmp_path, "host.memory", oom_window_s=3 * 3600)
    [result] = run_rule("host.memory", with_memory(h200, 60.0, log=OOM_LOG), rules=rules)
    assert result.status is Status.WARNING
    assert result.message.startswith("1 OOM kill(s) in the last 3h: python3 (pid 48213")
    rules = overridden(tmp_path, "host.memory", oom_window_s=3600)
    [result] = run_rule("host.memory", with_memory(h200, 60.0, log=OOM_LOG), rules=rules)
    assert result.status is Status.OK and "48213" not in result.message
    rules = overridden(tmp_path, "host.memory", oom_window_s=600)
    [result] = run_rule("host.memory", with_memory(h200, 60.0, log=OOM_LOG), rules=rules)
    assert result.status is Status.OK
    assert result.message.endswith("no OOM kill in the last 10m")


def test_xid_ack_does_not_hide_an_oom_kill(h200, run_rule):
    snap = with_memory(h200, 60.0, log=OOM_LOG)
    assert snap.host.kernel_log.value is not None
    snap.host.kernel_log.value["acked_seq"] = 10**6
    [result] = run_rule("host.memory", snap)
    assert result.status is Status.WARNING


def test_an_unreadable_kernel_log_is_unknown_unless_memory_already_fails(h200, run_rule):
    snap = with_memory(h200, 60.0, log=None)
    snap.host.kernel_log = Reading.failed("cannot read /dev/kmsg: permission denied")
    snap.host.__post_init__()
    [result] = run_rule("host.memory", snap)
    assert result.status is Status.UNKNOWN
    assert "permission denied" in result.message
    snap.host.host_memory = Reading.ok({"total_bytes": 100, "available_bytes": 1,
                                        "swap_total_bytes": 0, "swap_used_bytes": 0})
    snap.host.__post_init__()
    [result] = run_rule("host.memory", snap)
    assert result.status is Status.CRITICAL and "permission denied" in result.message


def test_memory_not_read_is_skipped_and_unreadable_is_unknown(h200, run_rule):
    h200.host.host_memory = Reading.not_supported("not asked: --host-resources")
    h200.host.disk_space = Reading.not_supported("not asked: --host-resources")
    h200.host.__post_init__()
    [result] = run_rule("host.memory", h200)
    assert result.status is Status.SKIPPED and result.message == "not asked: --host-resources"
    [result] = run_rule("host.disk", h200)
    assert result.status is Status.SKIPPED and result.message == "not asked: --host-resources"
    h200.host.host_memory = Reading.failed("/proc/meminfo: did not return within 5 s")
    h200.host.__post_init__()
    [result] = run_rule("host.memory", h200)
    assert result.status is Status.UNKNOWN and "did not return" in result.message


def test_impossible_memory_sizes_are_an_error_reading(h200, run_rule):
    h200.host.host_memory = Reading.ok({"total_bytes": 10, "available_bytes": 20,
                                        "swap_total_bytes": 0, "swap_used_bytes": 0})
    h200.host.__post_init__()
    [result] = run_rule("host.memory", h200)
    assert result.status is Status.UNKNOWN and "do not add up" in result.message


# --- host.disk -----------------------------------------------------------------------


def disk(path: str = "/var/lib/models", free_percent: float = 50.0,
         inodes_percent: float | None = 50.0, role: str = "profile") -> dict[str, Any]:
    total, inodes = 1000 * GIB, 1_000_000
    return {"path": path, "role": role, "total_bytes": total,
            "free_bytes": int(total * free_percent / 100),
            "inodes_total": inodes if inodes_percent is not None else 0,
            "inodes_free": int(inodes * inodes_percent / 100) if inodes_percent is not None
            else 0}


def with_disks(snap: Snapshot, *entries: dict[str, Any]) -> Snapshot:
    snap.host.disk_space = Reading.ok(list(entries))
    snap.host.__post_init__()
    return snap


def test_nothing_configured_is_skipped_not_a_warning(h200, run_rule):
    [result] = run_rule("host.disk", with_disks(h200))
    assert result.status is Status.SKIPPED


def test_disks_with_room_are_ok(h200, run_rule):
    [result] = run_rule("host.disk", with_disks(
        h200, disk("/var/lib/docker", role="docker"), disk("/models", 40.0)))
    assert result.status is Status.OK
    assert result.message == "/var/lib/docker 50 % free, /models 40 % free"


@pytest.mark.parametrize(("percent", "status"), [
    (10.0, Status.OK), (9.99, Status.WARNING), (5.0, Status.WARNING),
    (4.99, Status.CRITICAL)])
def test_free_space_lines(h200, run_rule, percent, status):
    [result] = run_rule("host.disk", with_disks(h200, disk("/models", 50.0),
                                                disk("/var/lib/docker", percent, role="docker")))
    assert result.status is status
    if status is not Status.OK:
        assert result.message.startswith("/var/lib/docker (Docker data root): ")
        assert "/models" not in result.message


@pytest.mark.parametrize(("percent", "status"), [
    (10.0, Status.OK), (9.99, Status.WARNING), (5.0, Status.WARNING),
    (4.99, Status.CRITICAL)])
def test_free_inode_lines(h200, run_rule, percent, status):
    [result] = run_rule("host.disk", with_disks(h200, disk("/models", 50.0, percent)))
    assert result.status is status
    if status is not Status.OK:
        assert "% of inodes free" in result.message


def test_disk_lines_come_from_the_rule(h200, run_rule, tmp_path):
    rules = overridden(tmp_path, "host.disk", free_warning_percent=30, free_critical_percent=20,
                       inodes_warning_percent=60, inodes_critical_percent=55)
    [result] = run_rule("host.disk", with_disks(h200, disk("/m", 25.0, 70.0)), rules=rules)
    assert result.status is Status.WARNING
    [result] = run_rule("host.disk", with_disks(h200, disk("/m", 19.0, 70.0)), rules=rules)
    assert result.status is Status.CRITICAL
    [result] = run_rule("host.disk", with_disks(h200, disk("/m", 50.0, 58.0)), rules=rules)
    assert result.status is Status.WARNING
    [result] = run_rule("host.disk", with_disks(h200, disk("/m", 50.0, 54.0)), rules=rules)
    assert result.status is Status.CRITICAL


def test_a_filesystem_without_an_inode_table_is_judged_on_space_only(h200, run_rule):
    [result] = run_rule("host.disk", with_disks(h200, disk("/btrfs", 50.0, None)))
    assert result.status is Status.OK
    assert result.observed["paths"][0]["inodes_free_percent"] is None


def test_worst_path_decides_and_each_failing_path_is_named(h200, run_rule):
    [result] = run_rule("host.disk", with_disks(
        h200, disk("/a", 8.0), disk("/b", 3.0), disk("/c", 60.0)))
    assert result.status is Status.CRITICAL
    assert "/a (profile): " in result.message and "/b (profile): " in result.message
    assert "/c" not in result.message


def test_a_path_not_read_is_unknown_unless_another_fails(h200, run_rule):
    gone = {"path": "/nfs/models", "role": "profile",
            "error": "statvfs did not return within 5 s (a network mount that is gone?)"}
    [result] = run_rule("host.disk", with_disks(h200, disk("/a", 60.0), gone))
    assert result.status is Status.UNKNOWN
    assert "/nfs/models" in result.message and "/a 60 % free" in result.message
    [result] = run_rule("host.disk", with_disks(h200, disk("/a", 4.0), gone))
    assert result.status is Status.CRITICAL and "1 not read" in result.message


def test_an_impossible_disk_entry_is_an_error_reading(h200, run_rule):
    wrong = disk("/a", 50.0)
    wrong["free_bytes"] = wrong["total_bytes"] + 1
    [result] = run_rule("host.disk", with_disks(h200, wrong))
    assert result.status is Status.UNKNOWN and "free is more than total" in result.message


def test_observed_percentages_are_rounded_to_a_tenth(h200, run_rule):
    snap = with_memory(h200, 100 / 3, swap_total=3 * GIB, swap_used=GIB)
    [result] = run_rule("host.memory", snap)
    assert result.observed["available_percent"] == 33.3
    assert result.observed["swap_used_percent"] == 33.3
    entry = disk("/m", 100 / 3, 200 / 3)
    [result] = run_rule("host.disk", with_disks(h200, entry))
    assert result.observed["paths"][0]["free_percent"] == 33.3
    assert result.observed["paths"][0]["inodes_free_percent"] == 66.7


def test_a_filesystem_of_no_size_counts_as_all_free(h200, run_rule):
    empty = {"path": "/pseudo", "role": "profile", "total_bytes": 0, "free_bytes": 0,
             "inodes_total": 0, "inodes_free": 0}
    [result] = run_rule("host.disk", with_disks(h200, empty))
    assert result.status is Status.OK and result.message == "/pseudo 100 % free"


def test_many_kills_name_the_last_three_and_count_the_rest(h200, run_rule, tmp_path):
    path = tmp_path / "loop.log"
    path.write_text("".join(f"[{100 + i}.000000] Out of memory: Killed process {500 + i} "
                            f"(worker{i}) total-vm:1kB\n" for i in range(5)))
    [result] = run_rule("host.memory", with_memory(h200, 60.0, log=path))
    msg = result.message
    assert msg.startswith("5 OOM kill(s) in the last 1d: worker2 (pid 502, 2s ago), "
                          "worker3 (pid 503, 1s ago), worker4 (pid 504, 0s ago) and 2 earlier")
    assert "worker1" not in msg and "not kept" not in msg
    three = tmp_path / "three.log"
    three.write_text("".join(f"[{100 + i}.000000] Out of memory: Killed process {500 + i} "
                             f"(worker{i}) total-vm:1kB\n" for i in range(3)))
    [result] = run_rule("host.memory", with_memory(h200, 60.0, log=three))
    assert "worker0 (pid 500" in result.message and "earlier" not in result.message
    four = tmp_path / "four.log"
    four.write_text("".join(f"[{100 + i}.000000] Out of memory: Killed process {500 + i} "
                            f"(worker{i}) total-vm:1kB\n" for i in range(4)))
    [result] = run_rule("host.memory", with_memory(h200, 60.0, log=four))
    assert result.message.endswith("worker3 (pid 503, 0s ago) and 1 earlier")


def test_kills_beyond_the_bound_are_counted_in_the_message(h200, run_rule, tmp_path):
    n = kmsg.MAX_OOMS + 7
    path = tmp_path / "storm.log"
    path.write_text("".join(f"[{100 + i}.000000] Out of memory: Killed process {1000 + i} "
                            f"(worker) total-vm:1kB\n" for i in range(n)))
    [result] = run_rule("host.memory", with_memory(h200, 60.0, log=path))
    assert result.message.endswith(f"and {kmsg.MAX_OOMS - 3} earlier (and 7 older kill "
                                   "line(s) not kept)")


def test_no_kernel_log_in_the_input_judges_memory_alone(h200, run_rule):
    [result] = run_rule("host.memory", with_memory(h200, 60.0, log=None))
    assert result.status is Status.OK
    assert result.message == "600.0 GiB of 1000.0 GiB available (60.0 %)"
    assert result.observed["oom_kills"] is None


def test_kill_lines_not_kept_are_told_with_the_cgroup_kills_when_no_host_kill(
        h200, run_rule, tmp_path):
    """More cgroup kills than the summary keeps: the note says how many were not kept
    (there is no host kill to say it instead)."""
    lines = [f"[{100 + i}.000000] Memory cgroup out of memory: Killed process {1000 + i} "
             "(worker) total-vm:1kB, anon-rss:1kB\n" for i in range(kmsg.MAX_OOMS + 1)]
    log = tmp_path / "memcg.log"
    log.write_text("".join(lines))
    [result] = run_rule("host.memory", with_memory(h200, 60.0, log=log))
    assert result.status is Status.OK, result.message
    assert "(and 1 older kill line(s) not kept)" in result.message
