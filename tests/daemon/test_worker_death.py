"""The daemon's NVML worker dying of a signal inside an NVML call: the cycle's results are
unknown naming the call, the daemon keeps serving, and the next cycle starts a fresh
worker (issue 11: nvmlDeviceGetGpuFabricInfoV segfaulted on a real H200 host)."""


def test_a_worker_killed_by_sigsegv_is_reported_and_replaced(start_daemon, tmp_path, fake_env):
    crash = tmp_path / "crash"
    env = fake_env(gpus=2, crash="nvmlDeviceGetTemperature", crash_gpu=1, crash_file=str(crash))
    daemon = start_daemon("--fast-interval", "0.5", "--slow-interval", "5", "--timeout", "2",
                          env=env)
    assert daemon.result("driver.responsive")["status"] == "ok"

    crash.touch()
    responsive = daemon.wait_for(
        lambda: (r := daemon.result("driver.responsive"))["status"] == "unknown" and r,
        what="driver.responsive unknown")
    assert "died of SIGSEGV in" in responsive["message"]
    assert "nvmlDeviceGetTemperature (GPU 1)" in responsive["message"]
    dead = daemon.result("thermal.margin", 1)
    assert dead["status"] == "unknown" and "nvmlDeviceGetTemperature (GPU 1)" in dead["message"]
    assert daemon.proc.poll() is None  # the daemon itself lives on

    crash.unlink()
    daemon.wait_for(lambda: daemon.result("driver.responsive")["status"] == "ok",
                    timeout=15, what="recovery with a fresh worker")
    assert daemon.result("thermal.margin", 1)["status"] == "ok"
    assert '"event": "nvml_worker_died"' in daemon.log.read_text()
