"""host.*: the host around the GPUs: memory (available, swap, OOM kills) and disk space.

Both judge one host, so each gives one result (as driver.* does); host.disk names every
path it judged in its message and its `observed`. A path that is not configured gives no
entry, and no entry at all is a skipped rule, never a warning.
"""

from __future__ import annotations

from typing import Any

from gpuguard.judge.registry import (
    CheckContext,
    Finding,
    critical,
    host_check,
    ok,
    skipped,
    unknown,
    warning,
)
from gpuguard.judge.xids import Grade, select, span
from gpuguard.model.results import Status

GIB = 1024**3


def _gib(size: int) -> str:
    return f"{size / GIB:.1f} GiB"


def _percent(part: int, whole: int) -> float:
    return 100.0 * part / whole if whole else 100.0


@host_check("host.memory", thresholds=("available_warning_percent",
                                       "available_critical_percent",
                                       "swap_used_warning_percent",
                                       "swap_available_below_percent", "oom_window_s"))
def memory(ctx: CheckContext) -> Finding:
    host = ctx.snapshot.host
    if host.host_memory.state == "not_supported":  # `check` without --host-resources: say so
        return skipped(host.host_memory.error or "host memory is not read here")
    sizes = host.host_memory.get()
    problems: list[tuple[Status, str]] = []
    notes: list[str] = []  # said in the message, never a warning
    available = _percent(sizes["available_bytes"], sizes["total_bytes"])
    observed: dict[str, Any] = {"available_percent": round(available, 1), **sizes}
    text = (f"{_gib(sizes['available_bytes'])} of {_gib(sizes['total_bytes'])} available "
            f"({available:.1f} %)")
    if available < ctx.threshold("available_critical_percent"):
        problems.append((Status.CRITICAL, f"only {text}"))
    elif available < ctx.threshold("available_warning_percent"):
        problems.append((Status.WARNING, f"only {text}"))
    if sizes["swap_total_bytes"]:
        swap = _percent(sizes["swap_used_bytes"], sizes["swap_total_bytes"])
        observed["swap_used_percent"] = round(swap, 1)
        # Used swap alone is no shortage: pages pushed out once (the page cache of a model
        # load) stay in swap until touched, for weeks, on a host with plenty available.
        # Swap filling while available memory is low is: the next load goes to the disk.
        if swap > ctx.threshold("swap_used_warning_percent") \
                and available < ctx.threshold("swap_available_below_percent"):
            # the memory part is said once: by its own warning, or here as the reason
            low = "" if problems else f" with {text}"
            problems.append((Status.WARNING, f"swap {swap:.0f} % in use "
                             f"({_gib(sizes['swap_used_bytes'])} of "
                             f"{_gib(sizes['swap_total_bytes'])}){low}"))

    window_s = float(ctx.threshold("oom_window_s"))
    log = host.kernel_log
    log_problem: str | None = None
    if log.is_ok:
        summary = log.get()
        # Not hidden by `gpuguard xid ack` (that acknowledges GPU faults); the window ages
        # them out.
        chosen = select(summary.get("ooms", []), {**summary, "acked_seq": None}, window_s,
                        lambda _: Grade("warning", "out of memory", ""))
        kills = chosen.counted
        observed["oom_kills"] = [{k: e.get(k) for k in ("pid", "process", "scope", "cgroup",
                                                         "seq", "age_s")} for e in kills]
        # A kill at a cgroup's own memory limit (a container's --memory, a unit's
        # MemoryMax=) says that cgroup is too small, not that the host is short of memory:
        # named here, never a warning of this rule. A kill whose lines do not say its
        # scope counts as the host's.
        host_kills = [e for e in kills if e.get("scope") != "cgroup"]
        cgroup_kills = [e for e in kills if e.get("scope") == "cgroup"]
        dropped = summary.get("ooms_dropped") or 0
        if host_kills:
            problems.append((Status.WARNING, _kills_text(host_kills, "OOM kill(s)", window_s,
                                                         dropped)))
        if cgroup_kills:
            notes.append(_kills_text(cgroup_kills, "OOM kill(s) at a cgroup's own memory "
                                     "limit (not the host's memory)", window_s,
                                     0 if host_kills else dropped))
    elif log.state == "error":
        log_problem = f"cannot read the kernel log for OOM kills: {log.error}"
    else:
        observed["oom_kills"] = None  # no kernel log in this input: kills not judged

    if problems:
        worst = max((status for status, _ in problems), key=lambda s: s.rank)
        message = "; ".join([*(words for _, words in problems), *notes])
        if log_problem:
            message += f" ({log_problem})"
        return critical(message, **observed) if worst is Status.CRITICAL \
            else warning(message, **observed)
    if log_problem:
        return unknown(f"{text}; {log_problem}", **observed)
    if observed.get("oom_kills") is None:
        return ok(text, **observed)
    which = "host " if notes else ""
    return ok("; ".join([f"{text}, no {which}OOM kill in the last {span(window_s)}", *notes]),
              **observed)


