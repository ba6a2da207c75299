"""Readiness of a variant: an HTTP status, a real inference request, or the container's
Docker health status."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuguard.supervisor.config import InferenceRequest

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
    # no complete answer within the deadline (connect, headers or body): a saturated
    # server and a hung one look alike here, so service.inference says unknown
    timed_out: bool = False


def send(url: str, status: int, request: InferenceRequest) -> Answer:
    """Send the request; ok when it answers `status` within its deadline with a JSON body
    (read up to MAX_BODY) that has `json_path`. Never raises, and returns within about
    `request.timeout` whatever the server does: the socket is shut down at the deadline,
    so a server that trickles its headers or body a byte at a time cannot hold it."""
    started = time.monotonic()
    cut = threading.Event()
    code: int | None = None
    try:
        code, body = _exchange(url, request, started + request.timeout, cut)
    except (OSError, ValueError, http.client.HTTPException) as exc:
        latency = time.monotonic() - started
        if cut.is_set() or isinstance(exc, TimeoutError):
            return Answer(False, latency, code,
                          f"TimeoutError: the request timed out after {request.timeout:g} s",
                          timed_out=True)
        return Answer(False, latency, code, f"{type(exc).__name__}: {str(exc)[:200]}")
    latency = time.monotonic() - started
    if cut.is_set():  # the deadline passed as the answer ended: it may be cut short
        return Answer(False, latency, code,
                      f"TimeoutError: the request timed out after {request.timeout:g} s",
                      timed_out=True)
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


def _exchange(url: str, request: InferenceRequest, end: float, cut: threading.Event
              ) -> tuple[int, bytes]:
    """The status and body (at most MAX_BODY) of one request. The socket's own timeout
    bounds each read only; a timer shuts the socket down at `end` and sets `cut`, which
    bounds the whole exchange."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url[:200]!r}")
    kind = (http.client.HTTPSConnection if parts.scheme == "https"
            else http.client.HTTPConnection)
    conn = kind(parts.hostname, parts.port, timeout=max(end - time.monotonic(), 0.001))
    try:
        conn.connect()
        timer = threading.Timer(max(end - time.monotonic(), 0.0), _shut, (conn.sock, cut))
        timer.daemon = True
        timer.start()
        try:
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            conn.request(request.method, path, body=request.body, headers=request.headers)
            resp = conn.getresponse()
            return resp.status, _read_bounded(resp)
        finally:
            timer.cancel()
    finally:
        conn.close()


def _shut(sock: socket.socket, cut: threading.Event) -> None:
    cut.set()
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _read_bounded(resp: http.client.HTTPResponse) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = resp.read1(64 * 1024)
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
