from gpuguard.model.profile import Profile
from gpuguard.model.results import Status
from gpuguard.model.snapshot import HostInfo, NvmlStatus, Snapshot


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


def stack(snap, procfs="procfs-match", log=None, sysfs_tree=None, rootfs=None):
    from gpuguard.io.paths import Paths
    from gpuguard.sources.host import HostOptions, collect_host
    from tests.conftest import FIXTURES

    opts = HostOptions(
        paths=Paths(procfs=FIXTURES / procfs, sysfs=FIXTURES / (sysfs_tree or "nowhere"),
                    rootfs=FIXTURES / (rootfs or "rootfs-cdi-current")),
        kmsg_file=FIXTURES / "kmsg" / (log or "dmesg.log"))
    collect_host(snap, opts)
    return snap


def test_module_matches_library(h200, run_rule):
    [result] = run_rule("driver.module_match", stack(h200))
    assert result.status is Status.OK


def test_module_mismatch_is_critical(h200, run_rule):
    [result] = run_rule("driver.module_match", stack(h200, "procfs-mismatch"))
    assert result.status is Status.CRITICAL
    assert "Driver/library version mismatch" in result.message
    assert "570.133.20" in result.message and "580.159.04" in result.message


def test_nouveau(h200, run_rule):
    assert run_rule("driver.nouveau", stack(h200))[0].status is Status.OK
    [result] = run_rule("driver.nouveau", stack(h200, "procfs-nouveau"))
    assert result.status is Status.CRITICAL


def not_loaded(kind="NVMLError_DriverNotLoaded", error="Driver Not Loaded"):
    return Snapshot(host=HostInfo(source="nvml"),
                    nvml=NvmlStatus(init_error=error, init_error_kind=kind))


def test_loaded_names_nouveau_as_the_cause(run_rule):
    [result] = run_rule("driver.loaded", stack(not_loaded(), "procfs-nouveau"))
    assert "the nouveau driver is loaded and holds the GPU" in result.message
    assert "the nvidia kernel module is not loaded" in result.message
    assert result.observed["causes_found"]


def test_loaded_names_secure_boot_refusing_the_module(run_rule):
    snap = stack(not_loaded(), "procfs-nouveau", log="unsigned-module.log",
                 sysfs_tree="sysfs-aer")
    [result] = run_rule("driver.loaded", snap)
    assert "Secure Boot is on and the kernel refused the unsigned nvidia module" \
        in result.message


def test_loaded_names_the_version_mismatch(run_rule):
    snap = stack(not_loaded("NVMLError_LibRmVersionMismatch",
                            "RM has detected an NVML/RM version mismatch."),
                 "procfs-mismatch", log="api-mismatch.log")
    [result] = run_rule("driver.loaded", snap)
    assert ("Driver/library version mismatch: the library is 580.159.04, the kernel module "
            "570.133.20") in result.message


def test_loaded_names_missing_device_nodes(run_rule, tmp_path):
    (tmp_path / "dev").mkdir()
    snap = stack(not_loaded("NVMLError_NoPermission", "Insufficient Permissions"),
                 rootfs=str(tmp_path))
    [result] = run_rule("driver.loaded", snap)
    assert "/dev/nvidiactl is missing" in result.message


# -- causes, states and boundaries (scripts/mutate_rules.py survivors) -------------------

def facts(snap, **readings):
    from gpuguard.model.snapshot import Reading

    for name, value in readings.items():
        setattr(snap.host, name, value if isinstance(value, Reading) else Reading.ok(value))
    snap.host.__post_init__()
    return snap


def causes(run_rule, snap):
    return run_rule("driver.loaded", snap)[0].observed["causes_found"]


def test_secure_boot_is_named_only_when_it_is_known_to_be_on(run_rule):
    from gpuguard.model.snapshot import Reading

    on = facts(not_loaded(), kernel_modules=["i2c_core"], kernel_log={"xids": []},
               secure_boot=True)
    assert causes(run_rule, on) == ["the nvidia kernel module is not loaded",
                                    "Secure Boot is on: an unsigned nvidia module would be "
                                    "refused"]
    off = facts(not_loaded(), kernel_modules=["i2c_core"], secure_boot=False,
                kernel_log={"xids": [], "unsigned_module_rejected": True})
    assert causes(run_rule, off) == ["the nvidia kernel module is not loaded"]
    unread = facts(not_loaded(), kernel_modules=["i2c_core"],
                   kernel_log={"xids": [], "unsigned_module_rejected": True},
                   secure_boot=Reading.failed("no efivars"))
    assert causes(run_rule, unread) == ["the nvidia kernel module is not loaded"]


def test_module_version_is_a_mismatch_cause_only_for_a_mismatch_error(run_rule):
    snap = facts(not_loaded("NVMLError_NoPermission", "Insufficient Permissions"),
                 kernel_modules=["nvidia"], kernel_log={"xids": []},
                 kernel_module_version="570.133.20",
                 device_nodes=["nvidiactl", "nvidia0"])
    assert causes(run_rule, snap) == []
    snap = facts(not_loaded("NVMLError_LibRmVersionMismatch", "mismatch"),
                 kernel_modules=["nvidia"], kernel_log={"xids": []},
                 kernel_module_version="570.133.20",
                 device_nodes=["nvidiactl", "nvidia0"])
    assert causes(run_rule, snap) == ["Driver/library version mismatch: the kernel module is "
                                      "570.133.20"]


def test_a_hung_call_with_a_known_driver_version_is_still_loaded(h200, run_rule):
    from gpuguard.model.snapshot import Reading

    h200.nvml = NvmlStatus(hung_call="nvmlDeviceGetPowerUsage (GPU 0)", deadline_s=9.0)
    assert run_rule("driver.loaded", h200)[0].status is Status.OK
    facts(h200, driver_version=Reading.failed("timed out"))
    [result] = run_rule("driver.loaded", h200)
    assert result.status is Status.UNKNOWN
    assert result.message == "NVML did not answer during nvmlDeviceGetPowerUsage (GPU 0)"
    # no hung call and no version: the reading's own failure, not a hang
    h200.nvml = NvmlStatus()
    [result] = run_rule("driver.loaded", h200)
    assert result.status is Status.UNKNOWN and "did not answer" not in result.message


def test_responsive_states(run_rule):
    [result] = run_rule("driver.responsive", Snapshot(nvml=NvmlStatus()))
    assert result.status is Status.SKIPPED and result.message == "not measured: replayed input"
    started = Snapshot(nvml=NvmlStatus(elapsed_s=0.5, init_error="Driver Not Loaded"))
    [result] = run_rule("driver.responsive", started)
    assert result.status is Status.SKIPPED
    assert result.message == "NVML did not start (see driver.loaded)"
    stopped = Snapshot(nvml=NvmlStatus(elapsed_s=0.5, sweep_error="GPU 2 vanished"))
    [result] = run_rule("driver.responsive", stopped)
    assert result.status is Status.UNKNOWN
    assert result.message == "the NVML sweep stopped early: GPU 2 vanished"


def test_the_required_version_itself_is_enough(h200, run_rule):
    exact = Profile(driver_min_version="580.159.04", cuda_min_version="13.0")
    assert run_rule("driver.version", h200, exact)[0].status is Status.OK