def _kills_text(kills: list[dict[str, Any]], what: str, window_s: float, dropped: int) -> str:
    victims = [f"{e.get('process') or '?'} (pid {e['pid']}"
               + (f", cgroup {e['cgroup']}" if e.get("scope") == "cgroup" and e.get("cgroup")
                  else "")
               + (f", {span(e['age_s'])} ago" if e.get("age_s") is not None else "") + ")"
               for e in kills[-3:]]
    more = f" and {len(kills) - 3} earlier" if len(kills) > 3 else ""
    kept = f" (and {dropped} older kill line(s) not kept)" if dropped else ""
    return (f"{len(kills)} {what} in the last {span(window_s)}: "
            f"{', '.join(victims)}{more}{kept}")


@host_check("host.disk", thresholds=("free_warning_percent", "free_critical_percent",
                                     "inodes_warning_percent", "inodes_critical_percent"))
def disk(ctx: CheckContext) -> Finding:
    reading = ctx.snapshot.host.disk_space
    if reading.state == "not_supported":  # `check` without --host-resources: say so
        return skipped(reading.error or "disk space is not read here")
    entries = reading.get()
    if not entries:
        return skipped("no path to judge: no Docker data root on this host and no "
                       "disk_paths in the profile")
    problems: list[tuple[Status, str]] = []
    unread: list[str] = []
    fine: list[str] = []
    observed: list[dict[str, Any]] = []
    for entry in entries:
        role = "Docker data root" if entry["role"] == "docker" else "profile"
        where = f"{entry['path']} ({role})"
        if entry.get("error"):
            unread.append(f"{where}: {entry['error']}")
            observed.append({"path": entry["path"], "role": entry["role"],
                             "error": entry["error"]})
            continue
        free = _percent(entry["free_bytes"], entry["total_bytes"])
        # A filesystem without a fixed inode table (btrfs, XFS) reports 0 inodes: not judged.
        inodes = _percent(entry["inodes_free"], entry["inodes_total"]) \
            if entry["inodes_total"] else None
        observed.append({"path": entry["path"], "role": entry["role"],
                         "free_percent": round(free, 1), "free_bytes": entry["free_bytes"],
                         "inodes_free_percent": None if inodes is None else round(inodes, 1)})
        status = Status.OK
        said: list[str] = []
        levels = [(free, f"{_gib(entry['free_bytes'])} free ({free:.1f} % of "
                   f"{_gib(entry['total_bytes'])})", ctx.threshold("free_critical_percent"),
                   ctx.threshold("free_warning_percent"))]
        if inodes is not None:
            levels.append((inodes, f"{inodes:.1f} % of inodes free",
                           ctx.threshold("inodes_critical_percent"),
                           ctx.threshold("inodes_warning_percent")))
        for value, what, critical_below, warning_below in levels:
            if value < critical_below:
                status = Status.CRITICAL
                said.append(what)
            elif value < warning_below:
                status = max(status, Status.WARNING, key=lambda s: s.rank)
                said.append(what)
        if said:
            problems.append((status, f"{where}: {', '.join(said)}"))
        else:
            fine.append(f"{entry['path']} {free:.0f} % free")
    extra = f" ({len(unread)} not read: {'; '.join(unread)})" if unread else ""
    if problems:
        worst = max((status for status, _ in problems), key=lambda s: s.rank)
        message = " | ".join(words for _, words in problems) + extra
        return critical(message, paths=observed) if worst is Status.CRITICAL \
            else warning(message, paths=observed)
    if unread:
        return unknown("cannot read " + "; ".join(unread)
                       + (f" ({', '.join(fine)})" if fine else ""), paths=observed)
    return ok(", ".join(fine), paths=observed)
