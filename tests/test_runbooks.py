"""Issue 34, item 5: every alert links a runbook page (`runbook_url`: the one base URL of
gpuguard/outputs/runbooks.py plus the page), every page is a rule's or an alert's, and the
rules' pages are what scripts/gen_runbooks.py writes from the pack today."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuguard.config.ruleset import load_ruleset
from gpuguard.outputs.runbooks import ALERT_PAGES, RUNBOOK_BASE_URL
from tests.conftest import REPO

PAGES = REPO / "docs" / "runbooks"
ALERT_FILES = {
    "prometheus": (REPO / "packaging" / "prometheus" / "gpuguard-alerts.yaml",
                   lambda doc: doc["groups"]),
    "kubernetes": (REPO / "packaging" / "kubernetes" / "prometheusrule.yaml",
                   lambda doc: doc["spec"]["groups"]),
}


def _alerts() -> list[dict]:
    alerts = []
    for path, groups_of in ALERT_FILES.values():
        for group in groups_of(yaml.safe_load(path.read_text())):
            alerts.extend(group["rules"])
    return alerts


def alerts_without_pages(alerts: list[dict], pages: Path, base: str = RUNBOOK_BASE_URL
                         ) -> list[str]:
    """`alert: why` for each alert whose runbook_url is missing, is not under the base, or
    names a page that is not in `pages`."""
    problems = []
    for alert in alerts:
        url = alert.get("annotations", {}).get("runbook_url")
        if not url:
            problems.append(f"{alert['alert']}: no runbook_url")
        elif not url.startswith(base.rstrip("/") + "/"):
            problems.append(f"{alert['alert']}: {url} is not under {base}")
        elif not (pages / url[len(base.rstrip("/")) + 1:]).is_file():
            problems.append(f"{alert['alert']}: {url} names no page in {pages}")
    return problems


def pages_without_owner(pages: Path, rule_ids: set[str], alert_names: set[str]) -> list[str]:
    """Pages that are no rule's of the pack (`<id>.md`, `notes/<id>.md`) and no alert's
    (`alerts/<AlertName>.md`); the index, README.md, belongs to the folder."""
    orphans = []
    for page in sorted(pages.rglob("*.md")):
        where = page.relative_to(pages)
        if where == Path("README.md"):
            continue
        owners = alert_names if where.parent == Path(ALERT_PAGES) else rule_ids
        if where.parent not in (Path("."), Path("notes"), Path(ALERT_PAGES)) \
                or page.stem not in owners:
            orphans.append(str(where))
    return orphans


def _owners() -> tuple[set[str], set[str]]:
    rule_ids = set(load_ruleset().rules)
    alert_names = {a["alert"] for a in _alerts() if "gpuguard_rule" not in a["labels"]}
    return rule_ids, alert_names


def test_every_alert_links_a_page_under_the_one_base():
    alerts = _alerts()
    assert len(alerts) > 100  # both files read, every rule's two alerts in them
    assert alerts_without_pages(alerts, PAGES) == []


def test_a_rules_two_alerts_share_its_page_and_each_daemon_alert_has_its_own():
    by_url: dict[str, set[str]] = {}
    for alert in _alerts():
        key = alert["labels"].get("gpuguard_rule", alert["alert"])
        by_url.setdefault(alert["annotations"]["runbook_url"], set()).add(key)
    assert all(len(keys) == 1 for keys in by_url.values()), by_url
    rule_urls = {u for u in by_url if "/alerts/" not in u}
    assert {u.rsplit("/", 1)[1] for u in rule_urls} == {
        f"{r}.md" for r in load_ruleset().rules if r != "xid.recent"}


def test_every_page_is_a_rules_or_an_alerts():
    rule_ids, alert_names = _owners()
    assert pages_without_owner(PAGES, rule_ids, alert_names) == []
    # and each rule has its page (xid.recent too: GPUGuardFatalXid's page points at it)
    assert {p.stem for p in PAGES.glob("*.md")} - {"README"} == rule_ids


def test_the_pages_are_current():
    check = subprocess.run([sys.executable, "scripts/gen_runbooks.py", "--check"], cwd=REPO,
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr


def _gen_runbooks():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import gen_runbooks
    finally:
        sys.path.remove(str(REPO / "scripts"))
    return gen_runbooks


@pytest.fixture
def pages_copy(tmp_path, monkeypatch):
    """docs/runbooks/ copied, and the generator pointed at the copy."""
    gen = _gen_runbooks()
    copy = tmp_path / "runbooks"
    shutil.copytree(PAGES, copy)
    monkeypatch.setattr(gen, "PAGES", copy)
    monkeypatch.setattr(gen, "NOTES", copy / "notes")
    monkeypatch.setattr(gen, "INDEX", copy / "README.md")
    monkeypatch.setattr(sys, "argv", ["gen_runbooks.py", "--check"])
    assert gen.main() == 0
    return gen, copy


def test_a_deleted_page_is_caught(pages_copy):
    gen, copy = pages_copy
    (copy / "pcie.link_width.md").unlink()
    assert alerts_without_pages(_alerts(), copy) == [
        f"GPUGuardRule{level}: {RUNBOOK_BASE_URL}pcie.link_width.md names no page in {copy}"
        for level in ("Critical", "Warning")] * len(ALERT_FILES)  # in both alert files
    assert gen.main() == 1
    (copy / ALERT_PAGES / "GPUGuardDown.md").unlink()
    assert any(p.startswith("GPUGuardDown:") for p in alerts_without_pages(_alerts(), copy))


def test_an_orphan_page_is_caught(pages_copy):
    gen, copy = pages_copy
    for orphan in ("pcie.link_speed.md", "notes/pcie.link_speed.md",
                   f"{ALERT_PAGES}/GPUGuardGone.md", "misc/pcie.link_width.md"):
        (copy / orphan).parent.mkdir(exist_ok=True)
        (copy / orphan).write_text("# a page of no rule\n")
    assert pages_without_owner(copy, *_owners()) == [
        f"{ALERT_PAGES}/GPUGuardGone.md", "misc/pcie.link_width.md",
        "notes/pcie.link_speed.md", "pcie.link_speed.md"]
    assert gen.main() == 1  # the rule page without a rule: the generator removes it


def test_a_stale_page_and_a_changed_note_are_caught(pages_copy, monkeypatch):
    gen, copy = pages_copy
    page = copy / "memory.row_remap.md"
    page.write_text(page.read_text().replace("warn_uncorrectable_rows", "old_key"))
    assert gen.main() == 1
    monkeypatch.setattr(sys, "argv", ["gen_runbooks.py"])
    assert gen.main() == 0 and "old_key" not in page.read_text()
    (copy / "notes" / "memory.row_remap.md").write_text("- a new fact from the field\n")
    monkeypatch.setattr(sys, "argv", ["gen_runbooks.py", "--check"])
    assert gen.main() == 1


def test_an_alert_without_runbook_url_is_caught():
    alerts = _alerts()
    del alerts[0]["annotations"]["runbook_url"]
    alerts[-1]["annotations"]["runbook_url"] = "https://example.com/" + \
        alerts[-1]["annotations"]["runbook_url"].rsplit("/runbooks/", 1)[1]
    assert alerts_without_pages(alerts, PAGES) == [
        f"{alerts[0]['alert']}: no runbook_url",
        f"{alerts[-1]['alert']}: {alerts[-1]['annotations']['runbook_url']} is not under "
        f"{RUNBOOK_BASE_URL}"]


def test_a_fleet_points_every_url_at_its_own_wiki():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import gen_alerts
    finally:
        sys.path.remove(str(REPO / "scripts"))
    wiki = "https://wiki.example.com/gpu/runbooks"
    texts = gen_alerts.render(wiki)
    alerts = [a for g in yaml.safe_load(texts[gen_alerts.OUT])["groups"] for a in g["rules"]]
    assert alerts_without_pages(alerts, PAGES, base=wiki) == []
    assert RUNBOOK_BASE_URL not in "".join(texts.values())
