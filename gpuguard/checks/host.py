"""host.*: the host around the GPUs: memory (available, swap, OOM kills) and disk space.

Both judge one host, so each gives one result (as driver.* does); host.disk names every
path it judged in its message and its `observed`. A path that is not configured gives no
entry, and no entry at all is a skipped rule, never a warning.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
from gpuguard.model.results import NAMES, Status

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
    available = _percent(sizes["available_bytes"], sizes["total_bytes"])
    observed: dict[str, Any] = {"available_percent": round(available, 1), **sizes}
    text = (f"{_gib(sizes['available_bytes'])} of {_gib(sizes['total_bytes'])} available "
            f"({available:.1f} %)")
    problems = _shortage(ctx, sizes, available, text, observed)
    notes: list[str] = []  # said in the message, never a warning

    window_s = float(ctx.threshold("oom_window_s"))
    log = host.kernel_log
    log_problem: str | None = None
    if log.is_ok:
        kills = _oom_kills(log.get(), window_s)
        observed["oom_kills"] = kills.records
        if kills.host:
            problems.append((Status.WARNING, kills.host))
            observed.setdefault(NAMES, []).extend(_host_kill_names(kills))
        if kills.cgroup:
            notes.append(kills.cgroup)
    elif log.state == "error":
        log_problem = f"cannot read the kernel log for OOM kills: {log.error}"
    else:
        observed["oom_kills"] = None  # no kernel log in this input: kills not judged

    if problems:
        worst = max((status for status, _ in problems), key=lambda s: s.rank)
        message = _problems_message(problems, notes, log_problem)
        return critical(message, **observed) if worst is Status.CRITICAL \
            else warning(message, **observed)
    if log_problem:
        return unknown(f"{text}; {log_problem}", **observed)
    if observed.get("oom_kills") is None:
        return ok(text, **observed)
    which = "host " if notes else ""
    return ok("; ".join([f"{text}, no {which}OOM kill in the last {span(window_s)}", *notes]),
              **observed)


def _shortage(ctx: CheckContext, sizes: dict[str, int], available: float, text: str,
              observed: dict[str, Any]) -> list[tuple[Status, str]]:
    """The memory problems: too little available (critical or warning), and swap filling
    while available memory is low. A host with swap gets its use in `observed`."""
    problems: list[tuple[Status, str]] = []
    # what the finding names (observed[NAMES], an ack covers these): what is short
    names = observed.setdefault(NAMES, [])
    if available < ctx.threshold("available_critical_percent"):
        problems.append((Status.CRITICAL, f"only {text}"))
        names.append("available memory")
    elif available < ctx.threshold("available_warning_percent"):
        problems.append((Status.WARNING, f"only {text}"))
        names.append("available memory")
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
            names.append("swap")
    return problems


@dataclass
class OomKills:
    """The OOM kills of the window, as host.memory reports them."""
    records: list[dict[str, Any]]  # its `observed` oom_kills
    host: str | None    # kills for want of the host's memory, said: a warning
    cgroup: str | None  # kills at a cgroup's own memory limit, said: never a warning


def _oom_kills(summary: dict[str, Any], window_s: float) -> OomKills:
    """The OOM kills of the window in the kernel log's summary, split by whose memory ran
    out."""
    # Not hidden by `gpuguard xid ack` (that acknowledges GPU faults); the window ages
    # them out.
    chosen = select(summary.get("ooms", []), {**summary, "acked_seq": None}, window_s,
                    lambda _: Grade("warning", "out of memory", ""))
    kills = chosen.counted
    records = [{k: e.get(k) for k in ("pid", "process", "scope", "cgroup", "seq", "age_s")}
               for e in kills]
    # A kill at a cgroup's own memory limit (a container's --memory, a unit's
    # MemoryMax=) says that cgroup is too small, not that the host is short of memory:
    # named here, never a warning of this rule. A kill whose lines do not say its
    # scope counts as the host's.
    host_kills = [e for e in kills if e.get("scope") != "cgroup"]
    cgroup_kills = [e for e in kills if e.get("scope") == "cgroup"]
    dropped = summary.get("ooms_dropped") or 0
    host: str | None = None
    cgroup: str | None = None
    if host_kills:
        host = _kills_text(host_kills, "OOM kill(s)", window_s, dropped)
    if cgroup_kills:
        # the lines the summary did not keep are counted once: with the host's kills if any
        cgroup = _kills_text(cgroup_kills, "OOM kill(s) at a cgroup's own memory limit (not "
                             "the host's memory)", window_s, 0 if host_kills else dropped)
    return OomKills(records, host, cgroup)


def _host_kill_names(kills: OomKills) -> list[str]:
    """What host.memory's finding names for its host-wide OOM kills (an ack covers these)."""
    return [f"OOM kill of {e.get('process') or '?'} (pid {e.get('pid')})"
            for e in kills.records if e.get("scope") != "cgroup"]


