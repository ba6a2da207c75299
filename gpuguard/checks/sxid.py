"""sxid.recent: NVSwitch SXid errors in the kernel log, graded by the catalog in
rules/sxid.yaml. As xid.recent: only events inside the window count (the profile's
xid_window, default since boot), and lines up to the sequence acknowledged with
`gpuguard xid ack` (one kernel log sequence for both) are left out.

An SXid line names the NVSwitch that logged it (its PCI address), not a GPU: without the
fabric manager's port map a switch link cannot be told to a GPU, so SXids are the host's
result, per switch in its message. Should a line ever name a GPU's own address, that GPU
gets the result, as with xid.recent."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from gpuguard.judge.actions import CATALOG_WORDS
from gpuguard.judge.registry import (
    CheckContext,
    Finding,
    PerGpu,
    host_check,
    ok,
    skipped,
    warning,
)
from gpuguard.judge.sxids import grade
from gpuguard.judge.xids import Selection, by_gpu, select, severest_first, span, window_words

SHOWN = 3  # (switch, SXid) pairs named in the message, the most severe first


@host_check("sxid.recent")
def recent(ctx: CheckContext) -> Finding | PerGpu:
    log = ctx.snapshot.host.kernel_log.get()
    events = log.get("sxids")
    if events is None:
        return skipped("this kernel log summary has no SXid list (an older input)")
    # (a malformed list never gets here: readings.py makes the kernel log an error reading)
    groups = by_gpu(events, ctx.snapshot, key="switch")
    return PerGpu({gpu: _judge(ctx, log, listed) for gpu, listed in groups.items()
                   if gpu is not None},
                  _judge(ctx, log, groups.get(None, [])))


def _judge(ctx: CheckContext, log: dict[str, Any], events: list[dict[str, Any]]) -> Finding:
    window_s = ctx.profile.xid_window_s
    catalog, source = ctx.ruleset.sxid_catalog, ctx.ruleset.sxid_catalog_source
    chosen = select(events, log, window_s,
                    lambda event: grade(event["sxid"], event.get("text"), catalog, source))
    counted, ignored = chosen.counted, chosen.ignored
    window = window_words(log, window_s)
    dropped = log.get("sxids_dropped") or 0
    observed = _observed(chosen, window, dropped, log.get("acked_seq"))
    if not counted:
        extra = f" ({ignored} informational)" if ignored else ""
        return ok(f"no NVSwitch SXid {window}{extra}", **observed)
    message = _message(counted, dropped)
    if any(e["severity"] == "critical" for e in counted):
        return ctx.fail(message, **observed)
    return warning(message, **observed)


def _observed(chosen: Selection, window: str, dropped: int, acked: int | None
              ) -> dict[str, Any]:
    """What the finding records: the counts of the selection and each counted SXid with its
    suggested action and why."""
    return {"window": window, "counted": len(chosen.counted), "aged_out": chosen.aged,
            "older_not_kept": dropped, "not_counted": chosen.ignored, "acked_seq": acked,
            "events": [{**{k: e.get(k) for k in ("sxid", "switch", "link", "severity", "seq",
                                                  "age_s", "why")},
                        "suggested": CATALOG_WORDS[e["first"]].value}
                       for e in chosen.counted]}


def _message(counted: list[dict[str, Any]], dropped: int) -> str:
    """The most severe (NVSwitch, SXid) pairs, how many more, and the lines the log summary
    did not keep."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for e in counted:
        groups[(str(e.get("switch") or "unknown switch"), e["sxid"])].append(e)
    keyed = {n: group for n, group in enumerate(groups.values())}
    ranked = severest_first(keyed, lambda word: CATALOG_WORDS[word].rank)
    parts = [_part(group) for _, group in ranked[:SHOWN]]
    if len(ranked) > SHOWN:
        parts.append(f"and {len(ranked) - SHOWN} more (switch, SXid) pair(s) (observed.events)")
    message = " | ".join(parts)
    if dropped:
        message += f" (and {dropped} older SXid line(s) not kept)"
    return message


def _part(group: list[dict[str, Any]]) -> str:
    """One SXid of one NVSwitch: its links, how often, and the latest line's meaning, age
    and action."""
    last = group[-1]
    switch = str(last.get("switch") or "unknown switch")
    links = sorted({e["link"] for e in group if isinstance(e.get("link"), int)})
    on = f" link {', '.join(map(str, links))}" if links else ""
    age = f", last {span(last['age_s'])} ago" if last["age_s"] is not None else ""
    times = f" x{len(group)}" if len(group) > 1 else ""
    return (f"NVSwitch {switch}{on}: SXid {last['sxid']}{times} ({last['meaning']}){age}: "
            f"{last['action']}")
