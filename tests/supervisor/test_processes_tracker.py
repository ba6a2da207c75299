"""supervisor/proc_tracker.py: an exec service's descendants kept from cycle to cycle, on
fake procfs trees (stat, status, task/*/children, loadavg) and once on Linux's own /proc
against psutil's recursive children (the oracle)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from gpuguard.supervisor import proc_tracker
from gpuguard.supervisor.proc_tracker import ProcessTracker, TrackerError


@dataclass
class FakeProcess:
    ppid: int
    start: int
    threads: dict[int, list[int]] = field(default_factory=dict)  # tid -> children it forked
    nthreads: int = 1


class FakeProc:
    """A procfs tree written from a model: /PID/stat, /PID/status, /PID/task/TID/children
    (with_children) and /loadavg (last_pid, None: no file)."""

    def __init__(self, root: Path, with_children: bool) -> None:
        self.root = root
        self.with_children = with_children
        self.procs: dict[int, FakeProcess] = {}
        self.threads_shown: dict[int, int] = {}  # a thread's TID -> its process, readable
        self.last_pid: int | None = 0
        self.now = 1000.0

    def clock(self) -> float:
        return self.now

    def add(self, pid: int, ppid: int, start: int, tid: int | None = None) -> None:
        """A process `pid` forked by thread `tid` (its main thread if None) of `ppid`."""
        self.procs[pid] = FakeProcess(ppid, start)
        if ppid in self.procs:
            parent = self.procs[ppid]
            parent.threads.setdefault(tid or ppid, []).append(pid)
        self.last_pid = max(self.last_pid or 0, pid)
        self.write()

    def remove(self, pid: int, reparent_to: int = 1) -> None:
        gone = self.procs.pop(pid)
        if gone.ppid in self.procs:
            for children in self.procs[gone.ppid].threads.values():
                if pid in children:
                    children.remove(pid)
        for orphans in gone.threads.values():
            for orphan in orphans:
                self.procs[orphan].ppid = reparent_to
                if reparent_to in self.procs:
                    self.procs[reparent_to].threads.setdefault(reparent_to, []).append(orphan)
        self.write()

    def write(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True)
        if self.last_pid is not None:
            (self.root / "loadavg").write_text(f"0.10 0.20 0.30 2/345 {self.last_pid}\n")
        for pid, proc in self.procs.items():
            self._write_stat(pid, pid, proc)
            if self.with_children:
                for tid in {pid, *proc.threads}:
                    task = self.root / str(pid) / "task" / str(tid)
                    task.mkdir(parents=True, exist_ok=True)
                    kids = proc.threads.get(tid, [])
                    (task / "children").write_text("".join(f"{c} " for c in kids))
        for tid, pid in self.threads_shown.items():
            self._write_stat(tid, pid, self.procs[pid])

    def _write_stat(self, pid: int, tgid: int, proc: FakeProcess) -> None:
        where = self.root / str(pid)
        where.mkdir(exist_ok=True)
        rest = " ".join(["0"] * 15 + [str(proc.nthreads), "0", str(proc.start)] + ["0"] * 30)
        (where / "stat").write_text(f"{pid} (a (b) c) S {proc.ppid} {rest}\n")
        (where / "status").write_text(f"Name:\tx\nTgid:\t{tgid}\nPid:\t{pid}\n")


def tracker_of(fake: FakeProc) -> ProcessTracker:
    return ProcessTracker(str(fake.root), clock=fake.clock)


def pids(tracker: ProcessTracker, main: int = 100) -> list[int]:
    return tracker.update(main, 2.0).pids


@pytest.fixture(params=[True, False], ids=["children-files", "scan"])
def fake(request: pytest.FixtureRequest, tmp_path: Path) -> FakeProc:
    fake = FakeProc(tmp_path / "proc", with_children=request.param)
    fake.add(1, 0, 1)
    fake.add(50, 1, 5)  # not the service's
    fake.add(100, 1, 10)  # its main process
    fake.add(101, 100, 11)
    return fake


def test_a_new_child_and_a_grandchild_join(fake: FakeProc) -> None:
    tracker = tracker_of(fake)
    assert pids(tracker) == [100, 101]
    fake.add(102, 100, 20)
    fake.add(103, 102, 21)  # a grandchild
    fake.add(104, 50, 22)  # not the service's
    assert pids(tracker) == [100, 101, 102, 103]
    assert tracker.counts.mode == ("children" if fake.with_children else "scan")
    # the scan read only the PIDs handed out since, not /proc again
    assert tracker.counts.full_scans == (0 if fake.with_children else 1)


def test_an_exited_child_leaves_and_its_orphan_with_it(fake: FakeProc) -> None:
    fake.add(102, 101, 12)
    tracker = tracker_of(fake)
    assert pids(tracker) == [100, 101, 102]
    fake.remove(101)  # 102 is re-parented to init: out, as psutil would say
    assert pids(tracker) == [100]


def test_an_orphan_re_parented_to_a_subreaper_in_the_tree_stays(fake: FakeProc) -> None:
    fake.add(102, 101, 12)
    tracker = tracker_of(fake)
    assert pids(tracker) == [100, 101, 102]
    fake.remove(101, reparent_to=100)  # the main process is a subreaper
    assert pids(tracker) == [100, 102]


def test_a_reused_pid_is_another_process(fake: FakeProc) -> None:
    tracker = tracker_of(fake)
    assert pids(tracker) == [100, 101]
    fake.remove(101)
    fake.add(101, 50, 30)  # the same PID, a new start, someone else's
    fake.last_pid = 102
    fake.write()
    assert pids(tracker) == [100]
    fake.remove(101)
    fake.add(101, 100, 40)  # and again, forked by the service this time
    fake.last_pid = 101  # the PIDs went round: the last one handed out went down
    fake.write()
    assert pids(tracker) == [100, 101]


def test_a_reused_pid_that_is_now_a_thread_is_not_a_process(tmp_path: Path) -> None:
    fake = FakeProc(tmp_path / "proc", with_children=False)
    fake.add(1, 0, 1)
    fake.add(100, 1, 10)
    fake.add(101, 100, 11)
    fake.add(102, 100, 12)
    tracker = tracker_of(fake)
    assert pids(tracker) == [100, 101, 102]
    fake.remove(101)
    # PID 101 now names a thread of 102: /proc/101/stat reads 102's (its parent: 100)
    fake.threads_shown[101] = 102
    fake.procs[102] = FakeProcess(100, 12)
    fake.last_pid = 103
    fake.write()
    assert pids(tracker) == [100, 102]
    assert tracker.counts.replaced == 1


def test_a_new_thread_read_by_number_is_not_a_process(tmp_path: Path) -> None:
    fake = FakeProc(tmp_path / "proc", with_children=False)
    fake.add(1, 0, 1)
    fake.add(100, 1, 10)
    tracker = tracker_of(fake)
    assert pids(tracker) == [100]
    fake.add(101, 100, 11)
    fake.threads_shown[102] = 101  # a thread of the new child: its stat says parent 100
    fake.last_pid = 102
    fake.write()
    assert pids(tracker) == [100, 101]


def test_a_child_forked_by_another_thread_is_found(tmp_path: Path) -> None:
    fake = FakeProc(tmp_path / "proc", with_children=True)
    fake.add(1, 0, 1)
    fake.add(100, 1, 10)
    tracker = tracker_of(fake)
    assert pids(tracker) == [100]
    fake.add(101, 100, 11, tid=150)  # forked by the main process's thread 150
    fake.last_pid = None  # no loadavg: the children files alone
    fake.write()
    assert pids(tracker) == [100, 101]
    assert tracker.counts.mode == "children" and tracker.counts.full_scans == 0


def test_members_with_many_threads_are_tracked_by_the_pids_handed_out(tmp_path: Path) -> None:
    fake = FakeProc(tmp_path / "proc", with_children=True)
    fake.add(1, 0, 1)
    fake.add(100, 1, 10)
    fake.add(101, 100, 11)
    fake.procs[101].nthreads = proc_tracker.MAX_WALKED_THREADS  # with the main's, above
    fake.write()
    tracker = tracker_of(fake)
    assert pids(tracker) == [100, 101] and tracker.counts.mode == "children"
    fake.add(102, 101, 12)
    assert pids(tracker) == [100, 101, 102]
    # the children walk was as good as a full scan: this mode goes on from it
    assert tracker.counts.mode == "scan" and tracker.counts.full_scans == 0
    fake.remove(101, reparent_to=100)
    assert pids(tracker) == [100, 102]
    fake.add(103, 102, 13)
    fake.last_pid = None  # the children files alone again
    fake.write()
    assert pids(tracker) == [100, 102, 103] and tracker.counts.mode == "children"


def test_without_children_files_the_scan_is_the_fallback(tmp_path: Path) -> None:
    fake = FakeProc(tmp_path / "proc", with_children=False)
    fake.add(1, 0, 1)
    fake.add(100, 1, 10)
    fake.add(101, 100, 11)
    tracker = tracker_of(fake)
    assert pids(tracker) == [100, 101]
    assert tracker.counts.mode == "scan" and tracker.counts.full_scans == 1


def scan_fake(tmp_path: Path) -> FakeProc:
    fake = FakeProc(tmp_path / "proc", with_children=False)
    fake.add(1, 0, 1)
    fake.add(100, 1, 10)
    fake.last_pid = 5000
    fake.write()
    return fake


def test_a_wrap_of_the_pids_is_a_full_scan(tmp_path: Path) -> None:
    fake = scan_fake(tmp_path)
    tracker = tracker_of(fake)
    assert pids(tracker) == [100]
    fake.add(102, 100, 20)  # handed out after the wrap: below the last PID seen
    fake.last_pid = 102
    fake.write()
    assert pids(tracker) == [100, 102]
    assert tracker.counts.full_scans == 2


def test_a_pid_the_probe_cannot_see_is_found_within_the_full_scan_period(
        tmp_path: Path) -> None:
    fake = scan_fake(tmp_path)
    tracker = tracker_of(fake)
    assert pids(tracker) == [100]
    # ns_last_pid written (or the PIDs went round pid_max within a cycle): the new
    # child is not among the PIDs handed out since, as loadavg tells them
    fake.add(102, 100, 20)
    fake.last_pid = 5001
    fake.write()
    assert pids(tracker) == [100]
    fake.now += proc_tracker.FULL_SCAN_EVERY_S - 1
    assert pids(tracker) == [100]
    fake.now += 1
    assert pids(tracker) == [100, 102]


def test_many_pids_handed_out_in_one_cycle_is_a_full_scan(tmp_path: Path) -> None:
    fake = scan_fake(tmp_path)
    tracker = tracker_of(fake)
    pids(tracker)
    fake.last_pid = 5000 + proc_tracker.MAX_PROBED_PIDS + 1
    fake.write()
    pids(tracker)
    assert tracker.counts.full_scans == 2 and tracker.counts.probed == 0


def test_unreadable_loadavg_is_a_full_scan_each_cycle(tmp_path: Path) -> None:
    fake = scan_fake(tmp_path)
    fake.last_pid = None
    fake.write()
    tracker = tracker_of(fake)
    assert pids(tracker) == [100]
    fake.add(7000, 100, 20)
    fake.last_pid = None
    fake.write()
    assert pids(tracker) == [100, 7000]
    assert tracker.counts.full_scans == 2


def test_a_pid_handed_out_but_not_yet_visible_is_read_again(tmp_path: Path) -> None:
    fake = scan_fake(tmp_path)
    tracker = tracker_of(fake)
    pids(tracker)
    fake.last_pid = 5002  # 5001 and 5002 handed out, not in /proc yet
    fake.write()
    assert pids(tracker) == [100]
    fake.add(5002, 100, 20)
    assert pids(tracker) == [100, 5002]
    assert tracker.counts.full_scans == 1


def test_a_new_main_process_starts_over(fake: FakeProc) -> None:
    tracker = tracker_of(fake)
    assert pids(tracker) == [100, 101]
    fake.remove(101)
    fake.remove(100)
    fake.add(100, 1, 99)  # the same PID, restarted
    first = tracker.update(100, 2.0)
    assert first.pids == [100] and first.start_ticks == 99


def test_a_main_process_not_running_is_an_error(fake: FakeProc) -> None:
    with pytest.raises(TrackerError, match="cannot read"):
        tracker_of(fake).update(4242, 2.0)


def test_a_spent_deadline_is_an_error(fake: FakeProc) -> None:
    with pytest.raises(TrackerError, match="deadline"):
        tracker_of(fake).update(100, 0.0)


@pytest.mark.skipif(not sys.platform.startswith("linux") or not Path("/proc/self/stat").exists(),
                    reason="Linux's /proc is needed")
@pytest.mark.parametrize("children_files", [True, False], ids=["children-files", "scan"])
def test_a_live_tree_is_psutils_recursive_children(children_files: bool) -> None:
    main = subprocess.Popen(["bash", "-c", "sleep 60 & sleep 60 & (sleep 60 & sleep 60 & wait) "
                             "& wait"])
    tracker = ProcessTracker(psutil.PROCFS_PATH, prefer_children=children_files)
    try:
        def oracle() -> list[int]:
            kids = psutil.Process(main.pid).children(recursive=True)
            return sorted([main.pid, *(c.pid for c in kids)])

        _wait_for(lambda: len(oracle()) == 6)
        assert tracker.update(main.pid, 2.0).pids == oracle()
        # the mode asked for, unless this kernel has no children files
        assert tracker.counts.mode in (("children", "scan") if children_files else ("scan",))
        victim = psutil.Process(main.pid).children()[0]
        victim.kill()
        _wait_for(lambda: victim.pid not in oracle())
        assert tracker.update(main.pid, 2.0).pids == oracle()
        assert tracker.update(main.pid, 2.0).pids == oracle()
    finally:
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(main.pid).children(recursive=True):
                child.kill()
        main.kill()
        main.wait()


def _wait_for(done: Callable[[], bool]) -> None:
    end = time.monotonic() + 10
    while not done():
        assert time.monotonic() < end
        time.sleep(0.05)
