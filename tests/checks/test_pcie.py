from gpuguard.results import Status
from tests.conftest import set_gpu


def test_link_width_full_is_ok(h200, run_rule):
    [result] = run_rule("pcie.link_width", h200)
    assert result.status is Status.OK
    assert result.observed["current"] == result.observed["max"] == 16


def test_link_width_narrow_under_load_is_critical(h200, run_rule):
    set_gpu(h200, pcie_link_width_current=8, utilization_gpu_percent=95)
    [result] = run_rule("pcie.link_width", h200)
    assert result.status is Status.CRITICAL
    assert "x8" in result.message and "x16" in result.message
    assert result.remediation and "lspci" in result.remediation


def test_link_width_narrow_while_idle_is_not_judged(h200, run_rule):
    # False positive that users complain about: links narrow to save power at idle.
    set_gpu(h200, pcie_link_width_current=8, utilization_gpu_percent=0)
    [result] = run_rule("pcie.link_width", h200)
    assert result.status is Status.OK
    assert "idle" in result.message


def test_link_gen_idle_downshift_is_normal(h200, run_rule):
    set_gpu(h200, pcie_link_gen_current=1, utilization_gpu_percent=0)
    [result] = run_rule("pcie.link_gen", h200)
    assert result.status is Status.OK
    assert "power saving" in result.message


def test_link_gen_low_under_load_warns(h200, run_rule):
    set_gpu(h200, pcie_link_gen_current=3, utilization_gpu_percent=80)
    [result] = run_rule("pcie.link_gen", h200)
    assert result.status is Status.WARNING
    assert "Gen3" in result.message and "Gen5" in result.message


def test_busy_threshold_comes_from_the_rule(h200, run_rule, default_rules):
    # 15% is below the default busy threshold (20): not judged.
    set_gpu(h200, pcie_link_width_current=8, utilization_gpu_percent=15)
    [result] = run_rule("pcie.link_width", h200)
    assert result.status is Status.OK


def test_replays(h200, run_rule):
    [result] = run_rule("pcie.replays", h200)
    assert result.status is Status.OK
    set_gpu(h200, pcie_replay_counter=5000)
    [result] = run_rule("pcie.replays", h200)
    assert result.status is Status.WARNING
    assert "5000" in result.message