def _problems_message(problems: list[tuple[Status, str]], notes: list[str],
                      log_problem: str | None) -> str:
    """Each problem, then the notes, and why OOM kills could not be judged."""
    message = "; ".join([*(words for _, words in problems), *notes])
    if log_problem:
        message += f" ({log_problem})"
    return message


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
    paths = _judge_paths(ctx, entries)
    unread, fine = paths.unread, paths.fine
    extra = f" ({len(unread)} not read: {'; '.join(unread)})" if unread else ""
    if paths.problems:
        worst = max((status for status, _ in paths.problems), key=lambda s: s.rank)
        message = " | ".join(words for _, words in paths.problems) + extra
        # what the finding names (an ack covers these): the paths short of space or inodes
        named = {NAMES: paths.short}
        return critical(message, paths=paths.observed, **named) \
            if worst is Status.CRITICAL else warning(message, paths=paths.observed, **named)
    if unread:
        return unknown("cannot read " + "; ".join(unread)
                       + (f" ({', '.join(fine)})" if fine else ""), paths=paths.observed)
    return ok(", ".join(fine), paths=paths.observed)


@dataclass
class DiskPaths:
    """The paths host.disk judged, by verdict, and each path's `observed` entry."""
    problems: list[tuple[Status, str]] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)
    fine: list[str] = field(default_factory=list)
    observed: list[dict[str, Any]] = field(default_factory=list)
    short: list[str] = field(default_factory=list)  # the paths of `problems`


def _judge_paths(ctx: CheckContext, entries: list[dict[str, Any]]) -> DiskPaths:
    """Each configured path: not read, below a line, or fine."""
    paths = DiskPaths()
    for entry in entries:
        role = "Docker data root" if entry["role"] == "docker" else "profile"
        where = f"{entry['path']} ({role})"
        if entry.get("error"):
            paths.unread.append(f"{where}: {entry['error']}")
            paths.observed.append({"path": entry["path"], "role": entry["role"],
                                   "error": entry["error"]})
            continue
        free = _percent(entry["free_bytes"], entry["total_bytes"])
        # A filesystem without a fixed inode table (btrfs, XFS) reports 0 inodes: not judged.
        inodes = _percent(entry["inodes_free"], entry["inodes_total"]) \
            if entry["inodes_total"] else None
        paths.observed.append({"path": entry["path"], "role": entry["role"],
                               "free_percent": round(free, 1), "free_bytes": entry["free_bytes"],
                               "inodes_free_percent": None if inodes is None
                               else round(inodes, 1)})
        status, said = _below_lines(ctx, entry, free, inodes)
        if said:
            paths.problems.append((status, f"{where}: {', '.join(said)}"))
            paths.short.append(entry["path"])
        else:
            paths.fine.append(f"{entry['path']} {free:.0f} % free")
    return paths


def _below_lines(ctx: CheckContext, entry: dict[str, Any], free: float,
                 inodes: float | None) -> tuple[Status, list[str]]:
    """What of one path's free space and free inodes (when judged) is below its warning or
    critical line, said, and the worst status that gives."""
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
    return status, said
