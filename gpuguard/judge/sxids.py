"""How an NVSwitch SXid is graded: the one place that turns an SXid (and the Fatal /
Non-fatal word its line carries) into a severity, a meaning and an action. sxid.recent
calls grade(); the catalog is data (rules/sxid.yaml, re-graded in rules.d)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from gpuguard.judge.xids import ACTION_WORDS, Grade

if TYPE_CHECKING:
    from gpuguard.model.rule import XidEntry

# "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 14 LTSSM Fault Up"
_FATAL = re.compile(r"(?:^|[\s,:])(non-fatal|fatal)\b", re.IGNORECASE)


def line_says(text: str | None) -> str | None:
    """`fatal` or `non-fatal` as the driver's line calls the SXid, or None."""
    found = _FATAL.search(text or "")
    return found.group(1).lower() if found else None


def grade(sxid: int, text: str | None, catalog: dict[int, XidEntry]) -> Grade:
    entry = catalog.get(sxid)
    if entry is not None:
        return Grade(entry.severity, entry.meaning,
                     "; ".join(ACTION_WORDS[a] for a in entry.actions))
    # Not in the catalog: the driver's own word grades it. A fatal SXid takes the switch's
    # links down until the switch and the GPUs on it are reset.
    if line_says(text) == "fatal":
        return Grade("critical", "fatal NVSwitch error not in gpuguard's catalog",
                     "drain the node; reset the NVSwitches and GPUs (reboot), then "
                     "look the SXid up in NVIDIA's catalog")
    return Grade("warning", "NVSwitch error not in gpuguard's catalog",
                 "look the SXid up in NVIDIA's catalog; re-grade it in rules.d")
