"""mig.mode on the real 2 x H200 host (MIG disabled, none pending) and its faults."""

from __future__ import annotations

from gpuguard.model.profile import Profile
from gpuguard.model.results import Status
from gpuguard.model.snapshot import Reading
from tests.checks import h200x2
from tests.conftest import set_gpu


def test_mig_disabled_none_pending_is_ok(run_rule):
    results = run_rule("mig.mode", h200x2.snapshot())
    assert [(r.status, r.message) for r in results] == [(Status.OK, "MIG disabled")] * 2


def test_a_pending_change_is_a_warning(h200, run_rule):
    set_gpu(h200, mig_mode_current=False, mig_mode_pending=True)
    [result] = run_rule("mig.mode", h200)
    assert result.status is Status.WARNING
    assert result.message == ("MIG is disabled but enabled is pending: it takes effect at the "
                              "next GPU reset")


def test_the_profile_enforces_the_mode(h200, run_rule):
    set_gpu(h200, mig_mode_current=False, mig_mode_pending=False)
    assert run_rule("mig.mode", h200, Profile(mig_expected=False))[0].status is Status.OK
    [result] = run_rule("mig.mode", h200, Profile(mig_expected=True))
    assert result.status is Status.CRITICAL
    assert result.message == "MIG is disabled, the profile wants it enabled"
    set_gpu(h200, mig_mode_pending=True)
    [result] = run_rule("mig.mode", h200, Profile(mig_expected=True))
    assert result.status is Status.CRITICAL and "pending: reset the GPU" in result.message


def test_no_mig_is_skipped_and_unread_unknown(h200, run_rule):
    set_gpu(h200, mig_mode_current=Reading.not_supported(),
            mig_mode_pending=Reading.not_supported())
    assert run_rule("mig.mode", h200)[0].status is Status.SKIPPED
    set_gpu(h200, mig_mode_current=False, mig_mode_pending=Reading.failed("x"))
    assert run_rule("mig.mode", h200)[0].status is Status.UNKNOWN
