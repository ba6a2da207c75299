"""`failback_probe: qualify` (issue 30): after a hardware finding moved a service to CPU,
its failback waits for a passing `gpuguard qualify` of its GPUs that started after that
finding. The supervisor asks once its passive gates let the failback through (enough
healthy cycles: the Xid cleared by a reset line, the counters quiet); this module decides
(`decide`, a pure function of the facts) and runs the qualification.

The run is a child the daemon owns (qualify/detached.launch: the same command line and
event as Slurm's detached runs, in a session of its own, with a record of its own in the
state dir), never a call inside a cycle: it takes a minute, and the supervisor's thread
only polls it. It is started only while the GPU variant is stopped and every GPU it takes
is idle in the daemon's last NVML sweep (qualify's own refusal: no compute process, use
that can be told, no MIG). It must not outlive its daemon: a stop of the daemon, or a
manual move to GPU, stops it (SIGTERM, which qualify answers within a second; then
SIGKILL of what is left of its group, at the latest past STOP_WAIT_S); a run left by a
daemon that was SIGKILLed is found by its record when the daemon starts again and
stopped (under the shipped unit systemd has already killed it with the daemon's
cgroup)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gpuguard.io.clock import utc
from gpuguard.qualify import detached, records
from gpuguard.supervisor.qualify_config import QualifySettings

# The failovers whose failback waits for a qualification: the actions of a hardware
# finding (gpuguard/judge/actions.py; the same set Slurm's resume gates, issue 30 item 1).
HARDWARE_ACTIONS = frozenset({"reset_gpu", "reboot", "inspect_hardware"})
# A run that did not pass without a hardware finding (no CUDA library, a GPU another
# process took, a one-off): the next one waits this long, and at most MAX_RUNS are
# started for one finding; a critical finding starts none (the board is at fault).
RETRY_S = 300.0
MAX_RUNS = 3
STOP_WAIT_S = 3.0

Verdict = Literal["pass", "wait", "start", "block"]


@dataclass(frozen=True)
class GpuNow:
    """One of the service's GPUs in the daemon's last NVML sweep."""

    index: int
    uuid: str | None
    serial: str | None
    busy: str | None  # why qualify would not take it now (sources/qualify/plan.refusal)


@dataclass(frozen=True)
class QualifyHost:
    """What the daemon gives the gate: where the runs keep their record and events, the
    daemon's own host options for qualify's command line (--path.*, --state-dir,
    --kmsg-file, --profile, --rules), and its last sweep's GPUs."""

    state_dir: Path
    procfs: Path
    boot_id: str | None
    args: tuple[str, ...]
    gpus: Callable[[], list[GpuNow]]
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Facts:
    gpus: list[GpuNow]                                  # the service's GPUs now
    latest: dict[int, records.Qualification | None]     # each one's newest since `after`
    missing: tuple[int, ...] = ()                       # its GPUs the sweep lacks
    running_since: float | None = None                  # wall time our run started
    variant_runs: bool = False                          # the GPU variant runs
    runs: int = 0                                       # runs started for this finding
    retry_in: float = 0.0                               # seconds before the next may start
    retry_at: float = 0.0                               # ... the wall time it says
    last_ending: str | None = None                      # how our last run ended


@dataclass(frozen=True)
class Step:
    verdict: Verdict
    why: str


def decide(facts: Facts, level: str, after: float) -> Step:
    """pass: every GPU's newest qualification since `after` passed; wait: ours runs;
    start: run one now; block: none can or will run now, and why (the reason the
    service stays on CPU)."""
    if facts.missing or not facts.gpus:
        which = f"GPU {', '.join(map(str, facts.missing))} is not" if facts.missing else \
            "none of the service's GPUs is"
        return Step("block", f"{which} in the daemon's last NVML sweep")
    if facts.running_since is not None:
        return Step("wait", f"qualifying since {utc(facts.running_since)}")
    unproven = [(g, facts.latest.get(g.index)) for g in facts.gpus
                if not _passed(facts.latest.get(g.index))]
    if not unproven:
        return Step("pass", _passed_words(facts, level))
    gpu, found = unproven[0]
    why = _not_proven(gpu, found, level, after, facts.last_ending)
    # a critical finding: the board is at fault, and no run of ours helps
    if found is not None and found.status == "critical":
        return Step("block", f"{why}; after the repair, `gpuguard qualify --gpu "
                    f"{gpu.index}` (a pass fails the service back) or `gpuguard failover "
                    "to gpu`")
    held = _held(facts, gpu.index)
    return Step("block", f"{why}; {held}") if held else Step("start", why)


