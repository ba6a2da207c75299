"""P2P status kept between the daemon's NVML sweeps (issue 32).

Why: a sweep asks nvmlDeviceGetP2PStatus four times for every ordered pair of GPUs,
4N(N-1) calls (16 128 at 64 GPUs) every fast cycle, for a fact that changes only with the
pair's wiring: its NVLinks, the fabric, which GPUs are there. The daemon's worker keeps
each pair's answer by (GPU count, index and UUID of both GPUs) and asks again only when it
may have changed:

- either GPU's NVLink reading (state, version, remote, error counters) or fabric
  reading differs from the one it was kept with,
- the GPU set changed (another count drops every pair; a UUID at an index is part of
  the pair's key),
- NVML was initialised again (the worker calls forget()), or the daemon said to forget
  (a GPU reset in the kernel log; the worker's `forget` command),
- it is older than the slow interval.

A GPU's NVLink and fabric readings of this sweep are published by its own thread before it
reads P2P; a pair whose peer has not published yet in this sweep (its thread is behind, or
hung) is asked again, never judged on last sweep's wiring. A failed answer, or one of a GPU
whose UUID could not be read, is never kept. `gpuguard check` keeps nothing (none of this
is used there: it reads P2P every run).
"""

from __future__ import annotations

import json
import threading
import time

# typing and collections.abc only for the type checker: this module runs in the NVML
# worker before its first NVML call (typing is 5-7 ms there on the H200 host)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

# (GPU count, index, UUID, peer index, peer UUID)
PairKey = tuple[int, int, str, int, str]
# the longest a sweep's threads wait, in all, for their peers to publish their wiring
PUBLISH_WAIT_S = 0.5


class P2PKept:
    def __init__(self, every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self.clock = clock
        self._lock = threading.Lock()  # the sweep's per-GPU threads share it
        self._kept: dict[PairKey, tuple[float, str, str, dict[str, Any]]] = {}
        self._last_count: int | None = None
        self.pairs_read = 0  # pairs asked of NVML, for the tests

    def note_read(self) -> None:
        with self._lock:
            self.pairs_read += 1

    def forget(self) -> None:
        """Drop every kept pair (NVML initialised again, or the daemon saw a GPU reset)."""
        with self._lock:
            self._kept.clear()

    def sweep(self, count: int) -> SweepPairs:
        """This sweep's view: what each GPU publishes, and the pairs kept. A GPU count
        other than the last sweep's drops every pair (the set changed, even back to an
        earlier one); a GPU of another UUID at an index is a new key for its pairs."""
        with self._lock:
            if count != self._last_count:
                self._kept.clear()
            self._last_count = count
        return SweepPairs(self, count)

    def lookup(self, key: PairKey, wiring: tuple[str, str]) -> dict[str, Any] | None:
        with self._lock:
            kept = self._kept.get(key)
        if kept is None or (kept[1], kept[2]) != wiring:
            return None
        if not 0.0 <= self.clock() - kept[0] < self.every_s:
            return None
        return dict(kept[3])

    def store(self, key: PairKey, wiring: tuple[str, str], entry: dict[str, Any],
              at: float) -> None:
        with self._lock:
            self._kept[key] = (at, wiring[0], wiring[1], dict(entry))


class SweepPairs:
    """One sweep's published wiring of each GPU (its UUID, and its NVLink and fabric
    readings as one text), read by the other GPUs' threads. A thread that reaches a pair
    before its peer published waits for it, up to PUBLISH_WAIT_S from the sweep's start
    in all (threads are started one after another, and the first would else find no peer
    published); a peer whose thread hangs costs that wait once a sweep, not once a pair."""

    def __init__(self, kept: P2PKept, count: int) -> None:
        self.kept = kept
        self.count = count
        self._published: dict[int, tuple[str, str]] = {}
        self._settled = [threading.Event() for _ in range(max(count, 0))]
        self._wait_until = time.monotonic() + PUBLISH_WAIT_S

    def publish(self, index: int, uuid: Any, readings: dict[str, Any]) -> None:
        """A GPU's wiring of this sweep; nothing for a GPU without a UUID (never kept)."""
        if isinstance(uuid, str) and uuid:
            self._published[index] = (uuid, wiring_text(readings))
        self.settled(index)

    def settled(self, index: int) -> None:
        """The GPU's thread published, or never will in this sweep (it ended first)."""
        if 0 <= index < len(self._settled):
            self._settled[index].set()

    def _wait_for(self, peer: int) -> None:
        if 0 <= peer < len(self._settled):
            self._settled[peer].wait(max(0.0, self._wait_until - time.monotonic()))

    def pair(self, index: int, peer: int) -> KeptPair:
        """The pair's place in the kept answers (none when a GPU of it did not publish in
        this sweep: then it is read and not kept)."""
        self._wait_for(peer)
        mine, theirs = self._published.get(index), self._published.get(peer)
        if mine is None or theirs is None:
            return KeptPair(self.kept, None, ("", ""))
        return KeptPair(self.kept, (self.count, index, mine[0], peer, theirs[0]),
                        (mine[1], theirs[1]))


class KeptPair:
    def __init__(self, kept: P2PKept, key: PairKey | None, wiring: tuple[str, str]) -> None:
        self.kept = kept
        self.key = key
        self.wiring = wiring
        self.asked_at = kept.clock()

    def entry(self) -> dict[str, Any] | None:
        """The pair's kept answer if it still holds; None: the caller reads the pair."""
        found = self.kept.lookup(self.key, self.wiring) if self.key is not None else None
        if found is None:
            self.kept.note_read()
        return found

    def keep(self, entry: dict[str, Any]) -> None:
        """A pair just read whole (every kind answered): kept from when it was asked."""
        if self.key is not None:
            self.kept.store(self.key, self.wiring, entry, self.asked_at)


WIRING_READINGS = ("nvlink_links", "fabric_state", "fabric_status", "fabric_clique_id")


def wiring_text(readings: dict[str, Any]) -> str:
    """The readings a pair's P2P status depends on, as one comparable text."""
    return json.dumps([readings.get(name) for name in WIRING_READINGS], sort_keys=True,
                      default=str)
