"""Copies timed through the CUDA driver API, shared by the active probe's workers
(sources/active/child.py) and qualify's (sources/qualify/child.py): a turn on the shared
links, copies timed by events, both directions with a peer, everything given back each
step on its own. Loaded only in a forked worker (it drives cuda_api's Driver)."""

from __future__ import annotations

import contextlib
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

REPEATS = 3


@contextlib.contextmanager
def link_turn(lock_fd: int, wait_s: float, say: Callable[[str], None]) -> Iterator[None]:
    """One GPU at a time on the shared PCIe/NVLink links (GPUs behind one switch, or
    copying into one NVSwitch port, would each read half). A GPU that hangs holding the
    turn must not make the others unknown: after `wait_s` a worker measures without it
    (the hung GPU moves no data, so the measurement is still alone)."""
    import fcntl

    say("waiting for its turn on the shared PCIe/NVLink links")
    end = time.monotonic() + wait_s
    held = False
    while not held and time.monotonic() < end:
        try:
            fcntl.lockf(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = True
        except OSError:
            time.sleep(0.002)
    try:
        yield
    finally:
        if held:
            fcntl.lockf(lock_fd, fcntl.LOCK_UN)


def timed(cu: Any, c: Any, events: tuple[Any, Any], call: str, *args: Any) -> float:
    """Seconds for REPEATS copies, timed by CUDA events on the stream (a copy between
    device buffers returns before it is done), after one copy to warm up."""
    cu.call(call, *args)
    start, stop = events
    cu.call("cuEventRecord", start, None)
    for _ in range(REPEATS):
        cu.call(call, *args)
    cu.call("cuEventRecord", stop, None)
    cu.call("cuEventSynchronize", stop)
    ms = c.c_float()
    cu.call("cuEventElapsedTime", c.byref(ms), start, stop)
    return float(max(ms.value, 1e-3)) / 1e3


def peer_copies(cu: Any, c: Any, dev: Any, ctx: Any, events: tuple[Any, Any],
                mine: int, size: int, bus_id: str) -> dict[str, Any]:
    """Copies to and from the GPU at `bus_id` with peer access, GB/s each way, or
    {"access": False}; the peer's context and buffer given back whatever happens."""
    peer_dev, can = c.c_int(), c.c_int()
    cu.call("cuDeviceGetByPCIBusId", c.byref(peer_dev), bus_id.encode())
    cu.call("cuDeviceCanAccessPeer", c.byref(can), dev, peer_dev)
    if not can.value:
        return {"access": False}
    peer_ctx, peer_buf = c.c_void_p(), c.c_uint64()
    cu.call("cuDevicePrimaryCtxRetain", c.byref(peer_ctx), peer_dev)
    try:
        cu.call("cuCtxSetCurrent", peer_ctx)
        cu.call("cuMemAlloc_v2", c.byref(peer_buf), c.c_size_t(size))
        cu.call("cuCtxSetCurrent", ctx)
        cu.call("cuCtxEnablePeerAccess", peer_ctx, c.c_uint(0), allow=(704,))
        here = c.c_uint64(mine)
        forward = timed(cu, c, events, "cuMemcpyPeer", peer_buf, peer_ctx, here, ctx,
                        c.c_size_t(size))
        backward = timed(cu, c, events, "cuMemcpyPeer", here, ctx, peer_buf, peer_ctx,
                         c.c_size_t(size))
        return {"access": True, "gbps": round(size * REPEATS / forward / 1e9, 1),
                "reverse_gbps": round(size * REPEATS / backward / 1e9, 1)}
    finally:
        steps: list[tuple[str, tuple[Any, ...]]] = [("cuCtxDisablePeerAccess", (peer_ctx,))]
        if peer_buf.value:
            steps.append(("cuMemFree_v2", (peer_buf,)))
        steps += [("cuDevicePrimaryCtxRelease_v2", (peer_dev,)), ("cuCtxSetCurrent", (ctx,))]
        give_back(cu, steps)


def give_back(cu: Any, steps: list[tuple[str, tuple[Any, ...]]]) -> None:
    """Each release on its own: one that fails frees the rest."""
    for call, args in steps:
        with contextlib.suppress(Exception):
            cu.call(call, *args)
