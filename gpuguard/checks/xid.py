"""xid.recent: Xid errors the NVIDIA driver logged, graded by the catalog in rules/xid.yaml.

A whole-dmesg grep stays red until reboot (the most common complaint about AzNHC and
gcm), so only events inside the window count (default: since boot), and events up to
the sequence number acknowledged with `gpuguard xid ack` are left out.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from gpuguard.judge.actions import of_xid
from gpuguard.judge.registry import CheckContext, Finding, host_check, ok, warning
from gpuguard.judge.xids import Selection, grade, select, span
from gpuguard.model.results import NAMES


@host_check("xid.recent", thresholds=("repeat_for_vendor",))
def recent(ctx: CheckContext) -> Finding:
    log = ctx.snapshot.host.kernel_log.get()
    window_s = ctx.profile.xid_window_s
    catalog = ctx.ruleset.xid_catalog
    chosen = select(log["xids"], log, window_s,
                    lambda event: grade(event["xid"], event.get("text"), catalog))
    counted = [{**e, "gpu": _index_at(ctx, e.get("pci")),
                "suggested": of_xid(e["xid"], e.get("text"), catalog).value}
               for e in chosen.counted]
    window = "since boot" if window_s is None else f"in the last {span(window_s)}"
    dropped = log.get("xids_dropped") or 0
    observed = _observed(chosen, counted, window, dropped, log.get("acked_seq"))
    if not counted:
        return ok(_nothing_to_act_on(chosen, window), **observed)
    message = _message(counted, dropped, ctx.threshold("repeat_for_vendor"))
    if any(e["severity"] == "critical" for e in counted):
        return ctx.fail(message, **observed)
    return warning(message, **observed)


def _index_at(ctx: CheckContext, bus_id: str | None) -> int | None:
    gpu = ctx.snapshot.gpu_at(bus_id)
    return None if gpu is None else gpu.index


def _observed(chosen: Selection, counted: list[dict[str, Any]], window: str, dropped: int,
              acked: int | None) -> dict[str, Any]:
    """What the finding records: the counts of the selection and each counted Xid with
    its GPU and suggested action."""
    return {"window": window, "counted": len(counted), "aged_out": chosen.aged,
            "older_not_kept": dropped,
            "not_counted": chosen.ignored, "acked_seq": acked,
            "acknowledged": chosen.acknowledged,
            "events": [{k: e[k] for k in ("xid", "pci", "gpu", "severity", "seq", "age_s",
                                            "pid", "process", "suggested")}
                       for e in counted],
            # what the finding names: the Xid codes it counts (an ack covers these)
            NAMES: sorted({str(e["xid"]) for e in counted})}


def _nothing_to_act_on(chosen: Selection, window: str) -> str:
    """The ok message: no Xid counted, with what was left out and why (acknowledged,
    informational, aged out), so an operator sees the log was read."""
    notes = [f"{n} {what}" for n, what in ((chosen.acknowledged, "acknowledged"),
                                           (chosen.ignored, "informational"),
                                           (chosen.aged, "older than the window")) if n]
    extra = f" ({', '.join(notes)})" if notes else ""
    return f"no Xid {window} to act on{extra}" if notes else f"no Xid {window}"


def _message(counted: list[dict[str, Any]], dropped: int, repeat_for_vendor: int) -> str:
    """One part per GPU and Xid; Xids at addresses NVML does not list (a GPU that fell
    off the bus) are grouped per Xid, with their addresses."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for e in counted:
        groups[(e["gpu"] is None, e["gpu"], e["xid"])].append(e)
    message = " | ".join(_part(unlisted, gpu, xid, events, repeat_for_vendor)
                         for (unlisted, gpu, xid), events
                         in sorted(groups.items(), key=lambda kv: str(kv[0])))
    if dropped:
        message += f" (and {dropped} older Xid line(s) not kept)"
    return message


def _part(unlisted: bool, gpu: int | None, xid: int, events: list[dict[str, Any]],
          repeat_for_vendor: int) -> str:
    """One Xid of one GPU (or of the unlisted addresses): how often, the latest event's
    meaning, age and action, and the vendor once a critical one keeps coming back."""
    last = events[-1]
    where = _unlisted_where(events) if unlisted else f"GPU {gpu} ({last['pci']})"
    age = f", last {span(last['age_s'])} ago" if last["age_s"] is not None else ""
    times = f" x{len(events)}" if len(events) > 1 else ""
    text = f"{where}: Xid {xid}{times} ({last['meaning']}){age}: {last['action']}"
    if last["severity"] == "critical" and len(events) >= repeat_for_vendor:
        text += "; it keeps coming back: contact NVIDIA support or the vendor"
    return text


def _unlisted_where(events: list[dict[str, Any]]) -> str:
    """The addresses of Xids at no GPU NVML lists: the first three, and how many more."""
    addresses = sorted({e["pci"] or "unknown" for e in events})
    shown = ", ".join(addresses[:3]) + (f" and {len(addresses) - 3} more"
                                         if len(addresses) > 3 else "")
    return f"{shown} (not among the GPUs NVML lists)"
