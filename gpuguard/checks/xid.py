"""xid.recent: Xid errors the NVIDIA driver logged, graded by the catalog in rules/xid.yaml,
one result per GPU (the line's bus address names it) and one for the host where lines name
no GPU NVML lists (a GPU that fell off the bus).

A whole-dmesg grep stays red until reboot (the most common complaint about AzNHC and
gcm), so only events inside the window count (default: since boot), events up to
the sequence number acknowledged with `gpuguard xid ack` are left out, and so are those
logged before the repair their action asked for (a GPU reset of their GPU, a driver
reload: issue 21, item 3; judge/xids.py REPAIRS).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from gpuguard.judge.actions import CATALOG_WORDS
from gpuguard.judge.registry import (
    CheckContext,
    Finding,
    PerGpu,
    gpu_check,
    host_check,
    ok,
    warning,
)
from gpuguard.judge.xids import (
    UNSUPPORTED,
    Grade,
    Selection,
    by_gpu,
    cut_words,
    grade,
    repair_words,
    repairs_for,
    select,
    severest_first,
    span,
    window_words,
)
from gpuguard.model.results import NAMES
from gpuguard.model.snapshot import GpuSnapshot, Snapshot

# The message names at most this many codes, the most severe first; the rest are in
# `observed` (codes, events) and in `gpuguard events`.
SHOWN_CODES = 3


@host_check("xid.recent", thresholds=("repeat_for_vendor",))
def recent(ctx: CheckContext) -> PerGpu:
    log = ctx.snapshot.host.kernel_log.get()
    groups = by_gpu(log["xids"], ctx.snapshot)
    gpus = {gpu.index: _judge(ctx, log, groups.get(gpu.index, []), gpu.index)
            for gpu in ctx.snapshot.gpus}
    host = _judge(ctx, log, groups.get(None, []), None) if None in groups or not gpus \
        else None
    return PerGpu(gpus, host)


def _judge(ctx: CheckContext, log: dict[str, Any], events: list[dict[str, Any]],
           gpu: int | None) -> Finding:
    """One GPU's Xids (or, `gpu` None, those naming no listed GPU)."""
    window_s = ctx.profile.xid_window_s
    catalog, source = ctx.ruleset.xid_catalog, ctx.ruleset.xid_catalog_source
    chosen = select(events, log, window_s,
                    lambda event: grade(event["xid"], event.get("text"), catalog, source),
                    repairs_for(log, ctx.snapshot, gpu),
                    lambda g: CATALOG_WORDS[g.first].value)
    counted = [{**e, "gpu": gpu, "suggested": CATALOG_WORDS[e["first"]].value}
               for e in chosen.counted]
    window = window_words(log, window_s)
    dropped = log.get("xids_dropped") or 0
    observed = _observed(chosen, counted, window, dropped, log.get("acked_seq"))
    observed["records_lost"] = log.get("records_lost") or 0  # overwritten before read
    if not counted:
        return ok(_nothing_to_act_on(chosen, window, dropped), **observed)
    message = _message(counted, dropped, ctx.threshold("repeat_for_vendor"), gpu is None) \
        + cut_words(log)
    if any(e["severity"] == "critical" for e in counted):
        return ctx.fail(message, **observed)
    return warning(message, **observed)


def _observed(chosen: Selection, counted: list[dict[str, Any]], window: str, dropped: int,
              acked: int | None) -> dict[str, Any]:
    """What the finding records: the counts of the selection, each code with its count
    (most severe first), and each counted Xid with its GPU, suggested action and why."""
    return {"window": window, "counted": len(counted), "aged_out": chosen.aged,
            "older_not_kept": dropped,
            "not_counted": chosen.ignored, "acked_seq": acked,
            "acknowledged": chosen.acknowledged, "cleared": chosen.cleared,
            "cleared_by": None if chosen.repair is None else
            {k: chosen.repair.get(k) for k in ("kind", "seq", "usec", "text")},
            "codes": [{"xid": xid, "count": len(events), "severity": events[-1]["severity"],
                       "suggested": events[-1]["suggested"]}
                      for xid, events in _ranked(counted)],
            "events": [{k: e[k] for k in ("xid", "pci", "gpu", "severity", "seq", "age_s",
                                            "pid", "process", "suggested", "why")}
                       for e in counted],
            # what the finding names: the Xid codes it counts (an ack covers these)
            NAMES: sorted({str(e["xid"]) for e in counted})}


