"""devices.*: processes stuck holding GPU devices, nvidia-uvm and nvidia-peermem (issue 21,
item 4), on the real H200 recording with the device facts set as the source gives them."""

from __future__ import annotations

from typing import Any

from gpuguard.model.profile import Profile
from gpuguard.model.results import Status
from gpuguard.model.snapshot import Process, Reading
from tests.conftest import overridden, set_gpu


def devices(h200, stuck: Any = None, modules: Any = None, rdma: Any = None, nodes=None):
    parts = {k: v for k, v in (("stuck", stuck), ("modules", modules), ("rdma", rdma))
             if v is not None}
    h200.host.gpu_devices = Reading.ok(parts)
    h200.host.device_nodes = Reading.ok(nodes if nodes is not None else
                                        ["nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"])
    h200.host.__post_init__()
    return h200


def proc(pid, off_cpu_s, comm="nvidia-smi", held=("/dev/nvidiactl",)):
    return {"pid": pid, "comm": comm, "off_cpu_s": off_cpu_s, "devices": list(held)}


def stuck(*processes, more=0, unreadable=()):
    return {"processes": list(processes), "more": more, "unreadable": list(unreadable),
            "scanned": 200}


def test_a_process_stuck_long_holding_a_gpu_device_is_a_warning_to_reboot(h200, run_rule):
    [result] = run_rule("devices.unkillable", devices(h200, stuck(
        proc(4321, 400.0, held=("/dev/nvidia0", "/dev/nvidiactl")), proc(1234, 50.0))))
    assert (result.status, result.action) == (Status.WARNING, "reboot")
    assert result.message == ("1 process(es) stuck in uninterruptible sleep holding GPU "
                              "devices: pid 4321 (nvidia-smi) holding /dev/nvidia0, "
                              "/dev/nvidiactl for 400 s. They cannot be killed and keep the "
                              "GPU from being reset")
    assert [p["pid"] for p in result.observed["processes"]] == [4321, 1234]


def test_the_limit_is_the_rules_threshold(h200, run_rule, tmp_path):
    at = devices(h200, stuck(proc(1, 120.0)))
    assert run_rule("devices.unkillable", at)[0].status is Status.WARNING
    below = devices(h200, stuck(proc(1, 119.9)))
    [result] = run_rule("devices.unkillable", below)
    assert result.status is Status.OK
    assert result.message == ("no process stuck in uninterruptible sleep holds a GPU device "
                              "(1 in it for less than 120 s)")
    rules = overridden(tmp_path, "devices.unkillable", min_stuck_s=100)
    assert run_rule("devices.unkillable", below, rules=rules)[0].status is Status.WARNING


def test_five_are_named_and_the_rest_counted(h200, run_rule):
    many = [proc(100 + n, 300.0 + n, comm=f"p{n}") for n in range(7)]
    [result] = run_rule("devices.unkillable", devices(h200, stuck(*many, more=2)))
    assert result.message.startswith("9 process(es) stuck in uninterruptible sleep")
    assert "pid 104 (p4)" in result.message and "pid 105" not in result.message
    assert "; and 4 more. They cannot be killed" in result.message
    [result] = run_rule("devices.unkillable", devices(h200, stuck(*many[:5])))
    assert "more" not in result.message
    [result] = run_rule("devices.unkillable", devices(h200, stuck(*many[:6])))
    assert "; and 1 more. They" in result.message


def test_what_cannot_be_told_is_unknown(h200, run_rule):
    # in D holding a GPU device, but how long cannot be read (no /proc/PID/sched)
    [result] = run_rule("devices.unkillable", devices(h200, stuck(proc(7, None))))
    assert result.status is Status.UNKNOWN and "how long cannot be told" in result.message
    # stuck long, but its files cannot be listed (another user's, without root)
    hidden = {"pid": 9, "comm": "x", "off_cpu_s": 500.0}
    [result] = run_rule("devices.unkillable", devices(h200, stuck(unreadable=[hidden])))
    assert result.status is Status.UNKNOWN and "run as root" in result.message
    at_limit = {**hidden, "off_cpu_s": 120.0}
    assert run_rule("devices.unkillable",
                    devices(h200, stuck(unreadable=[at_limit])))[0].status is Status.UNKNOWN
    brief = {**hidden, "off_cpu_s": 5.0}
    assert run_rule("devices.unkillable",
                    devices(h200, stuck(unreadable=[brief])))[0].status is Status.OK
    [result] = run_rule("devices.unkillable",
                        devices(h200, {"error": "the scan stopped after 9 processes"}))
    assert result.status is Status.UNKNOWN and "the scan stopped" in result.message


def test_a_replay_without_the_roots_is_skipped(h200, run_rule):
    for rule in ("devices.unkillable", "devices.uvm"):
        assert run_rule(rule, devices(h200))[0].status is Status.SKIPPED
        assert run_rule(rule, h200)[0].status is Status.SKIPPED  # no gpu_devices at all


def with_cuda(h200, pids=(4242,)):
    return set_gpu(h200, compute_processes=[Process(pid, 1 << 30, "vllm") for pid in pids])


