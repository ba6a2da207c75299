"""Backends run the two variants of a service; one module each (docker, systemd, exec).

Every operation is idempotent: start of a running variant and stop of a stopped one do
nothing, so a transition can be run again from its first step after a crash."""

from __future__ import annotations

from typing import Protocol

from gpuguard.supervisor.config import Service


class BackendError(Exception):
    pass


class Backend(Protocol):
    def start(self, variant: str) -> None: ...
    def stop(self, variant: str) -> None: ...
    def running(self, variant: str) -> bool: ...
    def healthy(self, variant: str) -> bool: ...


def make(service: Service) -> Backend:
    if service.backend == "docker":
        from gpuguard.supervisor.backends.docker import DockerBackend

        return DockerBackend(service)
    if service.backend == "systemd":
        from gpuguard.supervisor.backends.systemd import SystemdBackend

        return SystemdBackend(service)
    from gpuguard.supervisor.backends.exec import ExecBackend

    return ExecBackend(service)
