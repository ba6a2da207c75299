"""A supervised service's GPU errors tied to the Xids of its GPUs (issue 23,
service.gpu_errors): a CUDA error its own log showed (gpuguard/daemon/service_logs.py)
within `within` seconds, either side, of an Xid on one of its GPUs takes that Xid's action
(the catalog's, of_xid); without such an Xid it is the application's (restart_app).

Bytes of the log a read skipped (gpuguard/sources/service_logs.py's bound) make it unknown
for `window` seconds, like an error would have made it failed: never a silent ok.

Times: an error's age is counted from when the daemon read it (its monotonic clock; the
line was written within the cycle before), an Xid's from the kernel log's own stamp at
its read in the same cycle."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuguard.judge.actions import CATALOG_WORDS, Action
from gpuguard.judge.xids import by_gpu, grade, select
from gpuguard.model.derived import held_by
from gpuguard.model.results import NAMES

if TYPE_CHECKING:
    from gpuguard.model.rule import XidEntry
    from gpuguard.model.snapshot import Snapshot


@dataclass(frozen=True)
class ErrorJudgement:
    status: str  # ok, unknown or failed
    message: str
    observed: dict[str, Any] = field(default_factory=dict)


def judge(name: str, entry: dict[str, Any], snapshot: Snapshot,
          catalog: dict[int, XidEntry], window: float, within: float) -> ErrorJudgement:
    log = entry["log"]
    now = float(log.get("now") or 0.0)
    recent = [e for e in log.get("errors") or [] if now - float(e["seen"]) <= window]
    if not recent:
        return _without_errors(log, now, window)
    xids = xids_of(snapshot, gpus_of(snapshot, entry), catalog)
    pairs = [(e, tied(now - float(e["seen"]), xids, within)) for e in recent]
    # an error not tied to the GPU, read in a run that has since restarted: mended
    current = [(e, x) for e, x in pairs
               if x is not None or e.get("run") in (None, entry.get("identity"))]
    if not current:
        return ErrorJudgement("ok", f"{len(recent)} GPU error(s) in its log, none tied to an Xid, "
                       "and it has restarted since (the application's fault, mended)")
    error, xid = max(current, key=lambda p: (_rank(p[1]), p[0]["seen"]))
    age, line = now - float(error["seen"]), str(error["line"])[:300]
    if xid is None:
        why = ("the kernel log was not read: whether an Xid came with it is not known"
               if xids is None else f"no Xid on its GPUs within {within:g} s: the "
               "application's fault")
        return ErrorJudgement("failed", f"{error['kind']} in its log {age:.0f} s ago ({why}): "
                       f"{line!r}", {"suggested": Action.RESTART_APP.value, "why": why,
                                     "errors": recent, NAMES: [f"{name}: {error['kind']}"]})
    why = (f"Xid {xid['xid']} on GPU {xid['gpu']} {abs(xid['apart_s']):.0f} s "
           f"{'before' if xid['apart_s'] >= 0 else 'after'} the engine's {error['kind']}")
    return ErrorJudgement("failed", f"{error['kind']} in its log {age:.0f} s ago with {why}: the "
                   f"Xid's action, {xid['action']}: {line!r}",
                   {"suggested": xid["action"], "why": why, "errors": recent, "xid": xid,
                    NAMES: [f"{name}: {error['kind']} with Xid {xid['xid']}"]})


def _without_errors(log: dict[str, Any], now: float, window: float) -> ErrorJudgement:
    """No error read within the window: ok only where the log was read, every byte."""
    if log.get("error"):
        return ErrorJudgement("unknown", f"its log ({log.get('source')}) could not be read: "
                       f"{log['error']}")
    # bytes a read skipped (a flood past its bound) may have held an error: not an ok
    skips = [s for s in log.get("skips") or [] if now - float(s["seen"]) <= window]
    if skips:
        last = skips[-1]
        return ErrorJudgement("unknown", f"part of its log ({log.get('source')}) was not read "
                       f"{now - float(last['seen']):.0f} s ago: {last['what']}",
                       {"skips": skips})
    return ErrorJudgement("ok", f"no GPU error in its log ({log.get('source')})")


def xids_of(snapshot: Snapshot, gpus: set[int] | None, catalog: dict[int, XidEntry]
            ) -> list[dict[str, Any]] | None:
    """The kernel log's Xids on `gpus` (None: every GPU, and the lines that name no GPU
    NVML lists, a GPU that fell off the bus), each with its age in seconds at the log's
    read and the catalog's action, through xid.recent's own per-GPU selection
    (judge/xids.py: acknowledged ones and those graded `ignore`, Xid 45 or 63, left out:
    they are not what broke the engine); None when the kernel log was not read."""
    if not snapshot.host.kernel_log.is_ok:
        return None
    log = snapshot.host.kernel_log.get()
    found = []
    for gpu, events in by_gpu(log.get("xids") or [], snapshot).items():
        if gpus is not None and gpu not in gpus:
            continue
        chosen = select(events, log, None,
                        lambda event: grade(event["xid"], event.get("text"), catalog))
        for event in chosen.counted:
            action = CATALOG_WORDS[event["first"]]
            if event["age_s"] is None or action is Action.NONE:
                continue
            found.append({"xid": event["xid"], "gpu": gpu, "pci": event.get("pci"),
                          "age_s": float(event["age_s"]), "action": action.value})
    return found


def gpus_of(snapshot: Snapshot, entry: dict[str, Any]) -> set[int] | None:
    """The service's GPUs: its `gpus:`, else those its processes hold memory on, else
    None (every GPU)."""
    if entry.get("gpus") is not None:
        return set(entry["gpus"])
    pids = set(entry.get("pids") or [])
    held = {gpu.index for gpu in snapshot.gpus
            if gpu.compute_processes.is_ok and held_by(gpu, pids)}
    return held or None


def tied(age: float, xids: list[dict[str, Any]] | None, within: float
         ) -> dict[str, Any] | None:
    """The most severe Xid within `within` seconds of an error `age` seconds old;
    `apart_s` > 0: the Xid came first."""
    near = [{**x, "apart_s": x["age_s"] - age} for x in xids or []
            if abs(x["age_s"] - age) <= within]
    return max(near, key=lambda x: Action(x["action"]).rank, default=None)


def _rank(xid: dict[str, Any] | None) -> int:
    return -1 if xid is None else Action(xid["action"]).rank
