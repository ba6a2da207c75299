"""What the daemon remembers of the kernel log this boot (review 3): each cycle's summary is
the one a read of the whole ring buffer gives (the daemon reads only what is new, and its
summary is the whole read's: sources/kmsg_tail.py), and a busy host's buffer wraps, so an
Xid whose line was overwritten used to vanish from xid.recent (a fatal Xid turned ok, and
`slurm health` resumed a node drained for reset_gpu). The Xids, GSP lines, SXids and
repairs the daemon has read are kept here, bounded as a single read is (the newest N, and
the latest of each GPU and code: sources/kmsg_kept.py), and the rules judge what was seen,
not only what the buffer still holds. A repair (a GPU reset, a driver reload) and an ack
(`gpuguard xid ack`'s sequence number, the event store's acks) clear a remembered line as
they clear a read one.

New lines are told from known ones by their position, the kmsg sequence number (or, in a
saved log without one, the time stamp): the kernel log only grows within a boot. A read
with a line that has neither is passed on as it is (nothing to tell old from new by)."""

from __future__ import annotations

from collections import deque
from typing import Any

from gpuguard.sources.kmsg import MAX_XIDS
from gpuguard.sources.kmsg_gpu import MAX_GSP, MAX_REPAIRS
from gpuguard.sources.kmsg_kept import NewestKept, gsp_key, sxid_key, xid_key

Event = dict[str, Any]
# the lists whose events carry `n`, their place among the driver's lines, which a repair
# is compared with: renumbered here in the order the daemon first read them
_ORDERED = ("xids", "gsp", "repairs")


def _position(event: Event) -> tuple[str, int] | None:
    if event.get("seq") is not None:
        return ("seq", event["seq"])
    if event.get("usec") is not None:
        return ("usec", event["usec"])
    return None


class KernelLogMemory:
    def __init__(self) -> None:
        self.kept: dict[str, NewestKept] = {
            "xids": NewestKept(MAX_XIDS, xid_key), "gsp": NewestKept(MAX_GSP, gsp_key),
            "sxids": NewestKept(MAX_XIDS, sxid_key)}
        self.repairs: deque[Event] = deque(maxlen=MAX_REPAIRS)
        self.high = {"seq": -1, "usec": -1}  # the newest position read, by kind
        self.next_n = 1
        self.lost = 0
        self.lost_before: tuple[Any, Any] = (None, None)  # (seq, usec)
        self.last_seq: int | None = None

    def seed(self, xids: list[Event], repairs: list[Event]) -> None:
        """Lines of this boot read before a restart of the daemon (kmsg_seed.py), older
        than anything the buffer still holds: remembered as if read, in the log's order."""
        merged = sorted([("xids", e) for e in xids] + [("repairs", e) for e in repairs],
                        key=lambda item: item[1]["seq"])
        for name, event in merged:
            self._add(name, event)
            self.high["seq"] = max(self.high["seq"], event["seq"])

    def apply(self, log: dict[str, Any]) -> dict[str, Any]:
        """The summary of this read with what earlier reads saw: its lists replaced by the
        remembered ones (this read's new lines added), its counts of lost records summed."""
        lists = {name: log.get(name) or [] for name in (*_ORDERED, "sxids")}
        if any(_position(e) is None or (name in _ORDERED and e.get("n") is None)
               for name, events in lists.items() for e in events):
            return log
        self._take(lists)
        self._count_lost(log)
        merged = {**log, "repairs": list(self.repairs),
                  "records_lost": self.lost, "lost_before_seq": self.lost_before[0],
                  "lost_before_usec": self.lost_before[1]}
        for name, kept in self.kept.items():
            merged[name] = kept.events()
            # this read's own count where it left more out (a flood within one cycle)
            merged[f"{name}_dropped"] = max(kept.dropped(), log.get(f"{name}_dropped") or 0)
        return merged

    def _take(self, lists: dict[str, list[Event]]) -> None:
        """The lines of this read past the newest position read before, in the log's order."""
        ordered = sorted(((e["n"], name, e) for name in _ORDERED for e in lists[name]),
                         key=lambda item: item[0])
        fresh = [(name, e) for _, name, e in ordered] + [("sxids", e) for e in lists["sxids"]]
        high = dict(self.high)
        for name, event in fresh:
            kind, value = _position(event) or ("", 0)
            if value <= self.high[kind]:
                continue  # read before: remembered (or, past the bounds, counted as dropped)
            high[kind] = max(high[kind], value)
            self._add(name, event)
        self.high = high

    def _add(self, name: str, event: Event) -> None:
        if name in _ORDERED:
            event = {**event, "n": self.next_n}
            self.next_n += 1
        if name == "repairs":
            self.repairs.append(event)
        else:
            self.kept[name].append(event)

    def _count_lost(self, log: dict[str, Any]) -> None:
        """Records overwritten before the daemon read them: those before its first read's
        first record, those between one read's last record and the next read's first (the
        buffer wrapped faster than a cycle), and the gaps a read met itself (EPIPE)."""
        first, last = log.get("first_seq"), log.get("last_seq")
        lost, before = log.get("records_lost") or 0, (log.get("lost_before_seq"),
                                                       log.get("lost_before_usec"))
        if self.last_seq is None or first is None:
            if lost:
                self.lost, self.lost_before = self.lost + lost, before
        else:
            if first > self.last_seq + 1:
                self.lost += first - self.last_seq - 1
                self.lost_before = (first, log.get("first_usec"))
            inside = lost - first  # Lost counts the records before the first one too
            if inside > 0:
                self.lost, self.lost_before = self.lost + inside, before
        if last is not None:
            self.last_seq = last if self.last_seq is None else max(self.last_seq, last)
