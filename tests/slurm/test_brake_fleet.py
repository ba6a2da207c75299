"""A fleet of ten nodes on the fake Slurm whose health runs all find a critical failover
rule with the action restart_app (recovery.action: the driver asks to recover the IMEX
domain): gpuguard's drains with `gpuguard: restart_app: ...` are its own, so the brake
counts them and at most its share of the partition is drained (issue 27, items 4 and 6;
on d7c609d ten of ten were drained in one round)."""

from __future__ import annotations

from pathlib import Path

from tests.daemon.conftest import host_snapshot, write_snapshot
from tests.slurm.test_slurm_scripts import Fleet

NODES = [f"n{i}" for i in range(1, 11)]
REASON = "gpuguard: restart_app: recovery.action GPU 0"


def test_ten_runs_on_ten_nodes_with_restart_app_faults_drain_at_most_the_brakes_share(
        tmp_path: Path) -> None:
    """One run per node, one after the other (each sees the drains before it; runs at the
    same moment are the brake's documented race): 20 % of ten is two nodes, and the drain
    that would reach it is refused, so one node drains and nine are braked (exit 2)."""
    fleet = Fleet(tmp_path)
    fleet.write([(n, "IDLE", "Unknown", "none") for n in NODES])
    snap = tmp_path / "snap.json"
    write_snapshot(snap, host_snapshot(8, {(0, "recovery_action"): "recover_imex_domain"}))
    codes = {}
    for name in NODES:
        out = fleet.gpuguard("health", "--no-daemon", "--input", str(snap), "--brake-jitter",
                             "0", *fleet.slurm_args(), "--node", name, "--state-dir",
                             str(tmp_path / f"state-{name}"))
        assert "Traceback" not in out.stderr, out.stderr
        codes[name] = out.returncode
    rows = [line.split("|") for line in (tmp_path / "nodes").read_text().splitlines()]
    drained = [row[0] for row in rows if row[1] == "IDLE+DRAIN"]
    assert {row[4] for row in rows if row[1] == "IDLE+DRAIN"} <= {REASON}
    assert len(drained) * 100 / len(NODES) < 20, f"drained: {drained}"
    assert drained == ["n1"] and codes == {"n1": 0, **{n: 2 for n in NODES[1:]}}, codes
