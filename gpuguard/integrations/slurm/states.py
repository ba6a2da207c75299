"""What `gpuguard slurm health` may do with its node, by the node's state and who wrote its
reason: the table (TABLE) is data. It decides (integrations/slurm/plan.py looks the node
up in it), docs/slurm.md shows it (render(); a test holds the two equal) and each row is a
test of its own (tests/test_slurm_states.py).

A node is read as scontrol prints it (`State=IDLE+DRAIN+NOT_RESPONDING`: a base state and
flags, integrations/slurm/ctl.py). Health changes only a node that is in service and
carries no one else's reason, or one drained by gpuguard (its reason, integrations/slurm/
reason.py, or Slurm's "Prolog error"/"Epilog error" drain just after gpuguard's recorded
script failure). DOWN, FAIL, MAINT, powered down, rebooting, or any state or flag this
table does not know: never drained over, rewritten or resumed, whatever gpuguard sees.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gpuguard.integrations.slurm.ctl import NodeInfo


class Standing(StrEnum):
    """The node's state as health sees it; the first that applies, top down."""

    DOWN = "down"
    FAIL = "fail"
    MAINT = "maint"
    POWER = "power"
    REBOOT = "reboot"
    OTHER = "other"
    DRAINED = "drained"
    UP = "up"


class Owner(StrEnum):
    NONE = "none"  # no reason
    GPUGUARD = "gpuguard"  # gpuguard's grammar
    # gpuguard's, for reset_gpu, reboot or inspect_hardware: back only after a
    # qualification (integrations/slurm/gate.py); where a standing has no row of its own
    # for it, gpuguard's row applies
    GPUGUARD_GATED = "gpuguard, gated"
    SCRIPT = "script"  # Slurm's Prolog/Epilog error just after gpuguard's recorded failure
    ANYONE = "anyone"  # in a row: any reason not matched by a row above it


class Does(StrEnum):
    DRAIN = "drain"  # for a drain finding, after the brake; else nothing
    OWN = "own"  # keep; rewrite for another finding; resume when the whole verdict passes
    OWN_GATED = "own, gated"  # as OWN, and the resume waits for a passing qualification
    TAKE_OVER = "take over"  # gpuguard's reason, then as its own
    NOTHING = "nothing"


IN_SERVICE = ("IDLE", "MIXED", "ALLOCATED")
# flags that say nothing about who holds the node: health decides as without them
PASSIVE = frozenset({"COMPLETING", "NOT_RESPONDING", "RESERVED", "CLOUD", "PLANNED",
                     "DYNAMIC_NORM"})
FLAGS = {  # flag -> standing, in Standing's order of precedence
    "FAIL": Standing.FAIL,
    "MAINT": Standing.MAINT,
    "POWERED_DOWN": Standing.POWER, "POWERING_DOWN": Standing.POWER,
    "POWER_DOWN": Standing.POWER, "POWERING_UP": Standing.POWER,
    "REBOOT_REQUESTED": Standing.REBOOT, "REBOOT_ISSUED": Standing.REBOOT,
}


@dataclass(frozen=True)
class Row:
    standing: Standing
    state: str  # the states it stands for, in words (the doc's first column)
    owner: Owner
    reason: str  # the reasons it stands for, in words
    does: Does
    why: str
    # a case of it, for its test: scontrol's State=, a reason, and what health plans with
    # a drain finding and when the whole verdict passes (Plan.do)
    example: tuple[str, str]
    with_fault: str
    when_whole: str


_SOMEONE = "anyone else's: an administrator's, another tool's, or Slurm's own " \
    '("Kill task failed", "Not responding", "Node unexpectedly rebooted", "gres/gpu ' \
    'count reported lower than configured", a "Prolog error" not after gpuguard\'s ' \
    "failure, ...)"
_ANY = "any, gpuguard's included"
EXAMPLE_REASON = "gpuguard: inspect_hardware: memory.row_remap GPU 0"  # the examples' finding
EXAMPLE_UNGATED = "gpuguard: restart_app: service.engine GPU 0"  # a drain with no gate

