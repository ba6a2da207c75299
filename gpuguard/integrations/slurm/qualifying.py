"""What `gpuguard slurm health` reads and does for the return-to-service gate
(integrations/slurm/gate.py decides): the gate's time from the drain record and the
store's repairs, the qualifications the store holds, whether the run it started still
lives; then it starts a qualification detached (gpuguard/qualify/detached.py: its own
session, so slurmd ending the health program's process group after 60 s does not reach
it, and it takes the host-wide probe lock itself), stops one past its deadline, rewrites
the reason to a qualification's finding, and says each in the event store with the
drain it ends (`gpuguard events`).

The qualify command gets the health run's own host options (--path.*, --kmsg-file,
--profile, --rules, --timeout) and state dir, so it judges the host health judged and
records where health reads."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuguard.integrations.slurm import gate
from gpuguard.integrations.slurm import resume as slurm_resume
from gpuguard.integrations.slurm import state as slurm_state
from gpuguard.io.clock import utc
from gpuguard.qualify.records import Board

if TYPE_CHECKING:
    from gpuguard.integrations.slurm.ctl import NodeInfo
    from gpuguard.integrations.slurm.health_run import HealthRun
    from gpuguard.integrations.slurm.plan import Plan
    from gpuguard.integrations.slurm.resume import DrainRecord

# Past the qualify run's own deadline (its level's, grown with --seconds): its NVML sweep
# (--timeout), its start and its evidence. Alive after that, it is hung: stopped.
GRACE_S = 60.0
# The run is health's own child, in health's pid namespace: its /proc is this process's,
# not --path.procfs (the judged host's, another namespace in a container).
OWN_PROCFS = Path("/proc")
REPAIRS_READ = 500  # repair events read back since the drain (one per reset line)


def step(run: HealthRun, node: NodeInfo, record: DrainRecord | None,
         results: list[dict[str, Any]]) -> gate.Step | None:
    """The gate's step for this node; None where no gate applies (not a gated drain of
    gpuguard's, or no record of it: health keeps such a node anyway)."""
    if not node.drained or record is None or not gate.gated(node.reason):
        return None
    if not run.qualify.enabled:
        return gate.Step(gate.Verb.OFF, "--no-qualify: on the passive verdict alone")
    if run.inputs.input_path is not None:
        return gate.Step(gate.Verb.CANNOT, "a replayed snapshot (--input) is not this "
                         "host: no qualification vouches for its boards; not resuming "
                         "(--no-qualify resumes on the passive verdict alone)")
    facts = read_facts(run, node, record, results)
    return facts if isinstance(facts, gate.Step) else gate.decide(facts)


def _boot(run: HealthRun) -> str | None:
    from gpuguard.sources.boot_state import boot_id

    return boot_id(run.inputs.paths())


def read_facts(run: HealthRun, node: NodeInfo, record: DrainRecord,
               results: list[dict[str, Any]]) -> gate.Facts | gate.Step:
    """What the gate decides on; a Step where it cannot tell which GPU is which."""
    from gpuguard.qualify import detached, records

    now, boot = time.time(), _boot(run)
    drained_at = record.drained_at if record.drained_at is not None else now
    targets = _targets(record, results, serials_of(run))
    if isinstance(targets, str):
        return gate.Step(gate.Verb.CANNOT, targets)
    record_repairs(run, boot)
    when, why = max([(drained_at, f"the drain at {utc(drained_at)}"),
                     *_repairs(run.state_dir, drained_at, record.gpus)])
    attempt = record.attempt
    alive = attempt is not None and detached.alive(
        detached.Detached(attempt.pid, attempt.started_at, attempt.boot_id, run.qualify.level),
        OWN_PROCFS, boot)
    return gate.Facts(now=now, gate=when, gate_why=why, targets=targets,
                      found=tuple(records.qualifications(run.state_dir, since=when)),
                      attempt=attempt, alive=alive,
                      idle=node.base == "IDLE" and "COMPLETING" not in node.flags,
                      max_attempts=run.qualify.max_attempts, level=run.qualify.level,
                      boot_id=boot, new_boot=bool(record.boot_id and boot
                                                  and record.boot_id != boot))