def _not_proven(gpu: GpuNow, found: records.Qualification | None, level: str, after: float,
                last_ending: str | None) -> str:
    if found is None:
        why = f"no {level} qualification of GPU {gpu.index} started after {utc(after)}"
        return why + (f" (the last run {last_ending})" if last_ending else "")
    # the event says `standard: no pass: FINDING`: the finding is the reason
    finding = found.message.removeprefix(f"{found.level}: ").removeprefix("no pass: ")
    return f"the {found.level} qualification of GPU {gpu.index} did not pass: {finding}"


def _held(facts: Facts, index: int) -> str | None:
    """Why no run of ours starts now, or None: one may."""
    if facts.runs >= MAX_RUNS:
        return (f"{facts.runs} runs started, no more will be: `gpuguard qualify --gpu "
                f"{index}` or `gpuguard failover to gpu`")
    if facts.retry_in > 0:
        return f"the next run at {utc(facts.retry_at)}"
    if facts.variant_runs:
        return "the GPU variant runs: its GPUs are never qualified while they serve"
    busy = [g for g in facts.gpus if g.busy]
    if busy:
        return f"GPU {busy[0].index} cannot be qualified now: {busy[0].busy}"
    return None


def _passed(found: records.Qualification | None) -> bool:
    return found is not None and found.passed


def _passed_words(facts: Facts, level: str) -> str:
    runs = [q for q in facts.latest.values() if q is not None]
    first = min(runs, key=lambda q: q.started_at)
    bundles = sorted({q.bundle for q in runs if q.bundle})
    return (f"the {level} qualification of GPU(s) "
            f"{', '.join(str(g.index) for g in facts.gpus)} passed (started "
            f"{utc(first.started_at)}" + (f"; bundle {', '.join(bundles)}" if bundles else "")
            + ")")