TABLE: tuple[Row, ...] = (
    Row(Standing.UP, "in service: `IDLE`, `MIXED`, `ALLOCATED` (with `COMPLETING`, "
        "`NOT_RESPONDING`, `RESERVED`, `CLOUD`, `PLANNED` or `DYNAMIC_NORM` too)",
        Owner.NONE, "none", Does.DRAIN, "drain for a drain finding (after the brake)",
        ("MIXED+COMPLETING", ""), "drain", "none"),
    Row(Standing.UP, "in service", Owner.GPUGUARD, "gpuguard's", Does.DRAIN,
        "as with none: the reason is its own", ("IDLE", EXAMPLE_REASON), "drain", "none"),
    Row(Standing.UP, "in service", Owner.ANYONE, _SOMEONE, Does.NOTHING,
        "nothing: the reason is someone else's", ("IDLE", "admin: watch this one"),
        "none", "none"),
    Row(Standing.DRAINED, "drained or draining: one of those with `DRAIN`",
        Owner.GPUGUARD_GATED, "gpuguard's, for `reset_gpu`, `reboot` or `inspect_hardware`",
        Does.OWN_GATED, "keep it while the finding stands, rewrite the reason for another; "
        "when the whole verdict passes [the resume check](#resuming), qualify its GPUs, "
        "detached, once the node is idle, and resume after a pass "
        "[the gate](#qualifying-before-a-resume)", ("IDLE+DRAIN", EXAMPLE_REASON),
        "keep", "keep"),
    Row(Standing.DRAINED, "drained or draining", Owner.GPUGUARD,
        "gpuguard's, for `failover`, `restart_app` or `update_software`", Does.OWN,
        "keep it while the finding stands, rewrite the reason for another, resume when the "
        "whole verdict passes [the resume check](#resuming)",
        ("IDLE+DRAIN", EXAMPLE_UNGATED), "update", "resume"),
    Row(Standing.DRAINED, "drained or draining", Owner.SCRIPT, '"Prolog error" or "Epilog '
        'error" set close after a failure gpuguard recorded', Does.TAKE_OVER,
        "take it over (gpuguard's reason), then as its own", ("ALLOCATED+DRAIN",
                                                              "Epilog error"),
        "update", "update"),
    Row(Standing.DRAINED, "drained or draining", Owner.ANYONE, f"none, or {_SOMEONE}",
        Does.NOTHING, "**nothing, ever**", ("IDLE+DRAIN", "Kill task failed"), "none", "none"),
    Row(Standing.DOWN, "`DOWN`, with any flags (`DOWN+DRAIN` too)", Owner.ANYONE, _ANY,
        Does.NOTHING, "**nothing, ever**", ("DOWN+DRAIN+NOT_RESPONDING", EXAMPLE_REASON),
        "none", "none"),
    Row(Standing.FAIL, "`FAIL` (failing or failed)", Owner.ANYONE, _ANY, Does.NOTHING,
        "**nothing, ever**", ("IDLE+FAIL", "admin: PSU"), "none", "none"),
    Row(Standing.MAINT, "`MAINT` (in a maintenance reservation)", Owner.ANYONE, _ANY,
        Does.NOTHING, "**nothing, ever**", ("IDLE+MAINT+RESERVED", ""), "none", "none"),
    Row(Standing.POWER, "powered down or changing power: `POWERED_DOWN`, `POWERING_DOWN`, "
        "`POWER_DOWN`, `POWERING_UP`", Owner.ANYONE, _ANY, Does.NOTHING,
        "**nothing, ever**", ("IDLE+DRAIN+POWERED_DOWN", EXAMPLE_REASON), "none", "none"),
    Row(Standing.REBOOT, "`REBOOT_REQUESTED`, `REBOOT_ISSUED`", Owner.ANYONE, _ANY,
        Does.NOTHING, "**nothing, ever**", ("MIXED+REBOOT_REQUESTED", ""), "none", "none"),
    Row(Standing.OTHER, "anything else: `UNKNOWN`, `FUTURE`, `ERROR`, or a state or flag "
        "this table does not name", Owner.ANYONE, _ANY, Does.NOTHING,
        "**nothing, ever**: it cannot tell", ("IDLE+DRAIN+INVALID_REG", EXAMPLE_REASON),
        "none", "none"),
)


def standing(node: NodeInfo) -> Standing:
    if node.base == "DOWN":
        return Standing.DOWN
    held = [FLAGS[f] for f in node.flags if f in FLAGS]
    if held:
        return min(held, key=list(Standing).index)
    if node.base not in IN_SERVICE or not node.flags <= PASSIVE | {"DRAIN"}:
        return Standing.OTHER
    return Standing.DRAINED if node.drained else Standing.UP


# an owner a standing has no row for takes this one's row (then ANYONE's)
FALLBACK = {Owner.GPUGUARD_GATED: Owner.GPUGUARD}


def row_for(at: Standing, owner: Owner) -> Row:
    """The table's row: the first for this standing naming this owner, else its
    FALLBACK's, else ANYONE's."""
    rows = [r for r in TABLE if r.standing == at]
    for who in (owner, FALLBACK.get(owner), Owner.ANYONE):
        found = next((r for r in rows if r.owner == who), None)
        if found is not None:
            return found
    raise AssertionError(f"no row for {at}")  # every standing has an ANYONE row


def render() -> str:
    """The table as docs/slurm.md shows it."""
    lines = ["| the node's state (scontrol's `State=`) | its reason | what health does |",
             "| --- | --- | --- |"]
    lines += [f"| {r.state} | {r.reason} | {r.why} |" for r in TABLE]
    return "\n".join(lines) + "\n"
