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
        self.env.update({"GPUGUARD_VARIANT": to, "GPUGUARD_REASON": _env_value(reason),
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


# The longest GPUGUARD_REASON passed on: the kernel refuses to start a command with one
# string of the environment over 128 KiB (E2BIG), and the reason quotes result messages.
MAX_REASON = 4096


def _env_value(text: str) -> str:
    """`text` as a value the environment can hold: no NUL byte (the reason quotes results,
    which may quote what a service answered; one NUL and no command of a transition could
    start), at most MAX_REASON characters."""
    text = text.replace("\0", "\\x00")
    return text if len(text) <= MAX_REASON else text[:MAX_REASON - 3] + "..."
