"""The daemon's active probe (--active-probe-interval) on the fake NVML and fake libcuda,
its kept results going stale, and the supervisor's `failback_probe: active`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from gpuguard.daemon.active import ProbeKeeper
from gpuguard.model.profile import Profile
from gpuguard.model.results import Status
from tests.conftest import REPO, set_gpu
from tests.sources.test_active_probe import FAKE_FLOORS


def test_the_daemon_probes_idle_gpus_at_its_own_cadence(start_daemon, fake_nvml, fake_cuda,
                                                        tmp_path):
    profile = tmp_path / "profile.yaml"
    profile.write_text(FAKE_FLOORS + "  buffer_mib: 4\n  pattern_mib: 2\n")
    env = {"LD_LIBRARY_PATH": f"{fake_nvml}:{fake_cuda}", "FAKE_NVML_GPUS": "2",
           "FAKE_NVML_MEM_TOTAL_MIB": "1000", "FAKE_CUDA_CORRUPT": "pattern",
           "FAKE_CUDA_FAULT_GPU": "1"}
    daemon = start_daemon("--fast-interval", "0.5", "--active-probe-interval", "1",
                          "--profile", str(profile), env=env)
    # before its first run the probe rules are skipped, never unknown or ok
    first = daemon.result("gpu.compute", 0)
    assert first is None or first["status"] == "skipped"
    daemon.wait_for(lambda: (daemon.result("memory.pattern", 1) or {}).get("status")
                    == "critical", 20, "the probe's result in a fast cycle")
    assert daemon.result("memory.pattern", 0)["status"] == "ok"
    assert daemon.result("gpu.compute", 1)["status"] == "ok"


def test_without_an_interval_the_daemon_never_probes(start_daemon, fake_nvml, fake_cuda,
                                                     tmp_path):
    log = tmp_path / "cuda.log"
    env = {"LD_LIBRARY_PATH": f"{fake_nvml}:{fake_cuda}", "FAKE_NVML_MEM_TOTAL_MIB": "1000",
           "FAKE_CUDA_LOG": str(log)}
    daemon = start_daemon("--fast-interval", "0.3", env=env)
    daemon.wait_for(lambda: daemon.status()["results"], 10, "results")
    assert daemon.result("gpu.compute", 0)["status"] == "skipped"
    assert not log.exists()


def test_kept_results_turn_stale_after_two_intervals(h200):
    # a busy GPU is skipped without touching libcuda: the kept result is the skip
    set_gpu(h200, utilization_gpu_percent=90)
    keeper = ProbeKeeper(interval_s=60)
    keeper.run(h200, Profile())
    fresh = h200.gpus[0]
    keeper.apply(h200, now=time.monotonic() + 119)
    assert fresh.probe_skipped.get().startswith("busy")
    keeper.apply(h200, now=time.monotonic() + 121)
    assert fresh.probe_compute.state == "error" and "stale" in (fresh.probe_compute.error or "")
    from gpuguard.config.ruleset import load_ruleset
    from gpuguard.judge.engine import evaluate

    [result] = evaluate(h200, load_ruleset(), Profile(), only=["gpu.compute"])
    assert result.status is Status.UNKNOWN and "stale" in result.message


FAILBACK = """
import json, sys
from pathlib import Path
from gpuguard.daemon import active
from gpuguard.io.clock import boottime
from gpuguard.config.profile import load_profile
from gpuguard.model.identity import GpuId
from gpuguard.model.results import Result, Status
from gpuguard.config.ruleset import load_ruleset
from gpuguard.sources import nvml
from gpuguard.supervisor.config import load_services
from gpuguard.supervisor.service import Supervisor

tmp = Path(sys.argv[1])
snapshot = nvml.NvmlSweep(str(tmp / "proc"), 5).result()  # procfs: its own, empty
profile, rules = load_profile(tmp / "profile.yaml"), load_ruleset()
[service] = load_services(tmp / "gpuguard.yaml")
supervisor = Supervisor(service, tmp / "state", {"ecc.uncorrected"},
                        active_check=lambda gpus: active.passes(snapshot, profile, rules, gpus))
supervisor.recover()
ref = GpuId(0, "u", "p")
bad = [Result("ecc.uncorrected", Status.CRITICAL, Status.CRITICAL, "2 DBE", ref)]
good = [Result("ecc.uncorrected", Status.OK, Status.CRITICAL, "ok", ref)]
for _ in range(3):
    supervisor.handle_cycle(bad, boottime())
on_failover = supervisor.state.active
for _ in range(2):
    supervisor.handle_cycle(good, boottime())
