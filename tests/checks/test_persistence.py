from gpuguard.model.results import Status
from gpuguard.model.snapshot import Reading, Snapshot
from tests.conftest import set_gpu, with_gpus


def without_daemon(snapshot: Snapshot) -> Snapshot:
    snapshot.host.persistenced_running = Reading.ok(False)
    snapshot.host.__post_init__()
    return snapshot


def test_persistence_mode(h200, run_rule):
    assert run_rule("persistence.mode", h200)[0].status is Status.OK
    set_gpu(h200, persistence_mode=False)
    [result] = run_rule("persistence.mode", h200)
    assert result.status is Status.WARNING
    assert "nvidia-persistenced" in (result.remediation or "")


def test_daemon_found_by_process_name(h200, run_rule, tmp_path):
    """A real process named nvidia-persistenced (a copy of sleep), found through /proc."""
    import shutil
    import subprocess
    import time
    from pathlib import Path

    from gpuguard.sources import driver_stack

    set_gpu(h200, persistence_mode=False)  # with the mode on, the daemon is not needed
    h200.host.persistenced_running = driver_stack.persistenced_running(Path("/proc"))
    h200.host.__post_init__()
    if h200.host.persistenced_running.get():
        return  # a real one runs here; the case below needs none
    [result] = run_rule("persistence.daemon", h200)
    assert result.status is Status.WARNING
    assert "neither nvidia-persistenced" in result.message

    binary = tmp_path / "nvidia-persistenced"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", binary)
    proc = subprocess.Popen([str(binary), "30"])
    try:
        # until exec, the child still carries its parent's name
        comm = Path(f"/proc/{proc.pid}/comm")
        for _ in range(100):
            if comm.read_text().strip() == "nvidia-persiste":
                break
            time.sleep(0.05)
        h200.host.persistenced_running = driver_stack.persistenced_running(Path("/proc"))
        h200.host.__post_init__()
        assert run_rule("persistence.daemon", h200)[0].status is Status.OK
    finally:
        proc.kill()
        proc.wait()


def test_daemon_not_judged_without_gpus(run_rule):
    from gpuguard.model.snapshot import Reading, Snapshot

    snap = Snapshot()
    snap.host.gpu_count = Reading.ok(0)
    snap.host.persistenced_running = Reading.ok(False)
    snap.host.__post_init__()
    assert run_rule("persistence.daemon", snap)[0].status is Status.SKIPPED


def test_mode_on_for_every_gpu_without_the_daemon_is_healthy(h200, run_rule):
    """Both lent H200 hosts run so (a VM image): the mode keeps the driver up just the same."""
    with_gpus(without_daemon(h200), ["0000:3b:00.0", "0000:5d:00.0"])
    [result] = run_rule("persistence.daemon", h200)
    assert result.status is Status.OK, result.message
    assert "all 2 GPU(s)" in result.message and "nvidia-persistenced" in result.message
    assert [r.status for r in run_rule("persistence.mode", h200)] == [Status.OK, Status.OK]


def test_neither_daemon_nor_mode_warns_and_names_the_gpu(h200, run_rule):
    with_gpus(without_daemon(h200), ["0000:3b:00.0", "0000:5d:00.0"])
    set_gpu(h200, 1, persistence_mode=False)
    [result] = run_rule("persistence.daemon", h200)
    assert result.status is Status.WARNING
    assert "GPU(s) 1 " in result.message and result.observed["persistence_mode_off"] == [1]
    mode = run_rule("persistence.mode", h200)
    assert [r.status for r in mode] == [Status.OK, Status.WARNING]


def test_an_unread_mode_is_never_ok(h200, run_rule):
    with_gpus(without_daemon(h200), ["0000:3b:00.0", "0000:5d:00.0"])
    set_gpu(h200, 1, persistence_mode=Reading.failed("GPU is lost"))
    [result] = run_rule("persistence.daemon", h200)
    assert result.status is Status.UNKNOWN, result.message
    assert "GPU 1" in result.message
    # the driver counts a GPU that was not read at all
    set_gpu(h200, 1, persistence_mode=True)
    h200.host.gpu_count = Reading.ok(3)
    h200.host.__post_init__()
    [result] = run_rule("persistence.daemon", h200)
    assert result.status is Status.UNKNOWN, result.message


def test_mode_on_is_ok_even_when_the_daemon_state_is_unreadable(h200, run_rule):
    h200.host.persistenced_running = Reading.failed("permission denied")
    h200.host.__post_init__()
    [result] = run_rule("persistence.daemon", h200)
    assert result.status is Status.OK and "permission denied" in result.message
    set_gpu(h200, persistence_mode=False)
    assert run_rule("persistence.daemon", h200)[0].status is Status.UNKNOWN


def test_mode_off_is_fine_while_the_daemon_runs(h200, run_rule):
    h200.host.persistenced_running = Reading.ok(True)
    h200.host.__post_init__()
    set_gpu(h200, persistence_mode=False)
    [result] = run_rule("persistence.mode", h200)
    assert result.status is Status.OK and "nvidia-persistenced" in result.message
    assert run_rule("persistence.daemon", h200)[0].status is Status.OK


def test_mode_findings_say_what_they_saw(h200, run_rule):
    assert run_rule("persistence.mode", h200)[0].observed == {"persistence_mode": True}
    set_gpu(h200, persistence_mode=False)
    h200.host.persistenced_running = Reading.ok(True)
    h200.host.__post_init__()
    assert run_rule("persistence.mode", h200)[0].observed == {"persistence_mode": False,
                                                              "persistenced_running": True}
    without_daemon(h200)
    assert run_rule("persistence.mode", h200)[0].observed == {"persistence_mode": False}


def test_daemon_findings_say_the_daemon_is_not_running(h200, run_rule):
    without_daemon(set_gpu(h200, persistence_mode=False))
    [result] = run_rule("persistence.daemon", h200)
    assert result.status is Status.WARNING
    assert result.observed["persistenced_running"] is False
    set_gpu(h200, persistence_mode=Reading.failed("GPU is lost"))
    [result] = run_rule("persistence.daemon", h200)
    assert result.status is Status.UNKNOWN
    assert result.observed["persistenced_running"] is False
