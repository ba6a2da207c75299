"""Talking to Slurm: `sinfo` to read nodes, `scontrol` to drain and resume, each call with a
deadline. slurmd runs a health program with an almost empty environment (no PATH, often no
SLURM_CONF), so the tools are looked for where packages put them unless --slurm-bin names
a folder, and the cluster's configuration is passed on only when --slurm-conf names it.

Slurm that does not answer, or answers something this module cannot read, is
SlurmUnavailable: the caller changes nothing (nothing is drained or resumed on a guess).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

# Where Debian, RPM builds and source installs put the tools, searched in this order.
SEARCH = ("/usr/bin", "/usr/local/bin", "/opt/slurm/bin", "/usr/sbin", "/bin")
MAX_OUTPUT = 4 * 1024 * 1024
SEP = "\x1f"  # the unit separator: no node name, state or time holds it (reasons last)
FORMAT = SEP.join(("%N", "%T", "%H", "%P", "%E"))


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

    def run(self, name: str, *args: str) -> str:
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
        out = done.stdout[:MAX_OUTPUT].decode(errors="replace")
        if done.returncode != 0:
            err = done.stderr[:300].decode(errors="replace").strip()
            raise SlurmUnavailable(f"{name} {' '.join(args[:2])} failed ({done.returncode}): "
                                   f"{err or out[:200]}")
        return out


@dataclass
class NodeInfo:
    name: str
    state: str  # sinfo's %T: idle, mixed, allocated, drained, draining, down, ...
    reason: str  # "" when none
    reason_time: float | None  # when the reason was set (Unix time), None if not
    partitions: list[str] = field(default_factory=list)

    @property
    def drained(self) -> bool:
        """Drained or draining (no new jobs), whatever else the state says."""
        return "drain" in self.state


def parse_nodes(text: str) -> dict[str, NodeInfo]:
    """sinfo's lines (FORMAT) by node; a node in several partitions is one entry."""
    nodes: dict[str, NodeInfo] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split(SEP, 4)
        if len(parts) != 5 or not parts[0]:
            raise SlurmUnavailable(f"sinfo printed a line this gpuguard cannot read: "
                                   f"{line[:120]!r}")
        name, state, stamp, partition, reason = parts
        node = nodes.setdefault(name, NodeInfo(name, state.strip().lower(),
                                               "" if reason == "none" else reason,
                                               _stamp(stamp)))
        node.partitions.append(partition.rstrip("*"))
    return nodes


def _stamp(text: str) -> float | None:
    """sinfo's %H (the reason's time, local time, `Unknown` when none)."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def node(settings: SlurmSettings, name: str) -> NodeInfo:
    found = parse_nodes(settings.run("sinfo", "-h", "-N", "-n", name, "-o", FORMAT))
    if name not in found:
        raise SlurmUnavailable(f"sinfo does not list node {name} (give --node)")
    return found[name]


def partition_nodes(settings: SlurmSettings, partitions: list[str]) -> dict[str, NodeInfo]:
    """Every node of these partitions (the fleet the brake counts)."""
    return parse_nodes(settings.run("sinfo", "-h", "-N", "-p", ",".join(partitions),
                                    "-o", FORMAT))


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
