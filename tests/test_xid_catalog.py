"""The Xid catalog gpuguard ships (rules/xid.yaml) against NVIDIA's, saved in
tests/fixtures/nvidia-xid-catalog/: every code is there with NVIDIA's mnemonic and
buckets, and graded by the bucket table (gpuguard/judge/xid_buckets.py) or with the reason
it is not."""

from __future__ import annotations

import csv

import pytest

from gpuguard.config.ruleset import load_ruleset
from gpuguard.judge import xid_buckets
from gpuguard.judge.xid_buckets import grade_xid
from tests.conftest import FIXTURES, REPO

SAVED = FIXTURES / "nvidia-xid-catalog" / "xid-catalog.csv"


def saved() -> dict[int, dict[str, str]]:
    with SAVED.open(newline="") as f:
        return {int(row["code"]): row for row in csv.DictReader(f)}


@pytest.fixture(scope="module")
def catalog():
    return load_ruleset().xid_catalog


def test_the_saved_catalog_is_nvidias_whole_catalog():
    rows = saved()
    assert sorted(rows) == list(range(1, 173))
    assert sum(r["description"] != "Unused" for r in rows.values()) == 109


def test_every_code_of_the_saved_catalog_is_shipped_with_its_buckets(catalog):
    rows = saved()
    missing = sorted(set(rows) - set(catalog))
    assert not missing, f"codes of NVIDIA's catalog the pack lacks: {missing}"
    assert not sorted(set(catalog) - set(rows)), "codes the pack invents"
    for code, row in rows.items():
        entry = catalog[code]
        # a newline inside a cell is written " / " (the fixture's README)
        assert entry.mnemonic == row["mnemonic"].replace(" / / ", " / "), code
        assert entry.nvidia == (row["immediate_resolution"], row["investigatory_resolution"]), code
        assert entry.severity in ("critical", "warning", "ignore") and entry.actions, code
        assert entry.meaning, code


def test_every_code_is_graded_by_the_table_or_says_why(catalog):
    """A grade other than the table's carries its reason; one the table gives carries none
    (a reason left behind after the grade went back would mislead)."""
    for code, row in saved().items():
        entry = catalog[code]
        table = grade_xid(row["immediate_resolution"], row["investigatory_resolution"],
                          row["description"] != "Unused")
        if table is not None and (entry.severity, entry.actions[0]) == table:
            assert not entry.reason, f"Xid {code} is graded as the table says: no reason"
        else:
            assert entry.reason, f"Xid {code} is graded {entry.severity}, " \
                f"{entry.actions[0]} where the table says {table}: without a reason"


def test_the_bucket_table_is_the_issues_mapping():
    """Issue 21's mapping, written out: IGNORE ignore; RESTART_APP, CHECK_APP/CUDA warning
    restart_app; RESET_GPU critical reset_gpu; RESTART_BM / RESTART_VM critical reboot;
    CHECK_MECHANICALS critical inspect_hardware; CONTACT_SUPPORT critical inspect_hardware
    on a code in use, warning on an unused one; UPDATE_SWFW and CHECK_UVM warning with the
    new update_software; the WORKFLOW_* and XID_154 buckets by the line (or, where the line
    carries no grade, the data with its reason); no immediate bucket: the investigatory
    one, else warning inspect_hardware."""
    expect = {"IGNORE": ("ignore", "ignore"), "RESTART_APP": ("warning", "restart_app"),
              "CHECK_APP/CUDA": ("warning", "restart_app"),
              "RESET_GPU": ("critical", "reset_gpu"), "RESTART_BM": ("critical", "reboot"),
              "RESTART_VM": ("critical", "reboot"),
              "CHECK_MECHANICALS": ("critical", "inspect_hardware"),
              "UPDATE_SWFW": ("warning", "update_software"),
              "CHECK_UVM": ("warning", "update_software"),
              "WORKFLOW_NVLINK5_ERR": ("critical", "follow_text"),
              "XID_154": ("critical", "follow_text"),
              "WORKFLOW_XID_45": None, "WORKFLOW_XID_48": None, "WORKFLOW_NVLINK_ERR": None}
    for bucket, grade in expect.items():
        assert grade_xid(bucket, "", True) == grade, bucket
    assert grade_xid("CONTACT_SUPPORT", "", True) == ("critical", "inspect_hardware")
    assert grade_xid("CONTACT_SUPPORT", "", False) == ("warning", "inspect_hardware")
    assert grade_xid("", "RESET_GPU", True) == ("critical", "reset_gpu")
    assert grade_xid("", "", True) == ("warning", "inspect_hardware")
    assert grade_xid("SOMETHING_NEW", "", True) == ("warning", "inspect_hardware")
    assert set(xid_buckets.XID_BUCKETS) == set(expect)


def test_every_bucket_of_the_saved_catalog_is_in_the_table():
    """A bucket NVIDIA adds is graded warning, inspect_hardware by default: this names it,
    so that someone decides."""
    immediate = {row["immediate_resolution"] for row in saved().values()} - {""}
    assert immediate <= set(xid_buckets.XID_BUCKETS) | {"CONTACT_SUPPORT"}, immediate


def test_the_issue_example_and_the_codes_gpuguard_grades_otherwise(catalog):
    assert (catalog[143].severity, catalog[143].actions) == ("critical", ("reset_gpu",))
    assert catalog[143].mnemonic == "GPU_INIT_ERROR"
    # the ones where gpuguard knows better, each with its reason
    differs = {code for code, e in catalog.items() if e.reason}
    assert differs == {45, 48, 64, 74, 157, 162, 167, 169, 171, 172}


def test_the_docs_print_the_table_and_every_code():
    text = (REPO / "docs" / "rules.md").read_text()
    assert "| `RESTART_APP` | warning | `restart_app` |" in text
    for code in saved():
        assert f"\n| {code} | " in text, code
