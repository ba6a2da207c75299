"""What every backend is: the four operations, and the error they raise."""

from __future__ import annotations

from typing import Protocol


class BackendError(Exception):
    pass


class Backend(Protocol):
    def start(self, variant: str) -> None: ...
    def stop(self, variant: str) -> None: ...
    def running(self, variant: str) -> bool: ...
    def healthy(self, variant: str) -> bool: ...
