"""`gpuguard check --active` end to end: the real CLI, the real forked workers, the real
deadline, on the fake NVML and the fake libcuda.so.1 (tests/fake_cuda/fake_cuda.c)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, gpuguard, own_host

PROBE_RULES = ("gpu.compute", "memory.pattern", "memory.bandwidth", "pcie.bandwidth",
               "nvlink.bandwidth")
SMALL = ("--active-buffer-mib", "4", "--active-pattern-mib", "2")
# The fake's copies are memcpy (3.5-17 GB/s here): floors it meets by far (the per-model
# ones are a real H200's) and a slowed copy (40 ms per MiB: 0.05-0.1 GB/s) does not.
FAKE_FLOORS = "active_probe:\n  floors_gbps:\n    NVIDIA H200: {pcie: 0.5, memory: 0.5, " \
              "nvlink: 0.5}\n"


Run = Callable[..., tuple[int, dict[tuple[str, int | None], dict[str, Any]]]]


@pytest.fixture
def probe(fake_nvml: Path, fake_cuda: Path, tmp_path: Path) -> Run:
    """Run `check --active --format json` on 2 fake GPUs; the exit code and each result
    by (rule, GPU index)."""
    profile = tmp_path / "profile.yaml"
    profile.write_text(FAKE_FLOORS)

    def run(*args: str, cuda: bool = True, **switches: str | int) -> tuple[int, Any]:
        env = {"LD_LIBRARY_PATH": f"{fake_nvml}:{fake_cuda}" if cuda else str(fake_nvml),
               "FAKE_NVML_GPUS": "2", "FAKE_NVML_MEM_TOTAL_MIB": "1000",
               **{k.upper(): str(v) for k, v in switches.items()}}
        proc = gpuguard("check", *own_host(tmp_path / "host"), "--format", "json",
                        "--profile", str(profile),
                        *[a for rule in PROBE_RULES for a in ("--only", rule)], *args,
                        env=env)
        assert proc.stdout, proc.stderr
        doc = json.loads(proc.stdout)
        results = {(r["rule"], r["gpu"]["index"] if r["gpu"] else None): r
                   for r in doc["results"]}
        return proc.returncode, results

    return run


def test_check_active_passes_on_healthy_gpus_and_releases_everything(probe, tmp_path):
    log = tmp_path / "cuda.log"
    code, results = probe("--active", *SMALL, fake_cuda_log=str(log))
    assert code == 0, results
    assert {(r["rule"], r["status"]) for r in results.values()} == \
        {(rule, "ok") for rule in PROBE_RULES}
    phases = results[("gpu.compute", 1)]["observed"]["phases_ms"]
    assert {"init", "context", "alloc", "compute", "pattern", "pcie", "memory",
            "release"} <= set(phases)
    assert "peer" in results[("gpu.compute", 0)]["observed"]["phases_ms"]  # 0 copies to 1
    peers = results[("nvlink.bandwidth", 1)]["observed"]["peers"]
    assert [p["peer"] for p in peers] == [0] and peers[0]["gbps"] > 0
    # every allocation, context, module and event taken was given back
    lines = log.read_text().split("\n")
    for kind in ("device", "host", "context", "module", "event"):
        assert lines.count(f"take {kind}") == lines.count(f"give {kind}") > 0, kind


def test_without_active_the_probe_rules_are_skipped_and_export_nothing(fake_nvml, fake_cuda,
                                                                       host_args):
    env = {"LD_LIBRARY_PATH": f"{fake_nvml}:{fake_cuda}", "FAKE_NVML_MEM_TOTAL_MIB": "1000"}
    proc = gpuguard("check", *host_args, "--format", "json", env=env)
    results = [r for r in json.loads(proc.stdout)["results"] if r["rule"] in PROBE_RULES]
    assert len(results) == len(PROBE_RULES)
    assert all(r["status"] == "skipped" and "--active" in r["message"] for r in results)
    prom = gpuguard("check", *host_args, "--format", "prometheus", env=env).stdout
    assert not any(f'rule="{rule}"' in prom for rule in PROBE_RULES)


def test_a_cuinit_error_is_named_critical_and_the_rest_unknown(probe):
    code, results = probe("--active", *SMALL, fake_cuda_init_error=802)
    assert code == 2
    compute = results[("gpu.compute", 0)]
    assert compute["status"] == "critical"
    assert "cuInit" in compute["message"] and "CUDA_ERROR_SYSTEM_NOT_READY" in compute["message"]
    assert "fabric" in compute["message"]
    for rule in ("memory.pattern", "pcie.bandwidth", "memory.bandwidth"):
        assert results[(rule, 1)]["status"] == "unknown", rule
        assert "cuInit" in results[(rule, 1)]["message"]


def test_a_hang_in_one_gpu_keeps_the_others_results_and_names_the_call(probe):
    began = time.monotonic()
    code, results = probe("--active", *SMALL, "--active-deadline", "2",
                          fake_cuda_hang="cuMemcpyHtoD_v2", fake_cuda_fault_gpu=1)
    assert time.monotonic() - began < 30  # does not hang
    assert code == 3
    assert results[("pcie.bandwidth", 0)]["status"] == "ok"
    assert results[("memory.bandwidth", 0)]["status"] == "ok"
    hung = results[("pcie.bandwidth", 1)]
    assert hung["status"] == "unknown"
    assert "cuMemcpyHtoD_v2" in hung["message"] and "phase pcie" in hung["message"]
    # measured before the hang, but a GPU whose worker hung vouches for nothing (issue 20)
    compute = results[("gpu.compute", 1)]
    assert compute["status"] == "unknown" and "cuMemcpyHtoD_v2" in compute["message"]


@pytest.mark.parametrize("call", ["cuMemFree_v2", "cuDevicePrimaryCtxRelease_v2",
                                  "cuEventDestroy_v2", "cuMemFreeHost", "cuModuleUnload"])
def test_a_hang_while_releasing_is_unknown_naming_the_call_never_ok(probe, call):
    """Issue 20: a worker that hung releasing its memory or context used to report every
    rule ok once the deadline passed. Now its GPU's rules are unknown, naming the call."""
    began = time.monotonic()
    code, results = probe("--active", *SMALL, "--active-deadline", "2",
                          fake_cuda_hang=call, fake_cuda_fault_gpu=1)
    assert time.monotonic() - began < 30
    assert code == 3
    for rule in ("gpu.compute", "memory.pattern", "memory.bandwidth", "pcie.bandwidth"):
        hung = results[(rule, 1)]
        assert hung["status"] == "unknown", (rule, hung)
        assert call in hung["message"] and "phase release" in hung["message"], hung
        if call != "cuDevicePrimaryCtxRelease_v2":
            assert results[(rule, 0)]["status"] == "ok"
    if call == "cuDevicePrimaryCtxRelease_v2":
        # GPU 0 copies to GPU 1 and releases GPU 1's context after: it hangs there too
        assert "phase peer" in results[("gpu.compute", 0)]["message"]


