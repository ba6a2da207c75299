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
