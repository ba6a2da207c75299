"""A workload whose CUDA image.cuda judges (issue 24): a container image or a Python
environment, asked for on the command line (`check --image`, `--python-env`) or the GPU
variant of a supervised service (the daemon)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Workload:
    kind: Literal["image", "python"]
    # the image's reference (read, never pulled) or the environment's path
    name: str
    # the supervised service whose GPU variant it is; None: asked on the command line
    service: str | None = None
    # the GPUs it gets (a service's `gpus`); None: every GPU
    gpus: tuple[int, ...] | None = None
    # the service's own environment, laid over the image's (a container's
    # NVIDIA_DISABLE_REQUIRE may come from there)
    env: tuple[tuple[str, str], ...] = ()

    def facts(self) -> dict[str, Any]:
        """What the source reports besides what it read: which workload this is."""
        return {"kind": self.kind, "name": self.name, "service": self.service,
                "gpus": list(self.gpus) if self.gpus is not None else None}
