from gpuguard.results import Status
from tests.conftest import set_gpu


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

    h200.host.persistenced_running = driver_stack.persistenced_running(Path("/proc"))
    h200.host.__post_init__()
    if h200.host.persistenced_running.get():
        return  # a real one runs here; the case below needs none
    [result] = run_rule("persistence.daemon", h200)
    assert result.status is Status.WARNING
    assert "not running" in result.message

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
    from gpuguard.snapshot import Reading, Snapshot

    snap = Snapshot()
    snap.host.gpu_count = Reading.ok(0)
    snap.host.persistenced_running = Reading.ok(False)
    snap.host.__post_init__()
    assert run_rule("persistence.daemon", snap)[0].status is Status.SKIPPED