print(json.dumps({"after_failover": on_failover, "after_healthy": supervisor.state.active}))
"""


def _failback(tmp_path: Path, fake_nvml: Path, fake_cuda: Path, **switches: str
              ) -> dict[str, str]:
    tmp_path.mkdir()
    (tmp_path / "profile.yaml").write_text(FAKE_FLOORS + "  buffer_mib: 4\n  pattern_mib: 2\n")
    marks = {v: ["sh", "-c", f"touch {tmp_path}/{v}"] for v in ("gpu", "cpu")}
    (tmp_path / "gpuguard.yaml").write_text(json.dumps({"services": [{
        "name": "llm", "backend": "exec", "min_cpu_time": 0, "failback_after": 2,
        "failback_probe": "active", "gpus": [0], "probe": {"exec": ["true"], "timeout": 5},
        "exec": {"start_gpu": marks["gpu"], "start_cpu": marks["cpu"],
                 "stop_gpu": ["rm", "-f", f"{tmp_path}/gpu"],
                 "stop_cpu": ["rm", "-f", f"{tmp_path}/cpu"],
                 "running_gpu": ["test", "-f", f"{tmp_path}/gpu"],
                 "running_cpu": ["test", "-f", f"{tmp_path}/cpu"]}}]}))
    env = {"LD_LIBRARY_PATH": f"{fake_nvml}:{fake_cuda}", "FAKE_NVML_MEM_TOTAL_MIB": "1000",
           "PATH": "/usr/bin:/bin", **switches}
    proc = subprocess.run([sys.executable, "-c", FAILBACK, str(tmp_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {**json.loads(proc.stdout.splitlines()[-1]), "log": proc.stdout + proc.stderr}


def test_a_failing_pattern_blocks_failback_a_passing_one_allows_it(tmp_path, fake_nvml,
                                                                   fake_cuda):
    blocked = _failback(tmp_path / "bad", fake_nvml, fake_cuda, FAKE_CUDA_CORRUPT="pattern")
    assert blocked["after_failover"] == "cpu" and blocked["after_healthy"] == "cpu"
    assert "failback_blocked" in blocked["log"] and "memory.pattern" in blocked["log"]
    allowed = _failback(tmp_path / "good", fake_nvml, fake_cuda)
    assert allowed["after_failover"] == "cpu" and allowed["after_healthy"] == "gpu"
    assert "failback_probe_passed" in allowed["log"]


def test_one_probe_at_a_time_in_the_daemon(h200):
    """The scheduled probe and a supervisor's failback probe never measure together: the
    second waits for the first (both would read each other's copies as low bandwidth)."""
    import threading

    from gpuguard.daemon import active
    from gpuguard.model.profile import Profile

    h200.gpus[0].utilization_gpu_percent = type(h200.gpus[0].utilization_gpu_percent).ok(99)
    h200.gpus[0].__post_init__()  # busy: skipped, so no libcuda is needed
    done = threading.Event()
    with active.PROBE_LOCK:
        runner = threading.Thread(target=lambda: (active.probe(h200, Profile()), done.set()))
        runner.start()
        assert not done.wait(0.5)  # held off while another probe runs
    assert done.wait(10)
    runner.join()


def test_the_daemons_probe_waits_for_a_probe_run_beside_it(start_daemon, fake_nvml, fake_cuda,
                                                           tmp_path):
    """A `check --active` (or `slurm health`) probing the GPUs holds the host's lock in the
    state dir: the daemon's probe measured beside it would read low, so its GPUs are
    unknown until the other ends, then measured."""
    import fcntl

    from gpuguard.sources.active.plan import LOCK_FILE

    profile = tmp_path / "profile.yaml"
    profile.write_text(FAKE_FLOORS + "  buffer_mib: 4\n  pattern_mib: 2\n  deadline_s: 2\n")
    (tmp_path / "state").mkdir()
    held = (tmp_path / "state" / LOCK_FILE).open("w")
    fcntl.flock(held, fcntl.LOCK_EX)  # another probe runs
    env = {"LD_LIBRARY_PATH": f"{fake_nvml}:{fake_cuda}", "FAKE_NVML_GPUS": "1",
           "FAKE_NVML_MEM_TOTAL_MIB": "1000"}
    daemon = start_daemon("--fast-interval", "0.5", "--active-probe-interval", "1",
                          "--profile", str(profile), env=env)
    blocked = daemon.wait_for(lambda: (r := daemon.result("gpu.compute", 0) or {}).get(
        "status") == "unknown" and r, 20, "the daemon's probe waits for the other")
    assert "another active probe holds the GPUs" in blocked["message"], blocked
    held.close()  # the other probe ends
    daemon.wait_for(lambda: (daemon.result("gpu.compute", 0) or {}).get("status") == "ok",
                    20, "measured once the other probe ended")
