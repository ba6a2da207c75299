"""The daemon: two cadences of cycles, each a snapshot judged into results, served to
Prometheus; reloads on SIGHUP, stops on SIGTERM, tells systemd how it is doing.

Never hang, never die: NVML runs in a separate worker under a deadline (sampler.py), a cycle's
exception is logged and the next cycle runs, a bad reload leaves the last good configuration.
"""

from __future__ import annotations

import copy
import itertools
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import structlog

from gpuguard.assess.gpus_seen import SeenGpus
from gpuguard.assess.inputs import InputProblem, load_configuration
from gpuguard.assess.once import judge
from gpuguard.config.yamlfile import ConfigError
from gpuguard.daemon import active, freshness, http, logs, main_loop, notify, status, triggers
from gpuguard.daemon.freshness import Freshness
from gpuguard.daemon.latest import LatestResults
from gpuguard.daemon.metrics import DaemonStats, compat_text, registry_of
from gpuguard.daemon.qualify_host import qualify_host_of
from gpuguard.daemon.recorder import FIRST_HISTORY_WAIT_S, EventRecorder, supervisor_event
from gpuguard.daemon.sampler import NvmlSampler
from gpuguard.daemon.schedule import Schedule
from gpuguard.daemon.services import ServiceWatch
from gpuguard.daemon.settings import FAST_SOURCES, DaemonConfig, host_paths, sample_spans
from gpuguard.daemon.status_page import StatusPage
from gpuguard.daemon.verdict_publish import VerdictPublisher
from gpuguard.daemon.xid_counter import XidCounter
from gpuguard.events import store as eventstore
from gpuguard.io.paths import EXIT_HOST_FORBIDDEN, HostPathForbidden
from gpuguard.model.profile import Profile
from gpuguard.model.rule import RuleSet
from gpuguard.model.samples import Samples
from gpuguard.model.snapshot import Snapshot
from gpuguard.sources import collect, nvml, replay
from gpuguard.sources import host as host_sources
from gpuguard.supervisor.config import load_services
from gpuguard.supervisor.service import Supervisor
from gpuguard.supervisor.workloads import of_services

log = structlog.get_logger("gpuguard.daemon")

# How long SIGTERM waits for a cycle in progress (the unit's TimeoutStopSec is 15 s).
STOP_GRACE_S = 5.0