def _ranked(counted: list[dict[str, Any]]) -> list[tuple[int, list[dict[str, Any]]]]:
    codes: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in counted:
        codes[e["xid"]].append(e)
    return severest_first(codes, lambda word: CATALOG_WORDS[word].rank)


def _nothing_to_act_on(chosen: Selection, window: str, dropped: int) -> str:
    """The ok message: no Xid counted, with what was left out and why (acknowledged,
    informational, aged out), so an operator sees the log was read."""
    cleared = "" if chosen.repair is None else f"cleared by {repair_words(chosen.repair)}"
    notes = [f"{n} {what}" for n, what in ((chosen.acknowledged, "acknowledged"),
                                           (chosen.cleared, cleared),
                                           (chosen.ignored, "informational"),
                                           (chosen.aged, "older than the window")) if n]
    extra = f" ({', '.join(notes)})" if notes else ""
    text = f"no Xid {window} to act on{extra}" if notes else f"no Xid {window}"
    return text + _not_kept(dropped)


def _not_kept(dropped: int) -> str:
    # which GPUs the lines the summary did not keep were about cannot be told
    return f" (and {dropped} older Xid line(s) of any GPU not kept)" if dropped else ""


def _message(counted: list[dict[str, Any]], dropped: int, repeat_for_vendor: int,
             unlisted: bool) -> str:
    """The most severe codes, each with how often, the latest line's meaning, age and
    action; how many more codes there are. The result's own GPU names where; for the host
    result, the addresses each code was logged at."""
    ranked = _ranked(counted)
    parts = [_part(xid, events, repeat_for_vendor, unlisted)
             for xid, events in ranked[:SHOWN_CODES]]
    if len(ranked) > SHOWN_CODES:
        parts.append(f"and {len(ranked) - SHOWN_CODES} more Xid code(s) (observed.codes, "
                     "`gpuguard events`)")
    return " | ".join(parts) + _not_kept(dropped)


def _part(xid: int, events: list[dict[str, Any]], repeat_for_vendor: int,
          unlisted: bool) -> str:
    """One Xid of the GPU (or of the unlisted addresses): how often, the latest event's
    meaning, age and action, and the vendor once a critical one keeps coming back."""
    last = events[-1]
    where = f"{_unlisted_where(events)}: " if unlisted else ""
    age = f", last {span(last['age_s'])} ago" if last["age_s"] is not None else ""
    times = f" x{len(events)}" if len(events) > 1 else ""
    # a GPU the driver's release does not support rides Xid 79's path (judge/xids.py) but
    # is no loss: "Xid 79" in front of it would read as a GPU off the bus
    label = "Driver probe" if last["meaning"] == UNSUPPORTED else f"Xid {xid}"
    text = f"{where}{label}{times} ({last['meaning']}{_no_xid(last)}){age}: {last['action']}"
    if last["severity"] == "critical" and len(events) >= repeat_for_vendor:
        text += "; it keeps coming back: contact NVIDIA support or the vendor"
    return text


def _no_xid(event: dict[str, Any]) -> str:
    """The driver's own words where the event is a lost GPU's line without an Xid (a start
    or a probe that failed: sources/kmsg_lost.py), counted as Xid 79."""
    line = event.get("line")
    return f"; the driver logged {line[:80]!r}, no Xid" if isinstance(line, str) else ""


def _unlisted_where(events: list[dict[str, Any]]) -> str:
    """The addresses of Xids at no GPU NVML lists: the first three, and how many more."""
    addresses = sorted({e["pci"] or "no address" for e in events})
    shown = ", ".join(addresses[:3]) + (f" and {len(addresses) - 3} more"
                                         if len(addresses) > 3 else "")
    return f"{shown} (not among the GPUs NVML lists)"