def test_a_crash_in_libcuda_costs_only_its_gpu(probe):
    code, results = probe("--active", *SMALL, fake_cuda_crash="cuLaunchKernel",
                          fake_cuda_fault_gpu=0)
    assert code == 3
    crashed = results[("gpu.compute", 0)]
    assert crashed["status"] == "unknown"
    assert "SIGSEGV" in crashed["message"] and "phase compute" in crashed["message"]
    assert results[("gpu.compute", 1)]["status"] == "ok"


@pytest.mark.parametrize(("switches", "rule"), [
    ({"fake_cuda_corrupt": "compute"}, "gpu.compute"),
    ({"fake_cuda_corrupt": "pattern"}, "memory.pattern"),
    ({"fake_cuda_launch_error": 719}, "gpu.compute"),
])
def test_a_wrong_read_back_or_a_launch_failure_is_critical(probe, switches, rule):
    code, results = probe("--active", *SMALL, fake_cuda_fault_gpu=1, **switches)
    assert code == 2
    assert results[(rule, 1)]["status"] == "critical"
    assert results[(rule, 0)]["status"] == "ok"


def test_slow_copies_read_below_their_floor(probe):
    # 4 MiB at 40 ms per MiB: 0.1 GB/s read+written against the profile's 0.5
    code, results = probe("--active", *SMALL, fake_cuda_slow="d2d:40000",
                          fake_cuda_fault_gpu=1)
    assert results[("memory.bandwidth", 1)]["status"] == "warning"
    assert results[("memory.bandwidth", 0)]["status"] == "ok"
    code, results = probe("--active", *SMALL, fake_cuda_slow="peer:40000")
    assert {results[("nvlink.bandwidth", i)]["status"] for i in (0, 1)} == {"warning"}
    assert code == 1