class Daemon:
    def __init__(self, cfg: DaemonConfig) -> None:
        self.cfg = cfg
        self.store = LatestResults()
        self.stats = DaemonStats()
        self.samples = Samples()
        self.sampler: NvmlSampler | None = None
        self._config: tuple[Profile, RuleSet] | None = None
        self._last: Snapshot | None = None
        self._last_at = 0.0  # time.monotonic() of the last sweep
        self._slow_facts = Snapshot()
        self._slow_read = False  # a slow cycle has read the host sources it reads
        self.xids = XidCounter(self.stats)
        self._cycle_ids = itertools.count(1)
        self._stop = threading.Event()
        self._reload = threading.Event()
        self._ready = threading.Event()
        self._idle = threading.Event()  # set while no cycle runs
        self._idle.set()
        self._schedule: Schedule | None = None
        self.supervisors: list[Supervisor] = []
        self.probes = active.ProbeKeeper(cfg.active_probe_interval) \
            if cfg.active_probe_interval > 0 and cfg.input_path is None else None
        self.recorder: EventRecorder | None = None
        self.service_watch = ServiceWatch([])
        self.gpus_seen = SeenGpus(None, None)  # kept in the state dir once started
        # the one freshness rule (daemon/freshness.py), with the services' deadlines once
        # they are known (_start_parts)
        self.freshness = Freshness({"fast": cfg.fast_interval, "slow": cfg.slow_interval})
        self.publisher = VerdictPublisher.of(self)  # `gpuguard status`, NPD files (issue 22)
        self.page = StatusPage.of(self)  # the page at / (issue 31), off unless turned on

    def current(self) -> tuple[tuple[Profile, RuleSet] | None, Snapshot | None]:
        return self._config, self._last  # the rules in use, the last sweep (verdict_publish)

    # --- configuration -------------------------------------------------------------

    def load_config(self) -> tuple[Profile, RuleSet]:
        """The profile and rules; ConfigError (its file and line) when one is bad."""
        try:
            return load_configuration(self.cfg.profile_path, self.cfg.rules_dirs)
        except InputProblem as exc:
            raise exc.__cause__ if isinstance(exc.__cause__, ConfigError) else exc from None

    def use_config(self, config: tuple[Profile, RuleSet]) -> None:
        """The profile and rules in use (at start, on SIGHUP): the samples' spans, the
        status page's switch, host.disk's paths follow them."""
        self._config = config
        self.samples.keep_s, self.service_watch.keep_s = sample_spans(config[1])
        self.page.configure(config[0].status_page, self.cfg.listen)
        # host.disk watches the paths of the profile in use (a bad reload keeps the last)
        self.cfg.sources.disk_paths = tuple(config[0].disk_paths)

    def _do_reload(self) -> None:
        notify.reloading()
        with self.stats.lock:
            self.stats.reloads_total += 1
        try:
            self.use_config(self.load_config())
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
            self._fit_freshness("reload")
            self.run_now("reload")
        notify.notify("READY=1")

    # --- cycles --------------------------------------------------------------------

    def run_now(self, reason: str) -> None:
        """Start a fast cycle at once (after any cycle in progress: one at a time)."""
        if self._schedule is not None:
            self._schedule.now(reason)

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
            self.stats.account(cadence, time.monotonic() - started, succeeded)
            structlog.contextvars.unbind_contextvars("cycle", "cadence")
            self._idle.set()
            if cadence == "fast":
                self._ready.set()

    def _fast(self) -> None:
        assert self._config is not None
        profile, ruleset = self._config
        snap = self._collect_nvml()
        # The slow cycle's host facts, and the kernel log read now (Xids cannot wait a minute).
        # Before the first slow cycle has read them, every host source is read here: the
        # first verdict is judged on the whole host, as a cold check's is (issue 27).
        host_sources.collect_host(self._slow_facts, self.cfg.sources,
                                  only=FAST_SOURCES if self._slow_read else None)
        collect.finish(snap, self._slow_facts, self.cfg.sources)
        # The probe's age and the samples' windows on the monotonic clock: a step of the
        # wall clock neither ages a result into stale nor empties a window.
        now = time.monotonic()
        if self.probes is not None:
            self.probes.apply(snap, now)
        hung = snap.nvml.hung_call is not None
        if hung:
            with self.stats.lock:
                self.stats.deadline_exceeded_total += 1
        self.samples.add(snap, now)
        self.service_watch.sample(snap, now)
        self.xids.remember(snap)  # the kernel log's lines read before a wrap (review 3)
        # the one judgement (gpuguard/assess/once.py), with this daemon's history and the
        # GPUs it has seen since boot
        results = judge(snap, profile, ruleset, cadence="fast", samples=self.samples,
                        history=self.recorder, seen=self.gpus_seen)
        if self.xids.count_kernel_log(snap, ruleset) and self.sampler is not None:
            self.sampler.forget()  # a GPU reset or driver reload: read P2P, InfoROM anew
        self._last, self._last_at = snap, time.monotonic()
        self.store.update(results, "fast", source_failed=status.source_failure(snap))
        self.page.sample(snap, now)
        current = self.store.results()
        for supervisor in self.supervisors:
            supervisor.on_cycle(current)

    def _slow(self) -> None:
        assert self._config is not None
        profile, ruleset = self._config
        facts = Snapshot()
        host_sources.collect_host(facts, self.cfg.sources, skip=FAST_SOURCES)
        self._slow_facts = facts
        self._slow_read = True
        # the last sweep, unless fast cycles stopped ending: slow results judged on an old
        # sweep would be stored as fresh
        fresh = time.monotonic() - self._last_at <= 2 * self.cfg.fast_interval
        base = self._last if self._last is not None and fresh else self._collect_nvml()
        snap = Snapshot(host=copy.copy(base.host), nvml=base.nvml, gpus=base.gpus)
        host_sources.merge(snap, facts)
        results = judge(snap, profile, ruleset, cadence="slow", history=self.recorder)
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

    def on_nvml_xid(self, event: dict[str, Any]) -> None:
        """An Xid from NVML's event set, as it happens: counted, and a cycle starts."""
        log.warning("nvml_xid_event", xid=event.get("xid"), pci=event.get("pci"))
        if self._config is not None:
            self.xids.add_nvml_event(event, self._config[1], self._last)
        self.run_now("nvml xid event")

    def _supervisor_event(self, what: dict[str, Any]) -> None:
        """A failover transition ended: into the event store (`gpuguard failover status`)."""
        if self.recorder is not None:
            self.recorder.record(supervisor_event(what))

    # --- what the HTTP endpoints and systemd see ----------------------------------

    def health(self) -> tuple[bool, dict[str, Any]]:
        return status.health(self.stats, self.store, self.freshness)

    def _fit_freshness(self, why: str) -> None:
        """stale_after from the configured deadlines, logged (at start, on SIGHUP)."""
        self.freshness = Freshness(dict(self.freshness.intervals), freshness.bounds(
            self.cfg.timeout, self.service_watch.longest_wait_s(),
            FIRST_HISTORY_WAIT_S if self.recorder else 0.0,
            self.cfg.sources.probe_timeout if self.cfg.sources.probe_image else 0.0))
        log.info("freshness", why=why, **self.freshness.to_log())

    def status_document(self) -> dict[str, Any]:
        return status.document(self._last, self.store)

    def status_line(self) -> str:
        return status.line(self._last, self.store, self.supervisors)

    # --- the main loop ---------------------------------------------------------------

    def run(self) -> int:
        logs.configure(self.cfg.log_format)
        started = self._start()
        if isinstance(started, int):
            return started
        server, observer = started
        self._loop()
        self._shutdown(server, observer)
        return 0

    def _start(self) -> tuple[Any, Any] | int:
        """Up to the first cycle: the configuration (exit 3 when bad), host paths (exit 4), the
        parts, NVML, HTTP and the status socket (exit 1 if either cannot listen), the schedule."""
        try:
            config = self.load_config()
            self.use_config(config)
            host, port = http.parse_listen(self.cfg.listen)
            services = load_services(self.cfg.config_path) if self.cfg.config_path else []
        except Exception as exc:  # any bad file is exit 3 at start, never a traceback loop
            log.error("config_invalid", error=f"{exc}" if isinstance(exc, ConfigError | ValueError)
                      else f"{type(exc).__name__}: {exc}")
            return 3
        try:
            state_dir, boot, procfs = host_paths(self.cfg, bool(services))
        except HostPathForbidden as exc:
            log.error("host_path_forbidden", error=str(exc))
            return EXIT_HOST_FORBIDDEN
        self._start_parts(config[1], services, state_dir, boot, procfs)
        try:
            self.publisher.start()  # the status socket: a failure is exit 1, as the port's
            server = http.serve(host, port, registry_of(self), self.health,
                                self.status_document, page=self.page.answer,
                                extra_metrics=compat_text(self))
        except OSError as exc:
            log.error("listen_failed", listen=self.cfg.listen, error=str(exc))
            return 1
        self._schedule = Schedule(
            self.fast_cycle, self.cfg.fast_interval, self.slow_cycle, self.cfg.slow_interval,
            self.probe_cycle if self.probes is not None else None,
            self.cfg.active_probe_interval)
        self._schedule.start()
        signal.signal(signal.SIGHUP, lambda *_: self._reload.set())
        signal.signal(signal.SIGTERM, lambda *_: self._stop.set())
        signal.signal(signal.SIGINT, lambda *_: self._stop.set())
        observer = triggers.start_udev(self.run_now) if self.cfg.udev else None
        if self.cfg.events_file is not None:
            triggers.follow_file(self.cfg.events_file, self.run_now, self._stop)
        log.info("daemon_started", listen=f"{host}:{port}", fast_s=self.cfg.fast_interval,
                 slow_s=self.cfg.slow_interval, source="replay" if self.cfg.input_path
                 else "nvml")
        return server, observer

    def _start_parts(self, ruleset: RuleSet, services: list[Any], state_dir: Path | None,
                     boot: str | None, procfs: str) -> None:
        tagged = ruleset.failover_rules()
        self.cfg.sources.workloads = of_services(services)  # image.cuda, every slow cycle
        qualify = qualify_host_of(self.cfg, state_dir, boot, procfs, self.current)
        self.supervisors = [Supervisor(s, state_dir, tagged, self.cfg.dry_run,
                                       active_check=self.active_probe_passes, boot_id=boot,
                                       qualify_host=qualify)
                            for s in services if state_dir is not None]
        if self.cfg.event_store and state_dir is not None:
            self.recorder = EventRecorder(eventstore.path_in(state_dir), boot)
            self.recorder.start()
            self.xids.recorder = self.recorder
            for supervisor in self.supervisors:
                supervisor.on_transition = self._supervisor_event
        self.service_watch.supervisors = self.supervisors
        for supervisor in self.supervisors:
            supervisor.start()
        with self.stats.lock:
            self.stats.last_reload_time = time.time()
        if self.cfg.input_path is None:
            src = self.cfg.sources
            self.sampler = NvmlSampler(procfs, self.on_nvml_xid, self.cfg.slow_interval,
                                       str(src.paths.sysfs) if src.sysfs else None)
        self.gpus_seen = SeenGpus(state_dir, boot, log)
        active.HOST_LOCK["state_dir"] = state_dir
        self._fit_freshness("start")

    def _loop(self) -> None:
        """Until SIGTERM: reloads, systemd's READY= and STATUS=, its watchdog, steps of
        the wall clock (daemon/main_loop.py)."""
        main_loop.run(main_loop.Parts(
            stop=self._stop, reload=self._reload, do_reload=self._do_reload,
            ready=self._ready, status_line=self.status_line, stats=self.stats,
            fast_interval=self.cfg.fast_interval, timeout=self.cfg.timeout,
            stale_after=lambda: self.freshness.stale_after("fast")))

    def _shutdown(self, server: Any, observer: Any) -> None:
        log.info("daemon_stopping")
        notify.notify("STOPPING=1")
        if self._schedule is not None:
            self._schedule.stop()
        killed = active.stop()
        if killed:
            log.info("active_probe_stopped", workers_killed=len(killed))
        for supervisor in self.supervisors:
            supervisor.stop()
        if observer is not None:
            observer.send_stop()
        server.shutdown()
        self.publisher.stop()
        if self.sampler is not None:
            self.sampler.close()
        if self.recorder is not None:
            self.recorder.stop()
        if not self._idle.wait(STOP_GRACE_S):
            # Every read has a deadline, so this is a bug or a wedged kernel call: stop anyway,
            # within TimeoutStopSec, rather than wait for the cycle thread the exit would join.
            log.error("daemon_stopped_during_cycle", waited_s=STOP_GRACE_S)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
