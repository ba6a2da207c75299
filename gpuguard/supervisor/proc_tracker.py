"""An exec service's descendants, found each cycle without reading every process.

psutil's `children(recursive=True)` reads /proc/PID/stat of every process on the host
(its ppid_map) each time it is asked: most of the daemon's own time on a busy host. The
tracker keeps, per service, the PIDs of its tree with (ppid, start ticks: field 22 of
stat) and each cycle reads only those and the ones that may have joined:

- children files (preferred): /proc/PID/task/TID/children, every thread of every member
  (a child belongs to the thread that forked it). They exist with CONFIG_PROC_CHILDREN;
  whether they do is looked at once per main process (its own task's file). The tree is
  walked from the main PID through them each cycle, so a new child, a grandchild, an exit
  are seen at once. Its cost grows with the members' threads, not with the host: one
  file per thread, and an inference server's workers have a thread per core. So they are
  used only while the members have at most MAX_WALKED_THREADS threads (field 20 of the
  stats read anyway); above, the next way, which goes on from the walk (loadavg is read
  at every walk too, and a walk counts as a full scan).
- else the PIDs created since the last cycle: /proc/loadavg's last field is the last PID
  the kernel handed out; the PIDs after the one seen a cycle ago are read one by one (a
  PID that is not there yet, handed out but not yet visible, is read again next cycle).
  The whole of /proc is read instead (as psutil does) on the first cycle of a main
  process, when loadavg is unreadable, when the last PID went down (the PIDs wrapped at
  pid_max, or ns_last_pid was written), when more than MAX_PROBED_PIDS were handed out in
  one cycle, and at least every FULL_SCAN_EVERY_S on the monotonic clock (whatever a
  probe could miss is found within that time).

Membership is decided as psutil decides it: a candidate is in the tree when its parent,
read now from its stat, is; the walk starts at the main PID. So the PID set equals
psutil's recursive children of a live tree. The start ticks tell a known PID that is now
another process (the PID was reused): it is judged afresh like a new one, and a PID read
by number may be a thread (a thread's /proc/TID/stat is readable although /proc does not
list it), so a fresh candidate that would be a member is kept only when its status says
Tgid == PID. A process reached through the children files is a process (only thread group
leaders are on a children list).

Orphans: as with psutil, a descendant whose parent exits is re-parented to init or to a
subreaper; when that is outside the tree it leaves the tree (kept only when the subreaper
is a member, e.g. a main process that set PR_SET_CHILD_SUBREAPER). The tracker keeps the
same behaviour on purpose: the oracle is psutil's answer, and the kernel no longer counts
the orphan among the service's processes.

Every file read is bounded (gpuguard/io/bounded.py) and shares the cycle's deadline;
directory listings are cut at a bound on their entries and check the deadline too. The
procfs root is a parameter: the services' PIDs are of gpuguard's own PID namespace (their
pid files are written by the start commands gpuguard runs), so the caller gives the root
psutil reads (psutil.PROCFS_PATH), which is also the one the RSS of those PIDs comes from.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpuguard.io import bounded as boundedio

FULL_SCAN_EVERY_S = 60.0
# PIDs handed out in one cycle above which the whole of /proc is read instead: reading
# that many by number costs about what a listing and a read of each process does
MAX_PROBED_PIDS = 2048
# how many of the last PIDs handed out before a full scan are read again next cycle
# (handed out, not yet visible while /proc was listed)
RECHECK_AFTER_SCAN = 32
# the members' threads above which the PIDs handed out are read instead of the children
# files: those are one file per thread (a PyTorch worker has one per core), and 8 workers
# of 150 threads cost 18-30 ms a cycle, more than psutil's scan of 600 processes
# (docs/benchmarks.md); at 64, about 1.3 ms
MAX_WALKED_THREADS = 64
MAX_STAT = 4096
MAX_STATUS = 64 * 1024
MAX_CHILDREN_FILE = 1024 * 1024
MAX_LOADAVG = 256
MAX_LISTED = 4 * 1024 * 1024  # pid_max's ceiling: no listing of /proc is longer
MAX_THREADS = 1024 * 1024


class TrackerError(OSError):
    """The main process could not be read, or the cycle ran past its deadline."""


@dataclass(frozen=True)
class Stat:
    ppid: int
    start_ticks: int
    threads: int = 1


@dataclass
class Counts:
    """What the tracker did, for tests and the bench: never part of an output."""
    mode: str = ""  # "children" or "scan", the last cycle's
    full_scans: int = 0
    probed: int = 0  # PIDs read by number since loadavg's last PID
    replaced: int = 0  # known PIDs found to be another process


@dataclass
class _Budget:
    end: float

    def left(self) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise TrackerError(errno.ETIMEDOUT, "the service's processes were not read "
                               "within the deadline")
        return left


@dataclass
class Tracked:
    main: int
    start_ticks: int
    pids: list[int]  # the main PID and its descendants, sorted


@dataclass
class ProcessTracker:
    """The descendants of one service's main process, kept from cycle to cycle."""
    procfs: str = "/proc"
    prefer_children: bool = True
    clock: Callable[[], float] = time.monotonic
    counts: Counts = field(default_factory=Counts)
    _main: tuple[int, int] | None = None  # (pid, start ticks) of the tree kept
    _known: dict[int, Stat] = field(default_factory=dict)
    _children_files: bool = False
    _last_pid: int | None = None
    _last_full: float | None = None
    _pending: set[int] = field(default_factory=set)

    def update(self, main: int, deadline_s: float) -> Tracked:
        budget = _Budget(time.monotonic() + deadline_s)
        try:
            main_stat = self._stat(main, budget)
        except TrackerError:
            raise
        except OSError as exc:
            raise TrackerError(exc.errno, f"cannot read {self.procfs}/{main}/stat: "
                               f"{exc.strerror or exc}") from exc
        if self._main != (main, main_stat.start_ticks):
            self._start_over(main, main_stat.start_ticks)
        recheck: set[int] = set()
        threads = sum(s.threads for pid, s in self._known.items() if pid != main)
        if self._children_files and threads + main_stat.threads <= MAX_WALKED_THREADS:
            self.counts.mode = "children"
            # loadavg is read first all the same: a cycle in the other mode goes on from
            # here (the walk found every process up to this last PID, as a full scan)
            self._last_pid = self._loadavg_last_pid(budget)
            self._last_full = self.clock()
            trusted = self._walk_children(main, budget)
            candidates = set(self._known) | trusted
        else:
            self.counts.mode = "scan"
            fresh, recheck, trusted = self._new_pids(budget)
            candidates = set(self._known) | fresh
        stats = {main: main_stat}
        for pid in candidates - {main}:
            stat = self._stat_or_none(pid, budget)
            if stat is not None:
                stats[pid] = stat
        # handed out but not there: not yet visible, or ended; read once more next cycle
        self._pending = recheck - stats.keys()
        members = self._members(main, stats, trusted, budget)
        self._known = {pid: stats[pid] for pid in members}
        return Tracked(main, main_stat.start_ticks, sorted(members))

    def _start_over(self, main: int, start_ticks: int) -> None:
        self._main = (main, start_ticks)
        self._known = {}
        self._last_full = None
        self._pending = set()
        self._children_files = self.prefer_children and os.path.exists(
            f"{self.procfs}/{main}/task/{main}/children")

    def _members(self, main: int, stats: dict[int, Stat], trusted: set[int],
                 budget: _Budget) -> set[int]:
        """The walk from the main PID over the parents read now (psutil's, on the
        candidates); a PID not known as this very process and not reached through a
        children file is kept only if it is a process, not a thread."""
        by_parent: dict[int, list[int]] = {}
        for pid, stat in stats.items():
            if pid != main:
                by_parent.setdefault(stat.ppid, []).append(pid)
        members = {main}
        queue = [main]
        while queue:
            for child in by_parent.get(queue.pop(), ()):
                if child in members:
                    continue
                known = self._known.get(child)
                if known is not None and known.start_ticks != stats[child].start_ticks:
                    self.counts.replaced += 1
                    known = None
                if known is None and child not in trusted and not self._is_process(child,
                                                                                    budget):
                    continue
                members.add(child)
                queue.append(child)
        return members

    def _walk_children(self, main: int, budget: _Budget) -> set[int]:
        found: set[int] = set()
        queue = [main]
        while queue:
            for child in self._children_of(queue.pop(), budget):
                if child not in found and child != main:
                    found.add(child)
                    queue.append(child)
        return found

    def _children_of(self, pid: int, budget: _Budget) -> list[int]:
        task = f"{self.procfs}/{pid}/task"
        children: list[int] = []
        for tid in _listed(task, MAX_THREADS, budget):
            text = _read_or_none(f"{task}/{tid}/children", MAX_CHILDREN_FILE, budget)
            if text is None:
                continue  # the thread or the process ended since the listing
            children.extend(int(x) for x in text.split() if x.isdigit())
        return children

    def _new_pids(self, budget: _Budget) -> tuple[set[int], set[int], set[int]]:
        """The PIDs that may have joined since the last cycle: those handed out since and
        the ones not yet visible a cycle ago, or every process at a full scan; with the
        ones to read again next cycle if absent now, and those known to be processes
        (a listing of /proc names no thread)."""
        last = self._loadavg_last_pid(budget)
        now = self.clock()
        previous = self._last_pid
        self._last_pid = last
        if (last is None or previous is None or last < previous
                or last - previous > MAX_PROBED_PIDS or self._last_full is None
                or now - self._last_full >= FULL_SCAN_EVERY_S):
            self._last_full = now
            self.counts.full_scans += 1
            listed = {int(x) for x in _listed(self.procfs, MAX_LISTED, budget) if x.isdigit()}
            recent = set(range(max(1, last - RECHECK_AFTER_SCAN + 1), last + 1)) \
                if last else set()
            return listed | recent, recent - listed, listed
        handed_out = set(range(previous + 1, last + 1))
        self.counts.probed += len(handed_out | self._pending)
        return handed_out | self._pending, handed_out, set()

    def _loadavg_last_pid(self, budget: _Budget) -> int | None:
        text = _read_or_none(f"{self.procfs}/loadavg", MAX_LOADAVG, budget)
        if text is None:
            return None
        fields = text.split()
        return int(fields[4]) if len(fields) >= 5 and fields[4].isdigit() else None

    def _stat(self, pid: int, budget: _Budget) -> Stat:
        text = boundedio.read_text(f"{self.procfs}/{pid}/stat", MAX_STAT, budget.left())
        return parse_stat(text, pid)

    def _stat_or_none(self, pid: int, budget: _Budget) -> Stat | None:
        try:
            return self._stat(pid, budget)
        except TrackerError:
            raise
        except OSError as exc:
            _raise_if_deadline(exc)
            return None  # it ended (or is unreadable: not a member we can tell)

    def _is_process(self, pid: int, budget: _Budget) -> bool:
        text = _read_or_none(f"{self.procfs}/{pid}/status", MAX_STATUS, budget)
        if text is None:
            return False  # it ended, or is unreadable
        for line in text.splitlines():
            if line.startswith("Tgid:"):
                return line[5:].strip() == str(pid)
        return False


