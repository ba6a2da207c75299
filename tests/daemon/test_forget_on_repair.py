"""The daemon tells its NVML worker to forget what it keeps between sweeps (P2P status,
InfoROM validity: sources/nvml_worker.py) when its kernel log shows a repair it had not
seen (a GPU reset line, a driver reload: a second load line), so that the next sweep reads
them anew (issue 32: "P2P status is not static: re-read on ... a reset line, a driver
reload"). The worker runs for real on the fake NVML, which counts the calls it is asked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.daemon.conftest import metric_lines

UUID0 = "GPU-fa4e0000-0000-0000-0000-000000000000"  # the fake's GPU 0
LOAD = ("NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build"
        "  (nixbld@)")
REPAIRS = {
    "gpu reset": f"12,2,2000000,-;GPU reset occurred: {UUID0}\n",
    # the driver unloaded and loaded again: its load line a second time (sources/kmsg_gpu.py)
    "driver reload": f"6,2,2000000,-;{LOAD}\n",
}


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def fast_cycles(daemon: Any) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metric_lines(
        daemon.metrics(), "gpuguard_cycles_total") if 'cadence="fast"' in line)


@pytest.mark.parametrize("repair", sorted(REPAIRS))
def test_a_repair_makes_the_worker_read_p2p_and_the_inforom_anew(
        start_daemon: Any, fake_env: Any, tmp_path: Path, repair: str) -> None:
    p2p, inforom, log = tmp_path / "p2p", tmp_path / "inforom", tmp_path / "kmsg.log"
    log.write_text(f"6,0,0,-;Linux version 6.8.0\n4,1,1000000,-;{LOAD}\n")
    env = fake_env(gpus=2, nvlinks=2, p2p_calls=str(p2p), inforom_calls=str(inforom))
    # slow interval of an hour: nothing is read again by age during the test
    daemon = start_daemon("--fast-interval", "0.2", "--slow-interval", "3600",
                          "--kmsg-file", str(log), env=env)

    def after_cycles(n: int) -> None:
        target = fast_cycles(daemon) + n
        daemon.wait_for(lambda: fast_cycles(daemon) >= target, 30, f"{n} more fast cycles")

    after_cycles(3)
    kept_p2p, kept_inforom = lines(p2p), lines(inforom)
    assert kept_p2p > 0 and kept_inforom == 2
    after_cycles(5)
    assert (lines(p2p), lines(inforom)) == (kept_p2p, kept_inforom)  # kept, not re-read
    with log.open("a") as f:
        f.write(REPAIRS[repair])
    after_cycles(5)
    assert lines(p2p) == 2 * kept_p2p  # every pair read once again, after the repair
    assert lines(inforom) == 2 * kept_inforom
    after_cycles(5)
    assert (lines(p2p), lines(inforom)) == (2 * kept_p2p, 2 * kept_inforom)
