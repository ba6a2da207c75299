"""The supervisor's clock (issue 20, item 1): its decisions on CLOCK_BOOTTIME, kept in the
state file beside the boot id, so that a restart of the daemon within a boot loses none of
the time on CPU, and a file of another boot, or of gpuguard before issue 20, counts it
from the restart. The exec backend with real (trivial) commands, in-process."""

from __future__ import annotations

import json
import time
from pathlib import Path

from gpuguard.io.clock import boot_elapsed, boottime
from gpuguard.model.identity import GpuId
from gpuguard.model.results import Result, Status
from gpuguard.supervisor import policy, state
from gpuguard.supervisor.config import load_services
from gpuguard.supervisor.service import Supervisor

BOOT = "7e570000-0000-4000-8000-00000000b007"
OTHER_BOOT = "7e570000-0000-4000-8000-00000000b008"
BAD = [Result("ecc.uncorrected", Status.CRITICAL, Status.CRITICAL, "2 DBE", GpuId(0, "u", "p"))]
GOOD = [Result("ecc.uncorrected", Status.OK, Status.CRITICAL, "ok", GpuId(0, "u", "p"))]
LEGACY = Path(__file__).resolve().parent / "data" / "failover-batch-before-issue-20.json"


def supervisor(tmp_path: Path, boot_id: str | None, min_cpu_time: float = 60) -> Supervisor:
    config = tmp_path / "gpuguard.yaml"
    config.write_text(json.dumps({"services": [{
        "name": "batch", "backend": "exec", "failover_after": 2, "failback_after": 2,
        "min_cpu_time": min_cpu_time, "probe": {"exec": ["true"]},
        "exec": {"start_gpu": ["true"], "stop_gpu": ["true"], "start_cpu": ["true"],
                 "stop_cpu": ["true"], "running_gpu": ["true"], "running_cpu": ["false"]}}]}))
    [service] = load_services(config)
    return Supervisor(service, tmp_path / "state", {"ecc.uncorrected"}, boot_id=boot_id)


def on_cpu(tmp_path: Path, boot_id: str | None) -> Supervisor:
    first = supervisor(tmp_path, boot_id)
    first.recover()
    for _ in range(2):
        first.handle_cycle(BAD, boottime())
    assert first.state.active == "cpu"
    return first


def test_the_time_on_cpu_lives_through_a_restart_within_the_boot(tmp_path):
    first = on_cpu(tmp_path, BOOT)
    went = first.state.on_cpu_boottime
    on_disk = json.loads(state.path_for(tmp_path / "state", "batch").read_text())
    assert on_disk["boot_id"] == BOOT and on_disk["on_cpu_boottime"] == went
    assert boot_elapsed(BOOT, went, BOOT) is not None

    again = supervisor(tmp_path, BOOT)  # the daemon restarted, same boot
    again.recover()
    assert again.state.active == "cpu" and again.state.on_cpu_boottime == went
    # min_cpu_time 60 s from the failover, not from the restart
    for _ in range(2):
        again.handle_cycle(GOOD, went + 59)
    assert again.state.active == "cpu"
    for _ in range(2):
        again.handle_cycle(GOOD, went + 61)
    assert again.state.active == "gpu"


def test_another_boot_counts_the_time_on_cpu_from_the_restart(tmp_path):
    first = on_cpu(tmp_path, BOOT)
    went = first.state.on_cpu_boottime
    assert went is not None
    time.sleep(0.05)
    later = supervisor(tmp_path, OTHER_BOOT)
    before = boottime()
    later.recover()
    rebased = later.state.on_cpu_boottime
    assert rebased is not None and before <= rebased <= boottime()
    assert later.state.boot_id == OTHER_BOOT


def test_a_state_file_of_before_issue_20_is_read_and_counted_from_the_restart(tmp_path):
    legacy = json.loads(LEGACY.read_text())
    ahead = time.time() + 3600 - legacy["on_cpu_since"]
    for name in ("since", "on_cpu_since", "last_transition"):
        legacy[name] += ahead  # made under a clock an hour ahead of this one
    legacy["next_retry"] = time.time() + 86400  # and a retry a day ahead: bounded
    path = state.path_for(tmp_path / "state", "batch")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(legacy))
    sup = supervisor(tmp_path, BOOT, min_cpu_time=30)
    before = boottime()
    sup.recover()
    st = sup.state
    assert st.active == "cpu" and st.boot_id == BOOT
    assert st.on_cpu_boottime is not None and before <= st.on_cpu_boottime <= boottime()
    assert st.retry_boottime <= boottime() + policy.BACKOFF_MAX_S
    went = st.on_cpu_boottime
    for _ in range(2):
        sup.handle_cycle(GOOD, went + 29)
    assert sup.state.active == "cpu"  # min_cpu_time from the restart
    sup.handle_cycle(GOOD, went + policy.BACKOFF_MAX_S + 31)
    assert sup.state.active == "gpu"  # not an hour (nor a day) later


def test_a_reading_ahead_of_this_boots_clock_is_not_trusted(tmp_path):
    first = on_cpu(tmp_path, BOOT)
    path = first.path
    written = json.loads(path.read_text())
    written["on_cpu_boottime"] = boottime() + 10 * 86400  # hand-edited, or not ours
    written["retry_boottime"] = boottime() + 10 * 86400
    path.write_text(json.dumps(written))
    again = supervisor(tmp_path, BOOT)
    again.recover()
    assert again.state.on_cpu_boottime is not None
    assert again.state.on_cpu_boottime <= boottime()
    assert again.state.retry_boottime <= boottime() + policy.BACKOFF_MAX_S


def test_bad_clock_values_in_a_state_file_are_refused(tmp_path):
    path = tmp_path / "failover-batch.json"
    for bad in ({"on_cpu_boottime": -1}, {"retry_boottime": float("inf")},
                {"boot_id": "x" * 100}, {"boot_id": 7}):
        path.write_text(json.dumps({"active": "cpu", "since": 1.0, "reason": "r", **bad}))
        try:
            state.read(path)
        except state.Unreadable:
            continue
        raise AssertionError(f"accepted {bad}")
