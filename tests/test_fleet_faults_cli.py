"""Issue 21, item 4, through the command line: the faults that stop fleets, each set up
for real (the fake NVML's switches, a kernel log, a procfs, sysfs and /dev tree of the
test's own), judged by a live `gpuguard check`."""

from __future__ import annotations

import json

from tests.conftest import gpuguard


def by_rule_and_gpu(proc):
    assert "Traceback" not in proc.stderr, proc.stderr
    return {(r["rule"], None if r["gpu"] is None else r["gpu"]["index"]): r
            for r in json.loads(proc.stdout)["results"]}


def test_a_corrupted_inforom_is_critical_on_its_gpu_only(fake_env, host_args):
    healthy = by_rule_and_gpu(gpuguard("check", *host_args, "--format", "json", "--only",
                                       "gpu.inforom", env=fake_env(gpus=2)))
    assert {k: r["status"] for k, r in healthy.items()} == \
        {("gpu.inforom", 0): "ok", ("gpu.inforom", 1): "ok"}
    assert healthy[("gpu.inforom", 0)]["message"] == (
        "InfoROM valid (image G520.0282.02.02; ecc 7.16, oem 2.1)")
    proc = gpuguard("check", *host_args, "--format", "json", "--only", "gpu.inforom",
                    env=fake_env(gpus=2, inforom="corrupted", inforom_gpu=1))
    assert proc.returncode == 2
    found = by_rule_and_gpu(proc)
    assert found[("gpu.inforom", 0)]["status"] == "ok"
    bad = found[("gpu.inforom", 1)]
    assert (bad["status"], bad["action"]) == ("critical", "inspect_hardware")
    assert bad["observed"]["corrupted"] == ["ecc"] and bad["observed"]["valid"] is False


def test_a_gsp_line_without_an_xid_fails_its_gpu_only(fake_env, tmp_path):
    """The fake NVML's GPU 1 sits at 00000000:11:00.0: a rate-limited GSP timeout logged
    for it, and nothing else."""
    from tests.conftest import own_host

    line = ("4,700,5000000000,-;NVRM: Rate limiting GSP RPC error prints for GPU at "
            "PCI:0000:11:00 (printing 1 of every 30).  The GPU likely needs to be reset.\n")
    args = own_host(tmp_path / "host", kmsg=line)
    proc = gpuguard("check", *args, "--format", "json", "--only", "gsp.firmware",
                    env=fake_env(gpus=2))
    assert proc.returncode == 2
    found = by_rule_and_gpu(proc)
    assert set(found) == {("gsp.firmware", 0), ("gsp.firmware", 1)}
    assert found[("gsp.firmware", 0)]["status"] == "ok"
    assert (found[("gsp.firmware", 1)]["status"], found[("gsp.firmware", 1)]["action"]) == \
        ("critical", "reset_gpu")


def test_stuck_processes_and_modules_from_the_hosts_own_trees(fake_env, tmp_path):
    """A procfs with nvidia-smi stuck in D for 400 s holding /dev/nvidiactl, a sysfs without
    nvidia-uvm and a /dev without its node, while the fake NVML lists a CUDA process."""
    from tests.conftest import own_host
    from tests.sources.test_gpu_devices import STUCK, proc_tree

    args = own_host(tmp_path / "host")
    proc = proc_tree(tmp_path / "trees", {4321: STUCK[4321], 2222: STUCK[2222]})
    (proc / "sys" / "kernel" / "random").mkdir(parents=True)
    (proc / "sys" / "kernel" / "random" / "boot_id").write_text(
        (tmp_path / "host" / "proc" / "sys" / "kernel" / "random" / "boot_id").read_text())
    args[args.index("--path.procfs") + 1] = str(proc)
    (tmp_path / "host" / "rootfs" / "dev").mkdir()  # a /dev without nvidia-uvm
    procs = tmp_path / "procs.txt"
    procs.write_text("0 4242 2048\n")
    run = gpuguard("check", *args, "--format", "json", "--only", "devices.*",
                   env=fake_env(gpus=1, procs_file=procs))
    found = by_rule_and_gpu(run)
    stuck = found[("devices.unkillable", None)]
    assert (stuck["status"], stuck["action"]) == ("warning", "reboot")
    assert "pid 4321 (nvidia-smi) holding /dev/nvidia0, /dev/nvidiactl for 400 s" \
        in stuck["message"]
    uvm = found[("devices.uvm", None)]
    assert uvm["status"] == "critical", uvm["message"]
    assert "while 1 CUDA process(es) run" in uvm["message"]
    assert found[("devices.peermem", None)]["status"] == "skipped"
    # the module loaded with its node: ok
    sysfs = tmp_path / "host" / "sys"
    (sysfs / "module" / "nvidia_uvm").mkdir(parents=True)
    (sysfs / "module" / "nvidia_uvm" / "initstate").write_text("live\n")
    (tmp_path / "host" / "rootfs" / "dev" / "nvidia-uvm").write_text("")
    run = gpuguard("check", *args, "--format", "json", "--only", "devices.uvm",
                   env=fake_env(gpus=1, procs_file=procs))
    assert by_rule_and_gpu(run)[("devices.uvm", None)]["status"] == "ok"
