"""What `gpuguard slurm health` decides for its node (docs/slurm.md), from the verdict
(the daemon's or a cold check's results, as JSON dicts) and the node as sinfo shows it.

- Drain only for a critical result whose rule counts for failover or whose suggested
  action is reset_gpu, reboot or inspect_hardware; never for a warning, an unknown or
  fleet.brake itself. The reason is `gpuguard: <action>: <rule> [GPU n]`, at most 80
  characters, no paths.
- Ownership: only a drain whose reason gpuguard wrote (the prefix), or Slurm's own
  "Prolog error"/"Epilog error" drain after a failure gpuguard recorded, is ever rewritten
  or resumed. Anything else (an administrator's, another tool's, an administrator's
  re-drain of a gpuguard drain) is left as it is, whatever gpuguard sees.
- Resume only when the rule the reason names is ok now on that GPU: unknown or missing is
  no evidence that the finding is gone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gpuguard.integrations.slurm_ctl import NodeInfo
from gpuguard.judge.actions import Action

PREFIX = "gpuguard:"
REASON_MAX = 80
DRAIN_ACTIONS = (Action.RESET_GPU, Action.REBOOT, Action.INSPECT_HARDWARE)
# Slurm's own reasons when a prolog or epilog exits non-zero (it drains and requeues)
SLURM_SCRIPT_REASONS = ("Prolog error", "Epilog error")
BRAKE_RULE = "fleet.brake"
_REASON = re.compile(r"^gpuguard: (?P<action>[a-z_]+): (?P<rule>[a-z0-9_.]+)"
                     r"(?: GPU (?P<gpu>\d+))?")


@dataclass
class Plan:
    do: str  # drain, update, resume, keep, none
    reason: str | None
    why: str


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
    """`gpuguard: <action>: <rule> [GPU n]`, and how many more, in at most 80 characters."""
    first = findings[0]
    action = first.get("action") or "none"
    action = action if action != "none" else "failover"  # a failover rule without one
    gpu = gpu_of(first)
    text = f"{PREFIX} {action}: {first.get('rule')}" + (f" GPU {gpu}" if gpu is not None
                                                          else "")
    if len(findings) > 1:
        text += f" (+{len(findings) - 1} more)"
    return text[:REASON_MAX]


def owned(node: NodeInfo, script_failure_time: float | None) -> bool:
    """Whether gpuguard wrote this node's drain (see the module's doc)."""
    if not node.drained:
        return False
    if node.reason.startswith(PREFIX):
        return True
    if node.reason in SLURM_SCRIPT_REASONS and script_failure_time is not None:
        # Slurm drained it after gpuguard's prolog or epilog failed (its time is Slurm's,
        # wall clock, to the second: a minute's slack for the two clocks of one host)
        return node.reason_time is None or node.reason_time >= script_failure_time - 60
    return False


def named_in(reason: str) -> tuple[str, int | None] | None:
    """The rule and GPU a gpuguard reason names."""
    found = _REASON.match(reason)
    if found is None:
        return None
    return found["rule"], int(found["gpu"]) if found["gpu"] else None


def finding_gone(results: list[dict[str, Any]], rule: str, gpu: int | None) -> tuple[bool, str]:
    """Whether `rule` is ok now on `gpu` (every GPU of it for None), and why not."""
    mine = [r for r in results if r.get("rule") == rule and (gpu is None or gpu_of(r) == gpu)]
    if not mine:
        return False, f"no result of {rule}{'' if gpu is None else f' on GPU {gpu}'} to tell"
    bad = [r for r in mine if r.get("status") != "ok"]
    if bad:
        return False, f"{rule} is {bad[0].get('status')}: {str(bad[0].get('message'))[:120]}"
    return True, f"{rule} is ok"


def plan(results: list[dict[str, Any]], failover_rules: set[str], node: NodeInfo,
         script_failure_time: float | None, taken_over: str | None = None) -> Plan:
    """What to do with the node. `taken_over`: the reason to give a Prolog/Epilog error
    drain of gpuguard's (its recorded finding)."""
    findings = drain_worthy(results, failover_rules)
    wanted = reason_for(findings) if findings else None
    if node.drained and not owned(node, script_failure_time):
        return Plan("none", None, f"drained by someone else ({node.reason or 'no reason'}): "
                                  "not gpuguard's to change")
    if not node.drained:
        if wanted is None:
            return Plan("none", None, "nothing to drain for")
        return Plan("drain", wanted, f"{len(findings)} finding(s) drain the node")
    if not node.reason.startswith(PREFIX):  # Slurm's Prolog/Epilog error, after ours
        reason = wanted or taken_over
        if reason is None:
            return Plan("keep", None, "a prolog or epilog failure without a recorded finding")
        return Plan("update", reason, f"taking over Slurm's {node.reason!r}: gpuguard's failure")
    if wanted is not None:
        if wanted == node.reason:
            return Plan("keep", None, "the finding is still there")
        return Plan("update", wanted, "the finding changed")
    named = named_in(node.reason)
    if named is None:
        return Plan("keep", None, f"cannot read the rule in {node.reason!r}")
    gone, why = finding_gone(results, *named)
    return Plan("resume" if gone else "keep", None, why)
