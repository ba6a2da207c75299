"""Readiness of a variant: an HTTP status, or the container's Docker health status."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable


def http_ready(url: str, status: int, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return bool(resp.status == status)
    except urllib.error.HTTPError as exc:
        return exc.code == status
    except OSError:
        return False


def command_ready(command: list[str], timeout: float = 30.0) -> bool:
    import subprocess

    try:
        return subprocess.run(command, capture_output=True, timeout=timeout,
                              check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def wait(check: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    end = time.monotonic() + timeout
    while True:
        if check():
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(interval)