def parse_stat(text: str, pid: int) -> Stat:
    """The parent (field 4) and the start in clock ticks since boot (field 22)."""
    # the name (field 2) may hold spaces and parentheses: the fields after its last ')'
    fields = text[text.rfind(")") + 1:].split()
    if len(fields) < 20 or not fields[1].isdigit() or not fields[19].isdigit():
        raise OSError(errno.EINVAL, f"/proc/{pid}/stat has no parent or start time")
    threads = int(fields[17]) if fields[17].isdigit() else 1  # field 20
    return Stat(int(fields[1]), int(fields[19]), threads)


def _listed(path: str, bound: int, budget: _Budget) -> Iterable[str]:
    """The names in a procfs directory, at most `bound`, under the deadline; none when it
    is gone (the process ended)."""
    try:
        with os.scandir(path) as entries:
            for count, entry in enumerate(entries):
                if count >= bound:
                    break
                if count % 256 == 0:
                    budget.left()
                yield entry.name
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno not in (errno.ESRCH, errno.ENOENT):
            raise


def _read_or_none(path: str, max_bytes: int, budget: _Budget) -> str | None:
    """A bounded read within the budget's deadline: the text, or None where the file is
    gone or unreadable (a process that ended); TrackerError when the deadline passed."""
    try:
        return boundedio.read_text(path, max_bytes, budget.left())
    except TrackerError:
        raise
    except OSError as exc:
        _raise_if_deadline(exc)
        return None


def _raise_if_deadline(exc: OSError) -> None:
    if exc.errno == errno.ETIMEDOUT:
        raise TrackerError(errno.ETIMEDOUT, str(exc)) from exc
