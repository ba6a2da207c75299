"""Backends run the two variants of a service; one module each (docker, systemd, exec).

Every operation is idempotent: start of a running variant and stop of a stopped one do
nothing, so a transition can be run again from its first step after a crash."""

from __future__ import annotations

from gpuguard.supervisor.backends.base import Backend, BackendError
from gpuguard.supervisor.config import Service

__all__ = ["Backend", "BackendError", "make"]


def make(service: Service) -> Backend:
    if service.backend == "docker":
        from gpuguard.supervisor.backends.docker import DockerBackend

        return DockerBackend(service)
    if service.backend == "systemd":
        from gpuguard.supervisor.backends.systemd import SystemdBackend

        return SystemdBackend(service)
    from gpuguard.supervisor.backends.exec import ExecBackend

    return ExecBackend(service)
