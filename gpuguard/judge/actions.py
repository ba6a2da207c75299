"""What to do about a failing result: the one owner of the suggested action.

An action is one of `none`, `restart_app`, `update_software`, `reset_gpu`, `reboot`,
`inspect_hardware`, ordered by severity (an update is planned work on a board that is not
at fault; a reboot also resets the GPU; inspecting the hardware comes after a reboot did
not help). It is derived, first match wins, from:

0. a probe that read back wrong data (WRONG_DATA), or a fact that no reset repairs
   (NO_RESET_HELPS: a row remapping failure): `inspect_hardware`, whatever else;
1. the rule's own `action:` key in its YAML (where the family default below is wrong);
2. the Xid / SXid catalog's first action for each counted event, or the grade the event's
   own line names (xid.recent, sxid.recent); for gsp.firmware, what each GSP line means;
3. the driver's recovery action field (recovery.action);
4. a default by rule family and status (below).

A result that is not warning or critical suggests `none`. Escalation from history (the
same fatal finding after a reboot, a burst of fatal Xids) and acknowledgements change a
result's action later, in `escalate()` and `acknowledge()`; both say why in
`action_reason`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from gpuguard.model.results import Result, Status

if TYPE_CHECKING:
    from gpuguard.model.rule import Rule, RuleSet, XidEntry


class Action(StrEnum):
    NONE = "none"
    RESTART_APP = "restart_app"
    UPDATE_SOFTWARE = "update_software"
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
CATALOG_WORDS = {
    "restart_app": Action.RESTART_APP,
    "update_software": Action.UPDATE_SOFTWARE,
    "reset_gpu": Action.RESET_GPU,
    "reboot": Action.REBOOT,
    "inspect_hardware": Action.INSPECT_HARDWARE,
    "contact_vendor": Action.INSPECT_HARDWARE,
    "ignore": Action.NONE,
    # a line that names no grade of its own: what the catalog's severity of it is reset with
    "follow_text": Action.RESET_GPU,
}
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
# The active probe's and qualify's rules whose finding can be wrong data read back
# (observed `mismatches`): silent data corruption. A reset does not make such a board
# trustworthy (the next wrong answer is served, not caught), so it goes to a person, before
# any key. (qualify.sdc records `mismatches` only for results located to an SM.)
WRONG_DATA = ("gpu.compute", "memory.pattern", "qualify.sdc", "qualify.memtest")
# Findings whose observed fact says a reset cannot repair them: rule -> (the fact, why).
# A failed row remapping means the bank has no spare row left; a reset activates pending
# remaps but adds no rows, so the board goes to a person (NVIDIA: an RMA).
NO_RESET_HELPS = {"memory.row_remap": ("failure", "row remapping failed: no spare row is "
                                                  "left, and a reset does not add any")}
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
    # where no line names one (a GSP kind this gpuguard does not know)
    "gsp": (Action.RESET_GPU, Action.NONE),
    # every devices.* rule names its own action (rules/devices.yaml)
    "devices": (Action.NONE, Action.NONE),
    # a GPU that fails under qualify's full load goes to a person unless its rule says
    # otherwise (rules/qualify.yaml): qualify is the gate before a return to service
    "qualify": (Action.INSPECT_HARDWARE, Action.NONE),
}


def worst(actions: Iterable[Action]) -> Action:
    return max(actions, key=lambda a: a.rank, default=Action.NONE)


def of_xid(xid: int, text: str | None, catalog: dict[int, XidEntry], source: str = ""
           ) -> Action:
    """An Xid's action: its catalog entry's first, or what its own line names (Xid 154's
    recovery action, an NVLink5 Xid's Fatal); an Xid the catalog does not hold goes to a
    person (judge/xids.py grades it)."""
    from gpuguard.judge.xids import grade

    return CATALOG_WORDS[grade(xid, text, catalog, source).first]


def of_sxid(sxid: int, text: str | None, catalog: dict[int, XidEntry], source: str = ""
            ) -> Action:
    from gpuguard.judge.sxids import grade

    return CATALOG_WORDS[grade(sxid, text, catalog, source).first]


# What a GSP line the kernel log holds without an Xid means (gpuguard/checks/gsp.py):
# RPC timeouts and a GSP crash report are reset with the GPU (NVIDIA, Xid 119/120: "a GPU
# reset or node power cycle may be needed"); GSP that could not boot left the GPU
# uninitialised, so NVML cannot reset it: a reboot (a power cycle where that fails).
GSP_KINDS = {"rpc_timeout": Action.RESET_GPU, "crash": Action.RESET_GPU,
             "boot_failed": Action.REBOOT}


def suggest(rule: Rule, status: Status, observed: dict[str, Any],
            ruleset: RuleSet) -> tuple[Action, str | None]:
    """The action for one result of `rule`, and why (None when not failing)."""
    if status not in FAILING:
        return Action.NONE, None
    if rule.id in WRONG_DATA and observed.get("mismatches"):
        return Action.INSPECT_HARDWARE, ("wrong data read back: silent data corruption, "
                                         "which no reset makes trustworthy")
    fact, why = NO_RESET_HELPS.get(rule.id, ("", ""))
    if fact and observed.get(fact) is True:
        return Action.INSPECT_HARDWARE, why
    if rule.action is not None:
        where = (rule.action_origin or rule.origin).rsplit("/", 1)[-1]
        return Action(rule.action), f"the rule's action: key, {where}"
    found = _from_finding(rule, observed, ruleset)
    if found is not None:
        return found
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
# qualify.ecc names a reset for a new uncorrectable error or pending remap and an
# inspection for a failed remapping; qualify.xid the catalog's action of its worst Xid.
FINDING_DECIDES = {"service.gpu_errors": Action.RESTART_APP, "qualify.ecc": Action.RESET_GPU,
                   "qualify.xid": Action.RESET_GPU}


def _from_finding(rule: Rule, observed: dict[str, Any], ruleset: RuleSet
                  ) -> tuple[Action, str | None] | None:
    """The action the result's own finding names (its events, the driver's field, the
    check's `suggested`), or None where it names none."""
    if rule.id in ("xid.recent", "sxid.recent", "gsp.firmware"):
        return _from_events(rule.id, observed, ruleset)
    if rule.id == "recovery.action" and observed.get("recovery_action") in RECOVERY_FIELD:
        field = observed["recovery_action"]
        return RECOVERY_FIELD[field], f"the driver's recovery action field says {field}"
    if rule.id in FINDING_DECIDES:
        if observed.get("suggested") in ACTIONS:
            return Action(observed["suggested"]), str(observed.get("why") or "its finding")
        return FINDING_DECIDES[rule.id], "its finding names no action: its default"
    return None


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
    """The most severe action of the events a kernel-log rule counted: each carries its own
    (`suggested`, decided by of_xid, of_sxid or GSP_KINDS when the check graded it) and
    where it comes from (`why`)."""
    best: tuple[Action, str] | None = None
    for event in observed.get("events") or []:
        if not isinstance(event, dict):
            continue
        if event.get("suggested") in ACTIONS:
            action = Action(event["suggested"])
        elif rule_id == "xid.recent" and isinstance(event.get("xid"), int):
            action = of_xid(event["xid"], None, ruleset.xid_catalog,
                            ruleset.xid_catalog_source)
        elif rule_id == "sxid.recent" and isinstance(event.get("sxid"), int):
            action = of_sxid(event["sxid"], None, ruleset.sxid_catalog,
                             ruleset.sxid_catalog_source)
        else:
            continue
        why = event["why"] if isinstance(event.get("why"), str) else \
            f"{rule_id.split('.')[0].upper()} event in the log"
        if best is None or action.rank > best[0].rank:
            best = (action, why)
    return best


def per_gpu(results: Iterable[Result]) -> dict[str, Action]:
    """The most severe action of each GPU's failing results (label: its index), and of the
    host's (label `host`); a kernel-log rule gives each GPU its own result, so an Xid
    counts for the GPU it names. Every GPU seen has a value, `none` when all is well: one
    series per GPU."""
    out: dict[str, Action] = {}
    for r in results:
        label = "host" if r.gpu is None else str(r.gpu.index)
        failing = r.status in FAILING
        out[label] = worst((out.get(label, Action.NONE),
                            Action(r.action) if failing else Action.NONE))
    return out


def with_action(result: Result, action: Action, reason: str) -> Result:
    return dataclasses.replace(result, action=action.value, action_reason=reason)