def _targets(record: DrainRecord, results: list[dict[str, Any]],
             serials: dict[str, str]) -> tuple[gate.Target, ...] | str:
    """Each GPU of the drain record where NVML has it now (by UUID, else bus id), named
    by UUID and serial; or why one cannot be named."""
    now = slurm_resume.gpus_in(results)
    out = []
    for kept in record.gpus:
        found = next((g for g in now if slurm_resume.same_gpu(kept, g)), None)
        if found is None or not isinstance(found.get("index"), int):
            return f"GPU {kept.get('uuid') or kept.get('pci_bus_id')} of the drain is not " \
                   "in the verdict: it cannot be qualified"
        uuid = kept.get("uuid") or found.get("uuid")
        serial = kept.get("serial") or serials.get(str(uuid or "").lower())
        out.append(gate.Target(found["index"], Board(uuid, serial)))
    return tuple(out)


def serials_of(run: HealthRun) -> dict[str, str]:
    """UUID (lower case) -> serial of this host's GPUs: the cold check's snapshot, else
    what the store's events say (the daemon's verdict names no serial)."""
    if run.cold is not None and run.inputs.input_path is None:
        out = {}
        for g in run.cold.snapshot().gpus:
            if g.uuid.is_ok and g.serial.is_ok and g.serial.get():
                out[str(g.uuid.get()).lower()] = str(g.serial.get())
        return out
    return {str(e.gpu_uuid).lower(): str(e.gpu_serial)
            for e in reversed(_events(run.state_dir, None, ("xid", "repair", "qualify"), 200))
            if e.gpu_uuid and e.gpu_serial}


def _events(state_dir: Path, since: float | None, kinds: tuple[str, ...],
            limit: int) -> list[Any]:
    from gpuguard.events import store

    try:
        conn = store.open_reader(store.path_in(state_dir))
    except store.StoreUnreadable:
        return []
    try:
        return store.query(conn, since=since, kinds=kinds, limit=limit)
    except Exception:  # a damaged store: no evidence from it
        return []
    finally:
        conn.close()


def _repairs(state_dir: Path, after: float,
             gpus: list[dict[str, Any]]) -> list[tuple[float, str]]:
    """(time, words) of each repair since the drain that reached a GPU of it: a driver
    reload reaches every GPU, a reset the board it names (UUID or bus id)."""
    out = []
    for e in _events(state_dir, after, ("repair",), REPAIRS_READ):
        named = {"uuid": e.gpu_uuid, "pci_bus_id": e.gpu_bus_id}
        if e.status == "driver_reload" or any(slurm_resume.same_gpu(named, g) for g in gpus):
            what = "a driver reload" if e.status == "driver_reload" else "a GPU reset"
            out.append((float(e.time), f"{what} at {utc(e.time)}"))
    return out


def record_repairs(run: HealthRun, boot: str | None) -> None:
    """The resets and reloads this run's kernel log shows, into the store (the daemon
    records its own): one per line and boot, so the first time seen stays the time. A
    line without a sequence number (a dmesg-style file) has no place to keep: left out."""
    if run.cold is None or run.inputs.input_path is not None:
        return
    from gpuguard.events import store
    from gpuguard.events.ack_command import flush_within
    from gpuguard.events.recording import kernel_log_repairs
    from gpuguard.events.writer import EventWriter

    found = [e for e in kernel_log_repairs(run.cold.snapshot(), "slurm") if e.seq is not None]
    if not found or boot is None:
        return
    writer = EventWriter(store.path_in(run.state_dir), boot, integrity_check=False)
    try:
        writer.record_all(found)
        if not flush_within(writer, 2.0):
            run.say("the kernel log's repairs were not recorded (the store is busy)")
    except Exception as exc:  # history: the gate then counts from the drain alone
        run.say(f"repairs not recorded: {type(exc).__name__}: {exc}")
    finally:
        writer.close()


