"""The steps that move a supervised service between its GPU and CPU variants: start a
variant, wait until it is ready, route to it, stop the other. gpuguard.supervisor.service
runs them as a transition, writing each step to its state file before the step runs, so
every step is idempotent: a transition left half done is run again from its first step.

Here too: putting the source back after a failed transition, and making the active
variant the only one running and routed (on start, when no transition was left).
"""

from __future__ import annotations

from typing import Any

from gpuguard.supervisor import readiness, router
from gpuguard.supervisor.backends import Backend, BackendError
from gpuguard.supervisor.config import Service


class NotReady(Exception):
    pass


# What a step raises on a failure it knows of: the transition fails and is put back
STEP_ERRORS = (BackendError, router.RouterError, NotReady)


def other(variant: str) -> str:
    return "cpu" if variant == "gpu" else "gpu"


def steps_of(service: Service) -> list[str]:
    """The steps of a transition, in order: make before break with a router; without one
    both variants want the same port, so the source stops first."""
    return (["start", "ready", "route", "stop_source"] if service.nginx
            else ["stop_source", "start", "ready"])


def run_step(service: Service, backend: Backend, step: str, to: str) -> None:
    """One step of a transition to the variant `to`."""
    if step == "start":
        backend.start(to)
    elif step == "ready":
        wait_ready(service, backend, to)
    elif step == "route":
        assert service.nginx is not None
        router.route(service.name, service.nginx, to)
    elif step == "stop_source":
        backend.stop(other(to))


def roll_back(service: Service, backend: Backend, to: str) -> None:
    """The source of a failed transition to `to` as it was: running and routed, `to` stopped."""
    source = other(to)
    if not backend.running(source):
        backend.start(source)
    if service.nginx and router.routed(service.nginx) != source:
        router.route(service.name, service.nginx, source)
    if backend.running(to):
        backend.stop(to)


def converge(service: Service, backend: Backend, active: str, log: Any) -> None:
    """Exactly `active` runs and is routed; the other variant is stopped."""
    if not backend.running(active):
        log.warning("failover_converge_start", variant=active)
        backend.start(active)
        wait_ready(service, backend, active)
    if service.nginx and router.routed(service.nginx) != active:
        router.route(service.name, service.nginx, active)
    if backend.running(other(active)):
        log.warning("failover_converge_stop", variant=other(active))
        backend.stop(other(active))


def wait_ready(service: Service, backend: Backend, variant: str) -> None:
    """Until the variant's probe passes; NotReady past the probe's timeout."""
    cfg = service.probe
    if cfg.docker_health:
        def check() -> bool:
            return backend.healthy(variant)
    elif cfg.exec is not None:
        command = cfg.exec if isinstance(cfg.exec, list) else cfg.exec[variant]

        def check() -> bool:
            return readiness.command_ready(command)
    else:
        url = cfg.http if isinstance(cfg.http, str) else (cfg.http or {}).get(variant)
        request = cfg.request

        def check() -> bool:
            # a real request: ready only when inference answers, not just /health
            if request is not None:
                return readiness.send(str(url), cfg.status, request).ok
            return readiness.http_ready(str(url), cfg.status)
    if not readiness.wait(check, cfg.timeout):
        raise NotReady(f"the {variant} variant was not ready within {cfg.timeout:g} s")
