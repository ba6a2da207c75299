"""How an Xid is graded: the one place that turns an Xid (and, where its catalog entry
says `follow_text`, the grade its own line names: Xid 154's recovery action, the NVLink5
Xids' Fatal / Nonfatal) into a severity, a meaning and an action. xid.recent, the
daemon's `gpuguard_xid_*` metrics, the event store and so the fatal-Xid alert all call
grade()."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuguard.model.rule import XidEntry
    from gpuguard.model.snapshot import GpuSnapshot, Snapshot

ACTION_WORDS = {
    "restart_app": "restart the application",
    "update_software": "update the driver or firmware (the board is not at fault)",
    "reset_gpu": "drain and reset the GPU (nvidia-smi -r -i <index>)",
    "reboot": "drain and reboot the node",
    "inspect_hardware": "take the GPU out of service and have the hardware inspected "
                        "(a vendor case)",
    "contact_vendor": "open a case with the vendor if it comes back",
    "ignore": "no action needed",
    "follow_text": "follow the action in the message",
}
# Xid 154 carries the recovery action in its text: "GPU recovery action changed from 0x0
# (None) to 0x1 (GPU Reset Required)"; the action it changed *to* is what the GPU needs now.
_CHANGED_TO = re.compile(r"\bto 0x[0-9a-f]+ \(([^)]*)\)")
_RECOVERY_154 = (("node reboot required", ("critical", "reboot")),
                 ("gpu reset required", ("critical", "reset_gpu")),
                 ("drain and reset", ("critical", "reset_gpu")),
                 ("drain p2p", ("warning", "restart_app")), ("none", ("ignore", "ignore")))
# The NVLink5 Xids (144-150) say Fatal or Nonfatal after the unit: "145, RLW_REMAP Fatal XC0
# i0 Link 00 (...)". NVIDIA's NVLink5 workflow resolves every Fatal item with RESET_GPU; a
# Nonfatal one needs nothing unless the driver names an action in an Xid 154 of its own.
_FATAL_WORD = re.compile(r"\b(nonfatal|non-fatal|fatal)\b")
# The text of the event the driver's probe gives for a GPU its release does not support
# ("The NVIDIA GPU ... installed in this system is not supported by the NVIDIA 555.58.02
# driver release": sources/kmsg_lost.py). It rides the lost-GPU path (counted as Xid 79:
# tied to the GPU by its bus id, acknowledged and windowed as the kernel log's other lost
# GPUs, on every surface that grades Xids) because the GPU is as absent from NVML as one off
# the bus; but what it needs is another driver release, not a reboot (which loads the same
# release and prints the same message): update_software, whose repair is a driver reload
# (REPAIRS), as installing a release that supports the GPU is.
UNSUPPORTED = "GPU not supported by the installed NVIDIA driver release"
_UNSUPPORTED_ACTION = ("install an NVIDIA driver release that supports this GPU (the release "
                       "notes' list of supported GPUs; the open kernel module needs a GPU "
                       "with GSP); the installed release cannot drive it")


@dataclass(frozen=True)
class Grade:
    severity: str  # critical, warning or ignore
    meaning: str
    action: str  # what to do, in words
    first: str = "ignore"  # the catalog word that decides the suggested action
    why: str = ""  # where the grade comes from, for action_reason


def grade(xid: int, text: str | None, catalog: dict[int, XidEntry],
          source: str = "") -> Grade:
    """An Xid's grade: its catalog entry, or the grade its own line names where the entry
    says `follow_text`; an Xid the catalog does not hold is a warning for a person, never
    said to be in the catalog. `source` names the catalog ("NVIDIA's Xid catalog of ...")."""
    entry = catalog.get(xid)
    if entry is None:
        shipped = f" ({source})" if source else ""
        return Grade("warning", f"not in the Xid catalog gpuguard ships{shipped}",
                     "look it up in NVIDIA's Xid catalog and have the GPU inspected; "
                     "re-grade it in rules.d", "inspect_hardware",
                     f"Xid {xid} is not in the Xid catalog gpuguard ships{shipped}")
    if xid == 79 and text == UNSUPPORTED and entry.severity != "ignore":
        return Grade("critical", UNSUPPORTED, _UNSUPPORTED_ACTION, "update_software",
                     "the driver's probe said its release does not support the GPU")
    if entry.severity != "ignore" and entry.actions[:1] == ("follow_text",):
        return by_line(f"Xid {xid}", entry, text)
    first = entry.actions[0] if entry.actions else "ignore"
    return Grade(entry.severity, entry.meaning, words(entry.actions), first,
                 f"Xid {xid} in the catalog")


def by_line(name: str, entry: XidEntry, text: str | None) -> Grade:
    """The grade an Xid's (or SXid's) own line names: a recovery action (Xid 154), or
    Fatal / Nonfatal; a line that says neither (an NVML event has no text) keeps the
    entry's severity with a reset."""
    lowered = (text or "").lower()
    target = _CHANGED_TO.search(lowered) if "recovery action" in lowered else None
    if target is not None:
        found = next((g for words_, g in _RECOVERY_154 if words_ in target.group(1)), None)
        if found is not None:
            return Grade(found[0], entry.meaning, words((found[1],)), found[1],
                         f"{name}'s line names the recovery action")
    word = _FATAL_WORD.search(lowered)
    if word is not None and word.group(1) == "fatal":
        return Grade("critical", f"{entry.meaning}, fatal by its line",
                     words(("reset_gpu",)), "reset_gpu", f"{name}'s line says Fatal")
    if word is not None:
        return Grade("warning", f"{entry.meaning}, non-fatal by its line",
                     "none unless an Xid 154 names one", "ignore",
                     f"{name}'s line says Nonfatal")
    return Grade(entry.severity, entry.meaning, words(("reset_gpu",)), "reset_gpu",
                 f"{name} in the catalog (its line names no grade)")


