from gpuguard.model.profile import Profile
from gpuguard.model.results import Status
from gpuguard.model.snapshot import Reading
from tests.conftest import set_gpu, with_gpus


def test_count_against_profile(h200, run_rule):
    assert run_rule("gpu.count", h200, Profile(gpu_count=1))[0].status is Status.OK
    [result] = run_rule("gpu.count", h200, Profile(gpu_count=8))
    assert result.status is Status.CRITICAL
    assert "1 GPU(s) visible, the profile expects 8" in result.message


def test_no_profile_no_gpu_is_critical(h200, run_rule):
    assert run_rule("gpu.count", h200)[0].status is Status.OK
    h200.host.gpu_count = Reading.ok(0)
    h200.gpus = []
    assert run_rule("gpu.count", h200)[0].status is Status.CRITICAL


def test_a_lost_gpu_is_critical_and_an_answering_one_ok(h200, run_rule):
    with_gpus(h200, ["00000000:18:00.0", "00000000:28:00.0"])
    set_gpu(h200, 0, gpu_lost=False)
    set_gpu(h200, 1, gpu_lost=True)
    ok, lost = run_rule("gpu.lost", h200)
    assert ok.status is Status.OK
    assert lost.status is Status.CRITICAL and "fallen off the bus" in lost.message
    assert lost.gpu.index == 1


def test_lost_unknown_when_not_read(h200, run_rule):
    set_gpu(h200, gpu_lost=Reading.failed("nvmlDeviceGetUUID: timeout"))
    assert run_rule("gpu.lost", h200)[0].status is Status.UNKNOWN


def test_two_gpus_with_one_uuid_is_a_finding(h200, run_rule):
    with_gpus(h200, ["00000000:18:00.0", "00000000:28:00.0", "00000000:38:00.0"])
    assert run_rule("gpu.identity", h200)[0].status is Status.OK
    set_gpu(h200, 2, uuid=h200.gpus[0].uuid.get())
    [result] = run_rule("gpu.identity", h200)
    assert result.status is Status.CRITICAL
    assert "GPUs 0, 2 all report uuid" in result.message
    set_gpu(h200, 2, uuid="GPU-other", pci_bus_id="00000000:28:00.0")
    assert "GPUs 1, 2 all report pci_bus_id" in run_rule("gpu.identity", h200)[0].message


def test_lost_says_what_it_saw(h200, run_rule):
    set_gpu(h200, gpu_lost=False)
    assert run_rule("gpu.lost", h200)[0].observed == {"gpu_lost": False}
    set_gpu(h200, gpu_lost=True)
    assert run_rule("gpu.lost", h200)[0].observed == {"gpu_lost": True}


def test_empty_identities_are_not_a_clash_nor_distinct_and_no_gpu_is_ok(h200, run_rule):
    from gpuguard.model.snapshot import Reading
    from tests.conftest import with_gpus

    snap = with_gpus(h200, ["00000000:3B:00.0", "00000000:86:00.0"])
    for gpu in snap.gpus:
        gpu.uuid = Reading.ok("")
    [result] = run_rule("gpu.identity", snap)
    # every UUID empty (issue 20): no clash to report, and nothing that tells them apart
    assert result.status is Status.UNKNOWN and result.observed["unread"] == ["0", "1"]
    snap.gpus[0].uuid = Reading.ok("GPU-a")
    snap.gpus[1].uuid = Reading.ok("GPU-b")
    snap.gpus[1].pci_bus_id = Reading.ok("")
    assert run_rule("gpu.identity", snap)[0].status is Status.UNKNOWN
    snap.gpus = []
    [result] = run_rule("gpu.identity", snap)
    assert result.status is Status.OK and result.message == "no GPU to compare"


def test_identities_not_read_are_unknown_not_distinct(h200, run_rule):
    with_gpus(h200, ["00000000:18:00.0", "00000000:28:00.0"])
    set_gpu(h200, 1, uuid=Reading.failed("nvmlDeviceGetUUID: Unknown Error"))
    [result] = run_rule("gpu.identity", h200)
    assert result.status is Status.UNKNOWN and "GPU(s) 1" in result.message
    set_gpu(h200, 1, uuid="GPU-1")
    h200.nvml.hung_call = "nvmlDeviceGetTemperature (GPU 1)"  # kept from the last sweep
    assert run_rule("gpu.identity", h200)[0].status is Status.UNKNOWN


# --- gpu.compute (the active probe) ---------------------------------------------------