def test_uvm_is_judged_only_while_cuda_runs_or_where_the_profile_requires_it(h200, run_rule):
    unloaded = {"nvidia_uvm": None, "nvidia_peermem": None}
    # the real H200 fixture lists no compute process: not needed yet
    [result] = run_rule("devices.uvm", devices(h200, modules=unloaded, nodes=["nvidia0"]))
    assert (result.status, result.message) == (
        Status.OK, "nvidia-uvm is not loaded, and not needed yet: it loads on the first CUDA use")
    [result] = run_rule("devices.uvm", devices(h200, modules=unloaded, nodes=["nvidia0"]),
                        Profile(uvm_required=True))
    assert (result.status, result.action) == (Status.CRITICAL, "none")
    assert result.message == ("nvidia-uvm is not loaded while the profile requires it (uvm: "
                              "required): CUDA cannot start (cuInit fails) until it is")
    [result] = run_rule("devices.uvm", devices(with_cuda(h200), modules=unloaded,
                                               nodes=["nvidia0"]))
    assert result.status is Status.CRITICAL and "while 1 CUDA process(es) run" in result.message


def test_uvm_loaded_needs_its_device_node(h200, run_rule):
    live = {"nvidia_uvm": "live", "nvidia_peermem": None}
    [result] = run_rule("devices.uvm", devices(with_cuda(h200), modules=live))
    assert (result.status, result.message) == (
        Status.OK, "nvidia-uvm is loaded with /dev/nvidia-uvm (1 CUDA process(es) run)")
    assert result.observed["nodes"] == ["nvidia-uvm", "nvidia-uvm-tools"]
    [result] = run_rule("devices.uvm", devices(with_cuda(h200), modules=live,
                                               nodes=["nvidia0", "nvidiactl"]))
    assert result.status is Status.CRITICAL and "/dev/nvidia-uvm is missing" in result.message
    builtin = {"nvidia_uvm": "builtin"}
    assert run_rule("devices.uvm", devices(h200, modules=builtin),
                    Profile(uvm_required=True))[0].status is Status.OK
    going = {"nvidia_uvm": "going"}
    [result] = run_rule("devices.uvm", devices(h200, modules=going), Profile(uvm_required=True))
    assert result.status is Status.CRITICAL and "nvidia-uvm is going" in result.message


def test_uvm_cannot_tell_without_a_process_list(h200, run_rule):
    set_gpu(h200, compute_processes=Reading.not_supported())
    [result] = run_rule("devices.uvm", devices(h200, modules={"nvidia_uvm": None}))
    assert result.status is Status.SKIPPED and "cannot be read" in result.message
    [result] = run_rule("devices.uvm", devices(h200, modules={"nvidia_uvm": "live"}))
    assert result.status is Status.OK  # loaded: fine whether or not CUDA runs
    [result] = run_rule("devices.uvm", devices(h200, modules={
        "nvidia_uvm": "unreadable: permission denied"}), Profile(uvm_required=True))
    assert result.status is Status.UNKNOWN


def test_peermem_only_where_gpudirect_rdma_is_asked_for(h200, run_rule):
    rdma = Profile(gpudirect_rdma=True)
    loaded = {"nvidia_uvm": "live", "nvidia_peermem": "live"}
    assert run_rule("devices.peermem", devices(h200, modules={"nvidia_peermem": None},
                                               rdma=[]))[0].status is Status.SKIPPED
    [result] = run_rule("devices.peermem", devices(h200, modules=loaded, rdma=["uverbs0"]), rdma)
    assert (result.status, result.message) == (
        Status.OK, "nvidia-peermem is loaded, 1 RDMA device node(s)")
    [result] = run_rule("devices.peermem", devices(h200, modules={"nvidia_peermem": None},
                                                   rdma=["uverbs0"]), rdma)
    assert (result.status, result.action) == (Status.WARNING, "none")
    assert result.message.startswith("nvidia-peermem is not loaded: GPUDirect RDMA falls back")
    [result] = run_rule("devices.peermem", devices(h200, modules=loaded, rdma=[]), rdma)
    assert result.status is Status.WARNING and "no RDMA device node" in result.message
    assert run_rule("devices.peermem", devices(h200, modules=loaded), rdma)[0].status \
        is Status.SKIPPED  # /dev/infiniband not read here
    [result] = run_rule("devices.peermem", devices(h200, modules={
        "nvidia_peermem": "unreadable: x"}, rdma=[]), rdma)
    assert result.status is Status.UNKNOWN


def test_uvm_where_dev_cannot_be_read(h200, run_rule):
    """A container whose /dev is not the host's (the DaemonSet mounts none): the CUDA
    processes running already opened the node, so a live module is ok; a required one
    cannot be vouched for."""
    live = {"nvidia_uvm": "live"}
    snap = devices(with_cuda(h200), modules=live)
    snap.host.device_nodes = Reading.failed("cannot list /host/dev: No such file or directory")
    snap.host.__post_init__()
    [result] = run_rule("devices.uvm", snap)
    assert (result.status, result.message) == (
        Status.OK, "nvidia-uvm is loaded (/dev not read here) (1 CUDA process(es) run)")
    assert result.observed["nodes"] is None
    [result] = run_rule("devices.uvm", snap, Profile(uvm_required=True))
    assert result.status is Status.UNKNOWN and "/host/dev" in result.message
    [result] = run_rule("devices.uvm", devices(snap, modules={"nvidia_uvm": None}))
    assert result.status is Status.CRITICAL  # not loaded while CUDA runs: /dev not needed