def test_busy_gpus_are_left_alone_unless_forced(probe, tmp_path):
    log = tmp_path / "cuda.log"
    code, results = probe("--active", *SMALL, fake_nvml_util=50, fake_cuda_log=str(log))
    assert {r["status"] for r in results.values()} == {"skipped"}
    assert "busy: 50 %" in results[("gpu.compute", 0)]["message"]
    assert not log.exists()  # libcuda was never touched
    code, results = probe("--active", *SMALL, fake_nvml_mem_used_mib=500)
    assert "hold 50 % of its memory" in results[("memory.pattern", 1)]["message"]
    code, results = probe("--active=force", *SMALL, fake_nvml_util=50)
    assert code == 0 and results[("gpu.compute", 0)]["status"] == "ok"


def test_no_libcuda_is_unknown_never_ok(probe):
    code, results = probe("--active", *SMALL, cuda=False)
    assert code == 3
    assert results[("gpu.compute", 0)]["status"] == "unknown"
    assert "libcuda.so.1 cannot be loaded" in results[("gpu.compute", 0)]["message"]


def test_active_with_a_saved_input_is_refused(tmp_path):
    proc = gpuguard("check", "--active", "--input",
                    str(REPO / "tests/fixtures/h200/nvidia-smi-q.xml"))
    assert proc.returncode == 3 and "--active" in proc.stderr


def test_a_saved_snapshot_replays_the_probe_and_a_bad_value_is_unknown(h200, tmp_path):
    from tests.checks.probed import probed

    saved = tmp_path / "snapshot.json"
    doc = probed(h200, probe_pattern={"error": None, "mismatches": 3, "bytes": 1024}).to_json()
    saved.write_text(json.dumps(doc))
    proc = gpuguard("check", "--input", str(saved), "--format", "json",
                    *[a for rule in PROBE_RULES for a in ("--only", rule)])
    results = {r["rule"]: r for r in json.loads(proc.stdout)["results"]}
    assert results["memory.pattern"]["status"] == "critical"
    assert results["gpu.compute"]["status"] == "ok"
    doc["gpus"][0]["probe_memory"] = "fast"
    doc["gpus"][0]["probe_compute"] = {"mismatches": "none"}
    saved.write_text(json.dumps(doc))
    proc = gpuguard("check", "--input", str(saved), "--format", "json",
                    "--only", "memory.bandwidth", "--only", "gpu.compute")
    statuses = {r["rule"]: r["status"] for r in json.loads(proc.stdout)["results"]}
    assert statuses == {"memory.bandwidth": "unknown", "gpu.compute": "unknown"}


# --- workers started beside the NVML sweep (EarlyStart) -----------------------------


def _procfs_listing(tmp_path: Path, *bus_ids: str) -> Path:
    """A /proc holding only driver/nvidia/gpus/<bus id>/, as the driver lists its GPUs."""
    procfs = tmp_path / "proc"
    for bus_id in bus_ids:
        (procfs / "driver" / "nvidia" / "gpus" / bus_id).mkdir(parents=True)
    return procfs


