"""What to do about a failing result: the one owner of the suggested action.

An action is one of `none`, `restart_app`, `reset_gpu`, `reboot`, `inspect_hardware`,
ordered by severity (a reboot also resets the GPU; inspecting the hardware comes after
a reboot did not help). It is derived, first match wins, from:

0. a probe that read back wrong data (WRONG_DATA): `inspect_hardware`, whatever else;
1. the rule's own `action:` key in its YAML (where the family default below is wrong);
2. the Xid / SXid catalog's first action for each counted event (xid.recent, sxid.recent);
3. the driver's recovery action field (recovery.action);
4. a default by rule family and status (below).

A result that is not warning or critical suggests `none`. Escalation from history (the
same fatal finding after a reboot, a burst of fatal Xids) and acknowledgements change a
result's action later, in `escalate()` and `acknowledge()`; both say why in
`action_reason`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from gpuguard.model.results import Result, Status

if TYPE_CHECKING:
    from gpuguard.model.rule import Rule, RuleSet, XidEntry


class Action(StrEnum):
    NONE = "none"
    RESTART_APP = "restart_app"
    RESET_GPU = "reset_gpu"
    REBOOT = "reboot"
    INSPECT_HARDWARE = "inspect_hardware"

    @property
    def rank(self) -> int:
        return list(Action).index(self)


ACTIONS = tuple(a.value for a in Action)  # config_shapes.RuleAction holds the same words
FAILING = (Status.WARNING, Status.CRITICAL)

# The Xid catalog's words (rules/xid.yaml) as actions. contact_vendor is what to do when a
# fault keeps coming back, which escalation decides from history; as a first action it is
# an inspection.
_CATALOG = {
    "restart_app": Action.RESTART_APP,
    "reset_gpu": Action.RESET_GPU,
    "reboot": Action.REBOOT,
    "contact_vendor": Action.INSPECT_HARDWARE,
    "ignore": Action.NONE,
}
# Xid 154's text and NVML's recovery action field name what the driver wants.
_CHANGED_TO = re.compile(r"\bto 0x[0-9a-f]+ \(([^)]*)\)")
_RECOVERY_TEXT = (("node reboot required", Action.REBOOT),
                  ("gpu reset required", Action.RESET_GPU),
                  ("drain and reset", Action.RESET_GPU),
                  ("drain p2p", Action.RESTART_APP), ("none", Action.NONE))
RECOVERY_FIELD = {
    "none": Action.NONE,
    "gpu_reset": Action.RESET_GPU,
    "drain_and_reset": Action.RESET_GPU,
    "node_reboot": Action.REBOOT,
    "system_reboot": Action.REBOOT,
    "bus_reset": Action.REBOOT,
    "drain_p2p": Action.RESTART_APP,
    "recover_imex_domain": Action.RESTART_APP,
}
# The active probe's rules whose finding can be wrong data read back (observed
# `mismatches`): silent data corruption. A reset does not make such a board trustworthy
# (the next wrong answer is served, not caught), so it goes to a person, before any key.
WRONG_DATA = ("gpu.compute", "memory.pattern")
# family -> (action when critical, action when warning). A warning is something to watch,
# not to act on, unless the family says otherwise.
FAMILY_DEFAULT: dict[str, tuple[Action, Action]] = {
    "driver": (Action.REBOOT, Action.NONE),
    "gpu": (Action.REBOOT, Action.NONE),
    "vbios": (Action.INSPECT_HARDWARE, Action.NONE),
    "ecc": (Action.RESET_GPU, Action.NONE),
    "memory": (Action.RESET_GPU, Action.NONE),
    "pcie": (Action.INSPECT_HARDWARE, Action.NONE),
    "clocks": (Action.INSPECT_HARDWARE, Action.NONE),
    "power": (Action.INSPECT_HARDWARE, Action.NONE),
    "thermal": (Action.INSPECT_HARDWARE, Action.NONE),
    "persistence": (Action.NONE, Action.NONE),
    "toolkit": (Action.NONE, Action.NONE),
    "nvlink": (Action.RESET_GPU, Action.NONE),
    "fabric": (Action.REBOOT, Action.NONE),
    "p2p": (Action.RESET_GPU, Action.NONE),
    "mig": (Action.RESET_GPU, Action.NONE),
    # where no event or field names one (an Xid the catalog does not know, a new field)
    "recovery": (Action.RESET_GPU, Action.NONE),
    "xid": (Action.RESET_GPU, Action.NONE),
    "sxid": (Action.REBOOT, Action.NONE),
}


def worst(actions: Iterable[Action]) -> Action:
    return max(actions, key=lambda a: a.rank, default=Action.NONE)


def of_xid(xid: int, text: str | None, catalog: dict[int, XidEntry]) -> Action:
    """An Xid's first action in the catalog (Xid 154: the action its text names)."""
    entry = catalog.get(xid)
    if entry is None:
        return Action.NONE  # graded warning, "look it up": nothing known to do yet
    first = entry.actions[0] if entry.actions else "ignore"
    if first != "follow_text":
        return _CATALOG.get(first, Action.NONE)
    lowered = (text or "").lower()
    target = _CHANGED_TO.search(lowered)
    wanted = target.group(1) if target else lowered
    # No text (an NVML event) or words it does not know: a reset, as the catalog grades it
    return next((a for words, a in _RECOVERY_TEXT if words in wanted), Action.RESET_GPU)


