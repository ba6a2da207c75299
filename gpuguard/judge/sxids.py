"""How an NVSwitch SXid is graded: the one place that turns an SXid (and the Fatal /
Non-fatal word its line carries) into a severity, a meaning and an action. sxid.recent
calls grade(); the catalog is data (rules/sxid.yaml, re-graded in rules.d)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from gpuguard.judge.xids import Grade, words

if TYPE_CHECKING:
    from gpuguard.model.rule import XidEntry

# "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 14 LTSSM Fault Up"
_FATAL = re.compile(r"(?:^|[\s,:])(non-fatal|fatal)\b", re.IGNORECASE)


def line_says(text: str | None) -> str | None:
    """`fatal` or `non-fatal` as the driver's line calls the SXid, or None."""
    found = _FATAL.search(text or "")
    return found.group(1).lower() if found else None


def grade(sxid: int, text: str | None, catalog: dict[int, XidEntry],
          source: str = "") -> Grade:
    """The catalog's grade; where it says `follow_text` (the guide's "fatal" class: fatal
    or not as the line says), and for an SXid it does not hold, the line's own word. A
    fatal SXid takes the switch's links down until the NVSwitches and the GPUs on them are
    reset: on a bare-metal host, a reboot."""
    entry = catalog.get(sxid)
    if entry is not None and not (entry.severity != "ignore"
                                  and entry.actions[:1] == ("follow_text",)):
        first = entry.actions[0] if entry.actions else "ignore"
        return Grade(entry.severity, entry.meaning, words(entry.actions), first,
                     f"SXid {sxid} in the catalog")
    shipped = f" ({source})" if source else ""
    meaning = entry.meaning if entry is not None else \
        f"NVSwitch error not in the SXid list gpuguard ships{shipped}"
    says = line_says(text)
    if says == "fatal":
        return Grade("critical", f"{meaning}, fatal by its line",
                     "drain the node; reset the NVSwitches and GPUs (reboot)", "reboot",
                     f"SXid {sxid}'s line says Fatal")
    if says == "non-fatal" or entry is None:
        return Grade("warning", f"{meaning}{', non-fatal by its line' if says else ''}",
                     words(("inspect_hardware",)) + " if it repeats", "inspect_hardware",
                     f"SXid {sxid}'s line says Non-fatal" if says else
                     f"SXid {sxid} is not in the SXid list gpuguard ships{shipped}")
    # a fatal-class SXid whose line names neither: taken as fatal
    return Grade(entry.severity, entry.meaning, "drain the node; reset the NVSwitches and "
                 "GPUs (reboot)", "reboot", f"SXid {sxid} in the catalog (its line names "
                 "no grade)")
