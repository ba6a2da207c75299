"""Xids as the daemon counts them: each kernel-log line once (XidMarks), and each Xid, from
the kernel log or NVML's event set, into the metrics and the event store (XidCounter), under
a bounded set of labels per GPU (XidSeries); and what the daemon read of the kernel log this
boot, judged instead of what the ring buffer still holds (daemon/kmsg_memory.py)."""

from __future__ import annotations

import time
from typing import Any

from gpuguard.daemon import kmsg_seed
from gpuguard.daemon.kmsg_memory import KernelLogMemory
from gpuguard.daemon.metrics import DaemonStats
from gpuguard.daemon.recorder import EventRecorder
from gpuguard.events.recording import kernel_log_repairs, xid_event
from gpuguard.judge.actions import of_xid
from gpuguard.judge.xids import grade
from gpuguard.model.pci import normalise_pci, nvml_pci
from gpuguard.model.rule import RuleSet
from gpuguard.model.snapshot import Reading, Snapshot

# The series budget (docs/metrics.md): per GPU, at most this many Xid label sets (a code
# with its severity) of their own, catalog codes included, in the order they first came;
# every later one is counted under xid="other" with its severity (at most three more), so
# a log of made-up codes, or every code of the catalog, cannot grow the series without
# bound. Each Xid, whatever its label, is still one event in the store, with its code.
XID_CODES_PER_GPU = 3
OTHER = "other"
# the bucket of the Xids at addresses NVML does not list: one for all of them, whatever
# the addresses (a garbled or hostile log can name any number)
_UNLISTED = ("unlisted",)


class XidCounter:
    """Counts every new Xid once into the metrics (gpuguard_xid_total by Xid, severity and
    GPU) and, when the daemon keeps one, the event store."""

    def __init__(self, stats: DaemonStats) -> None:
        self.stats = stats
        self.recorder: EventRecorder | None = None
        self.marks = XidMarks()
        self.repair_marks = XidMarks()
        self.memory = KernelLogMemory()
        self.series = XidSeries()
        self._seeded = False

    def remember(self, snap: Snapshot) -> None:
        """Before the rules run: the kernel log this cycle read, with the lines earlier
        cycles read that the ring buffer has overwritten since (review 3). A failed read
        stays failed (its rules unknown)."""
        if not snap.host.kernel_log.is_ok:
            return
        log_ = snap.host.kernel_log.get()
        if not self._seeded and self.recorder is not None:
            # once: what the store kept of the lines the buffer lost before this daemon
            # started (a restart after a wrap: kmsg_seed.py)
            self._seeded = True
            first = log_.get("first_seq")
            if isinstance(first, int) and first > 0:
                self.memory.seed(*kmsg_seed.from_store(
                    self.recorder.writer.path, self.recorder.boot_id, first,
                    log_.get("now_usec")))
        snap.host.kernel_log = Reading.ok(self.memory.apply(log_))

    def count_kernel_log(self, snap: Snapshot, ruleset: RuleSet) -> bool:
        """Count the log's new Xids and record its new repairs; True when there was a
        repair (a GPU reset, a driver reload) this daemon had not seen."""
        if not snap.host.kernel_log.is_ok:
            return False
        log_ = snap.host.kernel_log.get()
        now_usec, now = log_.get("now_usec"), time.time()
        for event in self.marks.new_events(log_["xids"]):
            # the kernel log's clock (time since boot) turned into wall time
            usec = event.get("usec")
            ago = max(0.0, (now_usec - usec) / 1e6) if usec is not None and now_usec else 0.0
            self.add(event["xid"], event.get("pci"), event.get("text"), ruleset, snap,
                     now - ago, event.get("seq"), "kmsg", ago)
        # the repairs (a GPU reset, a driver reload) each once, like the Xids: the store
        # needs them to tell a fault that came back after its repair (events/escalation.py)
        fresh = self.repair_marks.new_events(log_.get("repairs") or [])
        if self.recorder is not None:
            for repair in kernel_log_repairs(snap, "kmsg", fresh):
                self.recorder.record(repair)
        return bool(fresh)

    def add_nvml_event(self, event: dict[str, Any], ruleset: RuleSet,
                       snap: Snapshot | None) -> None:
        """An Xid from NVML's event set (daemon/sampler.py), as it happens."""
        pci = normalise_pci(event["pci"]) if event.get("pci") else None
        self.add(int(event["xid"]), pci, None, ruleset, snap or Snapshot(),
                 float(event.get("time") or time.time()), None, "nvml")

    def add(self, xid: int, pci: str | None, text: str | None, ruleset: RuleSet,
            snap: Snapshot, when: float, seq: int | None = None, source: str = "nvml",
            ago_s: float = 0.0) -> None:
        """One Xid: `when` (wall time) is what the store keeps; `ago_s`, how long ago it
        happened by the kernel log's own clock, dates it on the monotonic clock for the
        metric's age (a step of the host's wall clock moves neither)."""
        severity = grade(xid, text, ruleset.xid_catalog).severity
        gpu = snap.gpu_at(pci)
        if self.recorder is not None and severity != "ignore":
            self.recorder.record(xid_event(xid, severity,
                                           of_xid(xid, text, ruleset.xid_catalog).value,
                                           None if gpu is None else gpu.identity(), source,
                                           when, seq, text, pci))
        # the GPU's own labels (gpu, uuid, pci_bus_id); an Xid at an address NVML does not
        # list (a GPU that fell off the bus) keeps the line's address, so it alerts apart
        labels = tuple(gpu.identity().labels()) if gpu is not None else ("", "", _label(pci))
        label = self.series.label(str(xid), severity, labels,
                                  labels if gpu is not None else _UNLISTED)
        with self.stats.lock:
            self.stats.xids[label] = self.stats.xids.get(label, 0) + 1
            happened = time.monotonic() - ago_s
            self.stats.xid_last[label] = max(self.stats.xid_last.get(label, happened), happened)
            if gpu is not None and happened >= self.stats.xid_latest.get(labels, (happened, 0))[0]:
                self.stats.xid_latest[labels] = (happened, xid)


