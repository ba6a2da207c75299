"""The daemon's latest verdict as `gpuguard status` and `gpuguard slurm health` ask for it:
fresh per cadence, filtered by `--only/--skip`, judged under `--fail-on` and rendered by
check's own renderers (gpuguard/outputs/render.py), here in the daemon, so the client
stays a few milliseconds of standard library (gpuguard/cli/status_client.py).

Freshness: a result is as old as the last cycle of its cadence that replaced it (the
monotonic clock: a wall-clock jump either way changes no age). Older than its cadence's
stale_after (daemon/freshness.py, the one rule: two of its intervals and its longest
cycle), it is unknown, naming its age and what it was: never an old ok.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuguard.daemon.freshness import Freshness
from gpuguard.model.results import Result, Status, Verdict
from gpuguard.model.rule_filter import filter_problem, selected
from gpuguard.model.snapshot import Snapshot

# What a request may ask for (gpuguard/cli/status_client.py builds it).
# render: {"code", "text"} as JSON; text: the same rendering framed (`GGV1 <code>` and a
# newline, then the text as it is), so `gpuguard status` needs no JSON parser (importing
# json is a fifth of its time budget); results: the results as JSON (slurm health)
WANTS = ("render", "text", "results")
FAIL_ON = ("unknown", "warning", "critical")


class BadRequest(ValueError):
    """A request the daemon cannot answer as asked: exit 3, saying why."""


@dataclass
class Request:
    want: str = "render"
    fmt: str = "table"
    only: list[str] = field(default_factory=list)
    skip: list[str] = field(default_factory=list)
    fail_on: str = "unknown"
    quiet: bool = False
    colour: bool = False
    width: int = 120

    @classmethod
    def from_line(cls, line: bytes) -> Request:
        """A request line as a client sent it: UTF-8 JSON (RFC 8259: no UTF-16 by its byte
        order mark, as json.loads would take it) holding one object. Whatever else is
        BadRequest, naming why: nested too deep included, where json.loads raises
        RecursionError (not a ValueError: it used to escape as a traceback)."""
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadRequest(f"the request is not UTF-8 (byte {exc.start})") from None
        try:
            value = json.loads(text)
        except RecursionError:  # 4 KiB of `[` is 4,000 levels; the parser stops at 1,000
            raise BadRequest("the request is nested too deep") from None
        except ValueError as exc:
            raise BadRequest(f"the request is not JSON: {str(exc)[:100]}") from None
        return cls.from_json(value)

    @classmethod
    def from_json(cls, raw: Any) -> Request:
        """A client's request, every field checked (a hostile one gets BadRequest)."""
        if not isinstance(raw, dict):
            raise BadRequest("the request is not a JSON object")
        req = cls()
        choices = {"want": WANTS, "fmt": ("table", "json", "prometheus"), "fail_on": FAIL_ON}
        for name, allowed in choices.items():
            value = raw.get(name, getattr(req, name))
            if value not in allowed:
                raise BadRequest(f"{name} must be one of {', '.join(allowed)}")
            setattr(req, name, value)
        for name in ("only", "skip"):
            value = raw.get(name, [])
            if not isinstance(value, list) or len(value) > 100 or not all(
                    isinstance(p, str) and len(p) <= 200 for p in value):
                raise BadRequest(f"{name} must be a list of at most 100 rule patterns")
            setattr(req, name, value)
        for name in ("quiet", "colour"):
            setattr(req, name, raw.get(name) is True)
        width = raw.get("width", 120)
        req.width = width if isinstance(width, int) and 20 <= width <= 1000 else 120
        return req


@dataclass
class DaemonView:
    """What the daemon hands over per request: its results with their cadences, the
    intervals, the rules it runs, its last snapshot, and its pid for the note."""

    entries: Callable[[], list[tuple[Result, str, float]]]
    freshness: Callable[[], Freshness]
    rule_ids: Callable[[], list[str]]
    failover_rules: Callable[[], list[str]]
    snapshot: Callable[[], Snapshot | None]
    cycle_duration_s: Callable[[], float]
    pid: int = 0


def fresh_results(entries: list[tuple[Result, str, float]], freshness: Freshness,
                  now: float) -> tuple[list[Result], dict[str, float]]:
    """The results, each older than its cadence's stale_after turned unknown, and each
    cadence's age (seconds, monotonic)."""
    ages: dict[str, float] = {}
    out = []
    for result, cadence, updated in entries:
        age = max(0.0, now - updated)
        ages[cadence] = age
        out.append(result if age <= freshness.stale_after(cadence) else
                   _stale(result, cadence, age, freshness))
    return out, ages


def _stale(result: Result, cadence: str, age: float, freshness: Freshness) -> Result:
    was = result.observed.get("last_status", result.status.value) \
        if result.observed.get("stale") else result.status.value
    return dataclasses.replace(
        result, status=Status.UNKNOWN, remediation=None, action="none", action_reason=None,
        message=f"stale: the daemon's last {cadence} result is {age:.0f} s old "
                f"({freshness.why(cadence)}); it was {was}: {result.message}",
        observed={"stale": True, "age_s": round(age, 1), "cadence": cadence,
                  "last_status": was, "stale_after_s": freshness.stale_after(cadence)})


def daemon_verdict(entries: list[tuple[Result, str, float]], freshness: Freshness,
                   now: float, failover_rules: frozenset[str] = frozenset(), pid: int = 0,
                   only: list[str] | None = None, skip: list[str] | None = None,
                   fail_on: str = "unknown") -> tuple[Verdict, dict[str, float]]:
    """The daemon's verdict now, the one object its consumers take (`status`, Slurm
    through the socket, NPD's files): each result fresh or stale by its cadence, those
    selected by --only/--skip; and each cadence's age (seconds, monotonic)."""
    results, ages = fresh_results(entries, freshness, now)
    results = [r for r in results if selected(r.rule, only or [], skip or [])]
    note = "the daemon's verdict (pid {}): {}".format(pid, ", ".join(
        f"{c} results {ages[c]:.0f} s old (stale after {freshness.stale_after(c):g} s)"
        for c in sorted(ages)))
    return Verdict(results, fail_on, (note,), source=note,
                   failover_rules=failover_rules), ages


def answer(view: DaemonView, req: Request) -> dict[str, Any]:
    """The reply document: {"code", "text"} for `render`, {"code", "results", ...} for
    `results`, {"error"} when it cannot answer (the client exits 3 with it)."""
    problem = filter_problem(req.only, req.skip, view.rule_ids())
    if problem is not None:
        return {"error": problem}
    entries = view.entries()
    if not entries:
        return {"error": "the daemon has no results yet: its first cycle has not ended"}
    verdict, _ = daemon_verdict(entries, view.freshness(), time.monotonic(),
                                frozenset(view.failover_rules()), view.pid, req.only,
                                req.skip, req.fail_on)
    if req.want == "results":
        return verdict.to_json()
    from gpuguard.outputs.render import renderer

    snapshot = view.snapshot() or Snapshot()
    if req.quiet and req.fmt == "table" and verdict.nagios_code == 0:
        return {"code": verdict.code, "text": ""}
    text = renderer(req.fmt)(snapshot, verdict, duration_s=view.cycle_duration_s(),
                             colour=req.colour, quiet=req.quiet, width=req.width)
    return {"code": verdict.code, "text": text}
