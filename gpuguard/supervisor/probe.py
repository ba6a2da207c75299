"""Readiness of a variant: an HTTP status, a real inference request, or the container's
Docker health status."""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuguard.supervisor.config import Request

# An answer longer than this is not a one-token completion: read no further.
MAX_BODY = 1024 * 1024


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


@dataclass(frozen=True)
class Answer:
    """How one inference request went (service.inference, the latency metric)."""

    ok: bool
    latency_s: float
    status: int | None
    error: str | None = None


def send(url: str, status: int, request: Request) -> Answer:
    """Send the request; ok when it answers `status` within its deadline with a JSON body
    (read up to MAX_BODY) that has `json_path`. Never raises."""
    started = time.monotonic()
    end = started + request.timeout
    code: int | None = None
    try:
        req = urllib.request.Request(url, data=request.body, method=request.method,
                                     headers=request.headers)
        try:
            resp = urllib.request.urlopen(req, timeout=request.timeout)
        except urllib.error.HTTPError as exc:
            resp = exc
        with resp:
            code = int(resp.status if hasattr(resp, "status") else resp.code)
            body = _read_bounded(resp, end)
    except (OSError, ValueError, http.client.HTTPException) as exc:
        return Answer(False, time.monotonic() - started, code,
                      f"{type(exc).__name__}: {str(exc)[:200]}")
    latency = time.monotonic() - started
    if code != status:
        return Answer(False, latency, code, f"answered {code}, expected {status}")
    if request.json_path is None:
        return Answer(True, latency, code)
    try:
        doc = json.loads(body)
    except ValueError as exc:
        return Answer(False, latency, code, f"the answer is not JSON: {str(exc)[:100]}")
    missing = _missing(doc, request.json_path)
    if missing is not None:
        return Answer(False, latency, code, f"the answer has no {missing}")
    return Answer(True, latency, code)


def _read_bounded(resp: Any, end: float) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        if time.monotonic() > end:
            raise TimeoutError("the answer did not arrive within the deadline")
        chunk = resp.read(64 * 1024)
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > MAX_BODY:
            raise ValueError(f"the answer is larger than {MAX_BODY // 1024} KiB")
        chunks.append(chunk)


def _missing(doc: Any, path: str) -> str | None:
    """None when `path` (dots; numbers index lists) is present in doc; else the part of
    the path that is not."""
    here = doc
    walked: list[str] = []
    for part in path.split("."):
        walked.append(part)
        if isinstance(here, list) and part.isdigit() and int(part) < len(here):
            here = here[int(part)]
        elif isinstance(here, dict) and part in here:
            here = here[part]
        else:
            return ".".join(walked)
    return None
