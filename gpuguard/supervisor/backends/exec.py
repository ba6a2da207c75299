"""exec backend: the user's own commands (a Kubernetes patch, a Slurm drain, a load
balancer API). `running_gpu`/`running_cpu` are optional: without them gpuguard trusts
its own state for what runs."""

from __future__ import annotations

import subprocess

from gpuguard.supervisor.backends.base import BackendError
from gpuguard.supervisor.config import Service


class ExecBackend:
    def __init__(self, service: Service) -> None:
        self.commands = service.backend_config
        self.env = {"GPUGUARD_SERVICE": service.name}

    def note(self, to: str, reason: str, action: str = "none") -> None:
        """The commands of a transition see where it goes, why (a Slurm drain reason) and
        the suggested action (gpuguard.judge.actions: a drain script tells a reboot from an
        inspection)."""
        self.env.update({"GPUGUARD_VARIANT": to, "GPUGUARD_REASON": reason,
                         "GPUGUARD_ACTION": action})

    def _run(self, key: str) -> int:
        import os

        proc = subprocess.run(self.commands[key], capture_output=True, text=True, timeout=300,
                              env={**os.environ, **self.env}, check=False)
        if proc.returncode != 0 and key.startswith(("start", "stop")):
            raise BackendError(f"{key} ({' '.join(self.commands[key])}) exited "
                               f"{proc.returncode}: {proc.stderr.strip()[-300:]}")
        return proc.returncode

    def start(self, variant: str) -> None:
        self._run(f"start_{variant}")

    def stop(self, variant: str) -> None:
        self._run(f"stop_{variant}")

    def running(self, variant: str) -> bool:
        key = f"running_{variant}"
        if key not in self.commands:
            raise BackendError(f"exec.{key} is not configured")
        return self._run(key) == 0

    def healthy(self, variant: str) -> bool:
        return self.running(variant)
