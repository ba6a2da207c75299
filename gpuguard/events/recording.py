"""What a run or a cycle writes to the event store: rule transitions (against the last
recorded finding of each rule on each board: its status and, for a failing one, the set it
names) and kernel-log / NVML Xids, each with the GPU's lasting identity. `gpuguard check
--record` and the daemon both build their events here."""

from __future__ import annotations

import time
from typing import Any

from gpuguard.events.store import Event, Finding
from gpuguard.judge.xids import repaired_gpu
from gpuguard.model.identity import GpuId, finding_key
from gpuguard.model.results import NAMES, SEVERITIES, Result, Status, names_of
from gpuguard.model.snapshot import Snapshot


def finding_of(r: Result) -> Finding:
    """What a transition compares: the status, and the set a failing finding names (an
    ok or unknown result names nothing an ack could cover)."""
    return (r.status.value, names_of(r.observed) if r.status in SEVERITIES else ())


def rule_transitions(results: list[Result], last: dict[tuple[str, str], Finding],
                     source: str, now: float | None = None) -> list[Event]:
    """The results whose finding (status and names) differs from the last recorded one;
    `last` is updated. A host rule whose names change under the same status (3 of 4 GPUs
    missing, then all 4) is a transition too, so the store knows the current set.
    Skipped results say nothing about the GPU and are not recorded; a rule seen first as
    ok is not news (but is remembered, so that its first failure is a transition)."""
    now = time.time() if now is None else now
    events = []
    for r in results:
        if r.status is Status.SKIPPED:
            continue
        key = finding_key(r.rule, r.gpu)
        old = last.get(key)
        last[key] = finding = finding_of(r)
        if old == finding or (old is None and r.status is Status.OK):
            continue
        data: dict[str, Any] = {"action_reason": r.action_reason} if r.action_reason else {}
        if finding[1]:
            data[NAMES] = list(finding[1])
        events.append(Event(kind="rule", source=source, time=now, rule=r.rule,
                            old_status=None if old is None else old[0],
                            status=r.status.value, action=r.action, message=r.message,
                            **_gpu_columns(r.gpu), data=data))
    return events


def xid_event(xid: int, severity: str, action: str, board: GpuId | None, source: str,
              when: float, seq: int | None = None, text: str | None = None,
              bus_id: str | None = None) -> Event:
    columns = _gpu_columns(board)
    if board is None and bus_id:
        columns["gpu_bus_id"] = bus_id
    return Event(kind="xid", source=source, time=when, rule="xid.recent", code=xid, seq=seq,
                 status=severity, action=action, message=(text or "")[:500], **columns)


def kernel_log_xids(snapshot: Snapshot, source: str, grade: Any) -> list[Event]:
    """Every Xid line of the kernel log read this run (the store keeps one per line and
    boot: its sequence number). `grade(xid, text) -> (severity, action)`."""
    if not snapshot.host.kernel_log.is_ok:
        return []
    log = snapshot.host.kernel_log.get()
    now, now_usec = time.time(), log.get("now_usec")
    events = []
    for e in log.get("xids") or []:
        usec = e.get("usec")
        when = now - (now_usec - usec) / 1e6 if usec is not None and now_usec else now
        severity, action = grade(e["xid"], e.get("text"))
        if severity == "ignore":
            continue
        pci = e.get("pci")
        gpu = snapshot.gpu_at(pci)
        events.append(xid_event(e["xid"], severity, action,
                                None if gpu is None else gpu.identity(), source, when,
                                e.get("seq"), e.get("text"), pci))
    return events


def kernel_log_repairs(snapshot: Snapshot, source: str,
                       only: list[dict[str, Any]] | None = None) -> list[Event]:
    """Every repair the kernel log read this run shows (or `only` these of it: the daemon's
    new ones): a GPU reset, with the board it names; a driver reload, of every GPU; as
    kind `repair` (the store keeps one per line and boot)."""
    if not snapshot.host.kernel_log.is_ok:
        return []
    log = snapshot.host.kernel_log.get()
    now, now_usec = time.time(), log.get("now_usec")
    events = []
    for r in (log.get("repairs") or []) if only is None else only:
        usec = r.get("usec")
        when = now - (now_usec - usec) / 1e6 if usec is not None and now_usec else now
        gpu = repaired_gpu(snapshot, r)
        columns = _gpu_columns(None if gpu is None else gpu.identity())
        if gpu is None and r["kind"] == "gpu_reset":
            # a GPU NVML does not list (yet): the line's own name for it
            columns.update(gpu_uuid=r.get("uuid"), gpu_bus_id=r.get("pci"))
        events.append(Event(kind="repair", source=source, time=when, seq=r.get("seq"),
                            status=r["kind"], message=(r.get("text") or "")[:500],
                            **columns))
    return events


def _gpu_columns(gpu: GpuId | None) -> dict[str, Any]:
    if gpu is None:
        return {}
    return {"gpu_index": gpu.index, "gpu_uuid": gpu.uuid, "gpu_serial": gpu.serial,
            "gpu_bus_id": gpu.pci_bus_id}


def probe_event(rule: str, status: str, board: GpuId | None, message: str = "",
                action: str | None = None, data: dict[str, Any] | None = None,
                source: str = "probe", when: float | None = None) -> Event:
    """One active-probe result (issue 12) as an event, kind `probe`: hand it to
    `EventWriter.record` (a command) or `EventRecorder.record` (the daemon)."""
    return Event(kind="probe", source=source, time=time.time() if when is None else when,
                 rule=rule, status=status, action=action, message=message,
                 data=data or {}, **_gpu_columns(board))