def grade_words(text: str | None) -> str:
    """The words of an Xid's (or SXid's) line that by_line() grades it by: the recovery
    action it changed to, Fatal or Nonfatal; "" for a line that names neither. What keeps a
    fatal line apart from a flood of the same code's non-fatal ones (sources/kmsg_kept.py)."""
    lowered = (text or "").lower()
    target = _CHANGED_TO.search(lowered) if "recovery action" in lowered else None
    if target is not None:
        return target.group(1)
    word = _FATAL_WORD.search(lowered)
    return "" if word is None else word.group(1)


def words(actions: tuple[str, ...]) -> str:
    return "; ".join(ACTION_WORDS[a] for a in actions)


def span(seconds: float) -> str:
    """An age or a window as the kernel-log rules write it: 90061 -> 1d, 150 -> 2m."""
    seconds = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def window_words(log: dict[str, Any], window_s: float | None) -> str:
    """What the kernel-log rules can vouch for: "since boot" or "in the last 1h", narrowed to
    "since [t]" where the kernel overwrote records of the window before they were read
    (review 3: a busy host's ring buffer wraps). Narrowed, not unknown: every long-running
    busy host wraps, and unknown forever would be a false alarm; the ok it gives claims only
    what was read, and the daemon keeps what it read before the wrap (daemon/kmsg_memory.py)."""
    window = "since boot" if window_s is None else f"in the last {span(window_s)}"
    cut = cut_words(log)
    lost, seq, usec = (log.get(k) for k in ("records_lost", "lost_before_seq",
                                             "lost_before_usec"))
    if not lost:
        return window + cut
    now = log.get("now_usec")
    if window_s is not None and now is not None and usec is not None \
            and now - window_s * 1_000_000 >= usec:
        return window + cut  # every record of the window was read
    at = f"[{usec // 10**6}.{usec % 10**6:06d}]" if usec is not None else f"record {seq}"
    return (f"since {at} ({lost} earlier kernel log record(s) overwritten before they were "
            f"read){cut}")


def cut_words(log: dict[str, Any]) -> str:
    """The note for a saved log whose last line had no newline (sources/kmsg.py
    with_cut_line): read as it is, but it may have been cut."""
    cut = log.get("cut_line")
    if not isinstance(cut, str):
        return ""
    return f" (the log's last line has no newline and may be cut: {cut[:40]!r})"


@dataclass
class Selection:
    """The kernel-log events a rule acts on, graded, and how many it left out and why."""

    counted: list[dict[str, Any]] = field(default_factory=list)
    acknowledged: int = 0
    aged: int = 0
    ignored: int = 0
    cleared: int = 0  # logged before a repair that did what they asked for
    repair: dict[str, Any] | None = None  # the latest repair that cleared one

    def clear(self, repair: dict[str, Any] | None) -> bool:
        """Count an event the repair cleared (None: it cleared none); whether it did."""
        if repair is None:
            return False
        self.cleared += 1
        if self.repair is None or repair["n"] > self.repair["n"]:
            self.repair = repair
        return True


# What a repair does, by the action an event asked for (issue 21, item 3): a GPU reset
# answers a reset (and an application's fault, whose state the reset ends), a driver reload
# does the same for every GPU and loads the software an update asked for; `reboot` and
# `inspect_hardware` ask for more than either (a new boot clears the kernel log itself).
REPAIRS = {"gpu_reset": ("restart_app", "reset_gpu"),
           "driver_reload": ("restart_app", "reset_gpu", "update_software")}


