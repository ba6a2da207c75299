"""The supervisor's writes of its state file, which may fail: a full or read-only state
filesystem must not stop a failover (issue 20: 15 critical cycles and no failover, since
the write before each step raised). A failed write is counted
(gpuguard_failover_state_write_errors_total), logged while its reason changes and at most
once a minute while it does not, and the first good write after it is logged too."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gpuguard.supervisor import state


class StateWrites:
    REPEAT_LOG_S = 60.0

    def __init__(self) -> None:
        self.errors = 0
        self._failing: str | None = None
        self._logged_at = 0.0

    def save(self, path: Path, current: state.ServiceState, log: Any) -> bool:
        """`current` into `path`; whether it was written. Never raises."""
        try:
            state.save(path, current)
        except Exception as exc:  # OSError mostly; nothing may stop a transition here
            self._failed(log, path, f"{type(exc).__name__}: {exc}")
            return False
        if self._failing is not None:
            log.info("failover_state_write_recovered", file=str(path),
                     failed_writes=self.errors)
            self._failing = None
        return True

    def _failed(self, log: Any, path: Path, error: str) -> None:
        self.errors = min(self.errors + 1, state.MAX_COUNT)
        now = time.monotonic()
        if error != self._failing or now - self._logged_at >= self.REPEAT_LOG_S:
            log.error("failover_state_write_failed", file=str(path), error=error,
                      failed_writes=self.errors,
                      effect="the transition goes on; the state is written when it can be")
            self._logged_at = now
        self._failing = error
