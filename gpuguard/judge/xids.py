"""How an Xid is graded: the one place that turns an Xid (and, for Xid 154, the recovery
action in its text) into a severity, a meaning and an action. xid.recent, the daemon's
`gpuguard_xid_*` metrics and so the fatal-Xid alert all call grade()."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuguard.model.rule import XidEntry

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


@dataclass(frozen=True)
class Grade:
    severity: str  # critical, warning or ignore
    meaning: str
    action: str


def grade(xid: int, text: str | None, catalog: dict[int, XidEntry]) -> Grade:
    entry = catalog.get(xid)
    if entry is None:
        return Grade("warning", "not in gpuguard's catalog",
                     "look it up in NVIDIA's Xid catalog; re-grade it in rules.d")
    severity = entry.severity
    if severity != "ignore" and "follow_text" in entry.actions:
        # "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)": the
        # action it changed *to* is what the GPU needs now. No text (an NVML event): the
        # catalog's own severity stands.
        lowered = (text or "").lower()
        target = _CHANGED_TO.search(lowered)
        wanted = target.group(1) if target else lowered
        severity = next((sev for words, sev in _RECOVERY_154 if words in wanted), severity)
    return Grade(severity, entry.meaning, "; ".join(ACTION_WORDS[a] for a in entry.actions))


def span(seconds: float) -> str:
    """An age or a window as the kernel-log rules write it: 90061 -> 1d, 150 -> 2m."""
    seconds = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


@dataclass
class Selection:
    """The kernel-log events a rule acts on, graded, and how many it left out and why."""

    counted: list[dict[str, Any]] = field(default_factory=list)
    acknowledged: int = 0
    aged: int = 0
    ignored: int = 0


def select(events: list[dict[str, Any]], log: dict[str, Any], window_s: float | None,
           grade_event: Callable[[dict[str, Any]], Grade]) -> Selection:
    """Events not acknowledged (`gpuguard xid ack`: one kmsg sequence for Xids and SXids),
    inside the window (None: since boot) and not graded `ignore`; each with its grade and
    its age in seconds (None where the log has no clock). xid.recent and sxid.recent."""
    now, acked = log.get("now_usec"), log.get("acked_seq")
    chosen = Selection()
    for event in events:
        seq, usec = event.get("seq"), event.get("usec")
        if acked is not None and seq is not None and seq <= acked:
            chosen.acknowledged += 1
            continue
        if window_s is not None and now is not None and usec is not None \
                and now - usec > window_s * 1_000_000:
            chosen.aged += 1
            continue
        graded = grade_event(event)
        if graded.severity == "ignore":
            chosen.ignored += 1
            continue
        chosen.counted.append({**event, "severity": graded.severity, "meaning": graded.meaning,
                               "action": graded.action,
                               "age_s": None if now is None or usec is None
                               else (now - usec) // 10**6})
    return chosen
