"""One supervised service: counts cycles, moves it between its GPU and CPU variants.

Transitions are a list of idempotent steps (gpuguard.supervisor.steps), each written to
the state file before it runs. With a router it is make before break: start the target,
wait until it is ready, switch the route, stop the source. Without one both variants
want the same port, so it is stop, start, wait (the downtime is measured in
docs/benchmarks.md).

On start the supervisor reads its state and looks at what actually runs: a
transition left half done (SIGKILL) is run again from its first step; otherwise the
active variant is made the only one running and routed. A failed transition puts the
source back as it was, counts an error and waits with a growing backoff. The putting
back comes first and is guarded on its own: no bookkeeping error may leave the service
with neither variant running.

A request file of `gpuguard failover to` is read only when it is a small regular file of
the daemon's user (state.take_request); anything else is moved aside and logged, and
never stops the counting of cycles.

Time: every decision (min_cpu_time, the retry backoff) is on CLOCK_BOOTTIME, kept in the
state file beside the boot id, so that neither a step of the wall clock nor a restart of
the daemon changes it (state.rebase says what happens across boots). The wall times in
the state are for display.

The state file comes second: a transition runs its steps even when the state cannot be
written (a full or read-only state filesystem); the write that failed is logged and
counted (gpuguard_failover_state_write_errors_total) and tried again at the next step
or cycle. Only a restart in the middle of such a transition loses where it stopped, and
recover() then takes the truth from what runs.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from gpuguard.io.clock import boottime
from gpuguard.judge.actions import ACTIONS as ACTION_ORDER
from gpuguard.model.results import Result
from gpuguard.supervisor import policy, router, state
from gpuguard.supervisor.backends import Backend, BackendError, make
from gpuguard.supervisor.config import Service
from gpuguard.supervisor.failback import ActiveCheck, Failback, Gate, hardware_action
from gpuguard.supervisor.qualify_gate import QualifyHost
from gpuguard.supervisor.state_writes import StateWrites
from gpuguard.supervisor.steps import STEP_ERRORS, converge, other, roll_back, run_step, steps_of

log = structlog.get_logger("gpuguard.failover")

# Test hook: pause this many seconds after writing the state of the named step, so a
# test can SIGKILL the daemon exactly there (tests/supervisor/test_failover.py).
PAUSE_ENV = "GPUGUARD_FAILOVER_PAUSE_AT"


@dataclass
class ServiceView:
    """What the metrics and `failover status` show of a service."""

    service: str
    state: state.ServiceState
    corrupt_file: str | None
    # writes of the state file that failed (full or read-only state filesystem)
    state_write_errors: int = 0


class Supervisor:
    def __init__(self, service: Service, state_dir: Path, tagged: set[str],
                 dry_run: bool = False, backend: Backend | None = None,
                 active_check: ActiveCheck | None = None, boot_id: str | None = None,
                 qualify_host: QualifyHost | None = None) -> None:
        self.service = service
        # this boot's id: the state's CLOCK_BOOTTIME readings are of it (state.rebase)
        self.boot_id = boot_id
        self.log = log.bind(service=service.name)
        # the gates of an automatic failback (supervisor/failback.py): `failback_probe:
        # active` asks the daemon's Daemon.active_probe_passes; `qualify` runs qualify
        # on the host the daemon describes (qualify_gate.QualifyHost)
        self.failback = Failback(service, active_check, qualify_host, self.log, dry_run)
        self.state_dir = state_dir
        self.path = state.path_for(state_dir, service.name)
        self.tagged = tagged
        self.dry_run = dry_run
        self._backend = backend
        self.state = state.ServiceState(boot_id=boot_id)
        self.corrupt_file: str | None = None
        self.writes = StateWrites()
        # the last bad request that could not be moved aside: logged once, not every 0.5 s
        self._ignored_request: str | None = None
        self._queue: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        # set once recover() has made the active variant run (or failed trying): until
        # then a probe of the service says nothing about it (tests/daemon/test_services)
        self.settled = threading.Event()
        # Told of each transition's end (the daemon records it in the event store)
        self.on_transition: Callable[[dict[str, Any]], None] | None = None

    # --- inputs --------------------------------------------------------------------

    def on_cycle(self, results: list[Result]) -> None:
        self._queue.put(("cycle", results, boottime()))

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name=f"failover-{self.service.name}",
                                  daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()
        self._queue.put(("stop",))
        self.failback.stop("the daemon stops", close=True)  # a qualification never outlives it

    def view(self) -> ServiceView:
        with self._lock:
            return ServiceView(self.service.name, state.ServiceState(**vars(self.state)),
                               self.corrupt_file, self.writes.errors)

    # --- the loop ------------------------------------------------------------------

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            self._backend = make(self.service)
        return self._backend

    def _run(self) -> None:
        try:
            self.recover()
        except Exception:
            self.log.exception("failover_recover_failed")
        self.settled.set()
        while not self._stop.is_set():
            try:
                item = self._queue.get(timeout=0.5)
            except queue.Empty:
                item = ("idle",)
            # Apart: whatever the request file is, the cycle is counted.
            try:
                self._check_request()
            except Exception:
                self.log.exception("failover_request_failed")
            if item[0] == "cycle":
                try:
                    self.handle_cycle(item[1], item[2])
                except Exception:
                    self.log.exception("failover_step_failed")

    def recover(self) -> None:
        self.failback.recover()
        try:
            loaded = state.load(self.path)
        except state.CorruptState as exc:
            self.corrupt_file = str(exc.moved_to or exc.path)
            self.log.error("failover_state_corrupt", file=str(exc.path),
                           moved_to=str(exc.moved_to), reason=exc.reason,
                           action="taking the truth from what runs")
            loaded = None
        if loaded is None:
            loaded = self._from_reality()
        rebased = state.rebase(loaded, self.boot_id, policy.BACKOFF_MAX_S)
        if rebased is not None and loaded.active == "cpu":
            self.log.info("failover_time_on_cpu_from_restart", file=rebased,
                          min_cpu_time_s=self.service.min_cpu_time)
        # a retry time far ahead (a clock set back, a file edited by hand) would block
        # every failover: never wait longer than the longest backoff from now (shown only:
        # the wait itself is retry_boottime, bounded the same way by rebase)
        loaded.next_retry = min(loaded.next_retry, time.time() + policy.BACKOFF_MAX_S)
        with self._lock:
            self.state = loaded
        if loaded.transition is not None:
            self.log.warning("failover_resuming", to=loaded.transition.to,
                             step=loaded.transition.step)
            self.transition(loaded.transition.to, loaded.transition.reason,
                            action=loaded.transition.action)
        else:
            self._ensure(loaded.active)
        self._save()

    def _from_reality(self) -> state.ServiceState:
        try:
            running = {v for v in ("gpu", "cpu") if self.backend.running(v)}
        except BackendError as exc:
            self.log.error("failover_backend_unreachable", error=str(exc))
            running = set()
        routed = router.routed(self.service.nginx) if self.service.nginx else None
        if routed in running:
            active = routed
        elif running == {"cpu"}:
            active = "cpu"
        else:
            active = "gpu"
        self.log.info("failover_state_from_reality", running=sorted(running), routed=routed,
                      active=active)
        now = time.time()
        return state.ServiceState(active=active, since=now, reason="recovered from what runs",
                                  on_cpu_since=now if active == "cpu" else None,
                                  boot_id=self.boot_id,
                                  on_cpu_boottime=boottime() if active == "cpu" else None)

    def _ensure(self, active: str) -> None:
        """Exactly `active` runs and is routed; the other variant is stopped."""
        if self.dry_run:
            return
        try:
            converge(self.service, self.backend, active, self.log)
        except STEP_ERRORS as exc:
            self.log.error("failover_converge_failed", active=active, error=str(exc))
            with self._lock:
                self.state.errors = min(self.state.errors + 1, state.MAX_COUNT)

    def handle_cycle(self, results: list[Result], now: float) -> None:
        """One cycle's results; `now` is io/clock.boottime() (CLOCK_BOOTTIME)."""
        svc = self.service
        result, why = policy.outcome(results, svc.rules, self.tagged, svc.gpus, svc.name,
                                     active=self.view().state.active)
        with self._lock:
            st = self.state
            counts, action = policy.decide(
                st.active, policy.Counts(st.failed_cycles, st.healthy_cycles), result, now,
                st.on_cpu_boottime, svc.failover_after, svc.failback_after, svc.min_cpu_time,
                svc.manual_failback)
            st.failed_cycles, st.healthy_cycles = counts.failed, counts.healthy
            if st.active == "cpu":  # a pass from before a new hardware finding proves nothing
                self.failback.note_finding(st, why)
        if action is None or now < self.state.retry_boottime:
            self._save()
            return
        if action == "to_cpu":
            self.transition("cpu", _failed_words(why), action=_suggested(why))
            return
        gate = self._may_fail_back(results)
        if gate.why is None:
            self.transition("gpu", f"{counts.healthy} healthy cycles"
                            + (f"; {gate.detail}" if gate.detail else ""))

    def _may_fail_back(self, results: list[Result]) -> Gate:
        """Fail back only through the gates of supervisor/failback.py. A gate that says
        no keeps the service on CPU: its reason is logged, recorded (kind supervisor)
        and shown by `failover status`, each time it changes."""
        gate = self.failback.check(results, self.view().state, lambda: self.backend)
        with self._lock:
            st = self.state
            changed, st.failback_blocked = st.failback_blocked != gate.why, gate.why
            if gate.why is not None and gate.restart_count:
                st.healthy_cycles = 0
        if gate.why is not None and changed:
            self.log.warning("failback_blocked", reason=gate.why, outcome=gate.outcome)
            self._tell({"to": "gpu", "reason": gate.why, "action": "none",
                        "outcome": gate.outcome})
        self._save()
        return gate

    def _check_request(self) -> None:
        try:
            request = state.take_request(self.state_dir, self.service.name)
        except state.BadRequest as exc:
            # moved aside: a new file next time; left in place: say so once
            if exc.moved_to is not None or exc.reason != self._ignored_request:
                self.log.error("failover_request_rejected", file=str(exc.path),
                               reason=exc.reason, moved_to=str(exc.moved_to))
            self._ignored_request = None if exc.moved_to is not None else exc.reason
            return
        if request is None:
            self._ignored_request = None
            return
        to, reason = request.to, request.reason
        self.log.info("failover_manual_request", to=to, reason=reason)
        if to == self.state.active and self.state.transition is None:
            return
        self.transition(to, f"manual: {reason}", manual=True)

    # --- a transition ----------------------------------------------------------------

    def transition(self, to: str, reason: str, manual: bool = False,
                   action: str = "none") -> bool:
        steps = steps_of(self.service)
        if self.dry_run:
            self.log.warning("failover_dry_run", to=to, reason=reason, steps=steps)
            return False
        if to == "gpu":  # the GPU variant starts: no qualification may hold its GPUs
            self.failback.stop("the GPU variant starts")
        began = time.monotonic()
        with self._lock:
            self.state.transition = state.Transition(to=to, step=steps[0], reason=reason,
                                                     started=time.time(), action=action)
        self.log.warning("failover_started", to=to, reason=reason)
        try:
            # inside the try: creating the backend reaches Docker, which may be down
            note = getattr(self.backend, "note", None)
            if note is not None:
                note(to, reason, action)
            for step in steps:
                with self._lock:
                    assert self.state.transition is not None
                    self.state.transition.step = step
                self._save()
                self._pause_for_tests(step)
                self.log.info("failover_step", to=to, step=step)
                run_step(self.service, self.backend, step, to)
        except STEP_ERRORS as exc:
            self._failed(to, str(exc))
            return False
        except Exception as exc:  # whatever went wrong, the source is put back
            self._failed(to, f"{type(exc).__name__}: {exc}", unexpected=exc)
            return False
        done = time.time()
        took_s = round(time.monotonic() - began, 3)
        with self._lock:
            st = self.state
            st.active, st.since, st.reason, st.transition = to, done, reason, None
            st.failed_cycles = st.healthy_cycles = 0
            st.on_cpu_since = done if to == "cpu" else None
            # a hardware failover's failback waits for a qualification started after it
            st.qualify_after = done if to == "cpu" and hardware_action(action) and \
                self.service.qualify is not None else None
            st.failback_blocked = None
            st.boot_id = self.boot_id
            st.on_cpu_boottime = boottime() if to == "cpu" else None
            st.next_retry = st.retry_boottime = 0.0
            st.failures_in_row = 0
            st.transitions[f"to_{to}"] = st.transitions.get(f"to_{to}", 0) + 1
            st.last_transition = done
        self._save()
        self.log.warning("failover_done", active=to, reason=reason, manual=manual,
                         took_s=took_s)
        self._tell({"to": to, "reason": reason, "action": action, "outcome": "done",
                    "manual": manual, "took_s": took_s})
        return True

    def _tell(self, what: dict[str, Any]) -> None:
        if self.on_transition is not None:
            try:
                self.on_transition({"service": self.service.name, **what})
            except Exception:  # the event store never stops a transition
                self.log.exception("failover_event_not_recorded")

    def _failed(self, to: str, error: str, unexpected: Exception | None = None) -> None:
        source = other(to)
        # First put the source back as it was (running, routed; the target stopped), in
        # its own guard: nothing of the bookkeeping below may come before it or skip it.
        try:
            roll_back(self.service, self.backend, to)
        except Exception as exc:  # nothing more to do here than say so
            rollback_error: str | None = f"{type(exc).__name__}: {exc}"
        else:
            rollback_error = None
        with self._lock:
            st = self.state
            step = st.transition.step if st.transition else "?"
            st.transition = None
            st.errors = min(st.errors + 1, state.MAX_COUNT)
            st.failures_in_row = min(st.failures_in_row + 1, state.MAX_COUNT)
            backoff = policy.backoff_s(st.failures_in_row)
            st.next_retry = time.time() + backoff  # shown
            st.boot_id = self.boot_id
            st.retry_boottime = boottime() + backoff
        # the file first: whoever reads it after the log says "failed" sees the failure
        self._save()
        if unexpected is not None:
            self.log.error("failover_unexpected_error", exc_info=unexpected)
        if rollback_error is not None:
            self.log.error("failover_rollback_failed", error=rollback_error)
        self.log.error("failover_failed", to=to, step=step, error=error, retry_in_s=backoff,
                       keeping=source)
        self._tell({"to": to, "reason": error, "action": "none", "outcome": "failed",
                    "step": step})

    def _save(self) -> None:
        """The state to its file; a write that fails (a full or read-only filesystem) is
        logged and counted, never raised: what the supervisor does comes first."""
        with self._lock:
            snapshot = state.ServiceState(**vars(self.state))
        self.writes.save(self.path, snapshot, self.log)

    def _pause_for_tests(self, step: str) -> None:
        wanted = os.environ.get(PAUSE_ENV, "")
        if wanted and wanted == step:
            self.log.warning("failover_paused_for_test", step=step)
            time.sleep(60)


def _failed_words(why: list[Result]) -> str:
    return "; ".join(f"{r.rule}" + (f" (GPU {r.gpu.index})" if r.gpu else "") + f": {r.message}"
                     for r in why[:3])


def _suggested(why: list[Result]) -> str:
    """The most severe suggested action of the results that failed it (judge/actions.py)."""
    return max((r.action for r in why if r.action in ACTION_ORDER), key=ACTION_ORDER.index,
               default="none")
