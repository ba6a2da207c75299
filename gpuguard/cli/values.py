"""The command line's value types: numbers that are finite and paths the kernel can take.

click's own types let through what later crashed a command with a traceback (issue 28,
"inputs that crash instead of being refused"): FloatRange compares, and every comparison
with NaN is false, so `--timeout nan` passed its minimum; with no maximum `--timeout inf`
(or 1e308) passed too, and reached `socket.settimeout` or `time.sleep` as a number past
`time_t`. A path longer than the kernel takes (ENAMETOOLONG) made `Path.exists()` raise,
since pathlib swallows only "not there" errors. Each is refused here, at parse time, as
click's usage error naming the option (exit 3, gpuguard/cli/entry.py)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import click

# A longest path gpuguard is given, and a longest name in it: the kernel's PATH_MAX is 4096
# and NAME_MAX 255, and gpuguard adds its own names under a root it is given
# (<sysfs>/bus/pci/devices/<address>/..., <state-dir>/failover-<service>.json.rejected-...).
MAX_PATH_BYTES = 2048
MAX_NAME_BYTES = 255
# The longest any deadline or wait of the command line may be: an hour (`--timeout`,
# `--slurm-timeout`, `failover to --wait`); cycles may be a day apart.
MAX_WAIT_S = 3600.0
MAX_INTERVAL_S = 86400.0


class Finite(click.FloatRange):
    """A FloatRange that refuses NaN and the infinities whatever its bounds."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class FilePath(click.Path):
    """A path (as pathlib.Path) of at most MAX_PATH_BYTES, each name at most
    MAX_NAME_BYTES, with no NUL: past those every use of it fails in the kernel."""

    def __init__(self) -> None:
        super().__init__(path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        raw = os.fsencode(value)
        if len(raw) > MAX_PATH_BYTES:
            self.fail(f"a path of at most {MAX_PATH_BYTES} bytes, not {len(raw)}", param, ctx)
        longest = max((len(name) for name in raw.split(b"/")), default=0)
        if longest > MAX_NAME_BYTES:
            self.fail(f"a path whose names are at most {MAX_NAME_BYTES} bytes, not one of "
                      f"{longest}", param, ctx)
        if b"\0" in raw:
            self.fail("a path with no NUL byte", param, ctx)
        return super().convert(value, param, ctx)
