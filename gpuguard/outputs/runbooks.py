"""Where an alert's runbook page lives: one base URL, set here, plus the page's path under
docs/runbooks/ (a rule's page is `<rule id>.md`, shared by its critical and warning alerts;
an alert about the daemon or the supervisor has `alerts/<AlertName>.md`).

scripts/gen_alerts.py writes `runbook_url` from these; a fleet that serves the pages from
its own wiki gives `--runbook-base URL` there (docs/operations.md), never edits this file."""

from __future__ import annotations

# The pages as the repository ships them (docs/runbooks/ on GitHub's main branch).
RUNBOOK_BASE_URL = "https://github.com/gpuguard/gpuguard/blob/main/docs/runbooks/"

# The folder of the daemon's and the supervisor's alert pages, under the base.
ALERT_PAGES = "alerts"


def rule_page(rule_id: str) -> str:
    """The page of a rule, relative to the base (and to docs/runbooks/)."""
    return f"{rule_id}.md"


def alert_page(alert: str) -> str:
    """The page of an alert that is no rule's (GPUGuardDown, GPUGuardFailoverActive...)."""
    return f"{ALERT_PAGES}/{alert}.md"


def runbook_url(page: str, base: str = RUNBOOK_BASE_URL) -> str:
    """The base and the page, with one slash between them whatever the base ends with."""
    return f"{base.rstrip('/')}/{page}"
