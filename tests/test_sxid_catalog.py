"""The SXid catalog gpuguard ships (rules/sxid.yaml) against the NVSwitch SXid list NVIDIA
publishes (the Fabric Manager User Guide, appendix D), saved in
tests/fixtures/nvidia-sxid-list/: every SXid is there, filed under the guide's class and
graded by the class table (gpuguard/judge/xid_buckets.py) or with the reason it is not."""

from __future__ import annotations

import csv

from gpuguard.config.ruleset import load_ruleset
from gpuguard.judge.xid_buckets import SXID_CLASSES, grade_sxid
from tests.conftest import FIXTURES

SAVED = FIXTURES / "nvidia-sxid-list" / "sxid-list.csv"


def saved() -> dict[int, dict[str, str]]:
    with SAVED.open(newline="") as f:
        return {int(row["code"]): row for row in csv.DictReader(f)}


def test_every_published_sxid_is_shipped_in_its_class_and_graded_or_says_why():
    catalog = load_ruleset().sxid_catalog
    rows = saved()
    assert len(rows) == 92
    missing = sorted(set(rows) - set(catalog))
    assert not missing, f"SXids of the guide the pack lacks: {missing}"
    assert not sorted(set(catalog) - set(rows)), "SXids the pack invents"
    for code, row in rows.items():
        entry = catalog[code]
        assert entry.mnemonic == row["name"] and entry.nvidia == (row["class"],), code
        if (entry.severity, entry.actions[0]) == grade_sxid(row["class"]):
            assert not entry.reason, f"SXid {code} is graded as its class says: no reason"
        else:
            assert entry.reason, f"SXid {code} is graded otherwise than its class, " \
                "without a reason"


def test_the_class_table():
    assert SXID_CLASSES == {"non-fatal": ("warning", "inspect_hardware"),
                            "potentially-fatal": ("critical", "follow_text"),
                            "always-fatal": ("critical", "reboot"),
                            "other": ("warning", "inspect_hardware")}
    assert grade_sxid("new class") == ("warning", "inspect_hardware")
