"""The textfile `gpuguard slurm health --metrics-file` writes for node_exporter's textfile
collector (the alert that needs no daemon), in Prometheus' text exposition format.

A label value is any UTF-8 text in double quotes, with exactly three characters escaped:
backslash as `\\\\`, double quote as `\\"`, line feed as `\\n` (Prometheus, "Exposition
formats", text format: "label_value can be any sequence of UTF-8 characters, but the
backslash (\\), double-quote ("), and line feed (\\n) characters have to be escaped as \\\\,
\\", and \\n, respectively"). json.dumps is not that: it writes `\\u0153` for "œ", an escape
the format does not have, and promtool and node_exporter refuse the whole file. A node
name that is not text at all (bytes that are not UTF-8 in the command line) has its
undecodable bytes replaced, never a traceback.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from gpuguard.io.atomic import write_text

# (name, help): the gauges, in the order written
GAUGES = (
    ("gpuguard_slurm_brake_engaged",
     "1 when the fleet brake kept this node from draining."),
    ("gpuguard_slurm_drained", "1 when gpuguard holds this node drained."),
    ("gpuguard_slurm_unknown", "1 when Slurm did not answer the last health run."),
    ("gpuguard_slurm_state_lost",
     "1 when the last health run could not make, read or keep a part of its state dir "
     "(the lock, the drain record, the script-failure record) and decided without it."),
    ("gpuguard_slurm_health_timestamp_seconds", "When the last health run ended."),
)


def label_value(text: str) -> str:
    """`text` as a quoted label value of the text format (UTF-8 kept)."""
    text = text.encode("utf-8", "replace").decode("utf-8")  # a lone surrogate: "?"
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


@dataclass
class HealthState:
    node: str
    drained: bool = False
    braked: bool = False
    unknown: bool = False
    state_lost: bool = False


def text(state: HealthState, now: float | None = None) -> str:
    values = (int(state.braked), int(state.drained), int(state.unknown),
              int(state.state_lost), f"{time.time() if now is None else now:.0f}")
    node = label_value(state.node)
    lines = []
    for (name, help_text), value in zip(GAUGES, values, strict=True):
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge",
                  f"{name}{{node={node}}} {value}"]
    return "\n".join(lines) + "\n"


def write(path: Path, state: HealthState) -> str | None:
    """Write the textfile atomically; why it could not be, else None."""
    try:
        write_text(path, text(state))
    except OSError as exc:
        return f"cannot write {path}: {exc.strerror or exc}"
    return None
