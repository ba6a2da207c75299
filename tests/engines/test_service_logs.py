"""A service's own log read incrementally and with a bound (gpuguard/sources/
service_logs.py), on real files and a real private Docker engine, and the CUDA errors
rules/engines/log-errors.yaml knows. The journal (JournalTail) is not run here (it would
read the host's journal): tests/systemd_pid1 reads a unit's journal."""

from __future__ import annotations

import os
import time

import pytest

from gpuguard.config.engine_profiles import load_catalog
from gpuguard.daemon.service_logs import any_of
from gpuguard.sources import service_logs
from gpuguard.sources.service_logs import DockerTail, FileTail, LogError

ERR = "RuntimeError: CUDA error: an illegal memory access was encountered"


def started(path) -> FileTail:
    """A tail whose first read (it marks the end) is done."""
    tail = FileTail(str(path))
    assert tail.read(1.0) == []
    return tail


def kinds(lines: list[str]) -> list[str]:
    return [kind for kind in map(load_catalog().error_kind, lines) if kind]


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


def test_a_flood_after_an_error_is_scanned_to_its_end(tmp_path):
    """Review 4, item 9: an error, then more than 1 MiB in the same cycle, is still seen
    (every new byte is scanned, up to MAX_SCAN), and nothing is said skipped."""
    log = tmp_path / "llm.log"
    log.write_text("INFO started\n")
    tail = started(log)
    flood = "ERROR request aborted: engine dead " + "x" * 80 + "\n"
    with log.open("a") as out:
        out.write(ERR + "\n" + flood * 25000)  # 3 MB after the error
    assert kinds(tail.read(5.0)) == ["illegal_memory_access"]
    keep = any_of(load_catalog())  # as the daemon reads: only the matching lines kept
    with log.open("a") as out:
        out.write(ERR + "\n" + flood * 25000)
    assert tail.read(5.0, keep) == [ERR]
    assert tail.count == 25001 and tail.skipped is None
    with log.open("a") as out:  # and the same bytes are never taken again
        out.write(flood * 3)
    assert tail.read(5.0, keep) == [] and tail.count == 3


def test_an_error_far_along_a_long_line_is_seen(tmp_path):
    """Review 4, item 9: lines were cut to 2000 characters before matching. A line is
    matched whole up to MAX_LINE, a longer one in overlapping pieces; what is kept of a
    matching line is SHOWN characters around its match."""
    log = tmp_path / "llm.log"
    log.write_text("")
    tail = started(log)
    with log.open("a") as out:
        out.write("[rank0] " + "y" * 2100 + " " + ERR + "\n")
    assert kinds(tail.read(2.0)) == ["illegal_memory_access"]
    keep = any_of(load_catalog())
    with log.open("a") as out:
        out.write("[rank0] " + "y" * 2100 + " " + ERR + "\n")
    [line] = tail.read(2.0, keep)
    assert ERR in line and len(line) <= service_logs.SHOWN
    with log.open("a") as out:  # past MAX_LINE, and a line across read chunks
        out.write("[rank0] " + "y" * (service_logs.CHUNK + 3000) + " " + ERR + "\n")
    assert kinds(tail.read(2.0, keep)) == ["illegal_memory_access"]
    assert tail.skipped is None
    assert tail.read(2.0) == []


