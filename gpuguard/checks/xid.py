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
from gpuguard.judge.xids import grade, select, span


@host_check("xid.recent", thresholds=("repeat_for_vendor",))
def recent(ctx: CheckContext) -> Finding:
    log = ctx.snapshot.host.kernel_log.get()
    window_s = ctx.profile.xid_window_s
    acked = log.get("acked_seq")
    catalog = ctx.ruleset.xid_catalog
    chosen = select(log["xids"], log, window_s,
                    lambda event: grade(event["xid"], event.get("text"), catalog))
    counted = [{**e, "gpu": _index_at(ctx, e.get("pci")),
                "suggested": of_xid(e["xid"], e.get("text"), catalog).value}
               for e in chosen.counted]
    aged, ignored, acknowledged = chosen.aged, chosen.ignored, chosen.acknowledged

    window = "since boot" if window_s is None else f"in the last {span(window_s)}"
    dropped = log.get("xids_dropped") or 0
    observed = {"window": window, "counted": len(counted), "aged_out": aged,
                "older_not_kept": dropped,
                "not_counted": ignored, "acked_seq": acked, "acknowledged": acknowledged,
                "events": [{k: e[k] for k in ("xid", "pci", "gpu", "severity", "seq", "age_s",
                                                "pid", "process", "suggested")}
                           for e in counted]}
    if not counted:
        notes = [f"{n} {what}" for n, what in ((acknowledged, "acknowledged"),
                                               (ignored, "informational"),
                                               (aged, "older than the window")) if n]
        extra = f" ({', '.join(notes)})" if notes else ""
        return ok(f"no Xid {window} to act on{extra}" if notes else f"no Xid {window}",
                  **observed)

    # One part per GPU and Xid; Xids at addresses NVML does not list (a GPU that fell
    # off the bus) are grouped per Xid, with their addresses.
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for e in counted:
        groups[(e["gpu"] is None, e["gpu"], e["xid"])].append(e)
    parts = []
    for (unlisted, gpu, xid), events in sorted(groups.items(), key=lambda kv: str(kv[0])):
        last = events[-1]
        if unlisted:
            addresses = sorted({e["pci"] or "unknown" for e in events})
            shown = ", ".join(addresses[:3]) + (f" and {len(addresses) - 3} more"
                                                 if len(addresses) > 3 else "")
            where = f"{shown} (not among the GPUs NVML lists)"
        else:
            where = f"GPU {gpu} ({last['pci']})"
        age = f", last {span(last['age_s'])} ago" if last["age_s"] is not None else ""
        times = f" x{len(events)}" if len(events) > 1 else ""
        text = f"{where}: Xid {xid}{times} ({last['meaning']}){age}: {last['action']}"
        if last["severity"] == "critical" and len(events) >= ctx.threshold("repeat_for_vendor"):
            text += "; it keeps coming back: contact NVIDIA support or the vendor"
        parts.append(text)
    message = " | ".join(parts)
    if dropped:
        message += f" (and {dropped} older Xid line(s) not kept)"
    if any(e["severity"] == "critical" for e in counted):
        return ctx.fail(message, **observed)
    return warning(message, **observed)


def _index_at(ctx: CheckContext, bus_id: str | None) -> int | None:
    gpu = ctx.snapshot.gpu_at(bus_id)
    return None if gpu is None else gpu.index
