"""An ack covers exactly the finding it was given for (issue 20, item 5): the rule, the
GPU, the status and, for a host rule, the set of things its finding names
(`observed["names"]`); it ends when any of them changes. An ack of a rule that is ok, or
of a GPU the store never recorded, is refused."""

from __future__ import annotations

import time
from pathlib import Path

from gpuguard.events import store as eventstore
from gpuguard.events.escalation import apply_history
from gpuguard.events.recording import rule_transitions
from gpuguard.events.writer import EventWriter
from gpuguard.io.paths import Paths
from gpuguard.model.results import Result, Status
from gpuguard.model.rule import RuleSet
from tests.events.conftest import BOOT_A, NONE, ack, events, kmsg_lines, procfs, result


def test_an_ack_of_a_rule_that_is_ok_is_refused_and_covers_no_later_fault(tmp_path, run):
    state, proc = tmp_path / "state", procfs(tmp_path, BOOT_A)
    fine = result(run(state, proc, recovery=NONE), "recovery.action", 0)
    assert fine["status"] == "ok"
    out = ack(state, proc, "recovery.action", "--gpu", "0")
    assert out.returncode == 3, out.stdout + out.stderr
    assert "nothing to acknowledge" in out.stderr and "ok" in out.stderr
    assert events(state, "--kind", "ack") == []  # refused: nothing written
    # the fault that comes later is not covered by anything
    later = result(run(state, proc), "recovery.action", 0)
    assert (later["status"], later["action"]) == ("critical", "reset_gpu")


def test_an_ack_for_a_gpu_this_host_does_not_have_is_refused(tmp_path, run):
    state, proc = tmp_path / "state", procfs(tmp_path, BOOT_A)
    run(state, proc)  # GPU 0's recovery.action is critical, recorded
    out = ack(state, proc, "recovery.action", "--gpu", "99")
    assert out.returncode == 3, out.stdout + out.stderr
    assert "recorded no GPU 99" in out.stderr
    out = ack(state, proc, "recovery.action", "--gpu", "GPU-not-here")
    assert out.returncode == 3 and "recorded no GPU GPU-not-here" in out.stderr
    assert events(state, "--kind", "ack") == []
    # the GPU that has the finding is acked, and says what it covers
    out = ack(state, proc, "recovery.action", "--gpu", "0")
    assert out.returncode == 0, out.stderr
    assert "covers its critical finding" in out.stdout


def test_an_ack_ends_when_what_its_finding_names_changes(tmp_path, run):
    """xid.recent critical for Xid 79 on GPU 0 (one result per GPU), acknowledged; then
    Xid 48 too, still critical: the ack covered Xid 79 only, so the action comes back."""
    state, proc = tmp_path / "state", procfs(tmp_path, BOOT_A)
    one = kmsg_lines(tmp_path, "one.log", [79])
    first = result(run(state, proc, "--kmsg-file", str(one), recovery=NONE), "xid.recent", 0)
    assert (first["status"], first["action"]) == ("critical", "reboot")
    assert first["observed"]["names"] == ["79"]
    empty = tmp_path / "empty.log"
    empty.write_text("")
    out = ack(state, proc, "xid.recent", "--gpu", "0", "--kmsg-file", str(empty))
    assert out.returncode == 0, out.stderr
    acked = result(run(state, proc, "--kmsg-file", str(one), recovery=NONE), "xid.recent", 0)
    assert (acked["status"], acked["action"]) == ("critical", "none")
    # worse under the same status: another fatal Xid
    two = kmsg_lines(tmp_path, "two.log", [79, 48])
    worse = result(run(state, proc, "--kmsg-file", str(two), recovery=NONE), "xid.recent", 0)
    assert worse["status"] == "critical"
    assert worse["action"] == "reboot", worse["action_reason"]
    assert "acknowledged at" not in (worse["action_reason"] or "")
    # the store knows the finding's new set: a transition under the same status
    changes = events(state, "--kind", "rule", "--rule", "xid.recent")
    assert [(e["old_status"], e["status"], e["data"].get("names")) for e in changes] == [
        ("critical", "critical", ["48", "79"]), (None, "critical", ["79"])]


