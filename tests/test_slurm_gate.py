"""The return-to-service gate of `gpuguard slurm health` (gpuguard/integrations/slurm/gate.py):
each step of `decide` on the facts a run reads, the plan it makes of them (plan.py), and the
drain record that keeps the gate's state (resume.py). The runs themselves: tests/slurm/
test_qualify_gate.py (the fake Slurm) and test_slurm_qualify_cluster.py (a real one)."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import time
from typing import Any

from gpuguard.integrations.slurm import gate
from gpuguard.integrations.slurm import plan as slurm
from gpuguard.integrations.slurm.ctl import NodeInfo
from gpuguard.integrations.slurm.gate import Attempt, Facts, Step, Target, Verb, decide
from gpuguard.integrations.slurm.resume import DrainRecord, record_of, with_reason
from gpuguard.qualify.records import Board, Qualification
from tests.test_slurm_plan import drained_for, result

T0 = 1_800_000_000.0  # the gate: the drain, or the repair after it
BOARDS = (Board("GPU-a", "S0"), Board("GPU-b", "S1"))
TARGETS = (Target(0, BOARDS[0]), Target(1, BOARDS[1]))


def qual(gpu: int, *, passed: bool = True, status: str = "", started: float = T0 + 5,
         level: str = "standard", drill: bool = False, action: str = "none",
         results: tuple[tuple[str, str], ...] = (), boot: str | None = "b1",
         board: Board | None = None) -> Qualification:
    b = board or BOARDS[gpu]
    return Qualification(time=started + 40, started_at=started, uuid=b.uuid, serial=b.serial,
                         index=gpu, level=level, passed=passed,
                         drill=drill, status=status or ("pass" if passed else "critical"),
                         action=action, message=f"{level}: {'pass' if passed else 'no pass'}",
                         purpose="p", bundle=f"/b/{gpu}.json", boot_id=boot, results=results)


def facts(*found: Qualification, attempt: Attempt | None = None, alive: bool = False,
          idle: bool = True, now: float = T0 + 100, **kw: Any) -> Facts:
    return Facts(now=now, gate=T0, gate_why="a GPU reset at T0", targets=TARGETS,
                 found=tuple(sorted(found, key=lambda q: -q.time)), attempt=attempt,
                 alive=alive, idle=idle, boot_id="b1", **kw)


def ours(number: int = 1, gate_at: float = T0, started: float = T0 + 10,
         deadline: float = T0 + 200) -> Attempt:
    return Attempt(pid=4242, started_at=started, number=number, gate=gate_at,
                   deadline_at=deadline, boot_id="b1", gpus=(0, 1))


def test_every_gpu_passing_after_the_gate_resumes_with_the_evidence() -> None:
    step = decide(facts(qual(0), qual(1)))
    assert step.verb == Verb.RESUME and "since a GPU reset at T0" in step.why
    assert [q.index for q in step.evidence] == [0, 1]
    # one GPU short: the other is qualified (only it), as the first attempt
    short = decide(facts(qual(0)))
    assert (short.verb, short.gpus, short.number, short.gate) == (Verb.START, (1,), 1, T0)
    assert short.why.startswith("qualifying since ") and "attempt 1 of 2" in short.why


def test_what_does_not_count_for_the_gate() -> None:
    not_evidence = {
        "started before the gate": qual(1, started=T0 - 1),
        "a quick run": qual(1, level="quick"),
        "a drill (never a pass, never a finding)": qual(1, drill=True),
        "another board in the slot": qual(1, board=Board("GPU-other", "S9")),
        "the same UUID with another serial": qual(1, board=Board("GPU-b", "S9")),
    }
    for what, q in not_evidence.items():
        step = decide(facts(qual(0), q))
        assert step.verb == Verb.START and step.gpus == (1,), what
    # a drill that failed is no finding either
    assert decide(facts(qual(0), qual(1, passed=False, drill=True))).verb == Verb.START
    # a long run counts for standard; exactly at the gate counts
    assert decide(facts(qual(0), qual(1, level="long"))).verb == Verb.RESUME
    assert decide(facts(qual(0, started=T0), qual(1))).verb == Verb.RESUME
    # a serial the run did not read: by UUID
    assert decide(facts(qual(0), qual(1, board=Board("GPU-b", None)))).verb == Verb.RESUME


def test_after_a_reboot_since_the_drain_only_this_boots_runs_count() -> None:
    earlier = (qual(0, boot="b0"), qual(1))
    assert decide(facts(*earlier, new_boot=True)).gpus == (0,)
    assert decide(facts(*earlier)).verb == Verb.RESUME  # the same boot as the drain
    assert decide(facts(qual(0), qual(1), new_boot=True)).verb == Verb.RESUME


def test_the_newest_run_of_a_board_decides() -> None:
    failed_then_passed = (qual(0), qual(1, passed=False, started=T0 + 5),
                          qual(1, started=T0 + 60))
    assert decide(facts(*failed_then_passed)).verb == Verb.RESUME
    passed_then_failed = (qual(0), qual(1, started=T0 + 5),
                          qual(1, passed=False, started=T0 + 60,
                               results=(("qualify.memtest", "critical"),)))
    assert decide(facts(*passed_then_failed)).verb == Verb.FAIL


def test_a_finished_run_that_did_not_pass_names_its_finding_in_the_reason() -> None:
    memtest = qual(1, passed=False, action="inspect_hardware",
                   results=(("qualify.sdc", "ok"), ("qualify.memtest", "critical"),
                            ("qualify.power", "warning")))
    step = decide(facts(qual(0), memtest))
    assert step.verb == Verb.FAIL and step.reason == "gpuguard: inspect_hardware: " \
        "qualify.memtest GPU 1"
    assert "GPU 1 (GPU-b)" in step.why and step.evidence == (memtest,)
    # a CUDA error under load is qualify.run's reset_gpu; among equals qualify.run
    run = qual(0, passed=False, action="reset_gpu",
               results=(("qualify.memtest", "critical"), ("qualify.run", "critical")))
    assert decide(facts(run, qual(1))).reason == "gpuguard: reset_gpu: qualify.run GPU 0"
    # a warning (below the power share) is not a pass: kept, still gated (never `none`)
    weak = qual(0, passed=False, status="warning", results=(("qualify.power", "warning"),))
    assert decide(facts(weak, qual(1))).reason == \
        "gpuguard: inspect_hardware: qualify.power GPU 0"
    # the GPU as NVML numbers it now (the board ran as GPU 3 before a renumber)
    moved = dataclasses.replace(memtest, index=3)
    assert decide(facts(qual(0), moved)).reason == \
        "gpuguard: inspect_hardware: qualify.memtest GPU 1"
    first = dataclasses.replace(memtest, index=5, uuid="GPU-a", serial="S0",
                                results=(("qualify.sdc", "critical"),))
    assert decide(facts(first, moved)).reason == \
        "gpuguard: inspect_hardware: qualify.sdc GPU 0 (+1 more)"
    # both failed: the first GPU named, the other counted
    both = decide(facts(qual(0, passed=False, results=(("qualify.sdc", "critical"),)),
                        memtest))
    assert both.reason == "gpuguard: inspect_hardware: qualify.sdc GPU 0 (+1 more)"
    assert gate.gated(both.reason or "")
    # a busy node does not hold a failure (or a pass) back
    assert decide(facts(qual(0), memtest, idle=False)).verb == Verb.FAIL
    assert decide(facts(qual(0), qual(1), idle=False)).verb == Verb.RESUME


def test_a_run_that_did_not_finish_is_retried_then_given_up() -> None:
    stopped = qual(1, passed=False, status="unknown", results=(("qualify.run", "unknown"),))
    retry = decide(facts(qual(0), stopped, attempt=ours(1)))
    assert (retry.verb, retry.number, retry.gpus) == (Verb.START, 2, (1,))
    died = decide(facts(attempt=ours(1)))  # nothing recorded: it died (SIGKILL, a crash)
    assert (died.verb, died.number, died.gpus) == (Verb.START, 2, (0, 1))
    spent = decide(facts(qual(0), stopped, attempt=ours(2)))
    assert spent.verb == Verb.GIVE_UP and "2 attempt(s)" in spent.why
    assert "the last: standard: no pass" in spent.why and "resume by hand" in spent.why
    silent = decide(facts(attempt=ours(2)))
    assert silent.verb == Verb.GIVE_UP and "no result recorded" in silent.why
    assert decide(facts(attempt=ours(2), max_attempts=3)).number == 3
    # attempts for an earlier gate do not count (a reset since: evidence anew)
    again = decide(facts(attempt=ours(2, gate_at=T0 - 50)))
    assert (again.verb, again.number) == (Verb.START, 1)


def test_a_running_qualification_is_waited_for_then_stopped_past_its_deadline() -> None:
    wait = decide(facts(qual(0), qual(1), attempt=ours(), alive=True))
    assert wait.verb == Verb.WAIT and "qualifying since " in wait.why and "pid 4242" in wait.why
    late = decide(facts(attempt=ours(deadline=T0 + 50), alive=True))
    assert late.verb == Verb.STOP and "outlived its deadline" in late.why
    assert decide(facts(attempt=ours(deadline=T0 + 100), alive=True)).verb == Verb.WAIT
    # dead: its results decide
    assert decide(facts(qual(0), qual(1), attempt=ours(), alive=False)).verb == Verb.RESUME


def test_a_busy_node_is_qualified_once_its_jobs_end() -> None:
    busy = decide(facts(idle=False))
    assert busy.verb == Verb.BUSY and "jobs to end" in busy.why
    assert decide(facts(idle=False, attempt=ours(2))).verb == Verb.BUSY
    assert decide(dataclasses.replace(facts(), targets=())).verb == Verb.RESUME


def test_which_drains_are_gated() -> None:
    for word in ("reset_gpu", "reboot", "inspect_hardware"):
        assert gate.gated(f"gpuguard: {word}: xid.recent GPU 0")
    for word in ("failover", "restart_app", "update_software"):
        assert not gate.gated(f"gpuguard: {word}: xid.recent GPU 0")
    assert not gate.gated("admin: inspect_hardware")
    assert gate.purpose("n1", T0, "gpuguard: reboot: gpu.lost") == \
        "slurm resume of n1 drained at 2027-01-15 08:00:00 UTC for reboot"


def node(reason: str, state: str = "IDLE+DRAIN") -> NodeInfo:
    return NodeInfo("n1", state, reason, T0, ["main"])


def test_the_plan_of_a_gated_drain_is_the_gates_once_the_passive_verdict_passes() -> None:
    hot = result("thermal.margin", "critical", "inspect_hardware")
    record = drained_for([hot], gpus=2)
    whole = [result("thermal.margin", "ok", gpu=i) for i in (0, 1)]
    gated = node("gpuguard: inspect_hardware: thermal.margin GPU 0")
    start = Step(Verb.START, "qualifying since T", gpus=(0, 1), number=1)
    planned = slurm.plan(whole, set(), gated, None, record=record, gate=start)
    assert (planned.do, planned.why, planned.step) == ("keep", "qualifying since T", start)
    # the passive verdict first: a fault still there keeps it, the gate not consulted
    kept = slurm.plan([hot, whole[1]], set(), gated, None, record=record, gate=start)
    assert kept.do == "keep" and kept.step is None
    assert slurm.plan(whole, set(), gated, None, record=record).do == "keep"  # none known
    for verb in (Verb.RESUME, Verb.OFF):
        done = slurm.plan(whole, set(), gated, None, record=record, gate=Step(verb, "why"))
        assert done.do == "resume" and done.why.endswith("; why")
    fail = Step(Verb.FAIL, "no pass", reason="gpuguard: inspect_hardware: qualify.memtest GPU 1")
    changed = slurm.plan(whole, set(), gated, None, record=record, gate=fail)
    assert (changed.do, changed.reason) == ("update", fail.reason)
    again = slurm.plan(whole, set(), node(fail.reason or ""), None, record=record, gate=fail)
    assert again.do == "keep" and again.step == fail
    for verb in (Verb.WAIT, Verb.STOP, Verb.BUSY, Verb.GIVE_UP, Verb.CANNOT):
        assert slurm.plan(whole, set(), gated, None, record=record,
                          gate=Step(verb, "w")).do == "keep"
    # not gated: the gate is not asked
    restart = node("gpuguard: restart_app: thermal.margin GPU 0")
    assert slurm.plan(whole, set(), restart, None, record=record).do == "resume"


def test_the_drain_record_keeps_the_gate_and_reads_older_records() -> None:
    results = [result("xid.recent", "critical", "reset_gpu", gpu=0),
               result("thermal.margin", "ok", gpu=1)]
    uuid0 = results[0]["gpu"]["uuid"]
    kept = record_of("gpuguard: reset_gpu: xid.recent GPU 0", results[:1], results, None,
                     now=T0, boot_id="b1", serials={uuid0.upper(): "S0"})
    assert (kept.drained_at, kept.boot_id, kept.attempt) == (T0, "b1", None)
    assert [g.get("serial") for g in kept.gpus] == ["S0", None]
    started = dataclasses.replace(kept, attempt=ours())
    assert DrainRecord.from_json(started.to_json()) == started
    # a rewritten reason keeps the attempt; the gate's finding keeps what it drained for
    later = record_of("r", results[:1], results, started, now=T0 + 9)
    assert later.attempt == started.attempt and later.drained_at == T0 + 9
    failed = with_reason(started, "gpuguard: inspect_hardware: qualify.memtest GPU 1")
    assert (failed.findings, failed.drained_at) == (started.findings, T0)
    # an older gpuguard's record (no time, boot, serial or attempt) reads as it was
    old = {"reason": kept.reason, "findings": kept.findings,
           "gpus": [{k: g[k] for k in ("index", "uuid", "pci_bus_id")} for g in kept.gpus]}
    read = DrainRecord.from_json(old)
    assert read is not None and (read.drained_at, read.boot_id, read.attempt) == \
        (None, None, None)
    for bad in ({"drained_at": "yesterday"}, {"drained_at": float("nan")},
                {"drained_at": True}, {"boot_id": 7}, {"attempt": {"pid": 1}},
                {"attempt": {**ours().to_json(), "pid": 1.5}},
                {"attempt": {**ours().to_json(), "gpus": ["0"]}},
                {"attempt": {**ours().to_json(), "gave_up": "no"}},
                {"attempt": {**ours().to_json(), "boot_id": 3}},
                {"gpus": [{**old["gpus"][0], "serial": 1654}]}):
        assert DrainRecord.from_json({**old, **bad}) is None, bad
    assert Attempt.from_json([1]) is None
    # given up only once said so (a record without the key: not yet)
    assert not ours().gave_up
    unsaid = {k: v for k, v in ours().to_json().items() if k != "gave_up"}
    assert Attempt.from_json(unsaid) == ours()


def test_a_hung_qualification_is_stopped_with_its_workers() -> None:
    """stop() kills the run's process group (it leads its own session): its forked
    workers go with it."""
    from gpuguard.integrations.slurm.qualifying import stop

    code = "import os, time\nif os.fork() == 0:\n    print(os.getpid(), flush=True)\n" \
        "time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code, "gpuguard", "qualify"],
                            start_new_session=True, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        worker = int(proc.stdout.readline())
        stop(proc.pid)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        until = time.monotonic() + 10
        while not gone(worker):  # the worker too (dead: gone, or a zombie not yet reaped)
            assert time.monotonic() < until, "the worker outlived its qualification"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
    stop(proc.pid)  # gone: nothing to do, no error


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:  # a process this test started
            return handle.read().split(") ", 1)[1][0] in "ZX"
    except OSError:
        return True
