"""The workloads image.cuda judges for the supervised services (issue 24): each Docker
service's GPU variant image, with the environment and GPUs the backend gives it; each
exec or systemd service's `python_env`. The daemon hands them to the host sources
(gpuguard/sources/workloads.py), which read them every slow cycle."""

from __future__ import annotations

from typing import Any

from gpuguard.model.workload import Workload
from gpuguard.supervisor.config import Service


def of_services(services: list[Service]) -> tuple[Workload, ...]:
    found: list[Workload] = []
    for service in services:
        if service.backend == "docker":
            gpu = service.backend_config["gpu"]
            env = tuple(sorted((str(k), str(v)) for k, v in (gpu.get("env") or {}).items()))
            found.append(Workload("image", gpu["image"], service.name,
                                  _docker_gpus(gpu.get("gpus", "all")), env))
        elif service.python_env:
            gpus = tuple(service.gpus) if service.gpus is not None else None
            found.append(Workload("python", service.python_env, service.name, gpus))
    return tuple(found)


def _docker_gpus(gpus: Any) -> tuple[int, ...] | None:
    """The GPUs the Docker backend asks for (backends/docker.py): all, none, or a list."""
    if gpus in (None, "all"):
        return None
    if gpus == "none":
        return ()
    return tuple(int(g) for g in gpus)
