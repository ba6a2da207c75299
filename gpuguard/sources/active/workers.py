"""The active probe's parent side: one forked worker per GPU (gpuguard/io/forked.py), some
started early while `check`'s NVML sweep runs (EarlyStart), their lines gathered by the
deadline, a worker that hung killed and remembered until it is gone, and every worker
of this process killed at once when the daemon stops (stop_all)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import threading
import time
from dataclasses import asdict, dataclass

from gpuguard.io import forked
from gpuguard.io.clock import utc
from gpuguard.model.pci import normalise_pci
from gpuguard.sources.active import assemble, child
from gpuguard.sources.active.host_lock import HostLock
from gpuguard.sources.active.plan import (
    FIELDS,
    MAX_EARLY,
    ProbeOptions,
    ProbeWorker,
    skip_reason,
)
from gpuguard.sources.nvml_progress import Progress

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path
    from typing import Any

    from gpuguard.model.snapshot import Snapshot

# Workers killed at a deadline and not reaped yet, by GPU bus id: (pid, when, where it
# hung). A worker in D state cannot be reaped until the kernel lets go of it; its GPU
# gets no new worker meanwhile (they would pile up, one per run), only unknown results.
KILLED: dict[str, tuple[int, float, str]] = {}


class _Live:
    """The workers of this process that may still run: stop_all() kills them at once. A
    stopping daemon must not wait out a probe's deadline (40 s with a long one, past the
    unit's TimeoutStopSec=15) for a worker hung in a CUDA call."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pids: set[int] = set()
        self.stopping = False

    def add(self, pid: int) -> None:
        with self.lock:
            self.pids.add(pid)
            stopping = self.stopping
        if stopping:  # forked while stop_all ran: it goes too
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def discard(self, pid: int) -> None:
        with self.lock:
            self.pids.discard(pid)


LIVE = _Live()


def stop_all(reap_s: float = 1.0) -> list[int]:
    """Kill every probe worker of this process now, and start no more; the pids killed.
    They are reaped for up to `reap_s` in all (one in D state cannot be: init reaps it
    once we are gone). A probe waiting on them returns at once, its GPUs unknown."""
    with LIVE.lock:
        LIVE.stopping = True
        pids = sorted(LIVE.pids)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    until = time.monotonic() + reap_s
    for pid in pids:
        forked.exit_code(pid, until)
    return pids


def _fork(body: Callable[[], None]) -> int:
    pid = forked.fork(body)
    LIVE.add(pid)
    return pid


