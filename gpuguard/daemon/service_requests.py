"""The services' requests (inference probes, health URLs, engine and log reads), each in
a daemon thread of its own, at most one in flight per key, and their answers taken by a
deadline: whatever happened to a request is an answer or an error of it, never an
exception in the cycle (gpuguard/daemon/services.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import structlog

from gpuguard.supervisor.service import Supervisor

log = structlog.get_logger("gpuguard.services")


class Requests:
    """The services' requests, each in a daemon thread of its own, at most one in flight
    per key (a service and what is asked). A request that does not return is left behind
    and nothing is sent in its place until it has: a service that holds its requests costs
    one thread, never one per cycle. Daemon threads, not a pool: the interpreter's exit
    joins a pool's threads, and a stop never waits for a service."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[Future[Any], float]] = {}

    def start(self, key: str, fn: Callable[[Supervisor], Any], supervisor: Supervisor
              ) -> Future[Any] | str:
        """The new request, or why none was sent (the last one is still on its way)."""
        held = self._last.get(key)
        if held is not None and not held[0].done():
            return (f"the request sent {time.monotonic() - held[1]:.0f} s ago has not "
                    "returned yet")
        future: Future[Any] = Future()
        threading.Thread(target=_settle, args=(future, fn, supervisor), daemon=True,
                         name=f"service-{key}"[:60]).start()
        self._last[key] = (future, time.monotonic())
        return future

    def last(self, key: str) -> Future[Any] | None:
        held = self._last.get(key)
        return None if held is None else held[0]


def _settle(future: Future[Any], fn: Callable[[Supervisor], Any], supervisor: Supervisor
            ) -> None:
    try:
        future.set_result(fn(supervisor))
    except BaseException as exc:  # handed to the cycle, which decides
        future.set_exception(exc)


def answer_by(request: Future[Any] | str, end: float, what: str) -> dict[str, Any]:
    """A read's answer by `end`, or why there is none (never an exception)."""
    if isinstance(request, str):
        return {"error": request.replace("request", what)}
    try:
        return request.result(timeout=max(end - time.monotonic(), 0.0))  # type: ignore[no-any-return]
    except FutureTimeout:
        return {"error": f"the {what} did not return within its deadline"}
    except Exception as exc:  # gpuguard's own fault, not the service's: not known
        log.error("service_read_failed", what=what, error=f"{type(exc).__name__}: {exc}"[:300])
        return {"error": f"the {what} failed: {type(exc).__name__}"}


def inference_result(request: Future[Any] | str, end: float) -> dict[str, Any] | None:
    """The probe's request as the service.inference rule reads it. Whatever happened to it
    is the service's result or unknown, never an exception in the cycle."""
    if isinstance(request, str):
        return {"ok": None, "error": request}
    try:
        return request.result(timeout=max(end - time.monotonic(), 0.0))  # type: ignore[no-any-return]
    except FutureTimeout:
        # not known, not failed: the answer came too late to be judged
        return {"ok": None, "error": "the request did not return within its deadline"}
    except Exception as exc:  # gpuguard's own fault, not the service's: not known
        log.error("service_probe_failed", error=f"{type(exc).__name__}: {exc}"[:300])
        return {"ok": None, "error": f"the probe failed: {type(exc).__name__}"}
