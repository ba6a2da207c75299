"""No state, still a decision (issue 27, item 7): a state dir that cannot be made, and the
Slurm scripts' records (the drain record, the script-failure record, the job's note, the
lock) of any shape or kind. A critical fault still drains, the loss is said (stderr and
gpuguard_slurm_state_lost in the textfile), never a traceback; a lost record is never a
finding, nor evidence for a resume. `gpuguard slurm` on the fake Slurm
(tests/slurm/fake_slurm), and the readers fuzzed in-process."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuguard.integrations.slurm import plan as slurm
from gpuguard.integrations.slurm import state as slurm_state
from gpuguard.integrations.slurm.resume import may_resume, record_of
from gpuguard.judge.actions import ACTIONS
from tests.conftest import mounted_tmpfs
from tests.daemon.conftest import host_snapshot, write_snapshot
from tests.slurm.test_slurm_scripts import Fleet, stamp

FAULT = {(0, "remapped_rows_failure"): True}
REASON = "gpuguard: inspect_hardware: memory.row_remap GPU 0"


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    return Fleet(tmp_path)


def health(fleet: Fleet, state_dir: Path, snapshot: dict[str, Any]
           ) -> subprocess.CompletedProcess[str]:
    path = fleet.root / "snap.json"
    write_snapshot(path, snapshot)
    return fleet.gpuguard("health", "--no-daemon", "--input", str(path), "--brake-jitter", "0",
                          *fleet.slurm_args(), "--state-dir", str(state_dir),  # the last counts
                          "--metrics-file", str(fleet.root / "metrics.prom"))


def state_lost(fleet: Fleet) -> str:
    text = (fleet.root / "metrics.prom").read_text()
    return next(line for line in text.splitlines()
                if line.startswith("gpuguard_slurm_state_lost{"))


def assert_drained_and_said(fleet: Fleet, out: subprocess.CompletedProcess[str],
                            said: str) -> None:
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    assert fleet.node() == ("IDLE+DRAIN", REASON), out.stdout + out.stderr
    assert said in out.stderr, out.stderr
    assert state_lost(fleet) == 'gpuguard_slurm_state_lost{node="n1"} 1'


def test_a_state_dir_under_a_regular_file_still_drains(fleet: Fleet) -> None:
    (fleet.root / "file").write_text("")
    out = health(fleet, fleet.root / "file" / "state", host_snapshot(8, FAULT))
    assert_drained_and_said(fleet, out, "cannot be made (Not a directory): no lock")
    assert "cannot keep the drain's record (Not a directory)" in out.stderr


def test_a_state_dir_on_a_read_only_filesystem_still_drains(fleet: Fleet) -> None:
    """A stateless node: the parent is a read-only tmpfs (as root, a mode is no bar)."""
    with mounted_tmpfs(fleet.root / "ro", "size=64k", read_only=True) as mnt:
        out = health(fleet, mnt / "state", host_snapshot(8, FAULT))
    assert_drained_and_said(fleet, out, "cannot be made (Read-only file system)")


def test_an_existing_state_dir_on_a_read_only_filesystem_still_drains(fleet: Fleet) -> None:
    """The state dir is there (in the image) but read-only: no lock, no record kept."""
    mnt = fleet.root / "ro"
    with mounted_tmpfs(mnt, "size=64k"):
        (mnt / "slurm").mkdir()
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        out = health(fleet, mnt, host_snapshot(8, FAULT))
    assert_drained_and_said(fleet, out, "cannot be had (Read-only file system)")
    assert "cannot keep the drain's record (Read-only file system)" in out.stderr


GOOD_FAILURE: dict[str, Any] = {
    "script": "prolog", "node": "n1", "job": "77", "time": 0.0, "gpus": [1],
    "findings": [{"rule": "gpu.compute", "status": "critical", "action": "inspect_hardware",
                  "gpu": {"index": 1}, "message": "wrong data"}]}
BAD_FILES: dict[str, Any] = {
    "a JSON list": "[]",
    "a JSON string": '"gpuguard"',
    "findings that are not objects": json.dumps({**GOOD_FAILURE, "findings": [1, "x", None]}),
    "an action that is a list": json.dumps(
        {**GOOD_FAILURE, "findings": [{**GOOD_FAILURE["findings"][0], "action": ["reboot"]}]}),
    "a GPU index that is a string": json.dumps(
        {**GOOD_FAILURE, "findings": [{**GOOD_FAILURE["findings"][0], "gpu": {"index": "1"}}]}),
    "gpus that is a number": json.dumps({**GOOD_FAILURE, "gpus": 7}),
    "a time that is NaN": json.dumps({**GOOD_FAILURE, "time": float("nan")}),
    "another node's": json.dumps({**GOOD_FAILURE, "node": "n9"}),
    "binary garbage": bytes(range(256)) * 4,
    "deep nesting": "[" * 100_000,
    "too large": " " * (slurm_state.MAX_BYTES + 1),
}


def plant(path: Path, how: str, content: Any = None) -> None:
    """A record at `path` of a kind: a file with `content`, or a directory, a FIFO, a
    symlink (to a good record elsewhere)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if how == "directory":
        path.mkdir()
    elif how == "fifo":
        os.mkfifo(path)
    elif how == "symlink":
        target = path.parent.parent / f"elsewhere-{path.name}"
        target.write_text(json.dumps(content))
        path.symlink_to(target)
    else:
        path.write_bytes(content if isinstance(content, bytes) else str(content).encode())


