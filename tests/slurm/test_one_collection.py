"""Issue 27: a Slurm health run collects the host once and loads the rules once, also
after a prolog failure, when the GPUs it failed on are probed again (before: the cold
verdict and the re-probe each collected the host and loaded the rules). Run in-process
on a replayed host against the fake Slurm, counting the collections and the loads as
they happen (spies: the code under test runs as it is)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuguard.assess import inputs as assess_inputs
from gpuguard.assess.inputs import HostInputs
from gpuguard.integrations.slurm import ctl as slurm_ctl
from gpuguard.integrations.slurm import state as slurm_state
from gpuguard.integrations.slurm.brake import BrakeSettings
from gpuguard.integrations.slurm.health import HealthRun, run_health
from gpuguard.sources import collect
from tests.daemon.conftest import host_snapshot, write_snapshot
from tests.slurm.test_slurm_scripts import FAKE_SLURM


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    calls = {"collections": 0, "configurations": 0}
    real_init, real_load = collect.Collection.__init__, assess_inputs.load_configuration

    def init(self: Any, *args: Any, **kw: Any) -> None:
        calls["collections"] += 1
        real_init(self, *args, **kw)

    def load(*args: Any, **kw: Any) -> Any:
        calls["configurations"] += 1
        return real_load(*args, **kw)

    monkeypatch.setattr(collect.Collection, "__init__", init)
    monkeypatch.setattr(assess_inputs, "load_configuration", load)
    monkeypatch.setattr("gpuguard.assess.once.load_configuration", load)
    return calls


def test_a_health_run_after_a_prolog_failure_collects_once(tmp_path: Path,
                                                           counted: dict[str, int]) -> None:
    snap = tmp_path / "snap.json"
    write_snapshot(snap, host_snapshot(2))
    state = tmp_path / "state"
    (tmp_path / "nodes").write_text("n1|IDLE|Unknown|gpu|none\n")
    slurm_state.record_failure(state, "prolog", "n1", "42",
                               [{"rule": "gpu.compute", "status": "critical",
                                 "action": "reset_gpu", "gpu": {"index": 0}}], [0])
    run = HealthRun("n1", slurm_ctl.SlurmSettings(FAKE_SLURM, tmp_path / "slurm.conf", 10.0),
                    BrakeSettings(20, 600), HostInputs(input_path=snap, state_dir=state),
                    state, None, probe_budget_s=1.0)
    code = run_health(run)
    assert code in (0, 2), run.lines
    assert any("verdict: a cold check" in line for line in run.lines), run.lines
    assert counted == {"collections": 1, "configurations": 1}, (counted, run.lines)