def _finding(names: list[str], status: Status = Status.CRITICAL) -> Result:
    # "names" is model.results.NAMES (spelled out: this test ran on the code before it)
    return Result("gpu.count", status, Status.CRITICAL, f"{len(names)} GPU(s) missing",
                  observed={"names": names}, action="reboot")


def _applied(path: Path, result_: Result, rules: RuleSet) -> Result:
    conn = eventstore.open_reader(path)
    try:
        [applied] = apply_history([result_], conn, BOOT_A, rules, {})
    finally:
        conn.close()
    return applied


def test_a_host_rules_ack_covers_the_set_it_was_given_for_not_a_worse_one(tmp_path,
                                                                         default_rules):
    """The mechanism is generic (gpu.count will name its missing GPUs): 3 of 4 GPUs
    missing, acknowledged; then all 4 missing under the same status is a new finding."""
    state = tmp_path / "state"
    path = eventstore.path_in(state)
    three = [f"GPU-{c * 4} (0000:{0x10 + i:02x}:00.0)" for i, c in enumerate("abc")]
    last: dict = {}
    writer = EventWriter(path, BOOT_A)
    writer.record_all(rule_transitions([_finding(three)], last, "daemon"))
    assert writer.flush() == 1
    writer.close()
    from gpuguard.events.ack_command import record_ack

    proc = procfs(tmp_path, BOOT_A)
    said = record_ack(state, Paths(procfs=proc), None, "gpu.count", None, "RMA", 3600.0)
    assert "covers its critical finding" in said
    assert _applied(path, _finding(three), default_rules).action == "none"
    # a set: the order does not matter
    assert _applied(path, _finding(list(reversed(three))), default_rules).action == "none"
    all_four = [*three, "GPU-dddd (0000:13:00.0)"]
    assert _applied(path, _finding(all_four), default_rules).action == "reboot"
    # fewer is a change too
    assert _applied(path, _finding(three[:2]), default_rules).action == "reboot"
    # recorded as a transition under the same status; the ack ends with it
    writer = EventWriter(path, BOOT_A)
    writer.record_all(rule_transitions([_finding(all_four)], last, "daemon",
                                       time.time() + 1))
    assert writer.flush() == 1
    writer.close()
    assert _applied(path, _finding(three), default_rules).action == "reboot"


def test_names_are_a_bounded_set_of_short_strings():
    from gpuguard.model.results import NAMES, names_of

    assert names_of({NAMES: ["b", "a", "b"]}) == ("a", "b")
    assert names_of({}) == () and names_of({NAMES: "not a list"}) == ()
    many = names_of({NAMES: [f"name-{i}" for i in range(1000)]})
    assert len(many) <= 65 and many != names_of({NAMES: [f"name-{i}" for i in range(999)]})
    assert max(len(n) for n in names_of({NAMES: ["x" * 5000]})) <= 200


def test_what_an_operator_or_the_kernel_wrote_prints_no_control_character(tmp_path, run):
    """An ack's reason (anyone in the gpuguard group can give one) with a terminal escape:
    `gpuguard events` shows it escaped, never as a sequence the terminal runs."""
    from tests.conftest import gpuguard

    state, proc = tmp_path / "state", procfs(tmp_path, BOOT_A)
    run(state, proc, "--kmsg-file", str(kmsg_lines(tmp_path, "one.log", [79])), recovery=NONE)
    empty = tmp_path / "empty.log"
    empty.write_text("")
    out = gpuguard("ack", "xid.recent", "--gpu", "0", "--reason", "RMA\x1b]0;owned\x07\x1b[2J",
                   "--state-dir", str(state), "--path.procfs", str(proc), "--kmsg-file",
                   str(empty))
    assert out.returncode == 0, out.stderr
    table = gpuguard("events", "--state-dir", str(state))
    assert table.returncode == 0, table.stderr
    assert "\x1b" not in table.stdout and "\x07" not in table.stdout
    assert "RMA\\x1b]0;owned\\x07\\x1b[2J" in table.stdout, table.stdout
