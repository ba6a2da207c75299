"""The epilog after the kernel's ring buffer wrapped during the job (issue 27, item 10):
the records overwritten since the job began are unknown, never "no hardware finding
during the job". The prolog and the epilog run on the fake NVML and libcuda; the kernel
log is a file in /dev/kmsg's own format (`prio,seq,usec,flags;text`), whose sequence
numbers tell the records lost (sources/kmsg_kept.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.slurm.test_slurm_scripts import Fleet, live


def kmsg(first_seq: int, usecs: list[int], xid_at: int | None = None) -> str:
    lines = []
    for i, usec in enumerate(usecs):
        text = "NVRM: Xid (PCI:0000:10:00): 79, pid=1, name=python3, GPU has fallen off the " \
               "bus." if usec == xid_at else f"line {first_seq + i}"
        lines.append(f"6,{first_seq + i},{usec},-;{text}")
    return "\n".join(lines) + "\n"


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    return Fleet(tmp_path)


def run_job(fleet: Fleet, fake_nvml: Path, fake_cuda: Path, at_start: str,
            at_end: str) -> tuple[str, int, str]:
    """The prolog with `at_start` as the kernel log, the epilog with `at_end`: the
    prolog's output, the epilog's exit code and output."""
    args, env = live(fleet, fake_nvml, fake_cuda, CUDA_VISIBLE_DEVICES="0")
    log = fleet.root / "host" / "kmsg.log"
    log.write_text(at_start)
    prolog = fleet.gpuguard("prolog", *args, env=env)
    assert prolog.returncode == 0, prolog.stdout + prolog.stderr
    log.write_text(at_end)
    epilog = fleet.gpuguard("epilog", *args, env=env)
    assert "Traceback" not in epilog.stderr, epilog.stderr
    return prolog.stdout, epilog.returncode, epilog.stdout + epilog.stderr


def test_a_wrap_during_the_job_makes_the_rest_of_it_unknown(
        fleet: Fleet, fake_nvml: Path, fake_cuda: Path) -> None:
    """The job began at 200 s (records 0 and 1 read); by its end the log starts at record
    5000 (300 s): 4998 records of the job's time were overwritten."""
    _, code, out = run_job(fleet, fake_nvml, fake_cuda, kmsg(0, [100_000_000, 200_000_000]),
                           kmsg(5000, [300_000_000, 400_000_000]))
    assert code == 0, out
    assert "no hardware finding during the job" not in out
    assert "job 77: no hardware finding in what could be read; the rest of the job is " \
           "unknown" in out
    assert "UNKNOWN kernel log during job 77: 5000 record(s) were overwritten (the ring " \
           "buffer wrapped) before the one at 300.000000 s since boot, after the job began " \
           "at 200.000000 s" in out


def test_a_wrap_before_the_job_leaves_it_known(fleet: Fleet, fake_nvml: Path,
                                               fake_cuda: Path) -> None:
    """The records lost were before the job began (the log started at record 5000 at the
    prolog already): every record of the job was read."""
    before = kmsg(5000, [300_000_000, 400_000_000])
    _, code, out = run_job(fleet, fake_nvml, fake_cuda, before,
                           kmsg(5000, [300_000_000, 400_000_000, 500_000_000]))
    assert code == 0 and "job 77: no hardware finding during the job" in out, out
    assert "UNKNOWN" not in out


def test_an_xid_seen_after_a_wrap_still_fails_the_job(fleet: Fleet, fake_nvml: Path,
                                                      fake_cuda: Path) -> None:
    _, code, out = run_job(fleet, fake_nvml, fake_cuda, kmsg(0, [100_000_000, 200_000_000]),
                           kmsg(5000, [300_000_000, 400_000_000], xid_at=400_000_000))
    assert code == 1, out
    assert "HARDWARE Xid 79 during the job" in out and "UNKNOWN kernel log during job 77" in out
