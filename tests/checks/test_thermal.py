from gpuguard.results import Status
from gpuguard.snapshot import Reading
from tests.conftest import set_gpu


def test_margin_levels(h200, run_rule):
    [result] = run_rule("thermal.margin", h200)
    assert result.status is Status.OK
    assert result.observed["limit_c"] == 89  # derived from the T.Limit-relative XML
    set_gpu(h200, temperature_c=85)
    assert run_rule("thermal.margin", h200)[0].status is Status.WARNING
    set_gpu(h200, temperature_c=89)
    [result] = run_rule("thermal.margin", h200)
    assert result.status is Status.CRITICAL
    assert "89 C" in result.message


def test_falls_back_to_gpu_max_when_slowdown_unknown(h200, run_rule):
    set_gpu(h200, temperature_slowdown_c=Reading.not_supported(), temperature_c=86)
    [result] = run_rule("thermal.margin", h200)
    assert result.status is Status.WARNING
    assert result.observed["limit"] == "GPU max"
