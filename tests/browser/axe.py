"""axe-core (npm, pinned in package.json and package-lock.json, installed into the
checkout's node_modules/ by scripts/test.sh) run in a page through the DevTools protocol.

The script goes in by Runtime.evaluate of axe.min.js's source, which a page's
Content-Security-Policy does not govern; the page's CSP is never loosened for it (no
Page.setBypassCSP), so the audit sees the page exactly as it is served."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.browser.cdp import Browser

REPO = Path(__file__).resolve().parents[2]
AXE = REPO / "node_modules" / "axe-core" / "axe.min.js"
PINNED = json.loads((REPO / "package.json").read_text())["devDependencies"]["axe-core"]
BAD = ("serious", "critical")


def installed_version() -> str | None:
    try:
        return str(json.loads((AXE.parent / "package.json").read_text())["version"])
    except (OSError, ValueError, KeyError):
        return None


def audit(browser: Browser, timeout: float = 60.0) -> list[dict[str, Any]]:
    """axe.run() on the loaded page: its violations (id, impact, help, nodes)."""
    if not browser.evaluate("typeof window.axe === 'object'"):
        browser.evaluate(AXE.read_text() + "\n;void 0", timeout=timeout)
    found: list[dict[str, Any]] = browser.evaluate(
        "axe.run(document, {resultTypes: ['violations']}).then(r => r.violations.map(v => ({"
        "id: v.id, impact: v.impact, help: v.help, helpUrl: v.helpUrl, nodes: v.nodes.map("
        "n => ({target: n.target, html: n.html, summary: n.failureSummary}))})))",
        timeout=timeout)
    return found


def serious(violations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [v for v in violations if v.get("impact") in BAD]


def describe(violations: list[dict[str, Any]]) -> str:
    """One block per violation: id, impact, what it asks, and each node that fails it."""
    lines = []
    for v in violations:
        lines.append(f"{v['id']} ({v['impact']}): {v['help']}")
        for node in v["nodes"]:
            lines.append(f"    {' '.join(map(str, node['target']))}: {node['html'][:200]}")
            for line in (node.get("summary") or "").splitlines():
                lines.append(f"        {line}")
    return "\n".join(lines)