class QualifyGate:
    """One service's qualifications: the run in progress, the runs started for the
    current hardware finding, the retry time."""

    def __init__(self, service: str, settings: QualifySettings, host: QualifyHost | None,
                 log: Any, dry_run: bool = False) -> None:
        self.service = service
        self.settings = settings
        self.host = host
        self.log = log
        self.dry_run = dry_run
        self.record = f"qualify-failback-{service}.json"
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._started: detached.Detached | None = None
        self._after: float | None = None  # the finding the runs below are for
        self._runs = 0
        self._retry_at = 0.0  # time.monotonic()
        self._retry_wall = 0.0  # the same, on the wall clock: what the reason says
        self._ending: str | None = None
        self._closed = False  # the daemon stops: no run starts after its stop

    def check(self, after: float, failover_at: float, gpus: list[int] | None,
              variant_runs: Callable[[], bool]) -> Step:
        """Whether the failback may go now; starts a run when one is due."""
        if self.host is None:
            return Step("block", "no qualification here: the daemon replays --input, whose "
                        "GPUs are not this host's")
        if after != self._after:  # a new finding: its own runs
            self._after, self._runs, self._retry_at, self._ending = after, 0, 0.0, None
        self._reap()
        facts = self._facts(self.host, after, gpus, variant_runs)
        step = decide(facts, self.settings.level, after)
        if step.verdict != "start":
            return step
        if self.dry_run:
            return Step("block", f"{step.why}; --dry-run: no qualification is started")
        started = self._start([g.index for g in facts.gpus], failover_at)
        if started is None:
            return Step("block", "the daemon stops")
        return Step("wait", f"qualifying since {utc(started)}")

    def _facts(self, host: QualifyHost, after: float, gpus: list[int] | None,
               variant_runs: Callable[[], bool]) -> Facts:
        now = [g for g in host.gpus() if gpus is None or g.index in gpus]
        missing = tuple(sorted(set(gpus or ()) - {g.index for g in now}))
        running = self._started.started_at if self._started is not None else None
        latest: dict[int, records.Qualification | None] = {}
        if running is None:  # the store is read only when no run of ours is under way
            found = records.qualifications(host.state_dir, since=after)
            latest = {g.index: records.latest(found, records.Board(g.uuid, g.serial),
                                              self.settings.level, after) for g in now}
        return Facts(now, latest, missing, running,
                     variant_runs=running is None and variant_runs(), runs=self._runs,
                     retry_in=max(0.0, self._retry_at - time.monotonic()),
                     retry_at=self._retry_wall, last_ending=self._ending)

    def _start(self, gpus: list[int], failover_at: float) -> float | None:
        assert self.host is not None
        purpose = f"failback of {self.service} after the failover at {utc(failover_at)}"
        # under the lock: a stop of the daemon meanwhile either sees this run or comes first
        with self._lock:
            if self._closed:
                return None
            made, proc = detached.launch(
                self.host.state_dir, gpus, level=self.settings.level,
                boot_id=self.host.boot_id, attempt=self._runs + 1, purpose=purpose,
                record_file=self.record, env=self.host.env,
                extra_args=(*self.host.args, *self.settings.args()))
            self._proc, self._started = proc, made
            self._runs += 1
        self.log.warning("failback_qualify_started", gpus=gpus, pid=made.pid,
                         level=self.settings.level, run=self._runs, purpose=purpose,
                         log=str(self.host.state_dir / detached.log_of(self.record)))
        return made.started_at

    def _reap(self) -> None:
        """Our run, if it ended: its result is in the event store now (qualify writes it
        before it exits)."""
        with self._lock:
            proc = self._proc
            if proc is None or proc.poll() is None:
                return
            self._proc = self._started = None
        code = proc.returncode
        self._ending = f"exited {code}" if code >= 0 else f"was killed by signal {-code}"
        self._retry_at = time.monotonic() + RETRY_S
        self._retry_wall = time.time() + RETRY_S
        assert self.host is not None
        detached.clear(self.host.state_dir, self.record)
        self.log.info("failback_qualify_ended", code=code)

    def recover(self) -> None:
        """A run left by a daemon that was SIGKILLed: stopped (it is no child of ours; its
        record names it, and detached.alive makes sure the pid is still that run)."""
        if self.host is None:
            return
        left = detached.load(self.host.state_dir, self.record)
        if left is not None and detached.alive(left, self.host.procfs, self.host.boot_id):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(left.pid, signal.SIGTERM)
            self.log.warning("failback_qualify_left_stopped", pid=left.pid)
        detached.clear(self.host.state_dir, self.record)

    def stop(self, why: str, close: bool = False) -> None:
        """Our run stopped now: the GPU variant is about to start, or the daemon stops
        (`close`: and none starts after)."""
        with self._lock:
            proc, self._proc, self._started = self._proc, None, None
            self._closed = self._closed or close
        if proc is None:
            return
        if proc.poll() is None:
            self.log.warning("failback_qualify_stopping", pid=proc.pid, why=why)
            proc.send_signal(signal.SIGTERM)  # qualify kills its workers and says "stopped"
            _exited(proc.pid, STOP_WAIT_S)
            # what is left of its group (a worker its death has not reached yet, or all of
            # it past the wait), while the pid is still ours: its exit not yet reaped
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(1.0)
        if self.host is not None:
            detached.clear(self.host.state_dir, self.record)


def _exited(pid: int, wait_s: float) -> bool:
    """Whether our child `pid` exited within `wait_s`, leaving it unreaped (WNOWAIT)."""
    end = time.monotonic() + wait_s
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.05)