def carry_out(run: HealthRun, node: NodeInfo, plan: Plan, record: DrainRecord) -> None:
    """Do what the gate's step says (the node stays drained: nothing to brake)."""
    step_ = plan.step
    assert step_ is not None
    if step_.verb == gate.Verb.START:
        start(run, node, step_, record)
    elif step_.verb == gate.Verb.STOP and record.attempt is not None:
        stop(record.attempt.pid)
        note(run, "qualify stopped", step_.why, "unknown", record)
    elif step_.verb == gate.Verb.FAIL and plan.do == "update" and plan.reason is not None:
        from gpuguard.integrations.slurm import ctl as slurm_ctl

        slurm_ctl.drain(run.ctl, node.name, plan.reason)
        save(run, slurm_resume.with_reason(record, plan.reason))
        note(run, "qualify failed", f"{step_.why}; reason now {plan.reason!r}", "critical",
             record, step_)
        run.say(f"reason now {plan.reason!r}")
    elif step_.verb == gate.Verb.GIVE_UP and record.attempt is not None \
            and not record.attempt.gave_up:
        save(run, replace(record, attempt=replace(record.attempt, gave_up=True)))
        note(run, "qualify given up", step_.why, "unknown", record)


def start(run: HealthRun, node: NodeInfo, step_: gate.Step, record: DrainRecord) -> None:
    """The qualification, detached; the drain record keeps it (the next runs read it)."""
    from gpuguard.qualify import detached
    from gpuguard.sources.qualify.plan import options

    drained_at = record.drained_at if record.drained_at is not None else time.time()
    why = gate.purpose(node.name, drained_at, node.reason)
    boot = _boot(run)
    try:
        started = detached.start(run.state_dir, list(step_.gpus), level=run.qualify.level,
                                 boot_id=boot, attempt=step_.number, purpose=why,
                                 extra_args=qualify_args(run))
    except OSError as exc:
        run.say(f"the qualification could not be started ({exc.strerror or exc}): "
                "a later run tries again")
        return
    deadline = options(run.qualify.level, 1, run.qualify.seconds).deadline_s + GRACE_S
    attempt = gate.Attempt(started.pid, started.started_at, step_.number, step_.gate,
                           started.started_at + deadline, boot, step_.gpus)
    save(run, replace(record, attempt=attempt))
    note(run, "qualify started", f"attempt {step_.number} of {run.qualify.max_attempts} "
         f"(pid {started.pid}) on GPU(s) {', '.join(map(str, step_.gpus))}: {why}", "unknown",
         record)


def qualify_args(run: HealthRun) -> tuple[str, ...]:
    """The qualify command's options: health's own host, and the gate's settings."""
    i, s = run.inputs, run.qualify
    pairs = [("--path.sysfs", i.sysfs), ("--path.procfs", i.procfs),
             ("--path.rootfs", i.rootfs), ("--kmsg-file", i.kmsg_file),
             ("--profile", i.profile_path), ("--targets", s.targets),
             ("--seconds", None if s.seconds is None else f"{s.seconds:g}"),
             *[("--rules", d) for d in i.rules_dirs]]
    return (*[a for k, v in pairs if v is not None for a in (k, str(v))],
            "--timeout", f"{i.timeout:g}")


def stop(pid: int) -> None:
    """Kill a hung qualification and its workers: its process group (it leads its own
    session), or the pid alone where it does not lead one."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)


def save(run: HealthRun, record: DrainRecord) -> None:
    try:
        slurm_state.save_drain(run.state_dir, run.node, record)
    except OSError as exc:
        run.lose(f"cannot keep the drain's record ({exc.strerror or exc}): the gate "
                 "starts again at the next run")


def note(run: HealthRun, what: str, message: str, status: str, record: DrainRecord,
         step_: gate.Step | None = None) -> None:
    """An event of the gate, with the drain it belongs to."""
    from gpuguard.integrations.slurm.health_run import record as write_event

    write_event(run, what, message, status, evidence(record, step_))


def evidence(record: DrainRecord, step_: gate.Step | None) -> dict[str, Any]:
    """The drain and the qualifications a step read: what ties the pair together."""
    return {"drain": {"reason": record.reason, "drained_at": record.drained_at},
            "qualifications": [
                {"gpu_index": q.index, "uuid": q.uuid, "serial": q.serial,
                 "started_at": q.started_at, "passed": q.passed, "status": q.status,
                 "bundle": q.bundle, "purpose": q.purpose}
                for q in (step_.evidence if step_ is not None else ())]}
