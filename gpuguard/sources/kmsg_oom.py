"""Out-of-memory kills in the kernel log (host.memory; sources/kmsg.py hands the kernel's
lines here: a record userspace wrote is never one, sources/kmsg_records.py)."""

from __future__ import annotations

import re
from collections import deque
from typing import Any

from gpuguard.sources.kmsg_records import Record

# Out-of-memory kills (mm/oom_kill.c). Since Linux 5.0 one kill logs a summary line, then
# the kill itself, whose prefix says whether the whole host or one cgroup ran out:
# oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,
#   task_memcg=/user.slice/...,task=python3,pid=2345,uid=1000
# Out of memory: Killed process 2345 (python3) total-vm:..kB, anon-rss:..kB, ...
# oom-kill:constraint=CONSTRAINT_MEMCG,...,oom_memcg=/system.slice/docker-ab.scope,
#   task_memcg=/system.slice/docker-ab.scope,task=vllm,pid=4242,uid=0
# Memory cgroup out of memory: Killed process 4242 (vllm) total-vm:..kB, ...
# Before 5.0: "Out of memory: Kill process 2345 (python3) score 912 or sacrifice child",
# then "Killed process 2345 (python3) total-vm:..". "Out of memory (oom_kill_allocating_task):"
# is the same kill under that sysctl. Lines of one kill become one event (same pid).
_OOM_KILL = re.compile(
    r"^(?:(?P<scope>Out of memory|Memory cgroup out of memory)(?: \([a-z_]{1,40}\))?: )?"
    r"Kill(?:ed)? process (?P<pid>\d{1,10}) \((?P<name>[^)]{0,64})\)")
_OOM_SUMMARY = re.compile(r"^oom-kill:constraint=(?P<constraint>[A-Z_]{1,32},)?(?P<rest>.*)$")
_OOM_FIELD = re.compile(r"(?:^|,)(oom_memcg|task_memcg|task|pid)=([^,]{0,512})")
# OOM kills kept in a summary: the newest ones (a host in an OOM loop logs one a second).
MAX_OOMS = 500


class OomKills:
    """Out-of-memory kills, the newest MAX_OOMS kept: {"pid", "process", "scope": host |
    cgroup, "cgroup", "seq", "usec"}; the stamp is that of the kill's first line."""

    def __init__(self) -> None:
        self.events: deque[dict[str, Any]] = deque(maxlen=MAX_OOMS)
        self.seen = 0

    def add(self, record: Record) -> None:
        text = record.text
        if m := _OOM_SUMMARY.match(text):
            fields = dict(_OOM_FIELD.findall(m["rest"]))
            pid = fields.get("pid", "")
            if not pid.isdigit() or len(pid) > 10:
                return
            memcg = fields.get("oom_memcg")
            constraint = (m["constraint"] or "").rstrip(",")
            self._event(record, int(pid), fields.get("task") or None,
                        "cgroup" if constraint == "CONSTRAINT_MEMCG" else "host",
                        memcg or fields.get("task_memcg") or None)
        elif m := _OOM_KILL.match(text):
            scope = "cgroup" if m["scope"] == "Memory cgroup out of memory" else \
                "host" if m["scope"] else None
            self._event(record, int(m["pid"]), m["name"] or None, scope, None)

    def _event(self, record: Record, pid: int, name: str | None, scope: str | None,
               cgroup: str | None) -> None:
        last = self.events[-1] if self.events else None
        if last is not None and last["pid"] == pid:  # another line of the same kill
            last["process"] = last["process"] or name
            last["scope"] = last["scope"] or scope
            last["cgroup"] = last["cgroup"] or cgroup
            return
        self.events.append({"pid": pid, "process": name, "scope": scope, "cgroup": cgroup,
                            "seq": record.seq, "usec": record.usec})
        self.seen += 1

    def dropped(self) -> int:
        return self.seen - len(self.events)