def _label(pci: str | None) -> str:
    try:
        return nvml_pci(pci) if pci else ""
    except (ValueError, IndexError):  # not an address (the line's own text): as it came
        return pci or ""


class XidSeries:
    """The label set each Xid is counted under: its own code for the first
    XID_CODES_PER_GPU (code, severity) pairs of each GPU, "other" with its severity after
    them. A label set once given stays (a counter's series never moves to another); the
    severity stays on "other" because the fatal-Xid alert selects on it."""

    def __init__(self, per_gpu: int = XID_CODES_PER_GPU) -> None:
        self.per_gpu = per_gpu
        self.named: dict[tuple[str, ...], set[tuple[str, ...]]] = {}

    def label(self, code: str, severity: str, labels: tuple[str, ...],
              bucket: tuple[str, ...]) -> tuple[str, ...]:
        """(xid, severity, gpu, uuid, pci_bus_id) for one Xid of the GPU `bucket` names;
        in the unlisted addresses' shared bucket each address counts apart, and their
        "other" has no address."""
        named = self.named.setdefault(bucket, set())
        label = (code, severity, *labels)
        if label in named or len(named) < self.per_gpu:
            named.add(label)
            return label
        return (OTHER, severity, *(labels if bucket == labels else ("", "", "")))


class XidMarks:
    """Which kernel-log Xids were counted already, in bounded memory: the highest kmsg
    sequence number (or, for a saved log without one, the latest time stamp) seen; only
    lines without either are remembered one by one, and only while the log still has them."""

    def __init__(self) -> None:
        self.seq = -1
        self.usec = -1
        self.unnumbered: set[tuple[Any, ...]] = set()

    def new_events(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        fresh: list[dict[str, Any]] = []
        top_seq, top_usec = self.seq, self.usec
        present: set[tuple[Any, ...]] = set()
        for event in events:
            seq, usec = event.get("seq"), event.get("usec")
            if seq is not None:
                if seq > self.seq:
                    fresh.append(event)
                top_seq = max(top_seq, seq)
            elif usec is not None:
                if usec > self.usec:
                    fresh.append(event)
                top_usec = max(top_usec, usec)
            else:
                key = (event.get("xid"), event.get("kind"), event.get("pci"), event.get("text"))
                present.add(key)
                if key not in self.unnumbered:
                    fresh.append(event)
        self.seq, self.usec, self.unnumbered = top_seq, top_usec, present
        return fresh
