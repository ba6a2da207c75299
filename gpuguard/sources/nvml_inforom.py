"""How often the daemon's NVML worker asks nvmlDeviceValidateInforom (issue 32).

Why: on an H200 the validation is 70 ms of a sweep's 83-116 ms, and the daemon's worker
asked it every fast cycle: 91 % of the worker's busy samples, about 1.6 % of a core by
itself. The InfoROM's checksum is a property of the board that changes on a reflash, not
from one 5 s cycle to the next, so the daemon's worker validates each board (by UUID) at
most once per slow interval and reuses that answer in between; `gpuguard check` validates
every run (it keeps nothing across runs). A failed validation is never kept: the next
sweep asks again. A board whose UUID could not be read is validated every sweep.
"""

from __future__ import annotations

import threading
import time

# typing and collections.abc only for the type checker: this module runs in the NVML
# worker before its first NVML call (typing is 5-7 ms there on the H200 host)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


class InforomValidity:
    def __init__(self, every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self.clock = clock
        self._lock = threading.Lock()  # the sweep's per-GPU threads share it
        self._kept: dict[str, tuple[float, Any]] = {}
        self.validations = 0  # asked of NVML, for the tests

    def read(self, uuid: Any, validate: Callable[[], Any]) -> Any:
        """The board's validity: kept from a validation younger than every_s, else
        validate() now (a reading: True, False, or {"state": ...})."""
        key = uuid if isinstance(uuid, str) and uuid else None
        now = self.clock()
        if key is not None:
            with self._lock:
                kept = self._kept.get(key)
            if kept is not None and 0.0 <= now - kept[0] < self.every_s:
                return kept[1]
        value = validate()
        self.validations += 1
        if key is not None and isinstance(value, bool):
            with self._lock:
                self._kept[key] = (now, value)
        return value