class ActiveProbe:
    """Workers started now, one per GPU that may be probed; `finish()` waits for them
    within the deadline and puts their results into the snapshot."""

    def __init__(self, snapshot: Snapshot, opts: ProbeOptions,
                 early: EarlyStart | None = None) -> None:
        self.opts = opts
        self.started = time.monotonic()
        self.skipped: dict[int, str] = {}
        self.stuck: dict[int, str] = {}
        self.workers: list[ProbeWorker] = []
        first_slot = len(early.waiting) if early else 0
        reap_killed()
        for gpu in snapshot.gpus:
            reason = skip_reason(gpu, opts) or (
                "gpuguard is stopping: no probe starts" if LIVE.stopping else None)
            killed = KILLED.get(normalise_pci(gpu.pci_bus_id.get())) \
                if reason is None else None
            if killed is not None:
                pid, when, where = killed
                self.stuck[gpu.index] = (
                    f"its worker of {utc(when)} "
                    f"(pid {pid}, killed at the deadline in {where or 'its start'}) is still "
                    "stuck in the driver; no new one is started until it is gone")
            elif reason is None:
                self.workers.append(ProbeWorker(first_slot + len(self.workers), gpu.index,
                                            gpu.pci_bus_id.get()))
            else:
                self.skipped[gpu.index] = reason
        self._stopped: list[int] = []
        self._host_lock = self._lock_the_host(opts)
        if early is None:
            early = EarlyStart(None)
        self._progress = early.progress
        self._read_fd = early.read_fd
        _import_worker_modules()
        for worker in self.workers:
            peers = [(w.index, w.bus_id) for w in self.workers if w.index > worker.index]
            waiting = early.take(worker.bus_id)
            if waiting is not None:
                # Started before the NVML sweep was in; cuInit done or under way.
                worker.slot, worker.pid = waiting.slot, waiting.pid
                waiting.go({"index": worker.index, "peers": peers, "opts": asdict(opts)})
                continue
            def late(worker: ProbeWorker = worker, peers: list[tuple[int, str]] = peers) -> None:
                os.close(early.read_fd)
                early.close_go_ends()
                if self._host_lock is not None:
                    self._host_lock.close_in_child()
                out = os.fdopen(early.write_fd, "w", buffering=1)
                child.run(out, self._progress, worker, peers, opts, early.lock.fileno())

            worker.pid = _fork(late)
        self._stopped = early.stop_rest()
        os.close(early.write_fd)
        early.lock.close()
        if not self.workers:
            self._read_fd = -1
            os.close(early.read_fd)

    def _lock_the_host(self, opts: ProbeOptions) -> HostLock | None:
        """Wait (within the deadline) for any other probe on this host to end; if it does
        not, this one's GPUs are unknown, never measured beside another probe."""
        if opts.lock_path is None or not self.workers:
            return None
        lock = HostLock(opts.lock_path)
        held = lock.acquire(self.started + opts.deadline_s)
        if held is False:
            for worker in self.workers:
                self.stuck[worker.index] = (
                    f"another active probe holds the GPUs: waited {opts.deadline_s:g} s "
                    f"for {opts.lock_path}")
            self.workers = []
            return None
        return lock if held else None

    def finish(self, snapshot: Snapshot) -> None:
        try:
            self._finish(snapshot)
        finally:
            for worker in self.workers:
                LIVE.discard(worker.pid)
            if self._host_lock is not None:
                self._host_lock.release()

    def _finish(self, snapshot: Snapshot) -> None:
        messages, finished = self._gather()
        ended = {m.get("gpu") for m in messages if m.get("t") == "end"}
        hung = {} if finished else {w.index: self._where(w) for w in self.workers
                                    if w.index not in ended}
        endings = {w.index: _ending(w.pid, finished) for w in self.workers}
        self._remember_killed(hung)
        elapsed = time.monotonic() - self.started
        ran = [w.index for w in self.workers] + list(self.stuck)
        assemble.readings(snapshot, self.opts, self.skipped, ran, messages, hung, endings,
                          elapsed, self.stuck)
        # gpuguard_source_success{source="active_probe"}: failed when a GPU it ran on
        # has a reading it could not take
        snapshot.record("active_probe", self.started,
                        [getattr(gpu, name) for gpu in snapshot.gpus if gpu.index in ran
                         for name in FIELDS])

    def _gather(self) -> tuple[list[dict[str, Any]], bool]:
        """The workers' lines by the deadline, and whether they all finished."""
        if self._read_fd < 0:
            return [], True
        data, finished = forked.read_until(self._read_fd, self.started + self.opts.deadline_s)
        # killed by stop_all: the pipe closed, but no worker finished; each GPU's readings
        # say where its worker was (unknown, naming the call), never a result
        finished = finished and not LIVE.stopping
        messages = []
        for line in data.splitlines():
            try:
                messages.append(json.loads(line))
            except ValueError:
                continue  # a line cut by the deadline
        return messages, finished

    def _remember_killed(self, hung: dict[int, str]) -> None:
        """Workers killed and not reaped yet: their GPUs get no new worker until gone."""
        now = time.time()
        for w in self.workers:
            if w.index in hung and not forked.reaped(w.pid):
                KILLED[normalise_pci(w.bus_id)] = (w.pid, now, hung[w.index])
        for pid in self._stopped:  # killed when told to stop (they held no context)
            if not forked.reaped(pid):
                KILLED[f"stopped-{pid}"] = (pid, now, "cuInit")

    def _where(self, worker: ProbeWorker) -> str:
        slot = self._progress.buf[worker.slot * 128:(worker.slot + 1) * 128]
        return bytes(slot).split(b"\0", 1)[0].decode(errors="replace")


def reap_killed() -> None:
    """Reap the workers killed on earlier runs that have ended since."""
    for key, (pid, _, _) in list(KILLED.items()):
        if forked.reaped(pid):
            del KILLED[key]


