"""History through the real command line: `check --record`, escalation across boots and
for bursts, `ack`, auto-clear, `events`, and the kernel-log ack bound to its boot."""

import json
import time
from pathlib import Path

from gpuguard.io.paths import Paths
from gpuguard.sources.boot_state import read_xid_ack, write_xid_ack
from tests.conftest import gpuguard, own_host
from tests.daemon.conftest import host_snapshot, write_snapshot
from tests.events.conftest import BOOT_A, BOOT_B, GPU_RESET, NONE, events, procfs, result


def test_the_same_fatal_finding_after_a_reboot_escalates_to_inspect_hardware(tmp_path, run):
    state = tmp_path / "state"
    first = result(run(state, procfs(tmp_path, BOOT_A)), "recovery.action", 0)
    assert (first["status"], first["action"]) == ("critical", "reset_gpu")
    # the transition is in the store, with the board's lasting identity
    [recorded] = events(state, "--kind", "rule")
    assert recorded["gpu_serial"] == "1654000000000" and recorded["boot_id"] == BOOT_A
    assert recorded["gpu_uuid"] == "GPU-fa4e0000-0000-0000-0000-000000000000"
    assert (recorded["old_status"], recorded["status"]) == (None, "critical")
    # the same boot again: nothing new, no escalation
    again = result(run(state, procfs(tmp_path, BOOT_A)), "recovery.action", 0)
    assert again["action"] == "reset_gpu"
    # a new boot, the same fault on the same board
    later = result(run(state, procfs(tmp_path, BOOT_B)), "recovery.action", 0)
    assert later["status"] == "critical"
    assert later["action"] == "inspect_hardware"
    assert f"also seen on boot {BOOT_A}" in later["action_reason"]
    # the other GPU is fine and stays so
    assert result(run(state, procfs(tmp_path, BOOT_B)), "recovery.action", 1)[
        "action"] == "none"


