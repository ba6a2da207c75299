"""`gpuguard failover status|to` on odd state directories: a clear line or message and
exit 3, never a traceback and never a hang (real files, FIFOs, another user)."""

import json
import os
import time

import pytest

from gpuguard.supervisor import state
from tests.conftest import gpuguard

ODD = {
    "text": "not json at all",
    "list": "[1, 2]",
    "string": '"gpu"',
    "missing": '{"since": 1}',
    "wrong-type": '{"active": "gpu", "since": "yesterday", "reason": "x"}',
    "unknown-variant": '{"active": "tpu", "since": 1, "reason": "x"}',
    "huge": " " * 1_000_000 + "{}",
}


def test_status_gives_a_line_per_bad_file_and_exit_3(tmp_path):
    state.save(state.path_for(tmp_path, "good"), state.ServiceState(reason="all well",
                                                                   since=1e300))
    for name, text in ODD.items():
        state.path_for(tmp_path, name).write_text(text)
    state.path_for(tmp_path, "dir").mkdir()
    os.mkfifo(state.path_for(tmp_path, "fifo"))  # no writer: a plain read blocks for ever
    proc = gpuguard("failover", "status", "--state-dir", str(tmp_path), timeout=30)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stdout.splitlines()
    for name in [*ODD, "dir", "fifo"]:
        [line] = [x for x in lines if x.startswith(f"{state.path_for(tmp_path, name)}: ")]
        assert ": unreadable (" in line, line
    assert any("not a regular file but a FIFO" in x for x in lines)
    assert any(x.startswith("good: GPU since 1e+300 (not a time) (all well)") for x in lines)
    assert proc.stderr.strip() == \
        f"gpuguard: {len(ODD) + 2} state file(s) in {tmp_path} could not be read"
    # the command only looked: every file is where it was
    assert state.path_for(tmp_path, "fifo").exists() and state.path_for(tmp_path, "dir").is_dir()


def test_status_of_a_state_dir_that_is_a_file(tmp_path):
    (tmp_path / "state").write_text("")
    proc = gpuguard("failover", "status", "--state-dir", str(tmp_path / "state"))
    assert proc.returncode == 3 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"gpuguard: cannot read {tmp_path / 'state'}: ")


def test_to_cannot_write_its_request(tmp_path):
    state.save(state.path_for(tmp_path, "llm"), state.ServiceState())
    state.request_path(tmp_path, "llm").mkdir()  # a leftover directory in the way
    proc = gpuguard("failover", "to", "cpu", "llm", "--reason", "x", "--state-dir",
                    str(tmp_path), "--wait", "0")
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(
        f"gpuguard: cannot write {state.request_path(tmp_path, 'llm')}: ")


@pytest.mark.parametrize("text", ["[1, 2]", "garbage"])
def test_to_waits_through_an_odd_state_file(tmp_path, text):
    state.path_for(tmp_path, "llm").write_text(text)
    started = time.monotonic()
    proc = gpuguard("failover", "to", "cpu", "llm", "--reason", "x", "--state-dir",
                    str(tmp_path), "--wait", "0.5")
    assert time.monotonic() - started < 30  # does not hang
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
    assert "llm is not on cpu after 0.5 s" in proc.stderr
    request = json.loads(state.request_path(tmp_path, "llm").read_text())
    assert request["to"] == "cpu" and request["reason"] == "x"


def test_load_moves_a_fifo_and_a_huge_file_aside_without_blocking(tmp_path):
    path = state.path_for(tmp_path, "llm")
    os.mkfifo(path)
    with pytest.raises(state.CorruptState) as caught:
        state.load(path)
    assert "FIFO" in caught.value.reason and caught.value.moved_to is not None
    assert not os.path.lexists(path)
    path.write_text(json.dumps({"active": "cpu", "since": 1, "reason": "x" * 100_000}))
    with pytest.raises(state.CorruptState) as caught:
        state.load(path)
    assert "more than 65536" in caught.value.reason
    assert state.load(path) is None  # moved aside: the next save can take its place


def test_to_takes_only_a_service_name_never_a_path(tmp_path):
    """`failover to cpu ../x`: a name that could reach outside the state dir (a state file
    `failover-..` made there by hand) is refused before anything is read or written."""
    (tmp_path / "failover-..").mkdir()
    state.save(tmp_path / "failover-.." / "x.json", state.ServiceState())
    proc = gpuguard("failover", "to", "cpu", "../x", "--reason", "x", "--state-dir",
                    str(tmp_path), "--wait", "0")
    assert proc.returncode == 3 and "is not a service name" in proc.stderr, proc.stderr
    assert not (tmp_path / "failover-.." / "x.request.json").exists()
