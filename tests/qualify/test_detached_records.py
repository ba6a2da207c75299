"""A qualification started detached (gpuguard/qualify/detached.py) and read back from the
event store (records.py): what Slurm's resume and the supervisor's failback consume."""

from __future__ import annotations

import os
import time
from pathlib import Path

from gpuguard.qualify import detached, records
from tests.qualify.test_qualify_cli import FAKE_TARGETS, environment, host


def wait_gone(record: detached.Detached, timeout: float = 60) -> None:
    """The run is this test's child (a health program's is init's): waited for as one."""
    until = time.monotonic() + timeout
    while os.waitpid(record.pid, os.WNOHANG) == (0, 0):
        assert time.monotonic() < until, "the detached qualification did not end"
        time.sleep(0.1)


def test_a_detached_run_records_a_pass_the_reader_finds(fake_nvml, fake_cuda, tmp_path):
    args = host(tmp_path / "host")
    state = tmp_path / "host" / "state"
    before = time.time()
    record = detached.start(state, [0], level="standard", boot_id="b1", purpose="a test",
                            extra_args=(*args, "--seconds", "1", "--targets",
                                        str(FAKE_TARGETS)),
                            env=environment(fake_nvml, fake_cuda, {}))
    assert detached.load(state) == record
    # its own session: slurmd killing the health program's group does not reach it
    assert os.getsid(record.pid) == record.pid
    wait_gone(record)
    found = records.qualifications(state)
    assert [(q.index, q.passed, q.level, q.purpose) for q in found] == \
        [(0, True, "standard", "a test")]
    assert found[0].bundle and Path(found[0].bundle).is_file()
    board = records.Board(found[0].uuid, found[0].serial)
    assert records.passed_after(state, [board], before) == (True, "every GPU passed")
    # a pass from before the drain does not count
    ok, why = records.passed_after(state, [board], time.time() + 1)
    assert not ok and "no standard qualification" in why
    # nor does another board's, nor a quick one for a standard gate
    other = records.Board("GPU-other", "999")
    assert not records.passed_after(state, [other], before)[0]
    assert records.latest(found, board, "long", before) is None


def test_a_failed_run_says_why_and_a_bad_record_is_none(fake_nvml, fake_cuda, tmp_path):
    args = host(tmp_path / "host")
    state = tmp_path / "host" / "state"
    before = time.time()
    record = detached.start(state, [1], extra_args=(*args, "--seconds", "1", "--targets",
                                                    str(FAKE_TARGETS)),
                            env=environment(fake_nvml, fake_cuda,
                                            {"fake_cuda_corrupt": "memtest"}))
    wait_gone(record)
    found = records.qualifications(state)
    ok, why = records.passed_after(state, [records.Board(found[0].uuid, found[0].serial)],
                                   before)
    assert not ok and "qualify.memtest" in why
    (state / detached.RECORD).write_text("{not json")
    assert detached.load(state) is None
    detached.clear(state)
    assert detached.load(state) is None
    assert records.qualifications(tmp_path / "nowhere") == []


def test_alive_means_this_boot_and_a_gpuguard_qualify_at_that_pid(tmp_path):
    procfs = tmp_path / "proc"
    (procfs / "4242").mkdir(parents=True)
    record = detached.Detached(pid=4242, started_at=1.0, boot_id="b1", level="standard")
    (procfs / "4242" / "cmdline").write_bytes(b"/usr/bin/python3\0-m\0gpuguard\0qualify\0")
    assert detached.alive(record, procfs, "b1")
    assert not detached.alive(record, procfs, "b2")   # a reboot ended it
    (procfs / "4242" / "cmdline").write_bytes(b"/usr/sbin/sshd\0-D\0")
    assert not detached.alive(record, procfs, "b1")   # the pid went to another program
    assert not detached.alive(detached.Detached(pid=7, started_at=1.0, boot_id=None,
                                                level="standard"), procfs, None)
