"""The shipped Slurm example: on failover the node is drained with the failed rule as the
reason. scontrol and sinfo cannot run here: stand-ins on PATH record what they were
asked and keep the node's state in a file, as Slurm would."""

import os

from gpuguard.io.clock import boottime
from gpuguard.model.identity import GpuId
from gpuguard.model.results import Result, Status
from gpuguard.supervisor.config import load_services
from gpuguard.supervisor.service import Supervisor
from tests.conftest import REPO


def test_failover_drains_the_node_with_the_rule_as_reason(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    state = tmp_path / "node-state"
    state.write_text("idle\n")
    calls = tmp_path / "calls"
    (bin_dir / "scontrol").write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\n'
        f'case "$*" in *state=drain*) echo drain > {state};; *state=resume*) echo idle > {state};;'
        ' esac\n')
    (bin_dir / "sinfo").write_text(f"#!/bin/sh\ncat {state}\n")
    for tool in ("scontrol", "sinfo"):
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")

    [service] = load_services(REPO / "packaging" / "examples" / "slurm-drain.yaml")
    supervisor = Supervisor(service, tmp_path / "state", {"memory.row_remap"})
    supervisor.recover()
    assert supervisor.state.active == "gpu"
    failed = [Result("memory.row_remap", Status.CRITICAL, Status.CRITICAL,
                     "row remapping failed", GpuId(3, "U3", "0000:3b:00.0"),
                     action="reset_gpu")]
    for _ in range(3):
        supervisor.handle_cycle(failed, boottime())
    assert supervisor.state.active == "cpu"
    assert state.read_text().strip() == "drain"
    drain = next(line for line in calls.read_text().splitlines() if "state=drain" in line)
    # the suggested action beside the reason: a drain script tells a reset from an RMA
    assert "reason=gpuguard: reset_gpu: memory.row_remap (GPU 3): row remapping failed" \
        in drain
