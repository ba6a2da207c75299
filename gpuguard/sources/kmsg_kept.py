"""What a kernel-log summary keeps of a list of events (Xids, GSP lines, SXids): the newest
`size`, as before, and outside that bound the latest event of each key (a GPU and a code),
so a fatal Xid is never lost to a flood of newer noise (2,500 Xid 13s after one Xid 48:
review 3). The keys are bounded too (`max_keys`): a hostile log of made-up codes cannot grow
the summary past `size + max_keys` events; the keys seen first are the ones kept. And
what it could not keep: the records the kernel overwrote before they were read (Lost)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

from gpuguard.judge.xids import grade_words

# Distinct keys kept outside the newest-N bound: a host has at most 16 GPUs (or 12
# NVSwitches) and NVIDIA's catalog about 160 Xid codes; this is more than a real log names.
MAX_KEYS = 1024

Event = dict[str, Any]


class NewestKept:
    """Events in the log's order; `events()` is the kept list, still in the log's order
    (an event outside the newest `size` is older than every one inside it)."""

    def __init__(self, size: int, key: Callable[[Event], Hashable],
                 max_keys: int = MAX_KEYS) -> None:
        self.newest: deque[tuple[int, Event]] = deque(maxlen=size)
        self.latest: dict[Hashable, tuple[int, Event]] = {}
        self.key = key
        self.max_keys = max_keys
        self.seen = 0
        # the newest event's key, and the entry it took that key from (rekeyed() gives it back)
        self._took: tuple[Hashable, tuple[int, Event] | None] | None = None

    def append(self, event: Event) -> None:
        entry = (self.seen, event)
        self.seen += 1
        self.newest.append(entry)
        key = self.key(event)
        self._took = None
        if key in self.latest or len(self.latest) < self.max_keys:
            self._took = (key, self.latest.get(key))
            self.latest[key] = entry

    def rekeyed(self) -> None:
        """The newest event changed what its key is made of (an SXid's description line, with
        its Fatal word, came after its Data line): it moves to its new key, and the event it
        took its first key from gets that key back (a fatal SXid is not lost to a later
        non-fatal one that began with the same Data line)."""
        if not self.newest:
            return
        entry = self.newest[-1]
        key = self.key(entry[1])
        if self._took is not None and self._took[0] != key:
            old, previous = self._took
            if previous is None:
                del self.latest[old]
            else:
                self.latest[old] = previous
        if self.latest.get(key) is not entry and (key in self.latest
                                                  or len(self.latest) < self.max_keys):
            self._took = (key, self.latest.get(key))
            self.latest[key] = entry

    def last(self) -> Event | None:
        return self.newest[-1][1] if self.newest else None

    def events(self) -> list[Event]:
        first = self.newest[0][0] if self.newest else self.seen
        older = {index: event for index, event in self.latest.values() if index < first}
        return [older[index] for index in sorted(older)] + [e for _, e in self.newest]

    def dropped(self) -> int:
        first = self.newest[0][0] if self.newest else self.seen
        return first - len({index for index, _ in self.latest.values() if index < first})


def xid_key(event: Event) -> Hashable:
    """An Xid's GPU and code, and the words of its line that change its grade (Xid 154's
    recovery action, the NVLink5 Xids' Fatal / Nonfatal)."""
    return (event.get("pci"), event.get("xid"), grade_words(event.get("text")))


def gsp_key(event: Event) -> Hashable:
    return (event.get("kind"), event.get("pci"), event.get("rm_gpu"))


def sxid_key(event: Event) -> Hashable:
    """An SXid's switch and code, and its Fatal / Non-fatal word (read when the event's
    description line came: the key is taken when the event starts, so its first line)."""
    return (event.get("switch"), event.get("sxid"), grade_words(event.get("text")))


class Lost:
    """Records the log read does not hold (review 3): /dev/kmsg numbers its records from 0
    at boot, so a first record numbered N says the N before it were overwritten (the ring
    buffer wrapped); with `gaps` (a live read the kernel told, with EPIPE, that records were
    overwritten while it read) a jump in the numbers counts too. `before`: the first record
    after the latest loss; no record is missing after it."""

    def __init__(self, gaps: bool) -> None:
        self.gaps = gaps
        self.count = 0
        self.before: tuple[int, int | None] | None = None  # (seq, usec)
        self.first: tuple[int, int | None] | None = None
        self.last_seq: int | None = None

    def add(self, seq: int | None, usec: int | None) -> None:
        """The next record (its sequence number, its time); one without a number (a dmesg
        file) tells nothing."""
        if seq is None:
            return
        if self.first is None:
            self.first = (seq, usec)
        expected = 0 if self.last_seq is None else self.last_seq + 1
        if seq > expected and (self.last_seq is None or self.gaps):
            self.count += seq - expected
            self.before = (seq, usec)
        self.last_seq = seq if self.last_seq is None else max(self.last_seq, seq)

    def summary(self) -> dict[str, Any]:
        return {"records_lost": self.count,
                "lost_before_seq": None if self.before is None else self.before[0],
                "lost_before_usec": None if self.before is None else self.before[1],
                "first_seq": None if self.first is None else self.first[0],
                "first_usec": None if self.first is None else self.first[1],
                "last_seq": self.last_seq}
