"""A worker that dies of a signal inside an NVML call (nvmlDeviceGetGpuFabricInfoV did, on
a real H200 host) is a result naming the call, never a crash of `gpuguard check`."""

import json
import signal

from tests.conftest import gpuguard


def test_a_segfault_in_nvml_is_unknown_naming_the_call(fake_env, host_args):
    proc = gpuguard("check", *host_args, "--format", "json", "--timeout", "5",
                    env=fake_env(gpus=2, crash="nvmlDeviceGetTemperature", crash_gpu=1))
    # a verdict, not a signal or a traceback: unknown (3), as nothing else on this host of
    # the test's own fails (it once read the machine's real kernel log, and passed only
    # where that log held an Xid)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
    results = {(r["rule"], (r["gpu"] or {}).get("index")): r
               for r in json.loads(proc.stdout)["results"]}
    responsive = results[("driver.responsive", None)]
    assert responsive["status"] == "unknown"
    assert "died of SIGSEGV in" in responsive["message"]
    assert "nvmlDeviceGetTemperature (GPU 1)" in responsive["message"]
    dead = results[("thermal.margin", 1)]
    assert dead["status"] == "unknown"
    assert "nvmlDeviceGetTemperature (GPU 1)" in dead["message"], dead
    # every GPU rule that GPU 0 has, GPU 1 has too: none vanished
    assert {rule for rule, gpu in results if gpu == 0} == {rule for rule, gpu in results
                                                           if gpu == 1}


def test_the_snapshot_keeps_what_answered_before_the_crash(fake_env, host_args):
    proc = gpuguard("snapshot", *host_args, env=fake_env(gpus=1, fabric="completed",
                                             crash="nvmlDeviceGetGpuFabricInfoV"))
    assert proc.returncode == 0, proc.stderr
    snap = json.loads(proc.stdout)
    error = snap["nvml"]["sweep_error"]
    assert error == (f"WorkerDied: the NVML worker died of {signal.SIGSEGV.name} in "
                     "nvmlDeviceGetGpuFabricInfoV (GPU 0)")
    gpu = snap["gpus"][0]  # its line was never written: every reading names the death
    assert gpu["uuid"]["state"] == "error" and "nvmlDeviceGetGpuFabricInfoV" in gpu["uuid"]["error"]
