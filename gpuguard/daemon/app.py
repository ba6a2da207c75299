"""The daemon: two cadences of cycles, each a snapshot judged into results, served to
Prometheus; reloads on SIGHUP, stops on SIGTERM, tells systemd how it is doing.

Never hang, never die: NVML runs in a separate worker under a deadline (sampler.py),
a cycle's exception is logged and the next cycle runs, a bad configuration on reload
leaves the last good one in use.
"""

from __future__ import annotations

import copy
import itertools
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from prometheus_client import CollectorRegistry

from gpuguard.config.ruleset import load_config
from gpuguard.config.yamlfile import ConfigError
from gpuguard.daemon import active, http, logs, notify
from gpuguard.daemon import triggers as events
from gpuguard.daemon.active import ProbeKeeper
from gpuguard.daemon.latest import ResultStore
from gpuguard.daemon.metrics import DaemonCollector, DaemonStats
from gpuguard.daemon.recorder import EventRecorder
from gpuguard.daemon.sampler import NvmlSampler
from gpuguard.daemon.services import ServiceWatch
from gpuguard.events import store as eventstore
from gpuguard.events.recording import xid_event
from gpuguard.events.store import Event
from gpuguard.io.paths import EXIT_HOST_FORBIDDEN, HostPathForbidden, state_dir_or_default
from gpuguard.judge.actions import of_xid
from gpuguard.judge.engine import evaluate
from gpuguard.judge.xids import grade
from gpuguard.model.pci import normalise_pci
from gpuguard.model.profile import Profile
from gpuguard.model.results import Status, Verdict
from gpuguard.model.rule import RuleSet
from gpuguard.model.samples import History
from gpuguard.model.snapshot import Snapshot
from gpuguard.outputs import json_out
from gpuguard.sources import collect, nvml, replay
from gpuguard.sources import host as host_sources
from gpuguard.supervisor.config import load_services
from gpuguard.supervisor.service import Supervisor

log = structlog.get_logger("gpuguard.daemon")

DEFAULT_LISTEN = "127.0.0.1:9412"
# Host sources read every fast cycle; the others every slow one. Host memory is one
# read of /proc/meminfo (~0.1 ms): memory pressure cannot wait a minute either.
FAST_SOURCES = frozenset({"kernel_log", "host_memory"})
# How long SIGTERM waits for a cycle in progress (the unit's TimeoutStopSec is 15 s).
STOP_GRACE_S = 5.0


@dataclass
class DaemonConfig:
    listen: str = DEFAULT_LISTEN
    fast_interval: float = 5.0
    slow_interval: float = 60.0
    timeout: float = 4.0  # NVML deadline of one sweep
    input_path: Path | None = None  # a replayed snapshot, read again every cycle
    host: host_sources.HostOptions = field(default_factory=host_sources.HostOptions)
    profile_path: Path | None = None
    rules_dirs: list[Path] = field(default_factory=list)
    udev: bool = True
    events_file: Path | None = None
    log_format: str = "auto"
    config_path: Path | None = None  # services for the supervisor (gpuguard/supervisor)
    dry_run: bool = False
    # Seconds between runs of the active probe on idle GPUs; 0: never (daemon/active.py).
    active_probe_interval: float = 0.0
    event_store: bool = True  # record transitions and Xids in state_dir/events.db


