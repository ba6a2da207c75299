"""The gates an automatic failback passes, in order, once the counting says the GPU is
healthy again (supervisor/policy.decide):

1. the GPU variant can run here (its image or Python environment: supervisor/image_gate.py);
2. `failback_probe: active`: a fresh active probe of the service's GPUs passes
   (the daemon's Daemon.active_probe_passes);
3. `failback_probe: qualify`, after a hardware finding since the failover: a passing
   qualification of its GPUs started after that finding (supervisor/qualify_gate.py).

A gate that says no keeps the service on CPU with its reason. The first two are asked
again after `failback_after` more healthy cycles (the count starts again); the
qualification's gate every cycle, since it waits for a run, not for health. A failback
by hand (`gpuguard failover to gpu`) is gated by none of them."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuguard.model.results import Result
from gpuguard.supervisor.backends import Backend, BackendError
from gpuguard.supervisor.config import Service
from gpuguard.supervisor.image_gate import blocks_failback
from gpuguard.supervisor.qualify_gate import HARDWARE_ACTIONS, QualifyGate, QualifyHost
from gpuguard.supervisor.state import ServiceState

# (the service's GPUs, None: all) -> (passed, why): the supervisor's failback probe
ActiveCheck = Callable[[list[int] | None], tuple[bool, str]]


@dataclass(frozen=True)
class Gate:
    """A gate's answer: `why` None lets the failback through (`detail` then goes into
    its reason); else why not, and whether the healthy count starts again."""

    why: str | None
    detail: str = ""
    restart_count: bool = True
    outcome: str = "blocked"  # the event's word: blocked, or qualifying


def hardware(why: list[Result]) -> bool:
    """Whether the results that failed a cycle include a hardware finding."""
    return any(hardware_action(r.action) for r in why)


def hardware_action(action: str) -> bool:
    """A failover for this suggested action is a hardware one (its failback qualifies)."""
    return action in HARDWARE_ACTIONS


class Failback:
    def __init__(self, service: Service, active_check: ActiveCheck | None,
                 qualify_host: QualifyHost | None, log: Any, dry_run: bool = False) -> None:
        self.service = service
        self.active_check = active_check
        self.log = log
        self.qualify = QualifyGate(service.name, service.qualify, qualify_host, log, dry_run) \
            if service.qualify is not None else None

    def check(self, results: list[Result], st: ServiceState,
              backend: Callable[[], Backend]) -> Gate:
        why = blocks_failback(results, self.service.name)
        if why is not None:
            return Gate(why)
        if self.service.failback_probe == "active":
            passed, detail = self._probe()
            if not passed:
                return Gate(detail)
            self.log.info("failback_probe_passed", detail=detail)
            return Gate(None, detail)
        if self.qualify is not None and st.qualify_after is not None:
            step = self.qualify.check(st.qualify_after, st.on_cpu_since or st.qualify_after,
                                      self.service.gpus, lambda: _gpu_runs(backend))
            if step.verdict == "pass":
                self.log.info("failback_qualify_passed", detail=step.why)
                return Gate(None, step.why)
            return Gate(step.why, restart_count=False,
                        outcome="qualifying" if step.verdict == "wait" else "blocked")
        return Gate(None)

    def note_finding(self, st: ServiceState, why: list[Result]) -> None:
        """A cycle on CPU: a hardware finding in it (`why`, the results that failed it)
        moves the time a qualification must have started after to now."""
        if self.qualify is not None and why and hardware(why):
            st.qualify_after = time.time()

    def _probe(self) -> tuple[bool, str]:
        if self.active_check is None:
            return False, "no active probe available (the daemon did not give one)"
        try:
            return self.active_check(self.service.gpus)
        except Exception as exc:  # no probe, no failback
            return False, f"the active probe failed: {type(exc).__name__}: {exc}"

    def recover(self) -> None:
        """A qualification left by a daemon that was SIGKILLed: stopped."""
        if self.qualify is not None:
            self.qualify.recover()

    def stop(self, why: str, close: bool = False) -> None:
        """The qualification in progress, if any, stopped now (`close`: for good)."""
        if self.qualify is not None:
            self.qualify.stop(why, close)


def _gpu_runs(backend: Callable[[], Backend]) -> bool:
    """Whether the GPU variant runs; one that cannot be told (no running_gpu command,
    Docker down) is left to NVML, whose compute processes the qualification's gate sees."""
    try:
        return backend().running("gpu")
    except BackendError:
        return False
