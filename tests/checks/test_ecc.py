from gpuguard.profile import Profile
from gpuguard.results import Status
from tests.conftest import set_gpu


def test_ecc_mode_matches(h200, run_rule):
    [result] = run_rule("ecc.mode", h200, Profile(ecc_expected=True))
    assert result.status is Status.OK


def test_ecc_mode_off_against_profile(h200, run_rule):
    set_gpu(h200, ecc_mode_current=False, ecc_mode_pending=False)
    [result] = run_rule("ecc.mode", h200, Profile(ecc_expected=True))
    assert result.status is Status.WARNING
    assert "expects it enabled" in result.message


def test_ecc_mode_pending_change(h200, run_rule):
    set_gpu(h200, ecc_mode_pending=False)
    [result] = run_rule("ecc.mode", h200)
    assert result.status is Status.WARNING
    assert "pending" in result.message


def test_uncorrected(h200, run_rule):
    [result] = run_rule("ecc.uncorrected", h200)
    assert result.status is Status.OK
    set_gpu(h200, ecc_volatile_uncorrected=2, ecc_volatile_dram_uncorrected=2)
    [result] = run_rule("ecc.uncorrected", h200)
    assert result.status is Status.CRITICAL
    assert result.observed["volatile_uncorrected"] == 2


def test_corrected_sram_threshold(h200, run_rule):
    set_gpu(h200, ecc_volatile_sram_corrected=10001)
    [result] = run_rule("ecc.corrected", h200)
    assert result.status is Status.WARNING
    assert "SRAM 10001" in result.message
    set_gpu(h200, ecc_volatile_sram_corrected=10000)
    [result] = run_rule("ecc.corrected", h200)
    assert result.status is Status.OK


def test_corrected_falls_back_to_total_without_split(h200, run_rule):
    from gpuguard.snapshot import Reading

    set_gpu(h200, ecc_volatile_sram_corrected=Reading.not_supported(),
            ecc_volatile_dram_corrected=Reading.not_supported(),
            ecc_volatile_corrected=30_000_000)
    [result] = run_rule("ecc.corrected", h200)
    assert result.status is Status.WARNING
    assert "total" in result.message


def test_ecc_disabled_gpu_is_skipped_not_failed(h200, run_rule):
    from gpuguard.snapshot import Reading

    set_gpu(h200, ecc_volatile_uncorrected=Reading.not_supported())
    [result] = run_rule("ecc.uncorrected", h200)
    assert result.status is Status.SKIPPED