class Daemon:
    def __init__(self, cfg: DaemonConfig) -> None:
        self.cfg = cfg
        self.store = ResultStore()
        self.stats = DaemonStats()
        self.history = History()
        self.sampler: NvmlSampler | None = None
        self._config: tuple[Profile, RuleSet] | None = None
        self._last: Snapshot | None = None
        self._slow_facts = Snapshot()
        self._xid_marks = XidMarks()
        self._cycle_ids = itertools.count(1)
        self._stop = threading.Event()
        self._reload = threading.Event()
        self._ready = threading.Event()
        self._idle = threading.Event()  # set while no cycle runs
        self._idle.set()
        self._scheduler: BackgroundScheduler | None = None
        self.supervisors: list[Supervisor] = []
        self.probes = ProbeKeeper(cfg.active_probe_interval) \
            if cfg.active_probe_interval > 0 and cfg.input_path is None else None
        self.recorder: EventRecorder | None = None
        self.service_watch = ServiceWatch([])

    # --- configuration -------------------------------------------------------------

    def load_config(self) -> tuple[Profile, RuleSet]:
        return load_config(self.cfg.profile_path, self.cfg.rules_dirs)

    def _use_config(self, config: tuple[Profile, RuleSet]) -> None:
        self._config = config
        self._fit_history(config[1])
        # host.disk watches the paths of the profile in use (a bad reload keeps the last)
        self.cfg.host.disk_paths = tuple(config[0].disk_paths)

    def _fit_history(self, ruleset: RuleSet) -> None:
        """Keep the history as long as the longest window a rule judges (a rule whose
        window_s an override lengthened must not be judged over less than it says)."""
        windows = {r.id: float(r.thresholds["window_s"]) for r in ruleset.rules.values()
                   if isinstance(r.thresholds.get("window_s"), int | float)}
        # the services' samples are kept apart (daemon/services.py): their 30 min window
        # does not lengthen every GPU's history
        self.history.keep_s = max([660.0, *(w + 60.0 for rule, w in windows.items()
                                            if not rule.startswith("service."))])
        self.service_watch.keep_s = max([60.0, *(w + 60.0 for rule, w in windows.items()
                                                 if rule.startswith("service."))])

    def _do_reload(self) -> None:
        notify.reloading()
        with self.stats.lock:
            self.stats.reloads_total += 1
        try:
            self._use_config(self.load_config())
        except ConfigError as exc:
            with self.stats.lock:
                self.stats.reload_success = 0
            log.error("config_reload_failed", file=exc.path, line=exc.line, reason=exc.problem,
                      keeping="the last good rules and profile")
        except Exception as exc:  # whatever a bad file raises, the last good rules stay
            with self.stats.lock:
                self.stats.reload_success = 0
            log.error("config_reload_failed", reason=f"{type(exc).__name__}: {exc}",
                      keeping="the last good rules and profile")
        else:
            with self.stats.lock:
                self.stats.reload_success = 1
                self.stats.last_reload_time = time.time()
            log.info("config_reloaded", rules=len(self._config[1].rules) if self._config else 0)
            self.run_now("reload")
        notify.notify("READY=1")

    # --- cycles --------------------------------------------------------------------

    def run_now(self, reason: str) -> None:
        """Start a fast cycle at once (after any cycle in progress: one at a time)."""
        if self._scheduler is not None:
            self._scheduler.add_job(self.fast_cycle, args=[reason], id=f"now-{reason}",
                                    replace_existing=True, misfire_grace_time=None)

    def _collect_nvml(self) -> Snapshot:
        if self.cfg.input_path is not None:
            started = time.monotonic()
            try:
                snap = collect.load_input(self.cfg.input_path, self.cfg.timeout)
            except replay.InputError as exc:
                snap = Snapshot()
                snap.nvml.sweep_error = str(exc)
                snap.record("input", started, error=str(exc))
        else:
            assert self.sampler is not None
            snap = self.sampler.sweep(self.cfg.timeout)
        # GPUs it did not answer for are listed, unknown, under the identity they last had.
        nvml.fill_unanswered(snap, self._last.gpus if self._last is not None else None)
        return snap

    def fast_cycle(self, reason: str = "schedule") -> None:
        self._cycle("fast", reason, self._fast)

    def slow_cycle(self, reason: str = "schedule") -> None:
        self._cycle("slow", reason, self._slow)

    def _cycle(self, cadence: str, reason: str, body: Any) -> None:
        structlog.contextvars.bind_contextvars(cycle=next(self._cycle_ids), cadence=cadence)
        started = time.monotonic()
        succeeded = False
        self._idle.clear()
        try:
            if reason != "schedule":
                log.info("cycle_started", reason=reason)
            body()
            succeeded = True
        except Exception as exc:
            # Not fresh: its rules turn unknown (never an old ok served as current), and
            # /healthz, /status, the metrics and systemd's STATUS= say so until one succeeds.
            log.exception("cycle_failed")
            self.store.mark_failed(cadence, f"{type(exc).__name__}: {str(exc)[:200]}")
        finally:
            with self.stats.lock:
                now = time.time()
                self.stats.cycle_duration_s[cadence] = time.monotonic() - started
                self.stats.last_cycle_time[cadence] = now
                self.stats.cycles_total[cadence] = self.stats.cycles_total.get(cadence, 0) + 1
                self.stats.last_cycle_ok[cadence] = succeeded
                if succeeded:
                    self.stats.last_success_time[cadence] = now
                else:
                    self.stats.cycle_failures_total[cadence] = \
                        self.stats.cycle_failures_total.get(cadence, 0) + 1
            structlog.contextvars.unbind_contextvars("cycle", "cadence")
            self._idle.set()
            if cadence == "fast":
                self._ready.set()

    def _fast(self) -> None:
        assert self._config is not None
        profile, ruleset = self._config
        snap = self._collect_nvml()
        # The slow cycle's host facts, and the kernel log read now (Xids cannot wait a minute).
        host_sources.collect_host(self._slow_facts, self.cfg.host, only=FAST_SOURCES)
        collect.finish(snap, self._slow_facts, self.cfg.host)
        if self.probes is not None:
            self.probes.apply(snap, time.time())
        hung = snap.nvml.hung_call is not None
        if hung:
            with self.stats.lock:
                self.stats.deadline_exceeded_total += 1
        self.history.add(snap, time.time())
        self.service_watch.sample(snap, time.time())
        results = evaluate(snap, ruleset, profile, cadence="fast", history=self.history)
        if self.recorder is not None:
            results = self.recorder.on_cycle(results, snap.gpu_ids(), ruleset)
        self._count_xids(snap, ruleset)
        self._last = snap
        self.store.update(results, "fast", source_failed=_source_failure(snap))
        current = self.store.results()
        for supervisor in self.supervisors:
            supervisor.on_cycle(current)

    def _slow(self) -> None:
        assert self._config is not None
        profile, ruleset = self._config
        facts = Snapshot()
        host_sources.collect_host(facts, self.cfg.host, skip=FAST_SOURCES)
        self._slow_facts = facts
        base = self._last if self._last is not None else self._collect_nvml()
        snap = Snapshot(host=copy.copy(base.host), nvml=base.nvml, gpus=base.gpus)
        host_sources.merge(snap, facts)
        results = evaluate(snap, ruleset, profile, cadence="slow")
        if self.recorder is not None:
            results = self.recorder.on_cycle(results, snap.gpu_ids(), ruleset)
        self.store.update(results, "slow")

    def probe_cycle(self) -> None:
        """The active probe on the GPUs of the last sweep that are idle now."""
        if self.probes is None or self._last is None or self._config is None:
            return
        try:
            self.probes.run(self._last, self._config[0])
        except Exception:  # the kept results age into stale (unknown); the daemon goes on
            log.exception("active_probe_failed")

    def active_probe_passes(self, gpus: list[int] | None) -> tuple[bool, str]:
        """For the supervisor's `failback_probe: active`: a fresh probe of `gpus`."""
        if self._last is None or self._config is None:
            return False, "no NVML sweep yet"
        profile, ruleset = self._config
        return active.passes(self._last, profile, ruleset, gpus)

    def _count_xids(self, snap: Snapshot, ruleset: RuleSet) -> None:
        if not snap.host.kernel_log.is_ok:
            return
        log_ = snap.host.kernel_log.get()
        now_usec, now = log_.get("now_usec"), time.time()
        for event in self._xid_marks.new_events(log_["xids"]):
            # the kernel log's clock (time since boot) turned into wall time
            usec = event.get("usec")
            when = now - (now_usec - usec) / 1e6 if usec is not None and now_usec else now
            self._add_xid(event["xid"], event.get("pci"), event.get("text"), ruleset, snap,
                          when, event.get("seq"), "kmsg")

    def _add_xid(self, xid: int, pci: str | None, text: str | None, ruleset: RuleSet,
                 snap: Snapshot, when: float, seq: int | None = None,
                 source: str = "nvml") -> None:
        severity = grade(xid, text, ruleset.xid_catalog).severity
        gpu = snap.gpu_at(pci)
        if self.recorder is not None and severity != "ignore":
            self.recorder.record(xid_event(xid, severity,
                                           of_xid(xid, text, ruleset.xid_catalog).value,
                                           None if gpu is None else gpu.identity(), source,
                                           when, seq, text, pci))
        label = (str(xid), severity, "" if gpu is None else str(gpu.index),
                 "" if gpu is None else gpu.pci_bus_id.get())
        with self.stats.lock:
            self.stats.xids[label] = self.stats.xids.get(label, 0) + 1
            self.stats.xid_last[label] = max(self.stats.xid_last.get(label, 0.0), when)

    def on_nvml_xid(self, event: dict[str, Any]) -> None:
        """An Xid from NVML's event set, as it happens: counted, and a cycle starts."""
        log.warning("nvml_xid_event", xid=event.get("xid"), pci=event.get("pci"))
        if self._config is not None:
            pci = normalise_pci(event["pci"]) if event.get("pci") else None
            self._add_xid(int(event["xid"]), pci, None, self._config[1],
                          self._last or Snapshot(),
                          float(event.get("time") or time.time()), None, "nvml")
        self.run_now("nvml xid event")

    def _supervisor_event(self, what: dict[str, Any]) -> None:
        """A failover transition ended: into the event store (`gpuguard failover status`)."""
        if self.recorder is not None:
            self.recorder.record(Event(
                kind="supervisor", source="supervisor", rule=str(what.get("service")),
                status=f"{what.get('outcome')}:{what.get('to')}",
                action=str(what.get("action") or "none"), message=str(what.get("reason") or ""),
                data={k: v for k, v in what.items() if k not in ("reason", "action")}))

    # --- what the HTTP endpoints and systemd see ----------------------------------

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Healthy: a fast cycle succeeded recently and the last one did not fail."""
        with self.stats.lock:
            last_ok = self.stats.last_success_time.get("fast")
            last_failed = self.stats.last_cycle_ok.get("fast") is False
        age = None if last_ok is None else round(time.time() - last_ok, 3)
        limit = 3 * self.cfg.fast_interval + self.cfg.timeout
        fresh = age is not None and age < limit and not last_failed
        return fresh, {"alive": True, "last_successful_cycle_age_s": age,
                       "fresh_within_s": limit, "last_cycle_failed": last_failed,
                       "stale_results": self.store.stale,
                       "stale_reason": self.store.stale_reason()}

    def status_document(self) -> dict[str, Any]:
        doc = json_out.document(self._last or Snapshot(), Verdict(self.store.results()))
        doc["stale"] = self.store.stale
        doc["stale_reason"] = self.store.stale_reason()
        return doc

    def status_line(self) -> str:
        results = self.store.results()
        worst = {s: sum(1 for r in results if r.status is s)
                 for s in (Status.CRITICAL, Status.WARNING, Status.UNKNOWN)}
        gpus = len(self._last.gpus) if self._last else 0
        text = (f"{gpus} GPU(s): {worst[Status.CRITICAL]} critical, {worst[Status.WARNING]} "
                f"warning, {worst[Status.UNKNOWN]} unknown")
        reason = self.store.stale_reason()
        text += f" (results stale: {reason})" if reason else ""
        for supervisor in self.supervisors:
            snap = supervisor.snapshot()
            moving = f", moving to {snap.state.transition.to}" if snap.state.transition else ""
            text += f"; {snap.service} on {snap.state.active.upper()}{moving}"
        return text

    def _cycles_progress(self) -> bool:
        with self.stats.lock:
            last_end = max(self.stats.last_cycle_time.values(), default=None)
        if self._idle.is_set() or last_end is None:
            return True  # between cycles, or the first one has not ended yet
        return time.time() - last_end < 3 * self.cfg.fast_interval + 2 * self.cfg.timeout

    # --- the main loop ---------------------------------------------------------------

    def run(self) -> int:
        logs.configure(self.cfg.log_format)
        try:
            config = self.load_config()
            self._use_config(config)
            host, port = http.parse_listen(self.cfg.listen)
            services = load_services(self.cfg.config_path) if self.cfg.config_path else []
        except Exception as exc:  # any bad file is exit 3 at start, never a traceback loop
            log.error("config_invalid", error=f"{exc}" if isinstance(exc, ConfigError | ValueError)
                      else f"{type(exc).__name__}: {exc}")
            return 3
        try:
            # every default host path this configuration reads, looked up now: under the
            # tests' guard (gpuguard/io/paths.py) a refused one stops the start, exit 4
            # A replay records history only into a state dir it was given: never into this
            # host's own (the replayed facts are not this host's).
            if self.cfg.input_path is not None and self.cfg.host.state_dir is None:
                if self.cfg.event_store:
                    log.info("event_store_off", why="a replayed --input without --state-dir")
                self.cfg.event_store = False
            self.cfg.host.look_up_host_paths()
            # looked up only where something is kept there (a replay without services and
            # without a store keeps nothing)
            state_dir = state_dir_or_default(self.cfg.host.state_dir) \
                if self.cfg.event_store or services else None
            boot = host_sources.boot_id(self.cfg.host.paths) if self.cfg.event_store else None
            procfs = str(self.cfg.host.paths.procfs) if self.cfg.input_path is None else ""
        except HostPathForbidden as exc:
            log.error("host_path_forbidden", error=str(exc))
            return EXIT_HOST_FORBIDDEN
        tagged = {r.id for r in config[1].rules.values() if "failover" in r.tags}
        self.supervisors = [Supervisor(s, state_dir, tagged, self.cfg.dry_run,
                                       active_check=self.active_probe_passes)
                            for s in services if state_dir is not None]
        if self.cfg.event_store and state_dir is not None:
            self.recorder = EventRecorder(eventstore.path_in(state_dir), boot)
            self.recorder.start()
            for supervisor in self.supervisors:
                supervisor.on_transition = self._supervisor_event
        self.service_watch.supervisors = self.supervisors
        for supervisor in self.supervisors:
            supervisor.start()
        with self.stats.lock:
            self.stats.last_reload_time = time.time()
        if self.cfg.input_path is None:
            self.sampler = NvmlSampler(procfs, self.on_nvml_xid)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(DaemonCollector(self.store, self.stats, lambda: self._last,
                                          lambda: [s.snapshot() for s in self.supervisors],
                                          self.recorder.metrics if self.recorder else None))
        try:
            server = http.serve(host, port, registry, self.health, self.status_document)
        except OSError as exc:
            log.error("listen_failed", listen=self.cfg.listen, error=str(exc))
            return 1

        self._scheduler = BackgroundScheduler(
            # one cycle at a time; the active probe (up to its deadline, 10 s) on its own
            # thread, so that it never delays a fast cycle
            executors={"default": ThreadPoolExecutor(1), "probe": ThreadPoolExecutor(1)},
            job_defaults={
                "coalesce": True,
                "max_instances": 1,
                # A cycle delayed by up to one interval (another cycle ran long) still
                # runs; later than that it is skipped and the next one comes.
                "misfire_grace_time": int(max(1, self.cfg.fast_interval)),
            },
            timezone="UTC",
        )
        # First runs at once, fast first (one executor thread takes jobs in order).
        self._scheduler.add_job(self.fast_cycle, "interval", seconds=self.cfg.fast_interval,
                                id="fast", next_run_time=_utcnow())
        self._scheduler.add_job(self.slow_cycle, "interval", seconds=self.cfg.slow_interval,
                                id="slow", next_run_time=_utcnow(),
                                misfire_grace_time=int(max(1, self.cfg.slow_interval)))
        if self.probes is not None:
            self._scheduler.add_job(self.probe_cycle, "interval",
                                    seconds=self.cfg.active_probe_interval, id="active_probe",
                                    executor="probe",
                                    misfire_grace_time=int(self.cfg.active_probe_interval))
        self._scheduler.start()

        signal.signal(signal.SIGHUP, lambda *_: self._reload.set())
        signal.signal(signal.SIGTERM, lambda *_: self._stop.set())
        signal.signal(signal.SIGINT, lambda *_: self._stop.set())
        observer = events.start_udev(self.run_now) if self.cfg.udev else None
        if self.cfg.events_file is not None:
            events.follow_file(self.cfg.events_file, self.run_now, self._stop)
        log.info("daemon_started", listen=f"{host}:{port}", fast_s=self.cfg.fast_interval,
                 slow_s=self.cfg.slow_interval, source="replay" if self.cfg.input_path
                 else "nvml")

        ping = notify.watchdog_interval()
        ready_sent = False
        last_status = ""
        last_ping = 0.0
        while not self._stop.wait(min(1.0, ping or 1.0)):
            if self._reload.is_set():
                self._reload.clear()
                self._do_reload()
            if self._ready.is_set():
                line = self.status_line()
                if not ready_sent:
                    notify.notify("READY=1", f"STATUS={line}")
                    ready_sent = True
                elif line != last_status:
                    notify.notify(f"STATUS={line}")
                last_status = line
            # The watchdog is pinged from this loop, not from cycles: a wedged GPU is
            # reported (driver.responsive) instead of getting the daemon restarted. But
            # only while cycles come to an end: every read has a deadline, so a cycle that
            # does not end is a stuck daemon, and systemd restarting it is the right cure.
            if ping and time.monotonic() - last_ping >= ping and self._cycles_progress():
                notify.notify("WATCHDOG=1")
                last_ping = time.monotonic()

        log.info("daemon_stopping")
        notify.notify("STOPPING=1")
        self._scheduler.shutdown(wait=False)
        for supervisor in self.supervisors:
            supervisor.stop()
        if observer is not None:
            observer.send_stop()
        server.shutdown()
        if self.sampler is not None:
            self.sampler.close()
        if self.recorder is not None:
            self.recorder.stop()
        if not self._idle.wait(STOP_GRACE_S):
            # Every read has a deadline, so this is a bug or a wedged kernel call: stop
            # anyway, within the unit's TimeoutStopSec, rather than wait for the cycle
            # thread that the interpreter would otherwise join at exit.
            log.error("daemon_stopped_during_cycle", waited_s=STOP_GRACE_S)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        return 0


def _source_failure(snap: Snapshot) -> str | None:
    """Why this cycle's GPU facts are not all current: NVML hung, or the sweep (or the
    replayed input) failed. NVML not starting at all is a current fact (driver.loaded)."""
    if snap.nvml.hung_call is not None:
        return "NVML did not answer in time"
    if snap.nvml.sweep_error is not None:
        return f"the NVML sweep failed: {snap.nvml.sweep_error[:200]}"
    return None


class XidMarks:
    """Which kernel-log Xids were counted already, in bounded memory: the highest kmsg
    sequence number (or, for a saved log without one, the latest time stamp) seen; only
    lines without either are remembered one by one, and only while the log still has them."""

    def __init__(self) -> None:
        self.seq = -1
        self.usec = -1
        self.unnumbered: set[tuple[Any, ...]] = set()

    def new_events(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        fresh: list[dict[str, Any]] = []
        top_seq, top_usec = self.seq, self.usec
        present: set[tuple[Any, ...]] = set()
        for event in events:
            seq, usec = event.get("seq"), event.get("usec")
            if seq is not None:
                if seq > self.seq:
                    fresh.append(event)
                top_seq = max(top_seq, seq)
            elif usec is not None:
                if usec > self.usec:
                    fresh.append(event)
                top_usec = max(top_usec, usec)
            else:
                key = (event["xid"], event.get("pci"), event.get("text"))
                present.add(key)
                if key not in self.unnumbered:
                    fresh.append(event)
        self.seq, self.usec, self.unnumbered = top_seq, top_usec, present
        return fresh


def _utcnow() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)
