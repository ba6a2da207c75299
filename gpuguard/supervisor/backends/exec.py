"""exec backend: the user's own commands (a Kubernetes patch, a Slurm drain, a load
balancer API). `running_gpu`/`running_cpu` are optional: without them gpuguard trusts
its own state for what runs."""

from __future__ import annotations

from gpuguard.supervisor.backends import command
from gpuguard.supervisor.backends.base import BackendError
from gpuguard.supervisor.config import Service

# How long one command may take (a start that pulls an image, a drain that waits for jobs).
COMMAND_DEADLINE_S = 300.0


class ExecBackend:
    def __init__(self, service: Service) -> None:
        self.commands = service.backend_config
        self.env = {"GPUGUARD_SERVICE": service.name}
        self.deadline_s = COMMAND_DEADLINE_S

    def note(self, to: str, reason: str, action: str = "none") -> None:
        """The commands of a transition see where it goes, why (a Slurm drain reason) and
        the suggested action (gpuguard.judge.actions: a drain script tells a reboot from an
        inspection)."""
        self.env.update({"GPUGUARD_VARIANT": to, "GPUGUARD_REASON": _env_value(reason),
                         "GPUGUARD_ACTION": action})

    def _run(self, key: str) -> int:
        import os

        argv = self.commands[key]
        # a start command leaves the service behind it, holding the command's stdout and
        # stderr: those are /dev/null, never a pipe read to its end (backends/command.py)
        outcome = command.run(argv, self.deadline_s, {**os.environ, **self.env},
                              keep_stderr=not key.startswith("start"))
        if outcome.code is None:
            raise BackendError(f"{key} ({' '.join(argv)}) {outcome.error}")
        if outcome.code != 0 and key.startswith(("start", "stop")):
            said = f": {outcome.stderr}" if outcome.stderr else ""
            raise BackendError(f"{key} ({' '.join(argv)}) exited {outcome.code}{said}")
        return outcome.code

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
