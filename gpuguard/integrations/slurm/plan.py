"""What `gpuguard slurm health` decides for its node (docs/slurm.md), from the verdict
(the daemon's or a cold check's results, as JSON dicts) and the node as scontrol shows it.

- Drain only for a critical result whose rule counts for failover or whose suggested
  action is reset_gpu, reboot or inspect_hardware; never for a warning, an unknown or
  fleet.brake itself. The reason is gpuguard's grammar (integrations/slurm/reason.py:
  `gpuguard: <action>: <rule>[~] [GPU n] [(+k more)]`, at most 80 characters).
- What it may do is the state table's (integrations/slurm/states.py), by the node's state
  and flags and who wrote its reason: gpuguard (its grammar, matched whole: an
  administrator's "gpuguard: ... RMA-4711 keep out" is theirs), or Slurm's own "Prolog
  error"/"Epilog error" drain set close after a failure gpuguard recorded, or anyone else.
  A DOWN, FAIL, MAINT, powered-down or someone else's node is left as it is.
- Resume only on the whole verdict (integrations/slurm/resume.py): nothing that would
  drain, no drain-capable rule unknown or missing on any GPU, every GPU present at the
  drain still there (by UUID or bus id), and each finding drained for ok on its board.
- A drain for reset_gpu, reboot or inspect_hardware resumes only after that and a passing
  qualification (integrations/slurm/gate.py: the Step health read for it); without one
  known it is kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuguard.integrations.slurm import reason as grammar
from gpuguard.integrations.slurm import states
from gpuguard.integrations.slurm.ctl import NodeInfo
from gpuguard.integrations.slurm.gate import Step, Verb
from gpuguard.integrations.slurm.gate import gated as gate_applies
from gpuguard.integrations.slurm.resume import DrainRecord, may_resume
from gpuguard.judge.actions import Action

PREFIX = grammar.PREFIX
REASON_MAX = grammar.REASON_MAX
CUT_MARK = grammar.CUT_MARK
DRAIN_ACTIONS = (Action.RESET_GPU, Action.REBOOT, Action.INSPECT_HARDWARE)
# Slurm's own reasons when a prolog or epilog exits non-zero (it drains and requeues)
SLURM_SCRIPT_REASONS = ("Prolog error", "Epilog error")
# Slurm drains right after the script exits; its reason time is slurmctld's wall clock to
# the second: a drain this close after gpuguard's recorded failure is that failure's
SCRIPT_DRAIN_BEFORE_S = 60.0
SCRIPT_DRAIN_AFTER_S = 300.0
BRAKE_RULE = "fleet.brake"


@dataclass
class Plan:
    do: str  # drain, update, resume, keep, none
    reason: str | None
    why: str
    step: Step | None = None  # the gate's, where it decided (health carries it out)


def gpu_of(result: dict[str, Any]) -> int | None:
    gpu = result.get("gpu")
    return gpu.get("index") if isinstance(gpu, dict) else None


def drain_worthy(results: list[dict[str, Any]], failover_rules: set[str]) -> list[dict[str, Any]]:
    """The critical results that drain, most severe action first."""
    actions = {a.value: a for a in Action}
    chosen = [r for r in results
              if r.get("status") == "critical" and r.get("rule") != BRAKE_RULE
              and (r.get("rule") in failover_rules
                   or actions.get(r.get("action", "")) in DRAIN_ACTIONS)]
    return sorted(chosen, key=lambda r: (-actions.get(r.get("action", ""), Action.NONE).rank,
                                         r.get("rule", ""), gpu_of(r) or -1))


def reason_for(findings: list[dict[str, Any]]) -> str:
    """`gpuguard: <action>: <rule> [GPU n]`, and how many more, in at most 80 characters:
    the rule id is what gives way (cut and marked), never the GPU or the count."""
    first = findings[0]
    action = first.get("action") or "none"
    word = action if action != "none" else grammar.FAILOVER  # a failover rule without one
    return grammar.Reason.of(str(word), str(first.get("rule")), gpu_of(first),
                             len(findings) - 1).text()


def script_drain_ours(node: NodeInfo, script_failure_time: float | None) -> bool:
    """Slurm's "Prolog error"/"Epilog error" drain set close after gpuguard's recorded
    failure (no reason time, or one far from it: someone else's script)."""
    if node.reason not in SLURM_SCRIPT_REASONS or script_failure_time is None \
            or node.reason_time is None:
        return False
    return script_failure_time - SCRIPT_DRAIN_BEFORE_S <= node.reason_time \
        <= script_failure_time + SCRIPT_DRAIN_AFTER_S


def owner(node: NodeInfo, script_failure_time: float | None) -> states.Owner:
    """Who wrote the node's reason (see the module's doc)."""
    if not node.reason:
        return states.Owner.NONE
    if ours(node.reason):
        return states.Owner.GPUGUARD_GATED if gate_applies(node.reason) else \
            states.Owner.GPUGUARD
    if script_drain_ours(node, script_failure_time):
        return states.Owner.SCRIPT
    return states.Owner.ANYONE


def ours(reason: str) -> bool:
    """Exactly gpuguard's grammar, nothing before or after it."""
    return grammar.ours(reason)


def named_in(reason: str) -> tuple[str, int | None] | None:
    """The rule (ending in `~` when cut) and GPU a gpuguard reason names."""
    found = grammar.parse(reason)
    if found is None:
        return None
    return found.rule + (CUT_MARK if found.cut else ""), found.gpu


def plan(results: list[dict[str, Any]], failover_rules: set[str], node: NodeInfo,
         script_failure_time: float | None, taken_over: str | None = None,
         record: DrainRecord | None = None, gate: Step | None = None) -> Plan:
    """What to do with the node. `taken_over`: the reason to give a Prolog/Epilog error
    drain of gpuguard's (its recorded finding); `record`: what gpuguard drained for
    (the state dir's, integrations/slurm/resume.py), without which it never resumes;
    `gate`: the qualification's step for a gated drain (integrations/slurm/gate.py),
    without which that drain is not resumed."""
    findings = drain_worthy(results, failover_rules)
    wanted = reason_for(findings) if findings else None
    row = states.row_for(states.standing(node), owner(node, script_failure_time))
    if row.does == states.Does.NOTHING:
        return Plan("none", None, _untouched(node, row))
    if row.does == states.Does.DRAIN:
        if wanted is None:
            return Plan("none", None, "nothing to drain for")
        return Plan("drain", wanted, f"{len(findings)} finding(s) drain the node")
    if row.does == states.Does.TAKE_OVER:  # Slurm's Prolog/Epilog error, after ours
        reason = wanted or taken_over
        if reason is None:
            return Plan("keep", None, "a prolog or epilog failure without a recorded finding")
        return Plan("update", reason, f"taking over Slurm's {node.reason!r}: gpuguard's failure")
    if wanted is not None:
        if wanted == node.reason:
            return Plan("keep", None, "the finding is still there")
        return Plan("update", wanted, "the finding changed")
    gone, why = may_resume(results, failover_rules, record)
    if not gone or row.does == states.Does.OWN:
        return Plan("resume" if gone else "keep", None, why)
    return gated_plan(node, why, gate)


def gated_plan(node: NodeInfo, why: str, gate: Step | None) -> Plan:
    """The passive verdict passes a gated drain: the qualification decides."""
    if gate is None:
        return Plan("keep", None, f"{why}; no qualification known: not resuming")
    if gate.verb in (Verb.RESUME, Verb.OFF):
        return Plan("resume", None, f"{why}; {gate.why}", gate)
    if gate.verb == Verb.FAIL and gate.reason is not None and gate.reason != node.reason:
        return Plan("update", gate.reason, gate.why, gate)
    return Plan("keep", None, gate.why, gate)


def _untouched(node: NodeInfo, row: states.Row) -> str:
    """Why the table leaves this node alone (the words health's plan line had before
    the table, for a drain of someone else's)."""
    if row.standing == states.Standing.DRAINED:
        return f"drained by someone else ({node.reason or 'no reason'}): " \
               "not gpuguard's to change"
    if row.standing == states.Standing.UP:
        return f"its reason is someone else's ({node.reason}): not gpuguard's to change"
    return f"{node.state} ({row.standing}, reason {node.reason or 'none'}): Slurm's or an " \
           "administrator's, not gpuguard's to change"