def _left_behind(marker: str) -> list[int]:
    """Processes still running whose environment carries this test's marker."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def test_workers_run_cuinit_while_the_nvml_sweep_runs(probe, tmp_path):
    """The fake NVML's sweep waits until the gate file is gone; only the fake cuInit
    removes it. Started after the sweep (as before the early start), the probe would
    leave the sweep waiting until its timeout and the check would read no GPU."""
    gate = tmp_path / "gate"
    gate.touch()
    marker = f"GPUGUARD_TEST_MARK={tmp_path.name}"
    # 0000:99:00.0: a GPU the folder lists that the sweep does not: its worker is stopped
    procfs = _procfs_listing(tmp_path, "0000:10:00.0", "0000:11:00.0", "0000:99:00.0")
    log = tmp_path / "cuda.log"
    code, results = probe("--active", *SMALL, "--path.procfs", str(procfs),
                          "--timeout", "20", fake_nvml_hang="nvmlDeviceGetUUID",
                          fake_nvml_hang_file=str(gate), fake_cuda_init_removes=str(gate),
                          fake_cuda_log=str(log), gpuguard_test_mark=marker)
    assert code == 0, results
    assert {(r["rule"], r["status"]) for r in results.values()} == \
        {(rule, "ok") for rule in PROBE_RULES}
    assert results[("gpu.compute", 0)]["observed"]["phases_ms"]["init"] > 0
    lines = log.read_text().split("\n")
    # each GPU's own context, and GPU 0's hold on GPU 1's for the peer copies
    assert lines.count("take context") == lines.count("give context") == 3
    assert _left_behind(marker) == []


def test_an_early_worker_of_a_busy_gpu_stops_before_any_context(probe, tmp_path):
    marker = f"GPUGUARD_TEST_MARK={tmp_path.name}"
    procfs = _procfs_listing(tmp_path, "0000:10:00.0", "0000:11:00.0")
    log = tmp_path / "cuda.log"
    _, results = probe("--active", *SMALL, "--path.procfs", str(procfs),
                          fake_nvml_util=50, fake_cuda_log=str(log), gpuguard_test_mark=marker)
    assert {r["status"] for r in results.values()} == {"skipped"}
    assert not log.exists() or "take" not in log.read_text()  # cuInit only
    assert _left_behind(marker) == []


def test_an_early_cuinit_that_hangs_is_unknown_and_killed(probe, tmp_path):
    marker = f"GPUGUARD_TEST_MARK={tmp_path.name}"
    procfs = _procfs_listing(tmp_path, "0000:10:00.0", "0000:11:00.0")
    began = time.monotonic()
    code, results = probe("--active", *SMALL, "--path.procfs", str(procfs),
                          "--active-deadline", "2", fake_cuda_hang="cuInit",
                          gpuguard_test_mark=marker)
    assert time.monotonic() - began < 30  # does not hang
    assert code == 3
    hung = results[("gpu.compute", 1)]
    assert hung["status"] == "unknown" and "cuInit" in hung["message"], hung
    assert _left_behind(marker) == []


def test_a_check_that_gives_up_early_leaves_no_worker(fake_nvml, fake_cuda, tmp_path):
    marker = f"GPUGUARD_TEST_MARK={tmp_path.name}"
    procfs = _procfs_listing(tmp_path, "0000:10:00.0")
    env = {"LD_LIBRARY_PATH": f"{fake_nvml}:{fake_cuda}", "GPUGUARD_TEST_MARK": marker,
           "FAKE_CUDA_HANG": "cuInit"}
    proc = gpuguard("check", *own_host(tmp_path / "host"), "--active", "--path.procfs",
                    str(procfs), "--only", "no.such",
                    env=env)
    assert proc.returncode == 3 and "no.such" in proc.stderr
    deadline = time.monotonic() + 5
    while _left_behind(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _left_behind(marker) == []


# --- never disturb a serving process; leave no worker behind ------------------------


def test_any_compute_process_keeps_the_probe_off_its_gpu(probe, tmp_path):
    """An embedding server holding 1 % of the memory at 0 % utilization between requests
    is serving: the probe leaves its GPU alone (a share of memory is no sign of idle)."""
    procs = tmp_path / "procs"
    procs.write_text("1 4242 1000\n")  # GPU 1: 1000 MiB of 143771
    log = tmp_path / "cuda.log"
    _, results = probe("--active", *SMALL, fake_nvml_procs_file=str(procs),
                       fake_cuda_log=str(log))
    assert results[("gpu.compute", 1)]["status"] == "skipped"
    assert "1 compute process(es) on it (4242" in results[("gpu.compute", 1)]["message"]
    assert results[("gpu.compute", 0)]["status"] == "ok"
    lines = log.read_text().split("\n")
    assert lines.count("take context") == 1  # GPU 0's only


def test_a_killed_check_takes_its_workers_with_it(fake_nvml, fake_cuda, tmp_path):
    import os
    import signal
    import subprocess
    import sys

    marker = f"GPUGUARD_TEST_MARK={tmp_path.name}"
    env = {**os.environ, "LD_LIBRARY_PATH": f"{fake_nvml}:{fake_cuda}",
           "FAKE_NVML_GPUS": "2", "FAKE_NVML_MEM_TOTAL_MIB": "1000",
           "FAKE_CUDA_HANG": "cuLaunchKernel", "FAKE_CUDA_FAULT_GPU": "1",
           "FAKE_CUDA_LOG": str(tmp_path / "cuda.log"), "GPUGUARD_TEST_MARK": marker}
    check = subprocess.Popen([sys.executable, "-m", "gpuguard", "check", "--active",
                              *own_host(tmp_path / "host"), *SMALL, "--active-deadline",
                              "60"], env=env, cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # GPU 0's worker has released its context: GPU 1's hangs in its kernel launch
        log = tmp_path / "cuda.log"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (
                log.exists() and "give context" in log.read_text()):
            time.sleep(0.05)
        assert "give context" in log.read_text()
        time.sleep(0.2)
        assert len(_left_behind(marker)) >= 2  # check and its hung worker
    finally:
        check.send_signal(signal.SIGKILL)  # as `timeout -s KILL` or a Slurm prolog would
        check.wait()
    deadline = time.monotonic() + 10
    while _left_behind(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _left_behind(marker) == []


def test_a_gpu_whose_last_worker_is_stuck_gets_no_new_one(h200):
    """A worker killed at the deadline but not reaped (in D state on a real GPU; here a
    child that is still alive) keeps its GPU from a new worker: unknown, naming it."""
    import os
    import signal

    from gpuguard.model.pci import normalise_pci
    from gpuguard.sources.active import plan, workers

    h200.gpus[0].__post_init__()
    bus = h200.gpus[0].pci_bus_id.get()
    stuck = os.fork()
    if stuck == 0:
        time.sleep(60)
        os._exit(0)
    key = normalise_pci(bus)
    workers.KILLED[key] = (stuck, time.time() - 60, "GPU 0 phase pcie: cuMemcpyHtoD_v2")
    try:
        probe = workers.ActiveProbe(h200, plan.ProbeOptions(deadline_s=2))
        assert probe.workers == []  # nothing forked for it
        probe.finish(h200)
        reading = h200.gpus[0].probe_compute
        assert reading.state == "error"
        assert f"pid {stuck}" in str(reading.error) and "still stuck" in str(reading.error)
    finally:
        os.kill(stuck, signal.SIGKILL)
        os.waitpid(stuck, 0)
    workers.reap_killed()
    assert key not in workers.KILLED  # gone: the next run may probe it again


def test_one_probe_per_host_at_a_time_across_processes(fake_nvml, fake_cuda, tmp_path):
    """Two `check --active` at once (issue 20) would share the links and each read low: the
    second waits within its own deadline for the first, then says so, unknown."""
    import os
    import subprocess
    import sys

    host = own_host(tmp_path / "host")  # one state dir: one host
    env = {**os.environ, "LD_LIBRARY_PATH": f"{fake_nvml}:{fake_cuda}", "FAKE_NVML_GPUS": "2",
           "FAKE_NVML_MEM_TOTAL_MIB": "1000", "FAKE_CUDA_LOG": str(tmp_path / "first.log"),
           "FAKE_CUDA_HANG": "cuMemcpyHtoD_v2", "FAKE_CUDA_FAULT_GPU": "1"}
    first = subprocess.Popen([sys.executable, "-m", "gpuguard", "check", *host, "--active",
                              *SMALL, "--active-deadline", "12", "--format", "json"],
                             env=env, cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    try:
        log = tmp_path / "first.log"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (log.exists() and "take context" in
                                                   log.read_text()):
            time.sleep(0.05)
        second = gpuguard("check", *host, "--active", *SMALL, "--active-deadline", "2",
                          "--format", "json", "--only", "gpu.compute",
                          env={"LD_LIBRARY_PATH": f"{fake_nvml}:{fake_cuda}",
                               "FAKE_NVML_GPUS": "2", "FAKE_NVML_MEM_TOTAL_MIB": "1000"})
        assert first.poll() is None  # the first still holds the GPUs
        results = json.loads(second.stdout)["results"]
        assert {r["status"] for r in results} == {"unknown"}
        assert all("another active probe holds the GPUs" in r["message"] for r in results)
    finally:
        out, _ = first.communicate(timeout=60)
    # the first, alone, measured GPU 0 and names GPU 1's hang
    statuses = {(r["rule"], r["gpu"]["index"]): r["status"] for r in json.loads(out)["results"]
                if r["gpu"]}
    assert statuses[("gpu.compute", 0)] == "ok" and statuses[("gpu.compute", 1)] == "unknown"
    # and once it is done, a probe runs again
    again = gpuguard("check", *host, "--active", *SMALL, "--format", "json", "--only",
                     "gpu.compute", env={"LD_LIBRARY_PATH": f"{fake_nvml}:{fake_cuda}",
                                         "FAKE_NVML_GPUS": "2",
                                         "FAKE_NVML_MEM_TOTAL_MIB": "1000"})
    assert {r["status"] for r in json.loads(again.stdout)["results"]} == {"ok"}
