"""When `gpuguard slurm health` may resume a node it drained: judged on the whole verdict,
never on the one rule and GPU index its reason names (docs/slurm.md#resuming).

At the drain, health keeps a record in the state dir (integrations/slurm/state.py): the
findings it drained for and the GPUs present then, each by identity (UUID and bus id),
since an NVML index names another board after a GPU falls off the bus. It resumes only
when all of these hold; when it cannot tell, it does not resume:

- there is a record (none: the state dir was lost or never written; a person resumes);
- every GPU of the drain is in the verdict: those present then and those the GPUs-seen
  memory (assess/gpus_seen.py) already missed then; one an ack of gpu.count has taken
  out since (the memory's `forgotten`) is no longer waited for;
- each finding drained for has results on its board, all ok;
- no drain-capable rule is unknown, or missing on a GPU where it reports on others;
- a kernel-log finding drained for is not "ok" only because the ring buffer wrapped
  (records lost and no repair seen).

A drain-capable rule: one that counts for failover, one drained for, or one whose
family's critical action (judge/actions.py FAMILY_DEFAULT) is reset_gpu or worse; a
family gpuguard does not know (a site's rule) counts, since it cannot tell.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from gpuguard.integrations.slurm.gate import Attempt
from gpuguard.judge.actions import FAMILY_DEFAULT, Action

_DRAINS = (Action.RESET_GPU, Action.REBOOT, Action.INSPECT_HARDWARE)


@dataclass
class DrainRecord:
    reason: str
    findings: list[dict[str, Any]]  # {"rule", "gpu": {"index", "uuid", "pci_bus_id"}|None}
    # {"index", "uuid", "pci_bus_id"} and, where it was read, "serial" (the board's)
    gpus: list[dict[str, Any]] = field(default_factory=list)
    # when gpuguard drained (or last rewrote the reason for a finding), and in which boot:
    # the return-to-service gate counts qualifications after it (integrations/slurm/
    # gate.py). None in a record of a gpuguard older than the gate: health sets it
    drained_at: float | None = None
    boot_id: str | None = None
    attempt: Attempt | None = None  # the qualification health started last

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason, "findings": self.findings, "gpus": self.gpus,
                "drained_at": self.drained_at, "boot_id": self.boot_id,
                "attempt": None if self.attempt is None else self.attempt.to_json()}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> DrainRecord | None:
        """None for a record this gpuguard cannot read (it then does not resume). One
        without the gate's fields (an older gpuguard's) is read as it was written."""
        reason, findings, gpus = raw.get("reason"), raw.get("findings"), raw.get("gpus")
        if not isinstance(reason, str) or not isinstance(findings, list) \
                or not isinstance(gpus, list) or not findings:
            return None  # a drain is always for a finding: an empty list is not ours
        if not all(isinstance(f, dict) and isinstance(f.get("rule"), str)
                   and isinstance(f.get("gpu"), dict | None) for f in findings):
            return None
        if not all(isinstance(g, dict) and isinstance(g.get("serial"), str | None)
                   for g in gpus):
            return None
        gate = _gate_fields(raw)
        return None if gate is None else cls(reason, findings, gpus, *gate)


def _gate_fields(raw: dict[str, Any]
                 ) -> tuple[float | None, str | None, Attempt | None] | None:
    """The drain's time, boot and attempt as to_json wrote them (each may be None: an
    older gpuguard's record); None when one is there and is not."""
    drained_at, boot, attempt = raw.get("drained_at"), raw.get("boot_id"), raw.get("attempt")
    if drained_at is not None and not (isinstance(drained_at, int | float)
                                       and not isinstance(drained_at, bool)
                                       and math.isfinite(drained_at)):
        return None
    kept = None if attempt is None else Attempt.from_json(attempt)
    if not isinstance(boot, str | None) or (attempt is not None and kept is None):
        return None
    return None if drained_at is None else float(drained_at), boot, kept


def identity(gpu: Any) -> dict[str, Any] | None:
    """A result's GPU as the record keeps it (None: a host result)."""
    if not isinstance(gpu, dict):
        return None
    return {"index": gpu.get("index"), "uuid": gpu.get("uuid") or None,
            "pci_bus_id": gpu.get("pci_bus_id") or None}