@pytest.mark.parametrize("kind", [*BAD_FILES, "directory", "fifo", "symlink"])
def test_a_failure_record_of_any_shape_is_said_and_the_fault_still_drains(
        fleet: Fleet, kind: str) -> None:
    state = fleet.root / "state"
    plant(state / "slurm" / slurm_state.FAILURE, kind if kind in
          ("directory", "fifo", "symlink") else "file", BAD_FILES.get(kind, GOOD_FAILURE))
    out = health(fleet, state, host_snapshot(8, FAULT))
    assert_drained_and_said(fleet, out, "state: the script-failure record")


@pytest.mark.parametrize("kind", ["a JSON list", "binary garbage", "deep nesting", "too large",
                                  "another node's", "directory", "fifo", "symlink"])
def test_a_drain_record_of_any_shape_is_said_and_keeps_a_drain_of_gpuguards(
        fleet: Fleet, kind: str) -> None:
    """Drained by gpuguard, the record lost: the repaired node is not resumed (no evidence
    of what it drained for), and the loss is said; once it is resumed by hand, a new
    fault drains (and the record is written anew where it can be)."""
    state = fleet.root / "state"
    good = {"node": "n1", "reason": REASON, "findings": [{"rule": "memory.row_remap",
                                                          "gpu": None}], "gpus": []}
    plant(state / "slurm" / slurm_state.DRAIN, kind if kind in
          ("directory", "fifo", "symlink") else "file", BAD_FILES.get(kind, good))
    fleet.write([("n1", "IDLE+DRAIN", stamp(60), REASON)])
    out = health(fleet, state, host_snapshot(8))
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stdout + out.stderr
    assert fleet.node() == ("IDLE+DRAIN", REASON)
    assert "state: the drain record" in out.stderr
    assert "will not resume a drain of its own without it" in out.stderr
    assert state_lost(fleet) == 'gpuguard_slurm_state_lost{node="n1"} 1'
    fleet.write([("n1", "IDLE", "Unknown", "none")])
    out = health(fleet, state, host_snapshot(8, FAULT))
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stdout + out.stderr
    assert fleet.node() == ("IDLE+DRAIN", REASON)


@pytest.mark.parametrize("kind", ["directory", "symlink"])
def test_a_lock_that_cannot_be_had_is_said_and_the_fault_still_drains(
        fleet: Fleet, kind: str) -> None:
    state = fleet.root / "state"
    plant(state / "slurm" / "health.lock", kind, {})
    out = health(fleet, state, host_snapshot(8, FAULT))
    assert_drained_and_said(fleet, out, "state: the lock ")


def test_a_lock_of_another_kind_still_locks(fleet: Fleet) -> None:
    """A FIFO or a file of garbage where the lock is: flock works on it, nothing is lost."""
    state = fleet.root / "state"
    plant(state / "slurm" / "health.lock", "fifo")
    out = health(fleet, state, host_snapshot(8, FAULT))
    assert out.returncode == 0 and fleet.node() == ("IDLE+DRAIN", REASON), out.stdout
    assert state_lost(fleet) == 'gpuguard_slurm_state_lost{node="n1"} 0'


