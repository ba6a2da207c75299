"""systemd backend: a GPU unit and a CPU unit, through systemctl."""

from __future__ import annotations

import subprocess

from gpuguard.supervisor.backends.base import BackendError
from gpuguard.supervisor.config import Service


class SystemdBackend:
    def __init__(self, service: Service, systemctl: str = "systemctl") -> None:
        self.units = service.backend_config
        self.systemctl = systemctl

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.systemctl, *args], capture_output=True, text=True,
                              timeout=120, check=False)

    def start(self, variant: str) -> None:
        proc = self._run("start", self.units[variant])
        if proc.returncode != 0:
            raise BackendError(f"systemctl start {self.units[variant]}: {proc.stderr.strip()}")

    def stop(self, variant: str) -> None:
        proc = self._run("stop", self.units[variant])
        if proc.returncode != 0:
            raise BackendError(f"systemctl stop {self.units[variant]}: {proc.stderr.strip()}")

    def running(self, variant: str) -> bool:
        return self._run("is-active", "--quiet", self.units[variant]).returncode == 0

    def healthy(self, variant: str) -> bool:
        return self.running(variant)
