"""gsp.firmware: the kernel log's GSP lines that carry no Xid (GSP is the GPU System
Processor, where the driver's resource manager runs on Hopper and newer): RPC timeouts
rate-limited after Xid 119s, a GSP crash report, GSP that could not boot. Xid 119 and 120
themselves are xid.recent's; where a GPU's GSP lines come with one of them in the window,
this rule leaves the finding to xid.recent (one cause, one finding). The patterns and their
sources are in gpuguard/sources/kmsg.py.

One result per GPU (the line's PCI address names it) and one for the host where a line
names no GPU NVML lists: the boot failures name the driver's own GPU number ("GPU7"), not
NVML's index, so they are the host's (such a GPU is usually missing from NVML too)."""

from __future__ import annotations

from typing import Any

from gpuguard.judge.actions import GSP_KINDS
from gpuguard.judge.registry import CheckContext, Finding, PerGpu, host_check, ok, skipped
from gpuguard.judge.xids import (
    Grade,
    by_gpu,
    repair_words,
    repairs_for,
    select,
    span,
    window_words,
)

MEANING = {"rpc_timeout": "GSP RPC timeouts, rate-limited (the driver: the GPU likely needs "
                          "to be reset)",
           "crash": "GSP crash report (GSP-CrashCat)",
           "boot_failed": "GSP firmware could not boot (the GPU is not initialised)"}
WORDS = {"reset_gpu": "drain and reset the GPU (nvidia-smi -r -i <index>); power-cycle the "
                      "node if it comes back",
         "reboot": "drain and reboot the node (a cold power cycle where a warm reboot does "
                   "not clear it)"}
GSP_XIDS = (119, 120)


@host_check("gsp.firmware")
def firmware(ctx: CheckContext) -> Finding | PerGpu:
    log = ctx.snapshot.host.kernel_log.get()
    events = log.get("gsp")
    if events is None:
        return skipped("this kernel log summary has no GSP list (an older input)")
    groups = by_gpu(events, ctx.snapshot)
    xids = by_gpu(log["xids"], ctx.snapshot)
    gpus = {g.index: _judge(ctx, log, groups.get(g.index, []), xids.get(g.index, []), g.index)
            for g in ctx.snapshot.gpus}
    host = _judge(ctx, log, groups.get(None, []), xids.get(None, []), None) \
        if None in groups or not gpus else None
    return PerGpu(gpus, host)


def _grade(event: dict[str, Any]) -> Grade:
    action = GSP_KINDS[event["kind"]].value
    return Grade("critical", MEANING[event["kind"]], WORDS[action], action,
                 f"the kernel log's GSP line: {event['kind'].replace('_', ' ')}")


def _judge(ctx: CheckContext, log: dict[str, Any], events: list[dict[str, Any]],
           xids: list[dict[str, Any]], gpu: int | None) -> Finding:
    window_s = ctx.profile.xid_window_s
    window = window_words(log, window_s)
    # a GPU reset or a driver reload after a line clears it, where it asked for no more
    repairs = repairs_for(log, ctx.snapshot, gpu)
    chosen = select(events, log, window_s, _grade, repairs)
    counted = [{k: e.get(k) for k in ("kind", "pci", "rm_gpu", "seq", "age_s", "why")}
               | {"suggested": e["first"]} for e in chosen.counted]
    observed: dict[str, Any] = {"window": window, "counted": len(counted),
                                "aged_out": chosen.aged, "acknowledged": chosen.acknowledged,
                                "older_not_kept": log.get("gsp_dropped") or 0,
                                "cleared": chosen.cleared, "events": counted}
    if not counted:
        cleared = f" ({chosen.cleared} cleared by {repair_words(chosen.repair)})" \
            if chosen.repair is not None else ""
        return ok(f"no GSP error line {window}{cleared}", **observed)
    with_xid = sorted({e["xid"] for e in select(
        [x for x in xids if x["xid"] in GSP_XIDS], log, window_s,
        lambda e: Grade("critical", "", "", "reset_gpu"), repairs).counted})
    if with_xid:
        observed["events"] = []  # xid.recent's to act on: no action from here
        observed["with_xid"] = with_xid
        return ok(f"{len(counted)} GSP error line(s) {window}, with Xid "
                  f"{', '.join(map(str, with_xid))}: xid.recent reports them", **observed)
    return ctx.fail(_message(chosen.counted), **observed)


def _message(counted: list[dict[str, Any]]) -> str:
    kinds: dict[str, list[dict[str, Any]]] = {}
    for e in counted:
        kinds.setdefault(e["kind"], []).append(e)
    parts = []
    for _, events in sorted(kinds.items(), key=lambda kv: -GSP_KINDS[kv[0]].rank):
        last = events[-1]
        where = f"GPU{last['rm_gpu']} (the driver's number): " \
            if last.get("rm_gpu") is not None and not last.get("pci") else ""
        times = f" x{len(events)}" if len(events) > 1 else ""
        age = f", last {span(last['age_s'])} ago" if last["age_s"] is not None else ""
        parts.append(f"{where}{last['meaning']}{times}{age}: {last['action']}")
    return " | ".join(parts)
