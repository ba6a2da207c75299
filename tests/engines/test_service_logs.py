"""A service's own log read incrementally and with a bound (gpuguard/sources/
service_logs.py), on real files, and the CUDA errors rules/engines/log-errors.yaml knows.
The journal (JournalTail) and Docker (DockerTail) backends are not run here: docs/
supervisor.md says which are tested where."""

from __future__ import annotations

import os

import pytest

from gpuguard.config.engine_profiles import load_catalog
from gpuguard.sources import service_logs
from gpuguard.sources.service_logs import FileTail, LogError


def test_the_first_read_marks_the_end_then_only_new_complete_lines(tmp_path):
    log = tmp_path / "llm.log"
    log.write_text("old line: an illegal memory access was encountered\n")
    tail = FileTail(str(log))
    assert tail.read(1.0) == []  # what it held before gpuguard watched is not news
    with log.open("a") as out:
        out.write("new 1\nnew 2\npartial")
    assert tail.read(1.0) == ["new 1", "new 2"]
    with log.open("a") as out:
        out.write(" line\n")
    assert tail.read(1.0) == ["partial line"]
    assert tail.read(1.0) == []


def test_a_truncated_or_replaced_file_is_read_from_its_start(tmp_path):
    log = tmp_path / "llm.log"
    log.write_text("a\n" * 10)
    tail = FileTail(str(log))
    tail.read(1.0)
    log.write_text("after truncate\n")
    assert tail.read(1.0) == ["after truncate"]
    rotated = tmp_path / "llm.log.new"
    rotated.write_text("after rotation\n")
    os.replace(rotated, log)
    assert tail.read(1.0) == ["after rotation"]


def test_a_file_made_later_is_read_from_its_start(tmp_path):
    log = tmp_path / "later.log"
    tail = FileTail(str(log))
    assert tail.read(1.0) == []
    log.write_text("CUDA error: unspecified launch failure\n")
    assert tail.read(1.0) == ["CUDA error: unspecified launch failure"]


def test_a_read_takes_at_most_its_bound_and_lines_are_cut(tmp_path):
    log = tmp_path / "big.log"
    log.write_text("")
    tail = FileTail(str(log))
    tail.read(1.0)
    with log.open("a") as out:
        out.write(("y" * 99 + "\n") * 30000)  # 3 MB: the newest MAX_BYTES are read
        out.write("z" * 5000 + "\n")
    lines = tail.read(1.0)
    assert sum(len(line) + 1 for line in lines) <= service_logs.MAX_BYTES
    assert lines[-1] == "z" * service_logs.MAX_LINE


def test_not_a_regular_file_is_an_error_of_the_read(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(LogError, match="not a regular file"):
        FileTail(str(fifo)).read(1.0)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "target")
    (tmp_path / "target").write_text("x\n")
    with pytest.raises(LogError, match="cannot open"):
        FileTail(str(link)).read(1.0)  # O_NOFOLLOW: a log is not followed elsewhere


@pytest.mark.parametrize(("line", "kind"), [
    ("RuntimeError: CUDA error: an illegal memory access was encountered",
     "illegal_memory_access"),
    ("torch.cuda: CUDA error: uncorrectable ECC error encountered", "uncorrectable_ecc"),
    ("CUDA error: unspecified launch failure", "launch_failure"),
    ("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, "
     "OpType=ALLREDUCE) ran for 600011 milliseconds before timing out.",
     "nccl_watchdog_timeout"),
    ("INFO: 127.0.0.1 - POST /v1/completions 200", None),
    ("CUDA out of memory. Tried to allocate 2.00 GiB", None),  # the app's, not the GPU's
])
def test_the_errors_known(line, kind):
    assert load_catalog().error_kind(line) == kind


def test_tail_for_each_backend():
    assert isinstance(service_logs.tail_for("exec", {"log_file_gpu": "/x"}, "gpu"), FileTail)
    assert service_logs.tail_for("exec", {}, "gpu") is None
    assert service_logs.tail_for("docker", {"gpu": {"name": "llm"}}, "gpu").container == "llm"
    assert service_logs.tail_for("systemd", {"gpu": "llm.service"}, "gpu").unit \
        == "llm.service"
