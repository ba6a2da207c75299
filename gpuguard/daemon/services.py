"""The supervised services, sampled every fast cycle into the snapshot's `services`
reading that the service.* rules judge (gpuguard/checks/service.py).

For each service: the process tree of its active variant (supervisor/processes.py),
their host RSS summed, the GPU memory NVML accounts to those PIDs, how much room is
left (host: available memory or the cgroup's limit; GPU: the free memory of the GPUs
it uses), and, when its probe is a real request, one inference request. The samples of
the current run are kept for `keep_s` (the longest window a rule judges); a new run
(another main PID, container or unit invocation) starts them over, so a restart is
never taken as growth or as a drop.

With no service configured the reading stays absent: the rules are skipped.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import structlog

from gpuguard.daemon.service_engine import EngineWatch
from gpuguard.daemon.service_logs import DEADLINE_S as LOG_DEADLINE_S
from gpuguard.daemon.service_logs import LogWatch
from gpuguard.daemon.service_requests import Requests, answer_by, inference_result
from gpuguard.judge.trend import fit
from gpuguard.model.derived import held_by
from gpuguard.model.snapshot import Reading, Snapshot
from gpuguard.supervisor import processes, readiness
from gpuguard.supervisor.proc_tracker import ProcessTracker
from gpuguard.supervisor.service import Supervisor

log = structlog.get_logger("gpuguard.services")

# The deadline of reading one service's processes (pid file, cgroup, Docker's top).
TREE_DEADLINE_S = 2.0
# How long past its request_timeout a cycle waits for an inference request to return.
INFERENCE_GRACE_S = 1.0
# The deadline of asking a plain health URL whether the service answers yet (the cycle
# does not wait for it: the next cycle takes its answer).
HEALTH_TIMEOUT_S = 2.0

# (time.monotonic(), host RSS bytes, GPU bytes or unknown): the windows and the warm-up are
# differences of the monotonic clock, which a step of the wall clock does not move
Sample = tuple[float, int, int | None]


@dataclass
class Run:
    identity: str
    samples: deque[Sample] = field(default_factory=deque)
    # when this run first answered its probe: its warm-up (service.memory_growth) is
    # counted from here, not from the process start, since a model that loads for 15
    # minutes from network storage grows all that time; None until it answers
    # (time.monotonic(), as the samples)
    answered_at: float | None = None


class ServiceWatch:
    def __init__(self, supervisors: list[Supervisor], keep_s: float = 1860.0) -> None:
        self.supervisors = supervisors
        self.keep_s = keep_s
        self._runs: dict[str, Run] = {}
        # the variant whose probe answered while the service's processes were not known
        # (an exec service without pid_file_*): its engine is looked for all the same
        self._probed: dict[str, str] = {}
        # an exec service's known processes, kept across cycles so that a cycle reads
        # only them and the new ones, not every process (supervisor/proc_tracker.py)
        self._trackers: dict[str, ProcessTracker] = {}
        self.requests = Requests()
        # the engines' metrics and the services' logs (issue 23), made with the first
        # services: they load the engine profiles
        self._engines: EngineWatch | None = None
        self._logs: LogWatch | None = None

    def longest_wait_s(self) -> float:
        """The longest a cycle waits for the services' requests and reads: they run at
        once, so the slowest service's deadline, and the grace (daemon/freshness.py)."""
        if not self.supervisors:
            return 0.0
        return max(_wait_s(s) for s in self.supervisors) + INFERENCE_GRACE_S

    def sample(self, snap: Snapshot, now: float) -> None:
        if not self.supervisors:
            return
        # The inference requests of all services at once, each under its own deadline: a
        # cycle waits for the slowest one, not for their sum, and never past the longest
        # deadline (and a second). readiness.send keeps its deadline and never raises;
        # this holds even if it did not (a name that does not resolve): a request that has
        # not returned answers nobody, and none is sent again until it has.
        asked = {s.service.name: self.requests.start(f"inference:{s.service.name}",
                                                     _inference, s)
                 for s in self.supervisors if s.service.probe.request is not None}
        # A plain health URL is asked only until the run first answers it, and the cycle
        # does not wait for it: the answer is taken by the first cycle that finds it.
        answered = {s.service.name: self._health(s) for s in self.supervisors
                    if _plain_url(s) and not self._answered(s)}
        engines, logs = self._engine_reads(now), self._log_reads()
        entries = {s.service.name: self._entry(s, snap, now) for s in self.supervisors}
        end = time.monotonic() + self.longest_wait_s()
        for name, request in asked.items():
            entries[name]["inference"] = inference_result(request, end)
        self._engine_results(engines, logs, entries, end, now)
        for supervisor in self.supervisors:
            self._note_answer(supervisor, entries[supervisor.service.name],
                              answered.get(supervisor.service.name), now)
        snap.host.services = Reading.ok(entries)

    def _engine_reads(self, now: float) -> dict[str, Future[Any] | str]:
        """The engines' metrics read this cycle, started at once (issue 23)."""
        if self._engines is None:
            self._engines = EngineWatch()
            self._logs = LogWatch(self._engines.catalog)
        engines = self._engines
        started: dict[str, Future[Any] | str] = {}
        for supervisor in self.supervisors:
            name = supervisor.service.name
            identity = self._runs[name].identity if name in self._runs else None
            if engines.due(supervisor, identity, now, self._answered(supervisor)):
                read = functools.partial(_read_engine, engines,
                                         engines.engine_of(supervisor, identity))
                started[name] = self.requests.start(f"engine:{name}", read, supervisor)
        return started

    def _log_reads(self) -> dict[str, tuple[Any, Future[Any] | str]]:
        """The services' logs read this cycle, for GPU errors (issue 23)."""
        assert self._logs is not None
        logs = self._logs
        started: dict[str, tuple[Any, Future[Any] | str]] = {}
        for supervisor in self.supervisors:
            log = logs.log_of(supervisor)
            if log is not None:
                read = functools.partial(_read_log, logs, log)
                started[supervisor.service.name] = (log, self.requests.start(
                    f"log:{supervisor.service.name}", read, supervisor))
        return started

    def _engine_results(self, engines: dict[str, Future[Any] | str],
                        logs: dict[str, tuple[Any, Future[Any] | str]],
                        entries: dict[str, dict[str, Any]], end: float, now: float) -> None:
        """What the engines and logs read this cycle answered, into the entries: a read
        that has not returned by `end` is an error of that read."""
        assert self._engines is not None and self._logs is not None
        for supervisor in self.supervisors:
            name = supervisor.service.name
            entry = entries[name]
            identity = entry.get("identity")
            if name in engines:
                answer = answer_by(engines[name], end, "read")
                entry["engine"] = self._engines.record(supervisor, identity, answer, now)
            if entry.get("engine") is None:
                # what is true of it, for service.engine's message (issue 28)
                entry["engine_note"] = self._engines.why_not(
                    supervisor, identity, now, self._answered(supervisor))
            elif entry.get("error"):
                # read all the same; only a restart cannot be told from its processes
                entry["engine"]["no_run_identity"] = entry["error"]
            if name in logs:
                log, asked = logs[name]
                answer = answer_by(asked, end, "log read")
                entries[name]["log"] = self._logs.record(supervisor, log, answer, identity,
                                                         now)

    def _health(self, supervisor: Supervisor) -> bool | None:
        """The answer of the plain health URL asked before, when it has come (True: it
        answered its status); then it is asked again. None while one is on its way."""
        key = f"health:{supervisor.service.name}"
        asked = self.requests.last(key)
        if asked is not None and not asked.done():
            return None
        self.requests.start(key, _health_answers, supervisor)
        if asked is None or asked.exception() is not None:
            return None
        return asked.result()  # type: ignore[no-any-return]

    def _answered(self, supervisor: Supervisor) -> bool:
        """Whether the active variant's run has answered its probe; where its processes
        are not known, whether the probe answered since the variant became active."""
        name = supervisor.service.name
        run = self._runs.get(name)
        if run is not None:
            return run.answered_at is not None
        return self._probed.get(name) == supervisor.view().state.active

    def _note_answer(self, supervisor: Supervisor, entry: dict[str, Any],
                     health: bool | None, now: float) -> None:
        """Start the run's warm-up at its first answer: a passing inference request, else a
        plain health URL answering its status. An exec or Docker health probe is not run
        every cycle: its warm-up starts at the process start, as before."""
        run = self._runs.get(supervisor.service.name)
        if run is None or entry.get("error"):
            self._note_probe(supervisor, entry, health)
            return
        if run.answered_at is None:
            probe_cfg = supervisor.service.probe
            inference = entry.get("inference")
            if probe_cfg.http is None:
                started = entry.get("started_at")  # wall time: its age, on our clock
                run.answered_at = now - max(time.time() - started, 0.0) \
                    if started is not None else run.samples[0][0]
            elif (inference or {}).get("ok") is True or health is True:
                run.answered_at = now
                log.info("service_answered", service=supervisor.service.name,
                         action="its memory warm-up starts now")
        entry["answered_at"] = run.answered_at

    def _note_probe(self, supervisor: Supervisor, entry: dict[str, Any],
                    health: bool | None) -> None:
        """Its processes are not known (an exec service without pid_file_*, a pid file
        not written yet): the probe alone says when the variant answers, and from then on
        its engine is looked for (issue 28: before, it never was). No warm-up: memory
        that cannot be read is not judged."""
        name, variant = supervisor.service.name, entry["variant"]
        if self._probed.get(name) == variant:
            return
        self._probed.pop(name, None)  # another variant: it answers anew
        inference = entry.get("inference") or {}
        if supervisor.service.probe.http is None:
            # an exec or Docker health probe is not run every cycle: the supervisor has
            # waited for it when it settled on the variant
            answers = supervisor.settled.is_set() and supervisor.view().state.transition is None
        else:
            answers = inference.get("ok") is True or health is True
        if answers:
            self._probed[name] = variant
            log.info("service_answered", service=name, variant=variant,
                     action="its engine is looked for now (its processes are not known)")

    def _tracker(self, name: str) -> ProcessTracker:
        tracker = self._trackers.get(name)
        if tracker is None:
            tracker = self._trackers[name] = processes.new_tracker()
        return tracker

    def _entry(self, supervisor: Supervisor, snap: Snapshot, now: float) -> dict[str, Any]:
        service = supervisor.service
        variant = supervisor.view().state.active
        # gpus: the GPUs its `gpus:` names (None: all), for the Xids its log errors are
        # tied to (service.gpu_errors)
        entry: dict[str, Any] = {"variant": variant, "gpus": service.gpus}
        try:
            tree = processes.tree(service, variant, TREE_DEADLINE_S,
                                  tracker=self._tracker(service.name))
        except processes.TreeError as exc:
            # not known is not "no memory": the rules say unknown, the window starts over
            self._runs.pop(service.name, None)
            entry["error"] = str(exc)
            return entry
        rss, each = processes.rss_bytes(tree.pids)
        gpu_bytes, gpu_headroom = _gpu_memory(snap, set(tree.pids))
        run = self._runs.get(service.name)
        if run is None or run.identity != tree.identity:
            if run is not None:
                log.info("service_restarted", service=service.name, old=run.identity,
                         new=tree.identity, action="memory samples start over")
            run = self._runs[service.name] = Run(tree.identity)
        run.samples.append((now, rss, gpu_bytes))
        while run.samples and now - run.samples[0][0] > self.keep_s:
            run.samples.popleft()
        entry.update({
            "identity": tree.identity, "started_at": tree.started_at, "pids": tree.pids,
            "processes": each, "rss_bytes": rss, "gpu_bytes": gpu_bytes,
            "host_headroom_bytes": processes.host_headroom_bytes(tree.pids),
            "gpu_headroom_bytes": gpu_headroom,
            "samples": [list(s) for s in run.samples],
        })
        entry["growth"] = _growth(entry)
        return entry


