"""The terminal table: problems first, one line each with what to do; all-ok rules folded."""

from __future__ import annotations

import shutil
import textwrap
from collections import defaultdict

from gpuguard.model.results import Result, Status, Verdict
from gpuguard.model.snapshot import Snapshot

_COLOURS = {
    Status.CRITICAL: "\033[1;31m",
    Status.WARNING: "\033[33m",
    Status.UNKNOWN: "\033[35m",
    Status.OK: "\033[32m",
    Status.SKIPPED: "\033[2m",
}
_RESET = "\033[0m"


# One row of the table: status, rule, GPU column, message, remediation, what to do.
Row = tuple[Status, str, str, str, str | None, str | None]


def render(snapshot: Snapshot, verdict: Verdict, colour: bool, quiet: bool = False,
           width: int | None = None) -> str:
    # `gpuguard status` passes its own terminal's width: the daemon renders for it
    width = width or shutil.get_terminal_size((120, 24)).columns
    lines: list[str] = [] if quiet else [*_header(snapshot, verdict), ""]
    shown = _rows(verdict.results)
    if quiet:
        shown = [row for row in shown if row[0] not in (Status.OK, Status.SKIPPED)]
    rule_w = max([len("RULE")] + [len(row[1]) for row in shown])
    lines.append(f"{'STATUS':<8}  {'RULE':<{rule_w}}  {'GPU':<5}  MESSAGE")
    indent = 8 + 2 + rule_w + 2 + 5 + 2
    msg_w = max(40, width - indent)
    for row in shown:
        lines.extend(_row_lines(row, rule_w, indent, msg_w, colour))
    counts = verdict.summary()
    parts = [f"{counts[s.value]} {s.value}" for s in
             (Status.CRITICAL, Status.WARNING, Status.UNKNOWN, Status.OK, Status.SKIPPED)]
    lines.append("")
    lines.append(f"{', '.join(parts)}  ({verdict.describe_exit()})")
    return "\n".join(lines) + "\n"


def _header(snapshot: Snapshot, verdict: Verdict) -> list[str]:
    host = snapshot.host
    where = host.hostname or host.source
    if host.driver_version.is_ok:
        stack = (f"driver {host.driver_version.value}  "
                 f"CUDA {host.cuda_driver_version.get_or('?')}  GPUs {len(snapshot.gpus)}")
    else:
        stack = "no usable NVIDIA driver"
    return [f"gpuguard check: {where}  {stack}  (source: {host.source})",
            *(f"note: {note}" for note in verdict.notes)]


def _rows(results: list[Result]) -> list[Row]:
    """Problems first; a rule whose every GPU is ok (or skipped) alike is one folded row."""
    shown: list[Row] = []
    by_rule: dict[str, list[Result]] = defaultdict(list)
    for r in results:
        by_rule[r.rule].append(r)
    for rule_id, rs in by_rule.items():
        folded = [r for r in rs if r.status in (Status.OK, Status.SKIPPED)]
        if len(rs) > 1 and len(folded) == len(rs) and len({r.status for r in rs}) == 1:
            shown.append((rs[0].status, rule_id, f"all {len(rs)}", _fold_message(rs), None,
                          None))
            continue
        for r in rs:
            gpu = "host" if r.gpu is None else str(r.gpu.index)
            todo = f"{r.action} ({r.action_reason})" if r.action_reason else r.action
            shown.append((r.status, rule_id, gpu, r.message, r.remediation, todo))
    shown.sort(key=lambda row: (-row[0].rank, row[1], row[2]))
    return shown


def _row_lines(row: Row, rule_w: int, indent: int, msg_w: int, colour: bool) -> list[str]:
    """One result: its message wrapped under its column, then for a failing one what to
    fix (`fix:`) and the suggested action (`do:`, gpuguard.judge.actions) and why."""
    s, rule_id, gpu, message, remediation, action = row
    text = f"{s.value.upper():<8}"
    status = f"{_COLOURS[s]}{text}{_RESET}" if colour else text
    wrapped = textwrap.wrap(message, msg_w) or [""]
    lines = [f"{status}  {rule_id:<{rule_w}}  {gpu:<5}  {wrapped[0]}"]
    lines.extend(" " * indent + more for more in wrapped[1:])
    if s not in (Status.CRITICAL, Status.WARNING):
        return lines
    for label, text_ in (("fix: ", remediation), ("do:  ", action)):
        if text_:
            for i, part in enumerate(textwrap.wrap(text_, msg_w - 5)):
                lines.append(" " * indent + (label if i == 0 else "     ") + part)
    return lines


def _fold_message(rs: list[Result]) -> str:
    first = rs[0]
    if len({r.message for r in rs}) == 1:
        return first.message
    return f"{first.message} (GPU {first.gpu.index if first.gpu else '-'}; others alike)"
