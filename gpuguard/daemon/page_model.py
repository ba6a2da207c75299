"""What the status page shows, taken from the daemon's one verdict (verdict_view.py): the
results fresh or stale by the one freshness rule, never an old ok, and the last sweep's
readings, said to be stale with them. Pure: the parts in, a Page out (outputs/status_page).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuguard.daemon.page_history import SPAN_S, PageHistory, Point
from gpuguard.events.store import Event
from gpuguard.io.clock import utc
from gpuguard.model.results import Result, Status
from gpuguard.model.snapshot import GpuSnapshot, Snapshot
from gpuguard.outputs import svg_chart
from gpuguard.outputs.status_page import EventRow, Finding, GpuCard, Page, Reading, ServiceRow
from gpuguard.supervisor.service import ServiceView

FAILING = (Status.CRITICAL, Status.WARNING, Status.UNKNOWN)


@dataclass
class PageParts:
    snapshot: Snapshot | None
    results: list[Result]  # the daemon's verdict now: each fresh or turned stale
    ages: dict[str, float]  # cadence -> seconds since its last cycle (monotonic)
    stale_reason: str | None  # the sources were not all read, or a cycle failed
    refresh_s: int
    services: list[ServiceView] | None = None  # None: no supervisor configured
    events: list[Event] = field(default_factory=list)
    events_note: str = ""
    history: PageHistory | None = None
    now: float = 0.0  # time.monotonic() of the render
    wall: float = 0.0  # time.time(), for display
    reloads: bool = True  # False: the page without its meta refresh (?refresh=off)


def build(parts: PageParts) -> Page:
    snap = parts.snapshot or Snapshot()
    results = parts.results
    stale = [r for r in results if r.observed.get("stale")]
    fresh, fresh_text = _freshness(results, stale, parts.stale_reason)
    return Page(
        **_host(snap),
        verdict=_worst(results) if results else "unknown",
        age=f"{parts.ages['fast']:.0f} s" if "fast" in parts.ages else "no verdict yet",
        freshness=fresh, freshness_text=fresh_text,
        refresh_s=parts.refresh_s if parts.reloads else 0,
        rendered_at=utc(parts.wall or time.time()),
        gpus=[_card(gpu, results, parts, fresh == "fresh") for gpu in snap.gpus],
        host_findings=_findings([r for r in results if r.gpu is None]),
        services=_services(parts.services, results),
        events=[_event(e) for e in parts.events], events_note=parts.events_note,
        history_note="The charts' history is kept in the daemon's memory only (one point "
                     "per fast cycle, the last hour): it starts empty when the daemon "
                     "restarts.")


def _host(snap: Snapshot) -> dict[str, str]:
    host = snap.host
    return {"host": host.hostname or host.source or "this host",
            "driver": str(host.driver_version.get_or("not usable")),
            "cuda": str(host.cuda_driver_version.get_or("-")),
            "gpu_count": str(len(snap.gpus))}


def _services(views: list[ServiceView] | None, results: list[Result]
              ) -> list[ServiceRow] | None:
    return None if views is None else [_service(v, results) for v in views]


def _freshness(results: list[Result], stale: list[Result],
               reason: str | None) -> tuple[str, str]:
    if not results:
        return "none", "No verdict yet: the daemon's first cycle has not ended."
    if stale:
        return "stale", (f"STALE: {len(stale)} of {len(results)} results are older than "
                         f"the freshness rule allows; they are shown as unknown. "
                         f"{stale[0].message}")
    if reason:
        return "stale", f"STALE: {reason}; the results it could not read are unknown."
    return "fresh", "The verdict is fresh."


def _worst(results: Sequence[Result]) -> str:
    shown = [r.status for r in results if r.status is not Status.SKIPPED]
    return max(shown, key=lambda s: s.rank).value if shown else "ok"


def _findings(results: Sequence[Result]) -> list[Finding]:
    failing = sorted((r for r in results if r.status in FAILING),
                     key=lambda r: (-r.status.rank, r.rule))
    return [Finding(r.rule, r.status.value, r.message, r.remediation or "",
                    "" if r.action == "none" else
                    f"{r.action} ({r.action_reason})" if r.action_reason else r.action)
            for r in failing]


def _card(gpu: GpuSnapshot, results: list[Result], parts: PageParts, fresh: bool) -> GpuCard:
    own = [r for r in results if r.gpu is not None and r.gpu.index == gpu.index]
    suffix = "" if fresh else " (last sweep, stale)"
    return GpuCard(
        index=gpu.index, name=str(gpu.name.get_or("unknown model")),
        uuid=str(gpu.uuid.get_or("-")), serial=str(gpu.serial.get_or("-")),
        bus_id=str(gpu.pci_bus_id.get_or("-")), state=_worst(own) if own else "unknown",
        readings=[Reading(name, label, text + suffix)
                  for name, label, text in _readings(gpu, own)],
        findings=_findings(own),
        chart_svg=_chart(parts.history.points(PageHistory.key(gpu.uuid.value, gpu.index),
                                              parts.now), parts.now,
                         gpu.power_limit_enforced_w.get_or(None))
        if parts.history is not None else "")


def _value(reading: Any, unit: str) -> str:
    if not reading.is_ok:
        return f"? ({reading.state})"
    value = reading.value
    return f"{value:.0f} {unit}" if isinstance(value, float) else f"{value} {unit}"


def _readings(gpu: GpuSnapshot, own: list[Result]) -> list[tuple[str, str, str]]:
    return [
        ("temperature", "Temperature", _value(gpu.temperature_c, "C")),
        ("power", "Power", f"{_value(gpu.power_draw_w, 'W')} of "
                           f"{_value(gpu.power_limit_enforced_w, 'W')} limit"),
        ("clocks", "Clocks", f"SM {_value(gpu.clock_sm_mhz, 'MHz')} "
                             f"(max {_value(gpu.clock_sm_max_mhz, 'MHz')}), memory "
                             f"{_value(gpu.clock_mem_mhz, 'MHz')}"),
        ("ecc", "ECC", f"{_value(gpu.ecc_volatile_corrected, 'corrected')}, "
                       f"{_value(gpu.ecc_volatile_uncorrected, 'uncorrected')} (volatile); "
                       f"{_value(gpu.remapped_rows_uncorrectable, 'rows remapped')}"),
        ("xids", "Xids", _xids(own)),
    ]


def _xids(own: list[Result]) -> str:
    """The worst xid.* result's words; a skipped one says why (a replay has no log)."""
    xids = [r for r in own if r.rule.startswith("xid.")]
    if not xids:
        return "no Xid rule ran for this GPU"
    worst = max(xids, key=lambda r: (r.status is not Status.SKIPPED, r.status.rank))
    return worst.message if worst.status is not Status.SKIPPED else \
        f"not judged: {worst.message}"