def test_gpu_compute_is_skipped_when_the_probe_did_not_run(h200, run_rule):
    [result] = run_rule("gpu.compute", h200)
    assert result.status is Status.SKIPPED
    assert "--active" in result.message


def test_gpu_compute_ok_when_the_pattern_reads_back(h200, run_rule):
    from tests.checks.probed import probed

    [result] = run_rule("gpu.compute", probed(h200))
    assert result.status is Status.OK
    assert result.observed["words"] == 262144 and result.observed["phases_ms"]["init"] == 497.0


def test_gpu_compute_one_wrong_word_is_critical(h200, run_rule):
    from tests.checks.probed import probed

    probed(h200, probe_compute={"error": None, "mismatches": 1, "words": 262144})
    [result] = run_rule("gpu.compute", h200)
    assert result.status is Status.CRITICAL
    assert "1 of 262144" in result.message


def test_gpu_compute_a_named_cuda_error_is_critical(h200, run_rule):
    from gpuguard.sources.cuda_api import describe
    from tests.checks.probed import probed

    error = f"cuInit returned {describe(802)} (phase init)"
    probed(h200, probe_compute={"error": error, "mismatches": None, "words": None})
    [result] = run_rule("gpu.compute", h200)
    assert result.status is Status.CRITICAL
    assert "CUDA_ERROR_SYSTEM_NOT_READY" in result.message and "fabric" in result.message


def test_gpu_compute_unknown_when_the_probe_hung_and_skipped_when_it_left_the_gpu(h200,
                                                                                 run_rule):
    from tests.checks.probed import probed

    probed(h200, probe_compute=Reading.failed("the active probe did not finish within its "
                                              "10 s deadline: GPU 0 phase compute: "
                                              "cuCtxSynchronize"))
    [result] = run_rule("gpu.compute", h200)
    assert result.status is Status.UNKNOWN and "cuCtxSynchronize" in result.message
    probed(h200, probe_skipped="busy: 95 % utilization > 10 %",
           probe_compute=Reading.not_supported("busy"))
    [result] = run_rule("gpu.compute", h200)
    assert result.status is Status.SKIPPED and "95 %" in result.message


def test_gpu_compute_ok_reports_no_mismatch(h200, run_rule):
    from tests.checks.probed import probed

    assert run_rule("gpu.compute", probed(h200))[0].observed["mismatches"] == 0


def test_a_count_the_listed_gpus_do_not_match_is_unknown_never_ok(h200, run_rule):
    """A replay that says gpu_count 2 and lists no GPU (issue 20): inconsistent input."""
    from gpuguard.model.snapshot import Reading

    h200.host.gpu_count = Reading.ok(2)
    [result] = run_rule("gpu.count", h200)
    assert result.status is Status.UNKNOWN and "counts 2 GPU(s) but 1 are listed" in \
        result.message
    h200.gpus = []
    assert run_rule("gpu.count", h200)[0].status is Status.UNKNOWN
    h200.host.gpu_count = Reading.ok(0)
    assert run_rule("gpu.count", h200)[0].status is Status.CRITICAL  # no GPU, consistently


def test_gpus_seen_since_boot_that_are_gone_are_critical_by_name(h200, run_rule):
    """The daemon's memory of the GPUs it saw (issue 20): one gone is critical even with
    the profile's count met (or no count), named so an ack and the supervisor can say
    which; an empty list is no finding, and no reading (check, a sweep that could not
    tell) leaves the count as it was."""
    gone = {"uuid": "GPU-1", "pci_bus_id": "00000000:28:00.0", "index": 1, "name": "H200"}
    assert run_rule("gpu.count", h200, Profile(gpu_count=1))[0].status is Status.OK
    h200.host.gpus_missing = Reading.ok([])
    assert run_rule("gpu.count", h200, Profile(gpu_count=1))[0].status is Status.OK
    h200.host.gpus_missing = Reading.ok([gone])
    [result] = run_rule("gpu.count", h200, Profile(gpu_count=1))
    assert result.status is Status.CRITICAL
    assert result.observed["names"] == ["GPU 1 (GPU-1, 00000000:28:00.0)"]
    assert result.observed["gpus"] == [1] and "seen since boot are gone" in result.message


# -- gpu.inforom (issue 21): a corrupted InfoROM is an RMA ------------------------------

VALID = {"valid": True, "objects": {"oem": "2.1", "ecc": "7.16"}, "corrupted": []}


