"""A service's `failback_probe: qualify` and its `qualify:` settings in the daemon's config
file (issue 30): after a hardware failover the failback waits for a passing `gpuguard
qualify` of the service's GPUs, which the daemon starts (supervisor/qualify_gate.py).

    failback_probe: qualify
    qualify:                  # optional; these are the defaults
      level: standard         # or long; quick is no gate back into service
      seconds: 35             # the load's length (default: the level's own)
      targets: /etc/gpuguard/gpus   # a folder of per-model targets (qualify --targets)

Accepted at load on any host: nothing here needs a GPU or CUDA (a host without them
keeps the service on CPU, saying so, when the qualification runs). A targets folder that
cannot be read is `file:line` at load, as `qualify --targets` refuses it before a GPU is
touched."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from gpuguard.config.yamlfile import ConfigError

Text = Annotated[str, msgspec.Meta(min_length=1)]


class QualifySpec(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    level: Literal["standard", "long"] = "standard"
    # qualify --seconds: its own bounds
    seconds: Annotated[float, msgspec.Meta(ge=0.5, le=3600)] | None = None
    targets: Text | None = None


@dataclass(frozen=True)
class QualifySettings:
    """How the daemon runs the qualification a failback waits for."""

    level: str = "standard"
    seconds: float | None = None
    targets: Path | None = None

    def args(self) -> tuple[str, ...]:
        """Its options on qualify's command line (the level apart: detached.start's)."""
        seconds = ("--seconds", f"{self.seconds:g}") if self.seconds is not None else ()
        return (*seconds, *(("--targets", str(self.targets)) if self.targets else ()))


def qualify_of(probe: str, given: QualifySpec | None,
               fail: Callable[[str, str], ConfigError]) -> QualifySettings | None:
    """The settings of a `failback_probe: qualify` service (None for another probe); a
    `qualify:` section on another is an error (it would never be used)."""
    if probe != "qualify":
        if given is not None:
            raise fail("qualify", "qualify: is for `failback_probe: qualify` (it is "
                       f"{probe!r} here): it would never be used")
        return None
    spec = given or QualifySpec()
    targets = Path(spec.targets) if spec.targets is not None else None
    if targets is not None:
        from gpuguard.config.gpu_targets import load_targets

        try:
            load_targets(targets)
        except (ConfigError, OSError) as exc:
            raise fail("qualify", f"qualify.targets: {exc}") from exc
    return QualifySettings(spec.level, spec.seconds, targets)
