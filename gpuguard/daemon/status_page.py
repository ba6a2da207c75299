"""The status page at `/` (issue 31): off unless `--status-page` or the profile's
`status_page: true` turns it on, the profile's key on a loopback listener only (a page on
0.0.0.0 takes the explicit switch: the shipped image and DaemonSet bind 0.0.0.0 for
/metrics and keep the page off).

Cheap whatever the request rate: the page is rendered at most once per fast cycle (and
once per fast interval when cycles stop ending, so that a stale verdict is shown as
stale); every other request gets the bytes of the last render. A request that comes
while a render runs waits for that one; renders never overlap.
"""

from __future__ import annotations

import ipaddress
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import structlog
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuguard.daemon.http import Answer, parse_listen
from gpuguard.daemon.page_history import PageHistory
from gpuguard.daemon.page_model import PageParts, build
from gpuguard.daemon.verdict_view import fresh_results
from gpuguard.events import store as eventstore
from gpuguard.events.rows import Skipped
from gpuguard.model.snapshot import Snapshot
from gpuguard.outputs.page_style import HEADERS
from gpuguard.outputs.status_page import render

log = structlog.get_logger("gpuguard.status_page")

EVENTS_SHOWN = 20
EVENTS_SINCE_S = 7 * 86400.0
CONTENT_TYPE = "text/html; charset=utf-8"


def loopback(host: str) -> bool:
    """Whether a listener on `host` is reachable from this host only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: whatever it resolves to, not known to be local


class StatusPage:
    def __init__(self, gather: Callable[[float], PageParts], fast_interval: float,
                 switch: bool = False) -> None:
        self.gather = gather
        self.fast_interval = fast_interval
        self.switch = switch  # --status-page
        self.enabled = switch
        self.history = PageHistory()
        self.renders_total = 0
        self._generation = 0  # fast cycles sampled
        self._lock = threading.Lock()  # one render at a time
        # per variant (reloading or not): the generation, when, the body
        self._cached: dict[bool, tuple[int, float, bytes]] = {}

    @classmethod
    def of(cls, daemon: Any) -> StatusPage:
        """The daemon's (gpuguard/daemon/app.py): its verdict as its socket serves it."""
        view = daemon.publisher.view

        def gather(now: float) -> PageParts:
            results, ages = fresh_results(view.entries(), view.freshness(), now)
            events, note = recent_events(daemon.recorder.writer.path
                                         if daemon.recorder is not None else None)
            refresh = max(5, min(60, round(daemon.cfg.fast_interval)))
            return PageParts(daemon.current()[1], results, ages, daemon.store.stale_reason(),
                             refresh, [s.view() for s in daemon.supervisors]
                             if daemon.supervisors else None, events, note, page.history,
                             now, time.time())

        page = cls(gather, daemon.cfg.fast_interval, daemon.cfg.status_page)
        return page

    def configure(self, profile_wants: bool, listen: str) -> None:
        """At start and on SIGHUP: the switch, or the profile's key on loopback."""
        try:
            host = parse_listen(listen)[0]
        except ValueError:
            host = listen  # the start refuses it (exit 3); never loopback meanwhile
        enabled = self.switch or (profile_wants and loopback(host))
        if profile_wants and not enabled:
            log.warning("status_page_off", listen=host,
                        why="the profile's status_page is honoured on a loopback listener "
                            "only; pass --status-page to serve the page on this one")
        self.enabled = enabled

    def collector(self) -> Collector:
        """gpuguard_status_page_renders_total, while the page is on."""
        page = self

        class Renders(Collector):
            def collect(self) -> Iterator[Metric]:
                if page.enabled:
                    yield CounterMetricFamily(
                        "gpuguard_status_page_renders",
                        "Renders of the status page (at most one per fast cycle, "
                        "whatever the request rate).", value=page.renders_total)

        return Renders()

    def sample(self, snap: Snapshot, now: float) -> None:
        """Each fast cycle: the chart's point, and a new render is due. Nothing while the
        page is off: the fast cycle pays nothing for a page nobody can open."""
        if not self.enabled:
            return
        self.history.add(snap, now)
        self._generation += 1

    def answer(self, query: str = "") -> Answer | None:
        """(code, content type, body, headers) of `/`, or None when the page is off.
        `refresh=off` in the query: the same page without its reload (WCAG 2.2.1: the
        reader may turn the time limit off; the page links to both)."""
        if not self.enabled:
            return None
        reloads = "refresh=off" not in query.split("&")
        with self._lock:
            now = time.monotonic()
            cached = self._cached.get(reloads)
            if cached is None or cached[0] != self._generation \
                    or now - cached[1] >= self.fast_interval:
                parts = self.gather(now)
                parts.reloads = reloads
                body = render(build(parts)).encode("utf-8")
                self.renders_total += 1
                cached = self._cached[reloads] = (self._generation, now, body)
        return 200, CONTENT_TYPE, cached[2], HEADERS


def recent_events(path: Path | None) -> tuple[list[eventstore.Event], str]:
    """The store's last events, newest first, or none and why (the page still renders)."""
    if path is None:
        return [], "No event store (the daemon runs with --no-event-store, or replays " \
                   "without --state-dir)."
    try:
        conn = eventstore.open_reader(path)
    except eventstore.StoreUnreadable as exc:
        return [], f"The event store cannot be read: {exc}"
    try:
        found = eventstore.query(conn, time.time() - EVENTS_SINCE_S, (), None, None,
                                 EVENTS_SHOWN, Skipped())
    except sqlite3.Error as exc:
        return [], f"The event store cannot be read: {exc}"
    finally:
        conn.close()
    return found, "" if found else "No event in the last 7 days."