def test_past_the_bound_is_skipped_and_said(tmp_path):
    """Review 4, item 9: where MAX_SCAN still cuts, the read says how many bytes it did
    not read (service.gpu_errors: unknown), and the next read starts at the end, without
    taking the rest of a cut line as a line."""
    log = tmp_path / "llm.log"
    log.write_text("")
    tail = started(log)
    line = "z" * 1023 + "\n"
    over = service_logs.MAX_SCAN + 10 * 1024
    with log.open("a") as out:
        out.write(line * (over // 1024) + "partial " + ERR)
    lines = tail.read(10.0)
    assert len(lines) == service_logs.MAX_SCAN // 1024
    skipped = over + len("partial " + ERR) - service_logs.MAX_SCAN
    assert tail.skipped is not None and tail.skipped.startswith(f"{skipped} bytes of ")
    with log.open("a") as out:
        out.write(" (the cut line's end)\nnew line\n")
    assert tail.read(2.0) == ["new line"] and tail.skipped is None


def test_a_rename_rotation_finishes_the_old_file_first(tmp_path):
    """Review 4, item 11: the lines written to the old file after the last read are read
    through the descriptor held open, then the new file from its start."""
    log = tmp_path / "llm.log"
    log.write_text("start\n")
    tail = started(log)
    with log.open("a") as out:
        out.write("ok line\n" + ERR + "\n")
    os.rename(log, tmp_path / "llm.log.1")
    log.write_text("after rotation\n")
    assert tail.read(2.0) == ["ok line", ERR, "after rotation"]
    (tmp_path / "llm.log.1").unlink()
    with log.open("a") as out:
        out.write("next\n")
    assert tail.read(2.0) == ["next"]
    log.unlink()  # removed: the rest of it is read, and a file made later from its start
    assert tail.read(2.0) == []
    log.write_text("again\n")
    assert tail.read(2.0) == ["again"]


def test_copytruncate_grown_past_the_offset_is_read_from_its_start(tmp_path):
    """Review 4, item 11: the same inode, cut and written past the old offset before the
    next read: the bytes before the offset are not those read, so from its start."""
    log = tmp_path / "llm.log"
    log.write_text("start\n")
    tail = started(log)
    with log.open("a") as out:
        out.write("x" * 100 + "\n")
    assert len(tail.read(2.0)) == 1
    with log.open("r+") as out:  # copytruncate: the same file, emptied and written again
        out.truncate(0)
        out.write(ERR + "\n" + "z" * 300 + "\n")
    assert tail.read(2.0) == [ERR, "z" * 300]


CRASH_THEN_SERVE = (
    # the first run logs one error per in-flight request (2000 lines, 1.2 MB) and dies;
    # restarted (the same container, its file kept), it serves and logs ordinary lines
    'p=$(busybox printf "%520s" "" | busybox tr " " p); '
    'if [ ! -e /crashed ]; then : > /crashed; i=0; while [ $i -lt 2000 ]; do '
    f'echo "[req $i] $p {ERR}"; i=$((i+1)); done; exit 1; fi; '
    'i=0; while true; do echo "INFO request ok $i"; i=$((i+1)); sleep 0.2; done')


def test_docker_an_old_error_is_never_new_after_a_restart(docker_host, busybox_image,
                                                           monkeypatch):
    """Review 4, item 4: the newest 2000 lines were cut to their last 1 MiB, and the first
    line of the cut (no Docker stamp: a fragment of an old line) was taken as new: the
    crashed run's error reported again on the restarted, healthy container. A line without
    a stamp is never taken; 2000 lines are read whole (up to MAX_SCAN bytes)."""
    import docker

    monkeypatch.setenv("DOCKER_HOST", docker_host)
    client = docker.from_env()
    container = client.containers.run(busybox_image, ["sh", "-c", CRASH_THEN_SERVE],
                                      name=f"gg-logs-{os.getpid()}", detach=True)
    try:
        assert container.wait(timeout=60)["StatusCode"] == 1
        tail = DockerTail(container.name)
        assert tail.read(5.0) == []  # the first read marks the end
        container.start()
        seen: list[str] = []
        for _ in range(5):
            time.sleep(0.3)
            seen += tail.read(5.0)
        assert kinds(seen) == []
        assert seen and all(line.startswith("INFO request ok") for line in seen)
        # (no read "from the run's start" for Docker: its stamps come from the log copier,
        # after FinishedAt under load, and the crashed run's error came back as new)
        assert service_logs.tail_for("docker", {"gpu": {"name": container.name}}, "gpu",
                        from_start=True).from_start is False
        # recreated under its name (a new run): what it logged before the read is its own
        container.remove(force=True)
        container = client.containers.run(busybox_image, ["sh", "-c", f"echo '{ERR}'"],
                                          name=tail.container, detach=True)
        assert container.wait(timeout=60)["StatusCode"] == 0
        assert tail.read(5.0) == [ERR]
    finally:
        container.remove(force=True)
        client.close()


def test_the_patterns_as_one_expression_match_as_each_does(tmp_path):
    """Patterns lowers the chunk (bytes: every offset kept) where the expression allows
    it, else matches with re.IGNORECASE; either way a read keeps the lines error_kind
    knows, as they were written."""
    fast = any_of(load_catalog())
    assert fast is not None and fast.lowered
    escaped = service_logs.Patterns([r"CUDA\s+error:\s+\w+ launch failure"])
    assert not escaped.lowered
    lines = ["ok", "cuda ERROR: Unspecified Launch Failure here", "ü " + ERR.upper(),
             "CUDA out of memory"]
    log = tmp_path / "llm.log"
    log.write_text("")
    for keep, kept in ((fast, lines[1:3]), (escaped, lines[1:2])):
        tail = started(log)
        with log.open("a") as out:
            out.write("\n".join(lines) + "\n")
        assert tail.read(2.0, keep) == kept and tail.count == 4


def test_docker_a_cut_of_lines_already_read_is_not_said(docker_host, busybox_image,
                                                         monkeypatch):
    """The newest 2000 lines past MAX_SCAN bytes: their oldest bytes are cut. Where the
    last read's newest line is still in what is kept, the cut held only lines read before:
    nothing is said (no unknown for ever on a service that logs long lines); a first read
    from the run's start did not read them: said."""
    import docker

    monkeypatch.setenv("DOCKER_HOST", docker_host)
    client = docker.from_env()
    script = ('p=$(busybox printf "%4500s" "" | busybox tr " " p); i=0; '
              f'while [ $i -lt 2000 ]; do echo "$i $p {ERR}"; i=$((i+1)); done; '
              'i=0; while true; do echo "INFO request ok $i"; i=$((i+1)); sleep 0.2; done')
    container = client.containers.run(busybox_image, ["sh", "-c", script],
                                      name=f"gg-cut-{os.getpid()}", detach=True)
    try:
        tail = DockerTail(container.name)
        deadline = time.monotonic() + 60
        while b"INFO request ok" not in container.logs(tail=1):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        tail.read(5.0)  # the first read marks the end
        for _ in range(3):
            time.sleep(0.3)
            assert kinds(tail.read(5.0)) == [] and tail.skipped is None
        fresh = DockerTail(container.name, from_start=True)
        assert kinds(fresh.read(5.0)) and fresh.skipped is not None
        assert fresh.skipped.endswith(f"lines not read (more than {service_logs.MAX_SCAN} bytes)")
    finally:
        container.remove(force=True)
        client.close()