def _import_worker_modules() -> None:
    """What the workers import, imported before the fork: in the daemon another thread
    may hold the import lock at the fork, and a child would wait on it forever (prctl is
    looked up for the same reason: gpuguard/io/forked.py)."""
    import array  # noqa: F401
    import fcntl  # noqa: F401
    import struct  # noqa: F401

    from gpuguard.sources import cuda_api  # noqa: F401

    forked.prepare()


@dataclass
class _Waiting:
    """A worker forked early, waiting to be told which GPU it probes."""

    slot: int
    pid: int
    go_fd: int

    def go(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):  # a worker that died: its ending says so
            os.write(self.go_fd, (json.dumps(message) + "\n").encode())
        os.close(self.go_fd)


class EarlyStart:
    """Workers forked while `check`'s NVML sweep runs, one per GPU the driver lists under
    <procfs>/driver/nvidia/gpus/ (named by bus id): each loads libcuda and runs cuInit,
    240-500 ms on an H200 host that touches no GPU memory and creates no context, then
    waits to be told which GPU to probe, or to stop (a GPU the sweep finds busy is never
    touched beyond cuInit). A GPU the folder does not list gets a worker forked later, as
    without an early start; `EarlyStart(None)` starts none."""

    def __init__(self, procfs: Path | None) -> None:
        self.progress = Progress()
        # lockf: the workers' turnstile; closed once every worker is forked
        self.lock = tempfile.TemporaryFile()  # noqa: SIM115
        self.read_fd, self.write_fd = os.pipe()
        self.waiting: dict[str, _Waiting] = {}
        names: list[str] = []
        if procfs is not None:
            with contextlib.suppress(OSError):
                names = sorted(os.listdir(procfs / "driver" / "nvidia" / "gpus"))[:MAX_EARLY]
        if names:
            _import_worker_modules()
        for name in names:
            try:
                bus_id = normalise_pci(name)
            except (IndexError, ValueError):
                continue
            slot = len(self.waiting)
            go_read, go_write = os.pipe()
            def run_early(go_read: int = go_read, go_write: int = go_write, slot: int = slot,
                          name: str = name) -> None:
                os.close(self.read_fd)
                os.close(go_write)
                self.close_go_ends()
                child.run_early(self.write_fd, go_read, self.progress, slot, name,
                             self.lock.fileno())

            pid = _fork(run_early)
            os.close(go_read)
            self.waiting[bus_id] = _Waiting(slot, pid, go_write)

    def take(self, bus_id: str) -> _Waiting | None:
        try:
            return self.waiting.pop(normalise_pci(bus_id), None)
        except (IndexError, ValueError):
            return None

    def close_go_ends(self) -> None:
        """In a child: the other workers' go pipes are not its to hold open."""
        for waiting in self.waiting.values():
            with contextlib.suppress(OSError):
                os.close(waiting.go_fd)

    def stop_rest(self) -> list[int]:
        """Stop the workers no GPU needs; their pids. Killed, not only told (their go pipe
        closes): one still in a slow cuInit would hold the result pipe open, and the
        probe would wait for it until its deadline. They hold no context to release."""
        pids = []
        for waiting in self.waiting.values():
            os.close(waiting.go_fd)
            with contextlib.suppress(ProcessLookupError):
                os.kill(waiting.pid, signal.SIGKILL)
            LIVE.discard(waiting.pid)
            pids.append(waiting.pid)
        self.waiting.clear()
        return pids

    def abandon(self) -> None:
        """`check` gave up before the sweep was in: stop every worker, reap what has gone."""
        for pid in self.stop_rest():
            _ending(pid, finished=False)
        for fd in (self.read_fd, self.write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.lock.close()


def _ending(pid: int, finished: bool) -> str | None:
    """How a worker ended: None when it exited by itself; otherwise the signal it died of.
    A worker still running (the deadline passed) is killed and not waited for: one in D
    state cannot be reaped until the kernel lets go of it."""
    if not finished:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return forked.describe_ending(
        forked.exit_code(pid, time.monotonic() + (0.5 if finished else 0.0)))
