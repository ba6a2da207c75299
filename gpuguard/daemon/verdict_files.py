"""One small verdict file per node condition, for node-problem-detector's custom plugin
(packaging/kubernetes/gpuguard-npd-plugin.sh, docs/kubernetes.md): written atomically
after every cycle into `--npd-dir`, a host directory NPD's pod mounts.

NPD's container has a POSIX shell and no Python, so a file is `key=value` lines the
plugin reads with `read`: the condition's worst fresh result (status, one line naming
the rule and GPU), when it was written on CLOCK_BOOTTIME (the plugin compares it with
/proc/uptime: the same clock, monotonic, counting suspend), and how old it may get before
the plugin answers Unknown: until the first result the daemon holds would be older than
its cadence's stale_after, the one freshness rule (daemon/freshness.py) that `gpuguard
status` and /healthz read too. A
file from before a reboot is newer than the clock: Unknown too.

Written as cheaply as that stamp allows (issue 32): each file is renamed into place
whole, with no fsync of it or its directory. It means nothing after a crash or reboot:
a file a crash lost or left empty is Unknown to the plugin, one that survived is from
before the boot (Unknown, as above), which an fsync would only have made durable. The
content is rewritten every cycle, not only when it changed: the plugin reads the
file's age from the boottime stamp inside it (POSIX sh built-ins cannot read an
mtime), so a file whose verdict did not change still carries a new stamp. Which
condition a rule goes to is worked out once per rule, not once per result and cycle.

"Worst" here is NPD's order, not `check`'s exit code: critical, then unknown, then
warning. A condition that holds an unknown is Unknown even beside a warning: NPD's OK
must mean gpuguard looked and saw nothing that sets the condition.
"""

from __future__ import annotations

import functools
import math
import time
from pathlib import Path

import structlog

from gpuguard.daemon.freshness import Freshness
from gpuguard.daemon.verdict_view import daemon_verdict
from gpuguard.io.atomic import write_text
from gpuguard.judge import registry
from gpuguard.model.results import Result, Status, Verdict

log = structlog.get_logger("gpuguard.daemon")

# condition file -> the rule families it reports
CONDITIONS: dict[str, tuple[str, ...]] = {
    "gpu-hardware": ("gpu", "ecc", "memory", "pcie", "clocks", "power", "thermal", "vbios",
                     "xid", "recovery", "mig", "gsp"),
    "gpu-driver": ("driver", "persistence", "toolkit", "devices"),
    "gpu-fabric": ("nvlink", "fabric", "p2p", "sxid"),
    "gpu-service": ("service",),
}
# Families of the pack's rules in no condition, each with why (a test holds every family
# of judge/registry.py to one or the other, so a new family cannot go unreported by
# accident). They exclude the pack's own rules only: a site's rule is never left out.
NOT_A_CONDITION: dict[str, str] = {
    "host": "the node's memory and disks: kubelet reports them as conditions of its own",
    "image": "an image that cannot run here is its workload's problem, not the node's: "
             "the deploy pipeline (check --image) and the failback gate act on it",
    "qualify": "judged by `gpuguard qualify`, a run of its own, never in the daemon's "
               "verdict that the conditions carry; its result gates the way back into "
               "service (Slurm's resume, the supervisor's failback) from the event store",
}
# A site's rule of a family in no condition: by where it looks
SITE_GPU_CONDITION = "gpu-hardware"
SITE_HOST_CONDITION = "gpu-driver"
MESSAGE_MAX = 200  # the plugin prints at most 80 characters; the file keeps a little more
# NPD's order of badness (Status.rank puts warning above unknown, as `check`'s exit
# code does: for NPD an unknown beside a warning must not read OK)
NPD_RANK = {Status.SKIPPED: 0, Status.OK: 1, Status.WARNING: 2, Status.UNKNOWN: 3,
            Status.CRITICAL: 4}


def boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


@functools.cache
def pack_rules() -> frozenset[str]:
    """The ids of the pack's rules of Python logic. The loader gives a site's rule a
    `when:` and refuses it an id registered here, so this tells the pack's from a site's."""
    registry.load_all()
    return frozenset(registry.HOST_CHECKS) | frozenset(registry.GPU_CHECKS)


