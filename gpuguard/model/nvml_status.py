"""How the NVML sweep went (a snapshot's `nvml`): facts the driver.* rules judge, and
whether the library was the tests' fake."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any


@dataclass
class NvmlStatus:
    """How the NVML sweep went, as facts the driver.* rules judge."""

    # None when NVML initialised; otherwise the error name and text.
    init_error: str | None = None
    init_error_kind: str | None = None
    # The NVML call still running when the deadline passed, with the GPU it was for.
    hung_call: str | None = None
    # The sweep stopped on an unexpected error after NVML started (GPUs after it are missing).
    sweep_error: str | None = None
    deadline_s: float | None = None
    elapsed_s: float | None = None
    # The loaded libnvidia-ml is the tests' fake (it exports their marker symbol): its
    # path, and the FAKE_NVML_* variables it ran under. None on a real driver.
    fake_library: str | None = None
    fake_settings: str | None = None

    def fake_note(self) -> str | None:
        """What `check` says under its header when the GPUs are the fake's."""
        if self.fake_library is None:
            return None
        settings = f" ({self.fake_settings})" if self.fake_settings else ""
        return (f"NVML is tests/fake_nvml{settings}, loaded from {self.fake_library}: "
                "these GPUs are not real")


def nvml_status(raw: Any) -> NvmlStatus:
    """An NvmlStatus from a snapshot's JSON form, its every field checked."""
    if not isinstance(raw, dict):
        raise ValueError("nvml must be a mapping")
    known = {f.name for f in dataclasses.fields(NvmlStatus)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"unknown nvml fields: {', '.join(unknown)}")
    for name, value in raw.items():
        if name.endswith("_s"):
            if value is not None and (isinstance(value, bool) or
                                      not isinstance(value, int | float) or
                                      not math.isfinite(value) or value < 0):
                raise ValueError(f"nvml.{name} must be seconds, not {value!r}")
        elif value is not None and not isinstance(value, str):
            raise ValueError(f"nvml.{name} must be text, not {value!r}")
    return NvmlStatus(**raw)
