from gpuguard.model.profile import Profile
from gpuguard.model.results import Status
from tests.conftest import overridden, set_gpu


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
    from gpuguard.model.snapshot import Reading

    set_gpu(h200, ecc_volatile_sram_corrected=Reading.not_supported(),
            ecc_volatile_dram_corrected=Reading.not_supported(),
            ecc_volatile_corrected=30_000_000)
    [result] = run_rule("ecc.corrected", h200)
    assert result.status is Status.WARNING
    assert "total" in result.message


def test_ecc_disabled_gpu_is_skipped_not_failed(h200, run_rule):
    from gpuguard.model.snapshot import Reading

    set_gpu(h200, ecc_volatile_uncorrected=Reading.not_supported())
    [result] = run_rule("ecc.uncorrected", h200)
    assert result.status is Status.SKIPPED



def test_uncorrected_limit_comes_from_the_rule(h200, run_rule, tmp_path):
    rules = overridden(tmp_path, "ecc.uncorrected", max_volatile_uncorrected=5)
    set_gpu(h200, ecc_volatile_uncorrected=5)
    assert run_rule("ecc.uncorrected", h200, rules=rules)[0].status is Status.OK
    set_gpu(h200, ecc_volatile_uncorrected=6)
    [result] = run_rule("ecc.uncorrected", h200, rules=rules)
    assert result.status is Status.CRITICAL
    assert result.message == "6 uncorrectable ECC error(s) since the driver loaded"


def test_corrected_limits_come_from_the_rule(h200, run_rule, tmp_path):
    from gpuguard.model.snapshot import Reading

    rules = overridden(tmp_path, "ecc.corrected", max_sram=5, max_dram=7, max_total=10)
    set_gpu(h200, ecc_volatile_sram_corrected=6, ecc_volatile_dram_corrected=8)
    [result] = run_rule("ecc.corrected", h200, rules=rules)
    assert result.message == ("corrected ECC errors since the driver loaded above threshold: "
                              "SRAM 6 > 5, DRAM 8 > 7")
    set_gpu(h200, ecc_volatile_sram_corrected=Reading.not_supported(),
            ecc_volatile_dram_corrected=Reading.not_supported(), ecc_volatile_corrected=11)
    [result] = run_rule("ecc.corrected", h200, rules=rules)
    assert result.status is Status.WARNING and "total 11 > 10" in result.message
    set_gpu(h200, ecc_volatile_corrected=10)
    assert run_rule("ecc.corrected", h200, rules=rules)[0].status is Status.OK


def test_corrected_total_at_the_default_limit_is_ok(h200, run_rule):
    from gpuguard.model.snapshot import Reading

    set_gpu(h200, ecc_volatile_sram_corrected=Reading.not_supported(),
            ecc_volatile_dram_corrected=Reading.not_supported(),
            ecc_volatile_corrected=20_000_000)
    assert run_rule("ecc.corrected", h200)[0].status is Status.OK


def test_dram_alone_is_judged_when_sram_is_not_reported(h200, run_rule):
    from gpuguard.model.snapshot import Reading

    set_gpu(h200, ecc_volatile_sram_corrected=Reading.not_supported(),
            ecc_volatile_dram_corrected=20_000_001, ecc_volatile_corrected=0)
    [result] = run_rule("ecc.corrected", h200)
    assert result.status is Status.WARNING and "DRAM 20000001 > 2e+07" in result.message


def test_daemon_fails_when_corrected_errors_grow(h200, default_rules):
    from gpuguard.judge.engine import evaluate
    from gpuguard.model.samples import Samples

    def judged(counts):
        history = Samples()
        for t, total in counts:
            history.add(set_gpu(h200, ecc_volatile_corrected=total), t)
        [result] = evaluate(h200, default_rules, Profile(), only=["ecc.corrected"],
                            samples=history)
        return result

    result = judged([(0, 3), (10, 7)])
    assert result.status is Status.WARNING
    assert result.message == "corrected ECC errors grew by 4 in the last 10 s"
    assert result.observed["grew_by"] == 4
    assert judged([(0, 1), (10, 2)]).status is Status.WARNING
    assert judged([(0, 7), (10, 7)]).status is Status.OK
    assert judged([(10, 7)]).status is Status.OK