def kmsg_with(tmp: Path, xid: int, times: int) -> Path:
    path = tmp / f"xid{xid}.log"
    lines = [f"4,{100 + i},{(1000 + i * 60) * 1_000_000},-;NVRM: Xid (PCI:0000:10:00): {xid}, "
             f"pid='<unknown>', name=<unknown>, GPU has fallen off the bus." for i in range(times)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_burst_of_fatal_xids_escalates_with_the_rule_file_threshold(tmp_path, run):
    state = tmp_path / "state"
    proc = procfs(tmp_path, BOOT_A)
    few = result(run(state, proc, "--kmsg-file", str(kmsg_with(tmp_path, 79, 4)),
                     recovery=NONE), "xid.recent", 0)  # GPU 0's own result (issue 21)
    assert (few["status"], few["action"]) == ("critical", "reboot")  # Xid 79: reboot
    state2 = tmp_path / "state2"
    five = result(run(state2, proc, "--kmsg-file", str(kmsg_with(tmp_path, 79, 5)),
                      recovery=NONE), "xid.recent", 0)
    assert five["action"] == "inspect_hardware"
    assert "Xid 79 on GPU 0 5 times within 1d (escalate.count 5)" in five["action_reason"]
    xids = events(state2, "--kind", "xid")
    assert len(xids) == 5 and {e["code"] for e in xids} == {79}
    assert {e["gpu_serial"] for e in xids} == {"1654000000000"}
    # read again: the same lines are not recorded twice
    run(state2, proc, "--kmsg-file", str(kmsg_with(tmp_path, 79, 5)), recovery=NONE)
    assert len(events(state2, "--kind", "xid")) == 5


def test_ack_makes_the_action_none_until_the_finding_changes(tmp_path, run, fake_env):
    state, proc = tmp_path / "state", procfs(tmp_path, BOOT_A)
    run(state, proc)
    out = gpuguard("ack", "recovery.action", "--gpu", "0", "--reason", "RMA case 123 opened",
                   "--state-dir", str(state), "--path.procfs", str(proc))
    assert out.returncode == 0, out.stderr
    assert "covers its critical finding" in out.stdout
    acked = result(run(state, proc), "recovery.action", 0)
    # the status stays (the fault is still there); what to do is nothing more
    assert acked["status"] == "critical" and acked["action"] == "none"
    assert "RMA case 123 opened" in acked["action_reason"]
    table = gpuguard("check", *own_host(tmp_path / "host"), "--state-dir", str(state),
                     "--only", "recovery.action", "--path.procfs", str(proc),
                     env=fake_env(gpus=2, recovery=GPU_RESET, recovery_gpu=0))
    assert table.returncode == 2  # the exit code is the status's
    [ack] = events(state, "--kind", "ack")
    assert ack["rule"] == "recovery.action" and ack["gpu_serial"] == "1654000000000"
    # it goes away and comes back: a changed finding, the ack no longer holds
    run(state, proc, recovery=NONE)
    back = result(run(state, proc), "recovery.action", 0)
    assert back["action"] == "reset_gpu"


def test_an_ack_ends_after_its_time(tmp_path, run):
    state, proc = tmp_path / "state", procfs(tmp_path, BOOT_A)
    run(state, proc)
    out = gpuguard("ack", "recovery.action", "--gpu", "0", "--reason", "r", "--for", "1s",
                   "--state-dir", str(state), "--path.procfs", str(proc))
    assert out.returncode == 0, out.stderr
    time.sleep(1.2)
    assert result(run(state, proc), "recovery.action", 0)["action"] == "reset_gpu"


def test_auto_clear_acknowledges_an_unchanged_finding(tmp_path, fake_env):
    rules = tmp_path / "rules.d"
    rules.mkdir()
    (rules / "site.yaml").write_text(
        "rules:\n  - id: site.gpu0\n    scope: gpu\n    severity: critical\n    summary: s\n"
        "    message: GPU $index flagged\n    when: 'index == 0'\n    auto_clear: 1s\n")
    state, proc = tmp_path / "state", procfs(tmp_path, BOOT_A)
    host = own_host(tmp_path / "host")

    def site() -> dict:
        out = gpuguard("check", *host, "--record", "--state-dir", str(state),
                       "--rules", str(rules), "--only", "site.*", "--path.procfs", str(proc),
                       "--format", "json", env=fake_env(gpus=2))
        return result(json.loads(out.stdout), "site.gpu0", 0)

    assert site()["action"] == "reset_gpu"  # a user's GPU rule: reset by default
    time.sleep(1.3)
    cleared = site()
    assert cleared["status"] == "critical" and cleared["action"] == "none"
    assert "auto-cleared" in cleared["action_reason"]


def test_events_filters_and_refuses_bad_input(tmp_path, run):
    state, proc = tmp_path / "state", procfs(tmp_path, BOOT_A)
    run(state, proc)
    assert len(events(state, "--gpu", "0")) == 1
    assert events(state, "--gpu", "1") == []
    assert len(events(state, "--gpu", "1654000000000")) == 1  # by serial
    assert events(state, "--rule", "xid.recent") == []
    table = gpuguard("events", "--state-dir", str(state))
    assert "recovery.action" in table.stdout and "new -> critical" in table.stdout
    for bad in (["--since", "soon"], ["--state-dir", str(tmp_path / "none")]):
        out = gpuguard("events", "--state-dir", str(state), *bad)
        assert out.returncode == 3, out.stdout + out.stderr
    out = gpuguard("ack", "no.such", "--reason", "r", "--state-dir", str(state))
    assert out.returncode == 3 and "no rule 'no.such'" in out.stderr
    # an ack names one board's finding: a GPU rule needs --gpu; a host rule's result on a
    # GPU (xid.recent gives one per GPU) is refused where the store recorded none
    out = gpuguard("ack", "recovery.action", "--reason", "r", "--state-dir", str(state))
    assert out.returncode == 3 and "name the GPU with --gpu" in out.stderr
    (tmp_path / "empty.log").write_text("")
    out = gpuguard("ack", "xid.recent", "--gpu", "0", "--reason", "r", "--state-dir", str(state),
                   "--kmsg-file", str(tmp_path / "empty.log"))
    assert out.returncode == 3 and "no failing finding" in out.stderr, out.stderr
    assert events(state, "--kind", "ack") == []  # bad input changes nothing


def test_a_kernel_log_ack_clears_on_a_new_boot(tmp_path):
    """Kernel-log findings clear on a new boot: /dev/kmsg holds only this boot's lines, and
    an ack (`gpuguard xid ack`) is bound to the boot it was taken in."""
    state = tmp_path / "state"
    proc_a, proc_b = procfs(tmp_path, BOOT_A), procfs(tmp_path, BOOT_B)
    write_xid_ack(state, Paths(procfs=proc_a), 42)
    assert read_xid_ack(state, Paths(procfs=proc_a)) == 42
    assert read_xid_ack(state, Paths(procfs=proc_b)) is None  # another boot: nothing is hidden


def test_a_replay_is_never_recorded_and_is_judged_with_the_state_dir_it_names(tmp_path, run):
    """A replay given --state-dir is judged with that state dir's history, as the daemon
    replaying it judges it (issue 27: one judgement); without one, nothing of this host
    is read."""
    state, proc = tmp_path / "state", procfs(tmp_path, BOOT_A)
    board = result(run(state, proc), "recovery.action", 0)["gpu"]["uuid"]
    out = gpuguard("ack", "recovery.action", "--gpu", "0", "--reason", "RMA", "--state-dir",
                   str(state), "--path.procfs", str(proc))
    assert out.returncode == 0, out.stderr
    before = events(state)
    snap = tmp_path / "replay.json"  # the same board, recorded
    write_snapshot(snap, host_snapshot(2, {(0, "recovery_action"): "gpu_reset",
                                           (0, "uuid"): board}))
    refused = gpuguard("check", "--input", str(snap), "--record", "--state-dir", str(state))
    assert refused.returncode == 3
    assert "cannot record a replayed --input" in refused.stderr
    assert events(state) == before  # bad input changes nothing
    # replayed with the state dir (and its boot) named: the ack given in that boot holds
    named = ("--input", str(snap), "--state-dir", str(state), "--path.procfs", str(proc),
             "--only", "recovery.action", "--format", "json")
    doc = json.loads(gpuguard("check", *named).stdout)
    assert result(doc, "recovery.action", 0)["action"] == "none"  # acknowledged
    assert "RMA" in json.dumps(result(doc, "recovery.action", 0)["observed"])
    assert events(state) == before  # and nothing was written
    # without the state dir named, nothing of this host is read: unacknowledged
    plain = json.loads(gpuguard("check", "--input", str(snap), "--only", "recovery.action",
                                "--format", "json").stdout)
    assert result(plain, "recovery.action", 0)["action"] == "reset_gpu"


def test_events_wraps_its_message_column(tmp_path, run):
    state, proc = tmp_path / "state", procfs(tmp_path, BOOT_A)
    run(state, proc)
    reason = "RMA case 123: " + "the board keeps failing after every reset " * 6
    out = gpuguard("ack", "recovery.action", "--gpu", "0", "--reason", reason,
                   "--state-dir", str(state), "--path.procfs", str(proc))
    assert out.returncode == 0, out.stderr
    table = gpuguard("events", "--state-dir", str(state), env={"COLUMNS": "150"}).stdout
    lines = table.splitlines()
    assert max(len(line) for line in lines) <= 150
    column = lines[0].index("MESSAGE")
    continued = [line for line in lines[1:] if not line[:column].strip()]
    assert len(continued) >= 2  # the long reason went on under its column
    assert " ".join(line.strip() for line in lines if "RMA" in line or line in continued) \
        .count("after every reset") == 6


def test_an_escalated_xids_message_names_the_escalated_action(tmp_path, run):
    """Issue 28, item 8: five Xid 79s within the rule's window escalate to
    inspect_hardware, but the message still said "... drain and reboot the node": what to
    do, in words, is what the action says."""
    from gpuguard.judge.xids import ACTION_WORDS

    proc = procfs(tmp_path, BOOT_A)
    five = result(run(tmp_path / "state", proc, "--kmsg-file",
                      str(kmsg_with(tmp_path, 79, 5)), recovery=NONE), "xid.recent", 0)
    assert five["action"] == "inspect_hardware"
    assert ACTION_WORDS["inspect_hardware"] in five["message"], five["message"]
    assert not five["message"].endswith(ACTION_WORDS["reboot"]), five["message"]
    # the catalog's own word is still there, as what the escalation replaced
    assert f"escalated from: {ACTION_WORDS['reboot']}" in five["message"], five["message"]
    # not escalated: the catalog's words, unchanged
    few = result(run(tmp_path / "state2", proc, "--kmsg-file",
                     str(kmsg_with(tmp_path, 79, 4)), recovery=NONE), "xid.recent", 0)
    assert few["action"] == "reboot" and ACTION_WORDS["reboot"] in few["message"]
    assert "escalated" not in few["message"]