def suggest(rule: Rule, status: Status, observed: dict[str, Any],
            ruleset: RuleSet) -> tuple[Action, str | None]:
    """The action for one result of `rule`, and why (None when not failing)."""
    if status not in FAILING:
        return Action.NONE, None
    if rule.id in WRONG_DATA and observed.get("mismatches"):
        return Action.INSPECT_HARDWARE, ("wrong data read back: silent data corruption, "
                                         "which no reset makes trustworthy")
    if rule.action is not None:
        where = (rule.action_origin or rule.origin).rsplit("/", 1)[-1]
        return Action(rule.action), f"the rule's action: key, {where}"
    if rule.id in ("xid.recent", "sxid.recent"):
        found = _from_events(rule.id, observed, ruleset)
        if found is not None:
            return found
    if rule.id == "recovery.action" and observed.get("recovery_action") in RECOVERY_FIELD:
        field = observed["recovery_action"]
        return RECOVERY_FIELD[field], f"the driver's recovery action field says {field}"
    if rule.id in FINDING_DECIDES:
        if observed.get("suggested") in ACTIONS:
            return Action(observed["suggested"]), str(observed.get("why") or "its finding")
        return FINDING_DECIDES[rule.id], "its finding names no action: its default"
    family = rule.id.split(".", 1)[0]
    if family not in FAMILY_DEFAULT:
        return _fallback(rule, status)
    critical, warning = FAMILY_DEFAULT[family]
    chosen = critical if status is Status.CRITICAL else warning
    return chosen, f"default for a {status.value} {family}.* result"


# Rules whose check decides the action from what it found (observed `suggested`, with
# `why`), and the action when it names none: service.gpu_errors takes the action of an Xid
# on the service's GPUs near the engine's CUDA error (of_xid, the catalog's), else the
# application's.
FINDING_DECIDES = {"service.gpu_errors": Action.RESTART_APP}


def _fallback(rule: Rule, status: Status) -> tuple[Action, str]:
    """A family gpuguard has no default for (a user's `when:` rule; every shipped rule has
    a family default or its own key, tests/test_actions.py): a GPU rule's fault is reset
    with the GPU, a host rule's with the host."""
    if status is not Status.CRITICAL:
        return Action.NONE, f"no family default for {rule.id}: a warning is to watch"
    chosen = Action.RESET_GPU if rule.scope == "gpu" else Action.REBOOT
    return chosen, f"no family default for {rule.id}: a critical {rule.scope} rule"


def _from_events(rule_id: str, observed: dict[str, Any],
                 ruleset: RuleSet) -> tuple[Action, str] | None:
    events = observed.get("events") or []
    best: tuple[Action, str] | None = None
    for event in events:
        if not isinstance(event, dict):
            continue
        if rule_id == "xid.recent" and isinstance(event.get("xid"), int):
            action = Action(event["suggested"]) if event.get("suggested") in ACTIONS \
                else of_xid(event["xid"], None, ruleset.xid_catalog)
            why = f"Xid {event['xid']} in the catalog"
        elif rule_id == "sxid.recent" and isinstance(event.get("sxid"), int):
            action = of_xid(event["sxid"], None, ruleset.sxid_catalog)
            why = f"SXid {event['sxid']} in the catalog"
        else:
            continue
        if best is None or action.rank > best[0].rank:
            best = (action, why)
    return best


def per_gpu(results: Iterable[Result]) -> dict[str, Action]:
    """The most severe action of each GPU's failing results (label: its index), and of the
    host's (label `host`); a kernel-log Xid counts for the GPU it names. Every GPU seen
    has a value, `none` when all is well: one series per GPU."""
    out: dict[str, Action] = {}
    for r in results:
        label = "host" if r.gpu is None else str(r.gpu.index)
        failing = r.status in FAILING
        out[label] = worst((out.get(label, Action.NONE),
                            Action(r.action) if failing else Action.NONE))
        if r.gpu is None and r.rule == "xid.recent" and failing and r.action != "none":
            for event in r.observed.get("events") or []:
                if isinstance(event, dict) and isinstance(event.get("gpu"), int) \
                        and event.get("suggested") in ACTIONS:
                    gpu = str(event["gpu"])
                    out[gpu] = worst((out.get(gpu, Action.NONE), Action(event["suggested"])))
    return out


def with_action(result: Result, action: Action, reason: str) -> Result:
    return dataclasses.replace(result, action=action.value, action_reason=reason)