def same_gpu(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """By UUID where both have one, else by bus id; never by index alone."""
    if a.get("uuid") and b.get("uuid"):
        return str(a["uuid"]).lower() == str(b["uuid"]).lower()
    return bool(a.get("pci_bus_id")) and \
        str(a["pci_bus_id"]).lower() == str(b.get("pci_bus_id") or "").lower()


def gpus_in(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every GPU the verdict names, once each."""
    seen: list[dict[str, Any]] = []
    for r in results:
        gpu = identity(r.get("gpu"))
        if gpu is not None and not any(same_gpu(gpu, s) or gpu == s for s in seen):
            seen.append(gpu)
    return seen


def missing_in(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The GPUs gpu.count names gone (seen since boot, or in an earlier boot, and not
    listed now), as the record keeps a GPU."""
    out = []
    for r in results:
        missing = (r.get("observed") or {}).get("missing") if r.get("rule") == "gpu.count" \
            else None
        for gpu in missing if isinstance(missing, list) else []:
            kept = identity(gpu)
            if kept is not None and (kept["uuid"] or kept["pci_bus_id"]):
                out.append(kept)
    return out


def record_of(reason: str, findings: list[dict[str, Any]], results: list[dict[str, Any]],
              before: DrainRecord | None, *, now: float | None = None,
              boot_id: str | None = None,
              serials: dict[str, str] | None = None) -> DrainRecord:
    """The record of a drain (or of a changed reason: a GPU present at the first drain
    stays in it, so one that fell off since is still missed), with the GPUs the verdict
    already misses: a node drained for a vanished GPU waits for it too. Each GPU with
    its serial where `serials` (UUID -> serial) has it; the qualification health
    started last is kept (a run still going is not forgotten)."""
    gpus = gpus_in(results)
    for old in [*missing_in(results), *(before.gpus if before is not None else [])]:
        if not any(same_gpu(old, g) for g in gpus):
            gpus.append(old)
    known = {str(k).lower(): v for k, v in (serials or {}).items()}
    for gpu in gpus:
        serial = known.get(str(gpu.get("uuid") or "").lower())
        if serial and not gpu.get("serial"):
            gpu["serial"] = serial
    kept = [{"rule": f.get("rule"), "gpu": identity(f.get("gpu"))} for f in findings]
    return DrainRecord(reason, kept, gpus, now, boot_id,
                       before.attempt if before is not None else None)


def with_reason(record: DrainRecord, reason: str) -> DrainRecord:
    """The same drain under another reason (the gate's finding): its findings, GPUs and
    time stay, so the next run still judges what it drained for."""
    return replace(record, reason=reason)


def drain_capable(rule: str, failover_rules: set[str], drained_for: set[str]) -> bool:
    if rule in failover_rules or rule in drained_for:
        return True
    family = FAMILY_DEFAULT.get(rule.split(".", 1)[0])
    return family is None or family[0] in _DRAINS


def _name(gpu: dict[str, Any]) -> str:
    return f"GPU {gpu.get('uuid') or '?'} ({gpu.get('pci_bus_id') or 'no bus id'})"


def _missing_gpu(record: DrainRecord, now: list[dict[str, Any]]) -> str | None:
    for gpu in record.gpus:
        if not any(same_gpu(gpu, g) for g in now):
            return f"{_name(gpu)}, present at the drain, is missing from the verdict"
    return None


def still_expected(record: DrainRecord | None,
                   forgotten: list[dict[str, Any]]) -> DrainRecord | None:
    """The record without the GPUs an ack of gpu.count has taken out since (the GPUs-seen
    memory forgot them: the way back with fewer GPUs, docs/slurm.md)."""
    if record is None or not forgotten:
        return record
    kept = [g for g in record.gpus if not any(same_gpu(g, f) for f in forgotten)]
    return replace(record, gpus=kept)


def _finding_left(record: DrainRecord, results: list[dict[str, Any]]) -> str | None:
    for found in record.findings:
        gpu = found.get("gpu")
        mine = [r for r in results if r.get("rule") == found["rule"] and _on(r, gpu)]
        where = "" if gpu is None else f" on {_name(gpu)}"
        if not mine:
            return f"no result of {found['rule']}{where} to tell"
        bad = [r for r in mine if r.get("status") != "ok"]
        if bad:
            return f"{found['rule']}{where} is {bad[0].get('status')}: " \
                   f"{str(bad[0].get('message'))[:120]}"
        blind = [r for r in mine if _narrowed(r)]
        if blind:
            return f"{found['rule']}{where} is ok only on what the kernel log still holds " \
                   f"({(blind[0].get('observed') or {}).get('records_lost')} earlier " \
                   "record(s) overwritten) and no repair was seen: the fault drained for " \
                   "may be among the lost lines"
    return None


def _on(result: dict[str, Any], gpu: dict[str, Any] | None) -> bool:
    """Is the result about this board (None: the host)?"""
    if gpu is None:
        return identity(result.get("gpu")) is None
    return isinstance(result.get("gpu"), dict) and same_gpu(gpu, result["gpu"])


def _narrowed(result: dict[str, Any]) -> bool:
    """An ok of a kernel-log rule on a wrapped ring buffer (sources/kmsg_kept.py) with no
    repair seen: the line it drained for may simply be gone, which is no evidence that the
    fault is (a daemon restarted after the wrap, or a cold check, says ok so)."""
    observed = result.get("observed") or {}
    return bool(observed.get("records_lost")) and not observed.get("cleared")


def _unknown_or_missing(results: list[dict[str, Any]], failover_rules: set[str],
                        drained_for: set[str]) -> str | None:
    gpus = gpus_in(results)
    by_rule: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        rule = str(r.get("rule"))
        if not drain_capable(rule, failover_rules, drained_for):
            continue
        if r.get("status") == "unknown":
            where = "" if r.get("gpu") is None else f" on GPU {(r['gpu'] or {}).get('index')}"
            return f"{rule}{where} is unknown: {str(r.get('message'))[:120]}"
        gpu = identity(r.get("gpu"))
        if gpu is not None:
            by_rule.setdefault(rule, []).append(gpu)
    for rule, seen in sorted(by_rule.items()):
        for gpu in gpus:
            if not any(same_gpu(gpu, s) or gpu == s for s in seen):
                return f"no result of {rule} on GPU {gpu.get('index')} ({_name(gpu)})"
    return None


def may_resume(results: list[dict[str, Any]], failover_rules: set[str],
               record: DrainRecord | None) -> tuple[bool, str]:
    """Whether gpuguard may resume its drain now, and why (see the module's doc)."""
    if record is None:
        return False, "no record of what gpuguard drained for (the state dir's): " \
                      "cannot tell, not resuming (resume by hand)"
    drained_for = {str(f["rule"]) for f in record.findings}
    why = _missing_gpu(record, gpus_in(results)) or _finding_left(record, results) \
        or _unknown_or_missing(results, failover_rules, drained_for)
    if why is not None:
        return False, why
    return True, f"{', '.join(sorted(drained_for)) or 'the finding'} ok on every GPU " \
                 "present at the drain, nothing unknown"