def _growth(entry: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The slope of the run's memory over all its samples (host RSS and GPU memory), and
    the seconds left at that slope: fitted once per cycle, here, for the metrics (the
    service.memory_growth rule judges its own window with its own thresholds)."""
    samples = entry["samples"]
    out: dict[str, dict[str, float]] = {}
    for memory, column, room in (("host", 1, "host_headroom_bytes"),
                                 ("gpu", 2, "gpu_headroom_bytes")):
        line = fit([(s[0], float(s[column])) for s in samples if s[column] is not None])
        if line is None:
            continue
        growth = out[memory] = {"slope_bytes_per_s": line.slope}
        headroom = entry.get(room)
        if line.slope > 0 and headroom is not None:
            growth["exhaustion_s"] = max(float(headroom), 0.0) / line.slope
    return out


def _gpu_memory(snap: Snapshot, pids: set[int]) -> tuple[int | None, int | None]:
    """The GPU memory the PIDs hold over all GPUs, and the free memory of the GPUs they
    use; (None, None) when a GPU's processes could not be read (not known, not zero)."""
    held = 0
    free = 0
    uses_gpu = False
    for gpu in snap.gpus:
        if not gpu.compute_processes.is_ok:
            return None, None
        mine = held_by(gpu, pids)
        if not mine:
            continue
        uses_gpu = True
        held += sum(p.used_memory_bytes or 0 for p in mine)
        total, used = gpu.memory_total_bytes.get_or(None), gpu.memory_used_bytes.get_or(None)
        if total is None or used is None:
            return held, None
        free += max(total - used, 0)
    return held, free if uses_gpu else None


def _request_timeout(supervisor: Supervisor) -> float:
    """How long a cycle may wait for the service's request (a plain health URL: not at all)."""
    request = supervisor.service.probe.request
    return request.timeout if request is not None else 0.0


def _wait_s(supervisor: Supervisor) -> float:
    """How long a cycle may wait for the service's request and reads."""
    engine = supervisor.service.engine
    return max(_request_timeout(supervisor), engine.timeout if engine is not None else 0.0,
               LOG_DEADLINE_S)


def _plain_url(supervisor: Supervisor) -> bool:
    probe = supervisor.service.probe
    return probe.request is None and probe.http is not None


def _health_answers(supervisor: Supervisor) -> bool | None:
    """Whether the active variant answers its plain health URL now; None when the probe
    is no plain URL (a request is _inference's) or the service is starting or moving."""
    cfg = supervisor.service.probe
    if cfg.request is not None or cfg.http is None:
        return None
    st = supervisor.view().state
    if not supervisor.settled.is_set() or st.transition is not None:
        return None
    url = cfg.http if isinstance(cfg.http, str) else cfg.http.get(st.active)
    return None if url is None else readiness.http_ready(url, cfg.status, HEALTH_TIMEOUT_S)


def _inference(supervisor: Supervisor) -> dict[str, Any] | None:
    """The probe's request to the active variant; None when the probe is no request."""
    cfg = supervisor.service.probe
    if cfg.request is None or cfg.http is None:
        return None
    st = supervisor.view().state
    if not supervisor.settled.is_set() or st.transition is not None:
        # starting up or moving: a failed request now says nothing about the service
        # (its result is unknown: it neither counts towards failover nor resets)
        return {"ok": None, "error": "the service is starting or moving"}
    variant = st.active
    url = cfg.http if isinstance(cfg.http, str) else cfg.http.get(variant)
    if url is None:
        return None
    answer = readiness.send(url, cfg.status, cfg.request)
    return {"ok": answer.ok, "latency_s": round(answer.latency_s, 4), "status": answer.status,
            "error": answer.error, "timed_out": answer.timed_out, "url": url}


def _read_engine(engines: EngineWatch, engine: str | None, supervisor: Supervisor
                 ) -> dict[str, Any]:
    return engines.read(supervisor, engine)


def _read_log(logs: LogWatch, log: Any, _supervisor: Supervisor) -> dict[str, Any]:
    return logs.read(log)
