"""The state table of `gpuguard slurm health` (gpuguard/integrations/slurm/states.py): one
test per row, on the node as scontrol prints it (a base state and its flags) and its
reason's owner, with a drain finding and with a verdict that passes; the table in
docs/slurm.md is the data's rendering. tests/slurm/test_slurm_scripts.py runs every row
again through `gpuguard slurm health` on the fake Slurm."""

from __future__ import annotations

import time

import pytest

from gpuguard.integrations.slurm import plan as slurm
from gpuguard.integrations.slurm import states
from gpuguard.integrations.slurm.ctl import NodeInfo
from gpuguard.integrations.slurm.gate import Step, Verb
from tests.conftest import REPO
from tests.test_slurm_plan import drained_for, result

FAULT = [result("memory.row_remap", "critical", "inspect_hardware", gpu=0),
         result("memory.row_remap", "ok", gpu=1)]
WHOLE = [result("memory.row_remap", "ok", gpu=g) for g in (0, 1)]
# what health's gate says of a gated drain with no qualification yet (integrations/slurm/
# gate.py): one is started, the node kept
STARTED = Step(Verb.START, "qualifying since now (attempt 1 of 2, GPU(s) 0, 1)", gpus=(0, 1),
               number=1)


def planned(row: states.Row, results: list[dict[str, object]]) -> slurm.Plan:
    """health's plan for the row's example: its reason set a second ago, a recorded
    script failure two seconds before (it makes only a "Prolog/Epilog error" gpuguard's),
    a drain record of gpuguard's for the finding (it resumes only its own row) and, for
    a gated drain, no qualification yet."""
    now = time.time()
    state, reason = row.example
    node = NodeInfo("n1", state, reason, now - 1 if reason else None, ["main"])
    assert slurm.reason_for(FAULT[:1]) == states.EXAMPLE_REASON
    return slurm.plan(results, set(), node, now - 3, states.EXAMPLE_REASON,
                      drained_for(FAULT[:1], gpus=2), STARTED)


@pytest.mark.parametrize("row", states.TABLE, ids=lambda r: f"{r.example[0]}-{r.owner}")
def test_each_row_of_the_state_table(row: states.Row) -> None:
    node = NodeInfo("n1", row.example[0], row.example[1], time.time(), ["main"])
    assert states.standing(node) == row.standing
    owner = slurm.owner(node, time.time() - 3)
    assert row.owner in (owner, states.FALLBACK.get(owner), states.Owner.ANYONE)
    assert states.row_for(row.standing, slurm.owner(node, time.time() - 3)) == row
    with_fault, when_whole = planned(row, FAULT), planned(row, WHOLE)
    assert (with_fault.do, when_whole.do) == (row.with_fault, row.when_whole), \
        (with_fault, when_whole)
    if row.does == states.Does.NOTHING:
        assert with_fault.reason is None and "not gpuguard's to change" in with_fault.why
    if row.with_fault in ("drain", "update"):
        assert with_fault.reason == states.EXAMPLE_REASON
    if row.does == states.Does.OWN_GATED:  # the passive verdict passes: the gate decides
        assert when_whole.step == STARTED and when_whole.why == STARTED.why
        assert slurm.plan(WHOLE, set(), NodeInfo("n1", *row.example, None, ["main"]), None,
                          None, drained_for(FAULT[:1], gpus=2)).do == "keep"  # none known


def test_every_standing_has_its_rows_and_any_owner_a_row() -> None:
    for at in states.Standing:
        for owner in states.Owner:
            assert states.row_for(at, owner).standing == at
    assert {r.with_fault for r in states.TABLE} <= {"drain", "keep", "update", "none"}


@pytest.mark.parametrize(("state", "standing"), [
    ("IDLE", "up"), ("MIXED", "up"), ("ALLOCATED+COMPLETING", "up"),
    ("IDLE+NOT_RESPONDING", "up"), ("IDLE+CLOUD", "up"), ("MIXED+RESERVED+PLANNED", "up"),
    ("IDLE+DRAIN", "drained"), ("MIXED+DRAIN+COMPLETING", "drained"),
    ("IDLE+DRAIN+NOT_RESPONDING", "drained"),
    ("DOWN", "down"), ("DOWN+NOT_RESPONDING", "down"), ("DOWN+DRAIN", "down"),
    ("DOWN+DRAIN+FAIL+POWERED_DOWN", "down"),
    ("IDLE+FAIL", "fail"), ("ALLOCATED+DRAIN+FAIL", "fail"), ("IDLE+FAIL+MAINT", "fail"),
    ("IDLE+MAINT", "maint"), ("IDLE+MAINT+RESERVED", "maint"), ("MIXED+DRAIN+MAINT", "maint"),
    ("IDLE+POWERED_DOWN", "power"), ("IDLE+CLOUD+POWERED_DOWN", "power"),
    ("IDLE+POWERING_DOWN", "power"), ("IDLE+DRAIN+POWER_DOWN", "power"),
    ("IDLE+POWERING_UP", "power"), ("MIXED+REBOOT_REQUESTED", "reboot"),
    ("IDLE+DRAIN+REBOOT_ISSUED", "reboot"),
    ("UNKNOWN", "other"), ("UNKNOWN+NOT_RESPONDING", "other"), ("FUTURE", "other"),
    ("ERROR", "other"), ("IDLE+INVALID_REG", "other"), ("IDLE+POWER_DRAIN", "other"),
    ("IDLE+SOMETHING_NEW", "other"), ("BLOCKED", "other"),
])
def test_the_standing_is_read_from_the_base_state_and_every_flag(state: str,
                                                                 standing: str) -> None:
    assert states.standing(NodeInfo("n1", state, "", None)) == standing


@pytest.mark.parametrize("reason", [
    "Kill task failed", "Not responding", "Node unexpectedly rebooted",
    "gres/gpu count reported lower than configured (1 < 2)", "Low RealMemory",
    "batch job complete failure", "Prolog error", "Epilog error", "NHC: check_gpu failed",
    "admin: cable swap"])
def test_slurms_own_reasons_and_others_are_never_gpuguards(reason: str) -> None:
    """Drained (or DOWN) for them, with a fault or without: nothing, ever. A Prolog or
    Epilog error is gpuguard's only just after its own recorded failure (none here)."""
    for state in ("IDLE+DRAIN", "MIXED+DRAIN", "DOWN+DRAIN", "IDLE", "DOWN"):
        node = NodeInfo("n1", state, reason, time.time(), ["main"])
        assert slurm.owner(node, None) == states.Owner.ANYONE
        for results in (FAULT, WHOLE):
            assert slurm.plan(results, set(), node, None, states.EXAMPLE_REASON,
                              drained_for(FAULT[:1], gpus=2)).do == "none", (state, results)


def test_the_docs_show_the_table() -> None:
    doc = (REPO / "docs" / "slurm.md").read_text()
    start = doc.index("<!-- the state table")
    table = doc[doc.index("\n", start) + 1:doc.index("<!-- end of the state table -->")]
    assert table == states.render()
