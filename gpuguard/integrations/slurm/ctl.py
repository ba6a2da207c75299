"""Talking to Slurm: `scontrol show node -o` to read nodes (the base state and every flag,
as Slurm 22.05 and later print them: sinfo's short forms hide flags such as FAIL or
MAINT), `scontrol update` to drain and resume, each call with a deadline. slurmd runs a
health program with an almost empty environment (no PATH, often no SLURM_CONF), so the
tool is looked for where packages put it unless --slurm-bin names a folder, and the
cluster's configuration is passed on only when --slurm-conf names it.

Slurm that does not answer, or answers something this module cannot read, is
SlurmUnavailable: the caller changes nothing (nothing is drained or resumed on a guess).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

# Where Debian, RPM builds and source installs put the tools, searched in this order.
SEARCH = ("/usr/bin", "/usr/local/bin", "/opt/slurm/bin", "/usr/sbin", "/bin")
MAX_OUTPUT = 4 * 1024 * 1024
MAX_FLEET_OUTPUT = 64 * 1024 * 1024  # every node's line (about 700 bytes each)


class SlurmUnavailable(Exception):
    """Slurm did not answer in time, or not in a form that can be trusted."""


@dataclass
class SlurmSettings:
    bin_dir: Path | None = None
    conf: Path | None = None
    timeout_s: float = 10.0

    def tool(self, name: str) -> str:
        dirs = [str(self.bin_dir)] if self.bin_dir else \
            [*os.environ.get("PATH", "").split(os.pathsep), *SEARCH]
        for folder in dirs:
            path = os.path.join(folder, name) if folder else ""
            if path and os.access(path, os.X_OK):
                return path
        raise SlurmUnavailable(f"{name} not found in {', '.join(d for d in dirs if d)} "
                               "(give --slurm-bin)")

    def run(self, name: str, *args: str, max_bytes: int = MAX_OUTPUT) -> str:
        """The tool's standard output; SlurmUnavailable past the deadline or on failure."""
        env = {"PATH": os.pathsep.join(SEARCH), "LC_ALL": "C"}
        if self.conf is not None:
            env["SLURM_CONF"] = str(self.conf)
        elif os.environ.get("SLURM_CONF"):
            env["SLURM_CONF"] = os.environ["SLURM_CONF"]
        try:
            done = subprocess.run([self.tool(name), *args], capture_output=True, env=env,
                                  timeout=self.timeout_s, check=False, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise SlurmUnavailable(f"{name} did not answer within {self.timeout_s:g} s") \
                from None
        except OSError as exc:
            raise SlurmUnavailable(f"{name}: {exc.strerror or exc}") from None
        if len(done.stdout) > max_bytes:  # a cut list of nodes would count too few
            raise SlurmUnavailable(f"{name} {' '.join(args[:2])} printed more than "
                                   f"{max_bytes} bytes")
        out = done.stdout.decode(errors="replace")
        if done.returncode != 0:
            err = done.stderr[:300].decode(errors="replace").strip()
            raise SlurmUnavailable(f"{name} {' '.join(args[:2])} failed ({done.returncode}): "
                                   f"{err or out[:200]}")
        return out


@dataclass
class NodeInfo:
    name: str
    state: str  # scontrol's State=: the base state and its flags, "IDLE+DRAIN+NOT_RESPONDING"
    reason: str  # "" when none
    reason_time: float | None  # when the reason was set (Unix time), None if not
    partitions: list[str] = field(default_factory=list)

    @property
    def base(self) -> str:
        return self.state.split("+", 1)[0]

    @property
    def flags(self) -> frozenset[str]:
        return frozenset(self.state.split("+")[1:])

    @property
    def drained(self) -> bool:
        """Drained or draining (no new jobs), whatever else the state says."""
        return "DRAIN" in self.flags

    @property
    def word(self) -> str:
        """The state as sinfo's %T names it (idle, drained, draining, ...) where it is one
        of those, else scontrol's whole State in lower case (health's plan line)."""
        busy = self.base in ("MIXED", "ALLOCATED")
        if self.base in ("IDLE", "MIXED", "ALLOCATED") and self.flags <= {"DRAIN"}:
            return ("draining" if busy else "drained") if self.drained else self.base.lower()
        return self.state.lower()


# `scontrol show node -o`: one line a node, `Key=value` fields; OS= holds spaces, and the
# reason comes last, the rest of the line, with ` [user@time]` when Slurm has its time.
_NAME = re.compile(r"NodeName=(\S+)")
_STATE = re.compile(r" State=([A-Z_]+(?:\+[A-Z_]+)*) ")
_PARTITIONS = re.compile(r" Partitions=(\S*)")
_REASON = re.compile(r"(?P<text>.*) \[(?P<user>[^\s\[\]]*)@"
                     r"(?P<time>[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2})\]",
                     re.ASCII)


def parse_node(line: str) -> NodeInfo:
    """One line of `scontrol show node -o`. The fields before the reason are Slurm's own
    in 22.05 (none holds text an administrator writes), and the reason's text never
    counts: a line with other than one ` State=` before it is not trusted."""
    head, marker, reason = line.partition(" Reason=")
    name, states = _NAME.match(head), _STATE.findall(head + " ")
    if name is None or len(states) != 1:
        raise SlurmUnavailable(f"scontrol printed a node this gpuguard cannot read: "
                               f"{line[:160]!r}")
    partitions = _PARTITIONS.search(head)
    stamp = _REASON.fullmatch(reason) if marker else None
    return NodeInfo(name[1], states[0], stamp["text"] if stamp else reason,
                    _stamp(stamp["time"]) if stamp else None,
                    [p for p in (partitions[1] if partitions else "").split(",") if p])


def parse_nodes(text: str) -> dict[str, NodeInfo]:
    """`scontrol show node -o`'s lines by node name."""
    nodes = [parse_node(line) for line in text.splitlines() if line.strip()]
    return {n.name: n for n in nodes}


def _stamp(text: str) -> float | None:
    """The reason's time (slurmctld's wall clock, printed in local time)."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def node(settings: SlurmSettings, name: str) -> NodeInfo:
    found = parse_nodes(settings.run("scontrol", "show", "node", "-o", name))
    if name not in found:
        raise SlurmUnavailable(f"scontrol does not show node {name} (give --node)")
    return found[name]


def partition_nodes(settings: SlurmSettings, partitions: list[str]) -> dict[str, NodeInfo]:
    """Every node of these partitions (the fleet the brake counts; "*": every node).
    scontrol shows every node of the cluster, hence the larger bound."""
    every = parse_nodes(settings.run("scontrol", "show", "node", "-o",
                                     max_bytes=MAX_FLEET_OUTPUT))
    wanted = set(partitions)
    return {k: n for k, n in every.items()
            if "*" in wanted or wanted.intersection(n.partitions)}


def drain(settings: SlurmSettings, name: str, reason: str) -> None:
    """Drain the node (or rewrite the reason of a drained one)."""
    settings.run("scontrol", "update", f"NodeName={name}", "State=DRAIN", f"Reason={reason}")


def resume(settings: SlurmSettings, name: str) -> None:
    settings.run("scontrol", "update", f"NodeName={name}", "State=RESUME")


def health_interval(settings: SlurmSettings) -> float | None:
    """slurm.conf's HealthCheckInterval in seconds (None: unset, 0 or unreadable)."""
    for line in settings.run("scontrol", "show", "config").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "HealthCheckInterval":
            digits = value.strip().split(" ", 1)[0]
            return float(digits) if digits.isdigit() and int(digits) > 0 else None
    return None