def test_an_unusable_note_of_the_jobs_start_is_unknown(fleet: Fleet) -> None:
    """The epilog with a note whose kernel-log position is not a number: what appeared
    during the job is unknown (exit 0), never a traceback."""
    state = fleet.root / "state"
    plant(state / "slurm" / "job-77.json", "file",
          json.dumps({"job": "77", "kmsg_usec": "12", "ecc_uncorrected": []}))
    snap = fleet.root / "snap.json"
    write_snapshot(snap, host_snapshot(2))
    (fleet.root / "kmsg.log").write_text("")
    out = fleet.gpuguard("epilog", "--input", str(snap), "--kmsg-file",
                         str(fleet.root / "kmsg.log"), "--node", "n1", "--state-dir",
                         str(state), env={"SLURM_JOB_ID": "77"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    assert "the note of job 77's start is not one gpuguard's prolog wrote" in out.stdout
    assert "what appeared during it is unknown" in out.stdout


# --- the readers, fuzzed -----------------------------------------------------------------

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
GPU = st.fixed_dictionaries({"index": st.integers(0, 7)},
                            optional={"uuid": st.text(max_size=12), "pci_bus_id": st.text()})
FINDING = st.fixed_dictionaries({
    "rule": st.sampled_from(["gpu.compute", "xid.recent", "site.nvlink_replay_" + "x" * 70]),
    "status": st.sampled_from(["critical", "ok", "unknown"]),
    "action": st.sampled_from(ACTIONS), "gpu": st.none() | GPU, "message": st.text()})
# records as gpuguard writes them, which the mutations below then break in one place
FAILURE = st.fixed_dictionaries({
    "script": st.sampled_from(["prolog", "epilog"]), "node": st.just("n1"),
    "job": st.text(max_size=6), "time": st.floats(0, 2e9), "findings": st.lists(FINDING,
                                                                              max_size=3),
    "gpus": st.lists(st.integers(0, 7), max_size=3),
    "slurmctld_time": st.none() | st.floats(0, 2e9)})
DRAIN = st.fixed_dictionaries({
    "node": st.just("n1"), "reason": st.just(REASON), "gpus": st.lists(GPU, max_size=3),
    "findings": st.lists(st.fixed_dictionaries({"rule": st.just("memory.row_remap"),
                                                "gpu": st.none() | GPU}), min_size=1,
                         max_size=3)})
NOTE = st.fixed_dictionaries({
    "job": st.just("77"), "kmsg_usec": st.none() | st.integers(0, 2**40),
    "time": st.floats(0, 2e9), "ecc_uncorrected": st.dictionaries(
        st.sampled_from("01234567"), st.integers(0, 99), max_size=3)})


@st.composite
def mutated(draw: st.DrawFn, valid: st.SearchStrategy[Any]) -> Any:
    """A valid record with one value somewhere in it (a key, an item, a nested key)
    replaced by any JSON, or dropped."""
    record = draw(valid)
    node = record
    while isinstance(node, dict | list) and node and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(node) if isinstance(node, dict)
                                   else range(len(node))))
        if not isinstance(node[key], dict | list) or not node[key]:
            break
        node = node[key]
    if isinstance(node, dict) and node:
        key = draw(st.sampled_from(sorted(node)))
        if draw(st.booleans()):
            del node[key]
        else:
            node[key] = draw(JSON)
    elif isinstance(node, list) and node:
        node[draw(st.integers(0, len(node) - 1))] = draw(JSON)
    return record


def shapes(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Any JSON at all, records as gpuguard writes them, and near misses of those."""
    return JSON | valid | mutated(valid)


RESULTS = [{"rule": "memory.row_remap", "status": "ok", "gpu": {"index": 0, "uuid": "GPU-0",
                                                                "pci_bus_id": "0:18:0"}}]
FUZZ = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def write(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))


@FUZZ
@given(value=shapes(FAILURE))
def test_any_failure_record_reads_whole_or_lost(tmp_path: Path, value: Any) -> None:
    from gpuguard.integrations.slurm.health import failure_time

    write(tmp_path / "slurm" / slurm_state.FAILURE, value)
    try:
        found = slurm_state.failure(tmp_path, "n1")
    except slurm_state.RecordLost:
        return
    assert found is not None
    # what health makes of it: the reason it would take a Prolog error drain over with
    findings = slurm.drain_worthy(found["findings"], set()) or found["findings"]
    if findings:
        reason = slurm.reason_for(findings)
        assert reason.startswith(slurm.PREFIX) and len(reason) <= slurm.REASON_MAX
    assert float(found["time"]) == found["time"]
    assert isinstance(failure_time(found), float)


@FUZZ
@given(value=shapes(DRAIN))
def test_any_drain_record_reads_whole_or_lost(tmp_path: Path, value: Any) -> None:
    write(tmp_path / "slurm" / slurm_state.DRAIN, value)
    try:
        record = slurm_state.drain_record(tmp_path, "n1")
    except slurm_state.RecordLost:
        return
    assert record is not None
    may_resume(RESULTS, set(), record)
    record_of(REASON, RESULTS, RESULTS, record)


@FUZZ
@given(value=shapes(NOTE))
def test_any_note_of_a_jobs_start_reads_whole_or_lost(tmp_path: Path, value: Any) -> None:
    from gpuguard.integrations.slurm.jobs import new_xids

    write(tmp_path / "slurm" / "job-77.json", value)
    try:
        start = slurm_state.job_start(tmp_path, "77")
    except slurm_state.RecordLost:
        return
    assert start is not None
    new_xids({"xids": [{"usec": 5, "xid": 79}]}, start.get("kmsg_usec"))
    assert all(isinstance(v, int) for v in start["ecc_uncorrected"].values())
