"""Docker backend: the GPU and CPU variants as containers, through the docker SDK.

The CPU variant is made truly GPU-free (FIELD-NOTES): no device requests; runtime runc,
since `nvidia` as the default runtime hands GPUs to every container; and
NVIDIA_VISIBLE_DEVICES=void with an empty CUDA_VISIBLE_DEVICES, since CUDA base images
default the first to `all`.
"""

from __future__ import annotations

from typing import Any

from gpuguard.supervisor.backends.base import BackendError
from gpuguard.supervisor.config import Service

LABEL = "io.gpuguard.service"


class DockerBackend:
    def __init__(self, service: Service) -> None:
        import docker

        self.service = service
        self.specs = service.backend_config
        self._docker = docker
        try:  # the client asks the engine for its API version right here
            self.client = docker.from_env(timeout=30)
        except docker.errors.DockerException as exc:
            raise BackendError(f"Docker: {exc}") from exc

    def _container(self, variant: str) -> Any:
        try:
            return self.client.containers.get(self.specs[variant]["name"])
        except self._docker.errors.NotFound:
            return None
        except self._docker.errors.DockerException as exc:
            raise BackendError(f"Docker: {exc}") from exc

    def run_options(self, variant: str) -> dict[str, Any]:
        spec = self.specs[variant]
        env = dict(spec.get("env") or {})
        options: dict[str, Any] = {
            "name": spec["name"],
            "command": spec.get("command"),
            "labels": {**(spec.get("labels") or {}), LABEL: self.service.name,
                       "io.gpuguard.variant": variant},
            "ports": spec.get("ports"),
            "volumes": spec.get("volumes"),
            "network_mode": spec.get("network_mode"),
            "detach": True,
        }
        if variant == "cpu":
            env.update({"NVIDIA_VISIBLE_DEVICES": "void", "CUDA_VISIBLE_DEVICES": ""})
            options["runtime"] = "runc"
            options["device_requests"] = []
        else:
            gpus = spec.get("gpus", "all")
            if gpus not in (None, "none"):
                ids = None if gpus == "all" else [str(g) for g in gpus]
                options["device_requests"] = [self._docker.types.DeviceRequest(
                    count=-1 if ids is None else None, device_ids=ids,
                    capabilities=[["gpu"]])]
            if spec.get("runtime"):
                options["runtime"] = spec["runtime"]
        options["environment"] = env
        return {k: v for k, v in options.items() if v is not None}

    def start(self, variant: str) -> None:
        container = self._container(variant)
        try:
            if container is not None and container.status == "running":
                return
            if container is not None:
                container.remove(force=True)  # a stopped one may hold an old config
            spec = self.specs[variant]
            self.client.containers.run(spec["image"], **self.run_options(variant))
        except self._docker.errors.DockerException as exc:
            raise BackendError(f"cannot start {self.specs[variant]['name']}: {exc}") from exc

    def stop(self, variant: str) -> None:
        container = self._container(variant)
        if container is None:
            return
        try:
            # seconds for SIGTERM before SIGKILL; it bounds a switch without a router
            container.stop(timeout=int(self.specs[variant].get("stop_timeout", 10)))
            container.remove(force=True)
        except self._docker.errors.NotFound:
            pass
        except self._docker.errors.DockerException as exc:
            raise BackendError(f"cannot stop {self.specs[variant]['name']}: {exc}") from exc

    def running(self, variant: str) -> bool:
        container = self._container(variant)
        return container is not None and container.status == "running"

    def healthy(self, variant: str) -> bool:
        container = self._container(variant)
        if container is None:
            return False
        health = (container.attrs.get("State") or {}).get("Health") or {}
        return bool(health.get("Status") == "healthy")