def _chart(points: list[Point], now: float, limit_w: float | None) -> str:
    def series(name: str, pick: Any) -> svg_chart.Series:
        return svg_chart.Series(name, [((p.at - now) / 60.0, pick(p)) for p in points])

    panels = [
        svg_chart.Panel("Temperature", "C", [series("temperature", lambda p: p.temperature_c)]),
        svg_chart.Panel("Power", "W", [series("power", lambda p: p.power_w)],
                        [svg_chart.Limit("limit", limit_w)] if limit_w else []),
        svg_chart.Panel("SM clock", "MHz", [series("SM clock", lambda p: p.sm_clock_mhz)]),
    ]
    return svg_chart.chart(panels, "Last hour", width=420, panel_height=60,
                           x_range=(-SPAN_S / 60.0, 0.0), x_label="minutes ago",
                           standalone=False)


def _service(view: ServiceView, results: list[Result]) -> ServiceRow:
    engine = next((r for r in results if r.rule == "service.engine" and r.gpu is None), None)
    states = (engine.observed.get("services") or {}) if engine is not None else {}
    judged = states.get(view.service) if isinstance(states, dict) else None
    st = view.state
    moving = f", moving to {st.transition.to}" if st.transition else ""
    last = utc(st.last_transition) if st.last_transition else "never"
    return ServiceRow(view.service, f"{st.active}{moving}",
                      str(judged.get("state", "-")) if isinstance(judged, dict) else "-",
                      last, st.reason)


def _event(e: Event) -> EventRow:
    what = f"Xid {e.code}" if e.kind == "xid" else (e.rule or e.status or "-")
    return EventRow(utc(e.time, suffix=False), e.kind, what,
                    "-" if e.gpu_index is None else str(e.gpu_index), e.message)