def test_the_real_h200s_inforom_is_ok(h200, run_rule):
    """Both recordings carry the versions (nvidia-smi's XML has no validation)."""
    from tests.checks import h200x2

    for snap in (h200, h200x2.snapshot()):
        for result in run_rule("gpu.inforom", snap):
            assert result.status is Status.OK, result.message
            assert result.message == ("InfoROM versions read (image G520.0282.02.02; ecc 7.16, "
                                      "oem 2.1); NVML does not validate it here")


def test_a_corrupted_inforom_is_critical_and_goes_to_a_person(h200, run_rule):
    [result] = run_rule("gpu.inforom", set_gpu(h200, inforom=VALID))
    assert (result.status, result.message) == (
        Status.OK, "InfoROM valid (image G520.0282.02.02; ecc 7.16, oem 2.1)")
    [result] = run_rule("gpu.inforom", set_gpu(h200, inforom={**VALID, "valid": False}))
    assert result.status is Status.CRITICAL and result.action == "inspect_hardware"
    assert result.message == "the InfoROM is corrupted (nvmlDeviceValidateInforom)"
    # the validation passes but reading an object's version says it is corrupted
    [result] = run_rule("gpu.inforom", set_gpu(h200, inforom={**VALID, "corrupted": ["ecc"]}))
    assert result.status is Status.CRITICAL
    assert result.message == ("the InfoROM is corrupted: reading its ecc object version says "
                              "so")
    [result] = run_rule("gpu.inforom", set_gpu(h200, inforom={
        "valid": None, "objects": {}, "corrupted": []}, inforom_image_version=Reading.failed("x")))
    assert result.message == "InfoROM versions read (image ?); NVML does not validate it here"


def test_an_unread_inforom_is_unknown_and_a_missing_one_skipped(h200, run_rule):
    [result] = run_rule("gpu.inforom", set_gpu(h200, inforom=Reading.failed(
        "nvmlDeviceValidateInforom: Unknown Error")))
    assert result.status is Status.UNKNOWN
    [result] = run_rule("gpu.inforom", set_gpu(h200, inforom=Reading()))
    assert result.status is Status.SKIPPED
    # a value of the wrong shape is an error reading, never judged
    [result] = run_rule("gpu.inforom", set_gpu(h200, inforom={"valid": "no"}))
    assert result.status is Status.UNKNOWN


def test_a_seen_gpu_handed_to_another_driver_is_named_not_gone(h200, run_rule):
    """A GPU the daemon saw, now on the bus bound to vfio-pci (libvirt's managed passthrough
    hands it to a VM after boot) or excluded by the driver, was given away, not lost: named,
    not critical (the review of issue 36). Still bound to nvidia, or with the bus unread, it
    is gone as before."""
    listed = h200.gpus[0].pci_bus_id.get()
    gone = {"uuid": "GPU-1", "pci_bus_id": "00000000:28:00.0", "index": 1, "name": "H200"}
    h200.host.gpus_missing = Reading.ok([gone])

    def bus(driver: str | None, excluded: bool | None = None) -> None:
        h200.host.pci_gpus = Reading.ok([
            {"address": listed.lower()[4:], "driver": "nvidia", "in_driver_procfs": None,
             "excluded": None},
            {"address": "0000:28:00.0", "driver": driver, "in_driver_procfs": None,
             "excluded": excluded}])

    bus("vfio-pci")
    [result] = run_rule("gpu.count", h200)
    assert result.status is Status.OK, result.message
    assert "0000:28:00.0 (vfio-pci)" in result.message
    bus("nvidia", excluded=True)
    [result] = run_rule("gpu.count", h200)
    assert result.status is Status.OK, result.message
    assert "excluded by the driver" in result.message
    bus("nvidia")
    assert run_rule("gpu.count", h200)[0].status is Status.CRITICAL
    h200.host.pci_gpus = Reading.not_supported("no sysfs")
    assert run_rule("gpu.count", h200)[0].status is Status.CRITICAL


def test_a_handle_refused_for_permission_is_unknown(h200, run_rule):
    h200.gpus[0].handle_error = Reading.ok(
        "nvmlDeviceGetHandleByIndex: Insufficient Permissions")
    assert run_rule("gpu.lost", h200)[0].status is Status.UNKNOWN
    h200.gpus[0].handle_error = Reading.ok("nvmlDeviceGetHandleByIndex: Unknown Error")
    assert run_rule("gpu.lost", h200)[0].status is Status.CRITICAL
