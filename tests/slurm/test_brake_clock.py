"""The fleet brake on slurmctld's clock (issue 27, item 6), on the fake Slurm
(tests/slurm/fake_slurm): slurmctld's clock is the node's plus `clock_offset` seconds; the
fake sdiag reports it, the fake scontrol stamps reasons with it, and the tests write the
other nodes' reason times on it. The node's own clock is the real one."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.daemon.conftest import host_snapshot
from tests.slurm.test_slurm_scripts import Fleet, live

FAULT = {(0, "remapped_rows_failure"): True}  # memory.row_remap: inspect_hardware
REASON = "gpuguard: reset_gpu: xid.recent GPU 0"


def ctld_stamp(offset_s: float, ago_s: float) -> str:
    """A reason time `ago_s` seconds ago on slurmctld's clock (the node's + offset_s)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + offset_s - ago_s))


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    return Fleet(tmp_path)


def skewed(fleet: Fleet, offset_s: float, drained_ago_s: float) -> None:
    """Ten nodes; n2 drained by gpuguard `drained_ago_s` ago by slurmctld's clock, which is
    `offset_s` ahead of this node's (negative: the node is ahead)."""
    (fleet.root / "clock_offset").write_text(f"{offset_s:.0f}\n")
    fleet.write([("n1", "IDLE", "Unknown", "none"),
                 ("n2", "IDLE+DRAIN", ctld_stamp(offset_s, drained_ago_s), REASON),
                 *((f"n{i}", "IDLE", "Unknown", "none") for i in range(3, 11))])


@pytest.mark.parametrize(("offset_s", "skew"), [(300, "behind"), (-1800, "ahead")])
def test_a_drain_of_the_window_is_counted_whatever_the_nodes_clock(
        fleet: Fleet, offset_s: float, skew: str) -> None:
    """n2 drained 30 s ago (slurmctld's clock); this node 5 minutes behind (the reason
    looks 270 s in the future) or 30 minutes ahead (it looks 30 minutes old): a second
    drain of ten is 20 %, the brake holds."""
    skewed(fleet, offset_s, 30)
    out = fleet.health(host_snapshot(8, FAULT))
    assert out.returncode == 2, out.stdout + out.stderr
    assert fleet.node() == ("IDLE", "none")
    assert "CRITICAL fleet.brake: 2 of 10 node(s) with this one drained by gpuguard " \
           "within 600 s" in out.stdout
    # sdiag's time is whole seconds, read a moment before the reply came back
    said = re.search(r"brake: on slurmctld's clock \(sdiag; this node (\d+) s (\w+)\)",
                     out.stdout)
    assert said and abs(int(said[1]) - abs(offset_s)) <= 2 and said[2] == skew, out.stdout


@pytest.mark.parametrize("offset_s", [300, -1800])
def test_a_drain_before_the_window_is_not_counted_whatever_the_nodes_clock(
        fleet: Fleet, offset_s: float) -> None:
    """n2 drained 700 s ago by slurmctld's clock (past the 600 s window): this one drains,
    also when the node's clock, 5 minutes behind, would put n2 400 s ago."""
    skewed(fleet, offset_s, 700)
    out = fleet.health(host_snapshot(8, FAULT))
    assert out.returncode == 0, out.stdout + out.stderr
    assert fleet.node() == ("IDLE+DRAIN", "gpuguard: inspect_hardware: memory.row_remap GPU 0")
    assert "drained: 'gpuguard: inspect_hardware: memory.row_remap GPU 0' (1 of 10 node(s) " \
           "with this one)" in out.stdout


@pytest.mark.parametrize("how", ["sdiag.fail", "sdiag.old"])
@pytest.mark.parametrize("offset_s", [300, -1800])
def test_without_slurmctlds_time_the_brake_errs_toward_not_draining(
        fleet: Fleet, how: str, offset_s: float) -> None:
    """sdiag fails (or prints no Unix time): a reason time in the future counts (node
    behind), and so does one within the window before the newest reason time slurmctld
    set (node ahead: its clock is at least that)."""
    skewed(fleet, offset_s, 30)
    (fleet.root / how).touch()
    out = fleet.health(host_snapshot(8, FAULT))
    assert out.returncode == 2, out.stdout + out.stderr
    assert fleet.node() == ("IDLE", "none")
    assert "brake: slurmctld's clock not known (sdiag" in out.stdout


def test_sdiags_header_is_read_as_slurm_prints_it() -> None:
    """The header of Slurm 22.05's sdiag (as the real one on loopback printed it), the
    older form without the Unix time, and lines that only look like it."""
    from gpuguard.integrations.slurm.clock import parse_sdiag

    real = ("*******************************************************\n"
            "sdiag output at Wed Dec 02 07:24:43 2026 (1796196283)\n"
            "Data since      Wed Dec 02 07:24:10 2026 (1796196250)\n"
            "*******************************************************\n"
            "Server thread count:  3\n")
    assert parse_sdiag(real) == 1796196283.0
    assert parse_sdiag("sdiag output at Wed Dec 02 07:24:43 2026\n") is None
    assert parse_sdiag("Data since      Wed Dec 02 07:24:10 2026 (1796196250)\n") is None
    assert parse_sdiag("sdiag output at then (17961962830000000000)\n") is None
    assert parse_sdiag("\n" * 10 + "sdiag output at x (1796196283)\n") is None


@pytest.mark.parametrize("offset_s", [600, -600])
def test_slurms_prolog_drain_is_matched_with_the_failure_on_slurmctlds_clock(
        fleet: Fleet, fake_nvml: Path, fake_cuda: Path, offset_s: float) -> None:
    """The prolog fails GPU 1 (the fake libcuda reads wrong data back) and records when,
    also on slurmctld's clock (its brake read it); Slurm's "Prolog error" drain is
    stamped on slurmctld's clock, 10 minutes off this node's: health takes it over as
    gpuguard's (on the node's clock alone it would be 600 s off, someone else's)."""
    (fleet.root / "clock_offset").write_text(f"{offset_s:.0f}\n")
    args, env = live(fleet, fake_nvml, fake_cuda, True, CUDA_VISIBLE_DEVICES="0,1",
                     FAKE_CUDA_CORRUPT="compute", FAKE_CUDA_FAULT_GPU="1")
    fleet.write([("n1", "IDLE", "Unknown", "none"),
                 *((f"n{i}", "IDLE", "Unknown", "none") for i in range(2, 11))])
    prolog = fleet.gpuguard("prolog", *args, env=env)
    assert prolog.returncode == 1, prolog.stdout + prolog.stderr
    fleet.write([("n1", "IDLE+DRAIN", ctld_stamp(offset_s, 0), "Prolog error"),
                 *((f"n{i}", "IDLE", "Unknown", "none") for i in range(2, 11))])
    out = fleet.gpuguard("health", *args, "--no-daemon", "--brake-jitter", "0", env=env)
    assert fleet.node() == ("IDLE+DRAIN", "gpuguard: inspect_hardware: gpu.compute GPU 1"), \
        out.stdout + out.stderr
    assert "taking over Slurm's 'Prolog error'" in out.stdout