def repairs_for(log: dict[str, Any], snapshot: Snapshot, gpu: int | None
                ) -> list[dict[str, Any]]:
    """The repairs in the log that reach this GPU (its index; None: the lines that name no
    GPU NVML lists): every driver reload, and the resets that name it by UUID or bus id."""
    out = []
    for repair in log.get("repairs") or []:
        if repair["kind"] == "driver_reload":
            out.append(repair)
            continue
        target = repaired_gpu(snapshot, repair)
        if gpu is not None and target is not None and target.index == gpu:
            out.append(repair)
    return out


def repaired_gpu(snapshot: Snapshot, repair: dict[str, Any]) -> GpuSnapshot | None:
    """The GPU a reset line names, by bus id or UUID, if NVML lists it (a reload names
    none)."""
    if repair.get("pci"):
        return snapshot.gpu_at(repair["pci"])
    uuid = repair.get("uuid")
    return next((g for g in snapshot.gpus if uuid and g.uuid.is_ok and g.uuid.get() == uuid),
                None)


def repair_words(repair: dict[str, Any]) -> str:
    """"a GPU reset at [5100.000000]": where to find it in `dmesg`."""
    what = "a GPU reset" if repair["kind"] == "gpu_reset" else "a driver reload"
    if repair.get("usec") is not None:
        return f"{what} at [{repair['usec'] // 10**6}.{repair['usec'] % 10**6:06d}]"
    if repair.get("seq") is not None:
        return f"{what} (kernel log record {repair['seq']})"
    return f"{what} later in the kernel log"


def _cleared_by(event: dict[str, Any], action: str, repairs: list[dict[str, Any]]
                ) -> dict[str, Any] | None:
    """The latest repair after the event (in the log's order) that does what it asked."""
    n = event.get("n")
    if n is None:  # an older summary, an NVML event: no place in the log to compare
        return None
    return next((r for r in reversed(repairs)
                 if r["n"] > n and action in REPAIRS[r["kind"]]), None)


def select(events: list[dict[str, Any]], log: dict[str, Any], window_s: float | None,
           grade_event: Callable[[dict[str, Any]], Grade],
           repairs: list[dict[str, Any]] | None = None,
           action_of: Callable[[Grade], str] = lambda g: g.first) -> Selection:
    """Events not acknowledged (`gpuguard xid ack`: one kmsg sequence for Xids and SXids),
    inside the window (None: since boot), not graded `ignore` and not cleared by one of
    `repairs` that did what their action (`action_of` their grade) asked; each with its
    grade and its age in seconds (None where the log has no clock). xid.recent,
    sxid.recent, gsp.firmware."""
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
        if chosen.clear(_cleared_by(event, action_of(graded), repairs or [])):
            continue
        chosen.counted.append({**event, "severity": graded.severity, "meaning": graded.meaning,
                               "action": graded.action, "first": graded.first,
                               "why": graded.why,
                               "age_s": None if now is None or usec is None
                               else (now - usec) // 10**6})
    return chosen


def by_gpu(events: list[dict[str, Any]], snapshot: Snapshot, key: str = "pci"
           ) -> dict[int | None, list[dict[str, Any]]]:
    """Kernel-log events by the GPU the address in `key` names (its index), None for those
    that name no GPU the snapshot lists (a GPU that fell off the bus, an NVSwitch, a line
    without an address); in the log's order."""
    groups: dict[int | None, list[dict[str, Any]]] = {}
    for event in events:
        gpu = snapshot.gpu_at(event.get(key))
        groups.setdefault(None if gpu is None else gpu.index, []).append(event)
    return groups


def severest_first(codes: dict[int, list[dict[str, Any]]], rank: Callable[[str], int]
                   ) -> list[tuple[int, list[dict[str, Any]]]]:
    """Codes (each with its counted events) most severe first: critical before warning,
    then the weightier action (`rank` of the catalog word), then the more frequent, then
    the latest."""
    def key(item: tuple[int, list[dict[str, Any]]]) -> tuple[int, int, int, int]:
        _, events = item
        last = max(events, key=lambda e: (e.get("seq") or -1, e.get("usec") or -1))
        return (max(2 if e["severity"] == "critical" else 1 for e in events),
                max(rank(e["first"]) for e in events), len(events),
                last.get("seq") or last.get("usec") or -1)

    return sorted(codes.items(), key=key, reverse=True)
