from gpuguard.profile import Profile
from gpuguard.results import Status
from gpuguard.snapshot import HostInfo, NvmlStatus, Snapshot


def test_loaded_ok_on_the_h200(h200, run_rule):
    [result] = run_rule("driver.loaded", h200)
    assert result.status is Status.OK
    assert "580.159.04" in result.message


def test_not_loaded_names_likely_causes(run_rule):
    snap = Snapshot(host=HostInfo(source="nvml"),
                    nvml=NvmlStatus(init_error="Driver Not Loaded",
                                    init_error_kind="NVMLError_DriverNotLoaded"))
    [result] = run_rule("driver.loaded", snap)
    assert result.status is Status.CRITICAL
    assert "nouveau" in result.message and "Secure Boot" in result.message
    assert result.remediation


def test_version_mismatch_is_named(run_rule):
    snap = Snapshot(nvml=NvmlStatus(init_error="RM has detected an NVML/RM version mismatch.",
                                    init_error_kind="NVMLError_LibRmVersionMismatch"))
    [result] = run_rule("driver.loaded", snap)
    assert "Driver/library version mismatch" in result.message


def test_responsive(run_rule):
    snap = Snapshot(nvml=NvmlStatus(hung_call="nvmlDeviceGetTemperature (GPU 3)", deadline_s=9.0))
    [result] = run_rule("driver.responsive", snap)
    assert result.status is Status.CRITICAL
    assert "nvmlDeviceGetTemperature (GPU 3)" in result.message
    ok = Snapshot(nvml=NvmlStatus(elapsed_s=0.05))
    assert run_rule("driver.responsive", ok)[0].status is Status.OK


def test_replayed_dump_is_not_measured(h200, run_rule):
    assert run_rule("driver.responsive", h200)[0].status is Status.SKIPPED


def test_version_against_profile(h200, run_rule):
    assert run_rule("driver.version", h200)[0].status is Status.SKIPPED
    good = Profile(driver_min_version="570.86.15", cuda_min_version="12.8")
    assert run_rule("driver.version", h200, good)[0].status is Status.OK
    old = Profile(driver_min_version="580.200.1")
    [result] = run_rule("driver.version", h200, old)
    assert result.status is Status.CRITICAL
    assert "580.159.04 is older than the required 580.200.1" in result.message
    cuda = Profile(cuda_min_version="13.1")
    [result] = run_rule("driver.version", h200, cuda)
    assert result.status is Status.CRITICAL
    assert "CUDA 13.0" in result.message