# -- xid.app_repeated: an application's Xid that keeps hitting one GPU ------------------

APP_XIDS = (13, 31)
# The lines of one fault come within a second or two (several SMs report it); a minute
# apart on one GPU, or another process, is another incident.
BURST_US = 60 * 10**6


@gpu_check("xid.app_repeated", thresholds=("period_s", "min_incidents"))
def app_repeated(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    """Xid 13 and 31 are the application's (a bad address, an illegal instruction), unless
    they keep hitting one GPU: the same code on the other GPUs of the host is the app's,
    the same GPU alone, again and again, is the GPU's. An incident is alone when no other
    GPU logged one within a minute of it (a tensor-parallel job fails on all its GPUs at
    once); the GPU is suspect when it has at least `min_incidents` alone in `period_s`
    and more than all the other GPUs together."""
    log = ctx.snapshot.host.kernel_log.get()
    # not `window_s`: the daemon keeps its samples as long as the longest of those, and
    # this span is of kernel-log lines, not of samples
    period_s = ctx.threshold("period_s")
    incidents = _incidents(log, ctx.snapshot, period_s)
    alone = {index: [i for i in found if not _shared(i, index, incidents)]
             for index, found in incidents.items()}
    mine = alone.get(gpu.index, [])
    others = sum(len(found) for index, found in alone.items() if index != gpu.index)
    observed = {"period_s": period_s, "incidents": len(incidents.get(gpu.index, [])),
                "alone": len(mine), "alone_on_other_gpus": others,
                "pids": sorted({i["pid"] for i in mine if i["pid"] is not None})[:20]}
    if len(mine) >= ctx.threshold("min_incidents") and len(mine) > others:
        return ctx.fail(f"Xid 13/31 hit this GPU alone {len(mine)} times in the last "
                        f"{span(period_s)} ({others} alone on the other GPUs): an "
                        "application fault that keeps hitting one GPU points at the GPU",
                        **observed)
    return ok(f"{len(mine)} Xid 13/31 incident(s) on this GPU alone in the last "
              f"{span(period_s)} ({others} on the other GPUs)", **observed)


def _incidents(log: dict[str, Any], snapshot: Snapshot, window_s: float
               ) -> dict[int, list[dict[str, Any]]]:
    """Each GPU's Xid 13/31 incidents inside the window and not acknowledged: lines of one
    process within a minute of each other are one ({"start", "end", "pid"}); lines without
    a time stamp are one incident per process."""
    chosen = select([e for e in log["xids"] if e["xid"] in APP_XIDS], log, window_s,
                    lambda e: Grade("warning", "", "", "restart_app"))
    out: dict[int, list[dict[str, Any]]] = {}
    for index, events in by_gpu(chosen.counted, snapshot).items():
        if index is None:
            continue  # an address NVML does not list: nothing to compare with
        found: list[dict[str, Any]] = []
        for e in sorted(events, key=lambda e: e.get("usec") or -1):
            usec, last = e.get("usec"), found[-1] if found else None
            same = last is not None and last["pid"] == e.get("pid") and (
                usec is None or last["end"] is None or usec - last["end"] <= BURST_US)
            if same and last is not None:
                last["end"] = usec if usec is not None else last["end"]
            else:
                found.append({"start": usec, "end": usec, "pid": e.get("pid")})
        out[index] = found
    return out


def _shared(incident: dict[str, Any], index: int,
            incidents: dict[int, list[dict[str, Any]]]) -> bool:
    """Another GPU logged an incident within a minute of this one (or, without times, of
    the same process): the application spans GPUs."""
    for other, found in incidents.items():
        if other == index:
            continue
        for i in found:
            if incident["start"] is None or i["start"] is None:
                if incident["pid"] is not None and i["pid"] == incident["pid"]:
                    return True
            elif abs(i["start"] - incident["start"]) <= BURST_US:
                return True
    return False
