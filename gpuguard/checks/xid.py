"""xid.recent: Xid errors the NVIDIA driver logged, graded by the catalog in rules/xid.yaml.

A whole-dmesg grep stays red until reboot (the most common complaint about AzNHC and
gcm), so only events inside the window count (default: since boot), and events up to
the sequence number acknowledged with `gpuguard xid ack` are left out.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from gpuguard.checks import CheckContext, Finding, host_check, ok, warning
from gpuguard.ruleset import XidEntry
from gpuguard.sources.kmsg import normalise_pci

ACTION_WORDS = {
    "restart_app": "restart the application",
    "reset_gpu": "drain and reset the GPU (nvidia-smi -r -i <index>)",
    "reboot": "drain and reboot the node",
    "contact_vendor": "open a case with the vendor if it comes back",
    "ignore": "no action needed",
    "follow_text": "follow the action in the message",
}
# Xid 154 carries the recovery action in its text.
_CHANGED_TO = re.compile(r"\bto 0x[0-9a-f]+ \(([^)]*)\)")
_RECOVERY_154 = (("node reboot required", "critical"), ("gpu reset required", "critical"),
                 ("drain and reset", "critical"), ("drain p2p", "warning"), ("none", "ignore"))


def _grade(event: dict[str, Any], catalog: dict[int, XidEntry]) -> tuple[str, str, str]:
    """(severity, meaning, action text) of one event."""
    entry = catalog.get(event["xid"])
    if entry is None:
        return ("warning", "not in gpuguard's catalog",
                "look it up in NVIDIA's Xid catalog; re-grade it in rules.d")
    severity = entry.severity
    if severity != "ignore" and "follow_text" in entry.actions:
        # "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)": the
        # action it changed *to* is what the GPU needs now.
        text = (event.get("text") or "").lower()
        target = _CHANGED_TO.search(text)
        wanted = target.group(1) if target else text
        severity = next((sev for words, sev in _RECOVERY_154 if words in wanted), "critical")
    return severity, entry.meaning, "; ".join(ACTION_WORDS[a] for a in entry.actions)


@host_check("xid.recent")
def recent(ctx: CheckContext) -> Finding:
    log = ctx.snapshot.host.kernel_log.get()
    window_s = ctx.profile.xid_window_s
    now = log.get("now_usec")
    acked = log.get("acked_seq")
    gpu_by_pci = {normalise_pci(g.pci_bus_id.get()): g.index
                  for g in ctx.snapshot.gpus if g.pci_bus_id.is_ok}

    counted: list[dict[str, Any]] = []
    aged = ignored = 0
    for event in log["xids"]:
        if acked is not None and event.get("seq") is not None and event["seq"] <= acked:
            continue
        usec = event.get("usec")
        if window_s is not None and now is not None and usec is not None \
                and now - usec > window_s * 1_000_000:
            aged += 1
            continue
        severity, meaning, action = _grade(event, ctx.ruleset.xid_catalog)
        if severity == "ignore":
            ignored += 1
            continue
        counted.append({**event, "severity": severity, "meaning": meaning, "action": action,
                        "gpu": gpu_by_pci.get(event["pci"]) if event.get("pci") else None,
                        "age_s": None if now is None or usec is None else (now - usec) // 10**6})

    window = "since boot" if window_s is None else f"in the last {_span(window_s)}"
    dropped = log.get("xids_dropped") or 0
    observed = {"window": window, "counted": len(counted), "aged_out": aged,
                "older_not_kept": dropped,
                "not_counted": ignored, "acked_seq": acked,
                "events": [{k: e[k] for k in ("xid", "pci", "gpu", "severity", "seq", "age_s",
                                                "pid", "process")} for e in counted]}
    if not counted:
        extra = f" ({ignored} informational)" if ignored else ""
        return ok(f"no Xid {window}{extra}", **observed)

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
        age = f", last {_span(last['age_s'])} ago" if last["age_s"] is not None else ""
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


def _span(seconds: float) -> str:
    seconds = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"

