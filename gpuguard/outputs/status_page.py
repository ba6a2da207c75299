"""The status page (`gpuguard daemon --status-page`, issue 31): one HTML document, drawn
on the server from a Page of plain text and numbers, with no script at all.

Safe by construction: every text that comes from the host (a GPU name or serial, a service
name, a rule's message, an event's text) reaches the document through one function,
`field()`, which bounds it, shows its control characters as escapes and escapes it for
HTML; nothing from the host is ever put into a tag, an attribute name or a URL. The charts
are drawn from numbers by svg_chart (which escapes its own text) with constant labels.
The only style is page_style.STYLE, which the Content-Security-Policy admits by its hash.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpuguard.io.text import printable
from gpuguard.outputs.page_style import STYLE

TEXT_MAX = 2000  # characters of one field on the page; a longer one ends in "..."
STATES = ("ok", "warning", "critical", "unknown")


def shown(text: object, limit: int = TEXT_MAX) -> str:
    """The text a field shows: one that does not print escaped (\\x1b, \\n), bounded."""
    out = printable(str(text))
    return out if len(out) <= limit else out[:limit - 1] + "\u2026"


def field(text: object, limit: int = TEXT_MAX) -> str:
    """The one way host text reaches the page: shown(), then escaped for element content
    and attribute values alike."""
    return html.escape(shown(text, limit), quote=True)


@dataclass(frozen=True)
class Finding:
    rule: str
    status: str  # warning, critical or unknown
    message: str
    fix: str = ""  # the rule's remediation
    action: str = ""  # the suggested action, with its reason


@dataclass(frozen=True)
class Reading:
    name: str  # temperature, power, clocks, ecc, xids: a constant, the data-field
    label: str  # a constant
    value: str  # host text


@dataclass(frozen=True)
class GpuCard:
    index: int
    name: str
    uuid: str
    serial: str
    bus_id: str
    state: str  # one of STATES
    readings: Sequence[Reading] = ()
    findings: Sequence[Finding] = ()
    chart_svg: str = ""  # svg_chart's inline <svg>, drawn from numbers only


@dataclass(frozen=True)
class ServiceRow:
    name: str
    active: str  # the variant that serves: gpu or cpu
    engine: str
    last_failover: str
    why: str


@dataclass(frozen=True)
class EventRow:
    when: str
    kind: str
    what: str
    gpu: str
    message: str


@dataclass(frozen=True)
class Page:
    host: str
    driver: str
    cuda: str
    gpu_count: str
    verdict: str  # one of STATES
    age: str  # the verdict's age, e.g. "3 s"
    freshness: str  # fresh, stale or none
    freshness_text: str
    refresh_s: int  # 0: the page does not reload itself (?refresh=off)
    rendered_at: str  # wall time, for display
    gpus: Sequence[GpuCard] = ()
    host_findings: Sequence[Finding] = ()
    services: Sequence[ServiceRow] | None = None  # None: no supervisor configured
    events: Sequence[EventRow] = ()
    events_note: str = ""  # why there are no events (no store, unreadable)
    history_note: str = ""


def render(page: Page) -> str:
    refresh = max(0, int(page.refresh_s))
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<meta name="color-scheme" content="light dark">',
        *([f'<meta http-equiv="refresh" content="{refresh}">'] if refresh else []),
        f"<title>gpuguard: {field(page.host, 200)} ({page_state(page.verdict)})</title>",
        f"<style>{STYLE}</style>",
        "</head>",
        "<body>",
        *_header(page),
        "<main>",
        *_gpus(page.gpus),
        *_host_findings(page.host_findings),
        *_services(page.services),
        *_events(page.events, page.events_note),
        "</main>",
        f"<footer><p>{field(page.history_note)} Rendered {field(page.rendered_at)}; "
        "this page acts on nothing.</p></footer>",
        "</body>",
        "</html>",
        "",
    ])


def page_state(state: str) -> str:
    """A state as the page writes it into a class or data attribute: a known one only."""
    return state if state in STATES else "unknown"


def _header(page: Page) -> list[str]:
    fresh = page.freshness if page.freshness in ("fresh", "stale") else "none"
    verdict = page_state(page.verdict)
    rows = [("driver", "Driver", field(page.driver)), ("cuda", "CUDA", field(page.cuda)),
            ("gpus", "GPUs", field(page.gpu_count)),
            ("verdict", "Verdict", f'<span class="badge s-{verdict}">{verdict}</span>'),
            ("age", "Verdict age", field(page.age))]
    return ["<header>", _reload_control(page.refresh_s), f"<h1>{field(page.host, 200)}</h1>",
            '<section id="host" aria-label="host">',
            f'<p id="freshness" data-state="{fresh}">{field(page.freshness_text)}</p>',
            "<dl>", *_pairs(rows), "</dl>", "</section>", "</header>"]


def _reload_control(refresh_s: int) -> str:
    """First on the page, so a keyboard or screen-reader user meets it before the reload
    does (WCAG 2.2.1, timing adjustable): a link to the page without it, or back."""
    if refresh_s > 0:
        return (f'<p class="reload">This page reloads every {int(refresh_s)} s. '
                '<a href="./?refresh=off">Stop reloading</a></p>')
    return '<p class="reload">This page does not reload. <a href="./">Reload it on a timer</a></p>'


def _pairs(rows: Iterable[tuple[str, str, str]]) -> list[str]:
    """dt/dd pairs; the values are already escaped (field()) or made of constants."""
    return [f'<dt>{label}</dt><dd data-field="{name}">{value}</dd>'
            for name, label, value in rows]


def _gpus(cards: Sequence[GpuCard]) -> list[str]:
    out = ['<section id="gpus" aria-labelledby="gpus-h">', '<h2 id="gpus-h">GPUs</h2>']
    if not cards:
        out.append("<p>No GPU in the last sweep.</p>")
    else:
        out.append('<div class="cards">')
        out.extend(line for card in cards for line in _card(card))
        out.append("</div>")
    out.append("</section>")
    return out


def _card(card: GpuCard) -> list[str]:
    state = page_state(card.state)
    index = int(card.index)
    out = [f'<article class="gpu" id="gpu-{index}" data-index="{index}" data-state="{state}"'
           f' aria-labelledby="gpu-{index}-h">',
           f'<h3 id="gpu-{index}-h">GPU {index}: {field(card.name, 200)} '
           f'<span class="badge s-{state}">{state}</span></h3>',
           '<dl class="readings">',
           *_pairs([("uuid", "UUID", f"<code>{field(card.uuid, 200)}</code>"),
                    ("serial", "Serial", field(card.serial, 200)),
                    ("bus", "PCI", f"<code>{field(card.bus_id, 200)}</code>")]),
           *_pairs((r.name, r.label, field(r.value)) for r in card.readings),
           "</dl>"]
    if card.chart_svg:
        out += ['<figure class="chart">', card.chart_svg,
                f"<figcaption>GPU {index}: temperature, power and SM clock over the last "
                "hour</figcaption>", "</figure>"]
    out += _findings(card.findings, f"gpu-{index}")
    out.append("</article>")
    return out


def _findings(findings: Sequence[Finding], where: str) -> list[str]:
    if not findings:
        return ['<p class="no-findings">No failing rule.</p>']
    out = [f'<ul class="findings" aria-label="failing rules of {where}">']
    for f in findings:
        status = page_state(f.status)
        out.append(f'<li class="finding" data-rule="{field(f.rule, 200)}" '
                   f'data-status="{status}"><span class="badge s-{status}">{status}</span> '
                   f'<code class="rule">{field(f.rule, 200)}</code> '
                   f'<span class="message">{field(f.message)}</span>')
        if f.fix:
            out.append(f'<p class="fix">Fix: {field(f.fix)}</p>')
        if f.action:
            out.append(f'<p class="action">Do: {field(f.action)}</p>')
        out.append("</li>")
    out.append("</ul>")
    return out


def _host_findings(findings: Sequence[Finding]) -> list[str]:
    return ['<section id="host-findings" aria-labelledby="host-findings-h">',
            '<h2 id="host-findings-h">Host</h2>', *_findings(findings, "the host"),
            "</section>"]


def _table(head: Sequence[str], rows: Iterable[tuple[str, Sequence[str]]]) -> list[str]:
    """A table; each row's attribute text is made here, its cells are host text."""
    out = ['<div class="table-wrap"><table>', "<thead><tr>",
           *(f'<th scope="col">{h}</th>' for h in head), "</tr></thead>", "<tbody>"]
    for attrs, cells in rows:
        out.append(f"<tr {attrs}>" + "".join(f'<td data-label="{h}">{field(c)}</td>'
                                             for h, c in zip(head, cells, strict=True))
                   + "</tr>")
    out += ["</tbody>", "</table></div>"]
    return out


def _services(services: Sequence[ServiceRow] | None) -> list[str]:
    out = ['<section id="services" aria-labelledby="services-h">',
           '<h2 id="services-h">Services</h2>']
    if not services:
        out.append("<p>No supervised service (the daemon's --config names none).</p>")
    else:
        out += _table(("Service", "Serves on", "Engine", "Last failover", "Why"),
                      ((f'data-service="{field(s.name, 200)}"',
                        (s.name, s.active, s.engine, s.last_failover, s.why))
                       for s in services))
    out.append("</section>")
    return out


def _events(events: Sequence[EventRow], note: str) -> list[str]:
    out = ['<section id="events" aria-labelledby="events-h">',
           '<h2 id="events-h">Recent events</h2>']
    if not events:
        out.append(f"<p>{field(note or 'No event in the store.')}</p>")
    else:
        out += _table(("Time (UTC)", "Kind", "What", "GPU", "Message"),
                      (('class="event"', (e.when, e.kind, e.what, e.gpu, e.message))
                       for e in events))
    out.append("</section>")
    return out
