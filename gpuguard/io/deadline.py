"""Calls under one deadline, each in a thread: for reads the kernel may never answer (statvfs
of a dead NFS mount, a procfs file on a wedged host).

The daemon runs its host sources in its cycle thread, where forking is unsafe (it has
threads), so a read that may block for ever runs in a thread of its own and the cycle waits
for it only until the deadline. A thread that does not return is left behind (a thread in a
kernel wait cannot be stopped), and while it has not returned no second one is started for
the same key: a dead mount costs one stuck thread, never one per cycle.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from gpuguard.io.clock import utc


class DeadlineExceeded(Exception):
    pass


_lock = threading.Lock()
# key -> (the thread still inside its call, when it started): at most one per key.
_stuck: dict[str, tuple[threading.Thread, float]] = {}


def call_all(calls: dict[str, Callable[[], Any]], timeout_s: float
             ) -> dict[str, Any | BaseException]:
    """Each call's value, or the exception it raised, or DeadlineExceeded when it did not
    return within `timeout_s` (all calls run at once and share the one deadline)."""
    results: dict[str, Any | BaseException] = {}
    running: dict[str, tuple[threading.Thread, dict[str, Any], float]] = {}
    for key, fn in calls.items():
        with _lock:
            held = _stuck.get(key)
            if held is not None and held[0].is_alive():
                since = utc(held[1])
                results[key] = DeadlineExceeded(f"the call made at {since} has still not "
                                                "returned")
                continue
            _stuck.pop(key, None)
        box: dict[str, Any] = {}
        thread = threading.Thread(target=_run, args=(fn, box), name=f"deadline:{key}"[:60],
                                  daemon=True)
        running[key] = (thread, box, time.time())
        thread.start()
    end = time.monotonic() + timeout_s
    for key, (thread, box, started) in running.items():
        thread.join(max(0.0, end - time.monotonic()))
        if thread.is_alive():
            with _lock:
                _stuck[key] = (thread, started)
            results[key] = DeadlineExceeded(f"did not return within {timeout_s:g} s")
        else:
            results[key] = box["error"] if "error" in box else box.get("value")
    return results


def call(key: str, fn: Callable[[], Any], timeout_s: float) -> Any:
    """fn() under a deadline; raises what it raised, or DeadlineExceeded."""
    result = call_all({key: fn}, timeout_s)[key]
    if isinstance(result, BaseException):
        raise result
    return result


def _run(fn: Callable[[], Any], box: dict[str, Any]) -> None:
    try:
        box["value"] = fn()
    except BaseException as exc:  # handed to the caller, who decides
        box["error"] = exc