@functools.lru_cache(maxsize=8192)
def condition_of(rule_id: str, per_gpu: bool) -> str | None:
    """The condition file a rule's results go to; None only for a pack rule of a family
    in NOT_A_CONDITION. `per_gpu`: the result names a GPU (every result of a site's
    `scope: gpu` rule does)."""
    family = rule_id.split(".", 1)[0]
    for name, families in CONDITIONS.items():
        if family in families:
            return name
    if family in NOT_A_CONDITION and rule_id in pack_rules():
        return None
    return SITE_GPU_CONDITION if per_gpu else SITE_HOST_CONDITION


def npd_status(results: list[Result]) -> Status | None:
    """The condition's status in NPD's order; None when no rule of it gave a result."""
    worst = max(results, key=lambda r: NPD_RANK[r.status], default=None)
    return None if worst is None else worst.status


def fresh_for(ages: dict[str, float], freshness: Freshness) -> float:
    """Seconds until the first result still fresh now turns stale (fresh_results' rule);
    the fast cadence's stale_after when none is fresh (the file says unknown already)."""
    left = [freshness.stale_after(cadence) - age for cadence, age in ages.items()]
    return min((s for s in left if s >= 0), default=freshness.stale_after("fast"))


def condition_text(results: list[Result], written: float, fresh_s: float) -> str:
    """The file of one condition: its worst result's status and line, and its age limit."""
    status = npd_status(results)
    if status is None or status is Status.SKIPPED:
        word, line = "ok", "ok: no rule of this condition runs here"
    elif status is Status.OK:
        word, line = "ok", f"ok: {len(results)} result(s) ok"
    else:
        worst = next(r for r in results if r.status is status)
        word = status.value
        gpu = "" if worst.gpu is None else f" GPU {worst.gpu.index}"
        more = sum(1 for r in results if r.status is status) - 1
        extra = f" (+{more} more)" if more else ""
        line = f"{word}: {worst.rule}{gpu}{extra}: {worst.message}"
    line = " ".join(line.split())[:MESSAGE_MAX]  # one line, whatever a message holds
    # Rounded down, as /proc/uptime is printed: rounding up would put a fresh file in
    # the future, which reads as an earlier boot. The limit is one unit short of the
    # deadline, since the plugin's clock is rounded down too: a file it calls fresh is.
    deadline = written + fresh_s
    max_age_s = max(0, math.floor(deadline) - int(written) - 1)
    written_cs = math.floor(written * 100)
    max_age_cs = max(0, math.floor(deadline * 100) - written_cs - 1)
    # boottime/max_age_s (whole seconds) for a plugin of before issue 27; the plugin
    # reads the centiseconds, which two cycles of 0.5 s need
    return (f"status={word}\nmessage={line}\nboottime={int(written)}\n"
            f"max_age_s={max_age_s}\nboottime_cs={written_cs}\nmax_age_cs={max_age_cs}\n")


class VerdictFiles:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._failed_logged = False

    def write(self, entries: list[tuple[Result, str, float]], freshness: Freshness) -> None:
        """The files of the daemon's verdict now (its latest results by cadence)."""
        verdict, ages = daemon_verdict(entries, freshness, time.monotonic())
        self.write_verdict(verdict, ages, freshness)

    def write_verdict(self, verdict: Verdict, ages: dict[str, float],
                      freshness: Freshness) -> None:
        """The files of one verdict (the one `status` and Slurm get), whose cadences are
        `ages` seconds old."""
        fresh_s = fresh_for(ages, freshness)
        written = boottime()
        by_condition: dict[str, list[Result]] = {name: [] for name in CONDITIONS}
        for result in verdict.results:
            name = condition_of(result.rule, result.gpu is not None)
            if name is not None:
                by_condition[name].append(result)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            for name, mine in by_condition.items():
                write_text(self.directory / name, condition_text(mine, written, fresh_s),
                           durable=False)
        except OSError as exc:
            # the plugin answers Unknown as the files age: loud on that side, once here
            if not self._failed_logged:
                log.error("npd_files_unwritable", dir=str(self.directory), error=str(exc))
                self._failed_logged = True
            return
        self._failed_logged = False
