from gpuguard.model.results import Status
from gpuguard.model.snapshot import Reading
from tests.conftest import overridden, set_gpu


def test_tlimit_margin_levels(h200, run_rule):
    [result] = run_rule("thermal.margin", h200)
    assert result.status is Status.OK
    assert result.observed["tlimit_margin_c"] == 48
    set_gpu(h200, temperature_tlimit_margin_c=4)
    assert run_rule("thermal.margin", h200)[0].status is Status.WARNING
    set_gpu(h200, temperature_tlimit_margin_c=-2)
    [result] = run_rule("thermal.margin", h200)
    assert result.status is Status.CRITICAL
    assert "2 C past" in result.message


def test_absolute_thresholds_when_no_tlimit(h200, run_rule):
    set_gpu(h200, temperature_tlimit_margin_c=Reading.not_supported(),
            temperature_slowdown_c=89, temperature_gpu_max_c=87, temperature_c=40)
    [result] = run_rule("thermal.margin", h200)
    assert result.status is Status.OK and result.observed["limit_c"] == 89
    set_gpu(h200, temperature_c=85)
    assert run_rule("thermal.margin", h200)[0].status is Status.WARNING
    set_gpu(h200, temperature_c=89)
    [result] = run_rule("thermal.margin", h200)
    assert result.status is Status.CRITICAL
    assert "89 C" in result.message


def test_falls_back_to_gpu_max_when_slowdown_unknown(h200, run_rule):
    set_gpu(h200, temperature_tlimit_margin_c=Reading.not_supported(),
            temperature_slowdown_c=Reading.not_supported(), temperature_gpu_max_c=87,
            temperature_c=86)
    [result] = run_rule("thermal.margin", h200)
    assert result.status is Status.WARNING
    assert result.observed["limit"] == "GPU max"


def test_no_temperature_at_all_is_skipped(h200, run_rule):
    set_gpu(h200, temperature_tlimit_margin_c=Reading.not_supported(),
            temperature_c=Reading.not_supported())
    assert run_rule("thermal.margin", h200)[0].status is Status.SKIPPED


def test_an_unreadable_margin_is_unknown_not_judged_by_another_sensor(h200, run_rule):
    set_gpu(h200, temperature_tlimit_margin_c=Reading.failed("nvmlDeviceGetMarginTemperature: "
                                                             "Unknown Error"))
    [result] = run_rule("thermal.margin", h200)
    assert result.status is Status.UNKNOWN and "Unknown Error" in result.message



def test_margin_boundaries(h200, run_rule):
    # 0 C of margin is at T.Limit (critical); 5 C (warn_margin_c) still warns; 6 C is ok
    for margin, status in ((0, Status.CRITICAL), (1, Status.WARNING), (5, Status.WARNING),
                           (6, Status.OK)):
        set_gpu(h200, temperature_tlimit_margin_c=margin)
        assert run_rule("thermal.margin", h200)[0].status is status, margin
    set_gpu(h200, temperature_tlimit_margin_c=Reading.not_supported(),
            temperature_slowdown_c=89)
    for temp, status in ((89, Status.CRITICAL), (88, Status.WARNING), (84, Status.WARNING),
                         (83, Status.OK)):
        set_gpu(h200, temperature_c=temp)
        assert run_rule("thermal.margin", h200)[0].status is status, temp


def test_warn_margin_comes_from_the_rule(h200, run_rule, tmp_path):
    rules = overridden(tmp_path, "thermal.margin", warn_margin_c=10)
    set_gpu(h200, temperature_tlimit_margin_c=10)
    assert run_rule("thermal.margin", h200, rules=rules)[0].status is Status.WARNING
    set_gpu(h200, temperature_tlimit_margin_c=Reading.not_supported(),
            temperature_slowdown_c=89, temperature_c=79)
    [result] = run_rule("thermal.margin", h200, rules=rules)
    assert result.status is Status.WARNING
    assert result.message == "79 C is 10 C from the slowdown temperature 89 C"
