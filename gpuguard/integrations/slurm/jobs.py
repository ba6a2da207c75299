"""`gpuguard slurm prolog` and `epilog`: no scontrol from either (Slurm's docs warn against
it at scale). A failure is a non-zero exit: Slurm requeues the job and drains the node
itself ("Prolog error", "Epilog error"); gpuguard records the failure in the state dir,
which makes that drain its own for the next health run (integrations/slurm/health.py).

The prolog probes the job's GPUs only, within its budget, and notes where the kernel log
and the ECC counters stood. The epilog compares: an Xid that appeared during the job and
whose catalog action (rules/xid.yaml, read through judge.actions.of_xid) is reset_gpu or
worse, or uncorrectable ECC errors that grew, fail it; an application Xid (restart_app,
ignore) only goes to the event store with the job id.

Before failing, either consults the fleet brake (integrations/slurm/brake.py) as health
does: a failure is a drain, and a bad driver push fails every job's prolog at once. When
the brake holds it passes and says so. A state dir that cannot be written never fails a
job: the note for the epilog is skipped (the epilog then says unknown) and said.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuguard.assess.inputs import HostInputs
from gpuguard.assess.once import Judgement
from gpuguard.integrations.slurm import brake as slurm_brake
from gpuguard.integrations.slurm import clock as slurm_clock
from gpuguard.integrations.slurm import ctl as slurm_ctl
from gpuguard.integrations.slurm import state as slurm_state
from gpuguard.integrations.slurm.gpus import JobGpus, job_gpus
from gpuguard.integrations.slurm.plan import BRAKE_RULE
from gpuguard.judge.actions import Action, of_xid

if TYPE_CHECKING:
    from gpuguard.model.rule import RuleSet
    from gpuguard.model.snapshot import Snapshot


@dataclass
class Job:
    node: str
    job_id: str
    env: dict[str, str]  # the job's variables: its GPUs (integrations/slurm/gpus.py)
    state_dir: Path
    inputs: HostInputs
    # how to read Slurm for the brake (None: never asked, the failure goes through)
    ctl: slurm_ctl.SlurmSettings | None = None
    brake: slurm_brake.BrakeSettings = field(default_factory=slurm_brake.BrakeSettings)


def gpus_of(job: Job, snapshot: Snapshot) -> JobGpus:
    from gpuguard.io.paths import Paths

    procfs = Paths(procfs=job.inputs.procfs).procfs if job.inputs.input_path is None \
        else job.inputs.procfs
    return job_gpus(job.env, snapshot, procfs)


def braked(job: Job) -> tuple[str | None, str, slurm_clock.Clock | None]:
    """(why the fleet brake holds, None when it does not; what was counted; slurmctld's
    clock, None when Slurm was not asked or did not answer)."""
    if job.ctl is None:
        return None, "the fleet brake was not asked (no Slurm settings)", None
    try:
        node = slurm_ctl.node(job.ctl, job.node)
        nodes = slurm_ctl.partition_nodes(job.ctl, node.partitions or ["*"])
    except slurm_ctl.SlurmUnavailable as exc:
        return None, f"the fleet brake cannot count (Slurm: {exc}): failing as without " \
                     "it", None
    clock = slurm_clock.read(job.ctl)
    count = slurm_brake.count(nodes, job.node, clock, job.brake.window_s)
    return slurm_brake.why_held(count, job.brake), \
        f"fleet brake: {count.describe()}, {clock.describe()}", clock


def fail(job: Job, script: str, findings: list[dict[str, Any]], gpus: list[int],
         lines: list[str]) -> tuple[int, list[str]]:
    """Exit 1 (Slurm drains the node) unless the brake holds: then pass, and say so."""
    why, counted, clock = braked(job)
    if why is not None:
        return 0, [f"CRITICAL {BRAKE_RULE}: {why}: not failing job {job.job_id} (Slurm "
                   "would drain the node); the findings stand", *lines]
    lines = [*lines, counted]
    try:
        slurm_state.record_failure(job.state_dir, script, job.node, job.job_id, findings,
                                   gpus, None if clock is None else clock.now())
    except OSError as exc:  # the drain stays Slurm's: gpuguard will not resume it
        lines.append(f"cannot record the failure ({exc.strerror or exc}): Slurm's drain "
                     "will not be gpuguard's to resume")
    return 1, lines


def _kernel_log(snapshot: Snapshot) -> dict[str, Any] | None:
    log = snapshot.host.kernel_log
    return log.get() if log.is_ok else None


def position(snapshot: Snapshot) -> dict[str, Any]:
    """Where the kernel log and each GPU's uncorrectable ECC count stand now."""
    log = _kernel_log(snapshot)
    ecc = {str(g.index): g.ecc_volatile_uncorrected.value for g in snapshot.gpus
           if g.ecc_volatile_uncorrected.is_ok}
    # None: the log could not be read (the epilog cannot tell what is new); 0: it was
    # read and held no stamped line yet (every stamped line the epilog sees is new)
    return {"time": time.time(),
            "kmsg_usec": None if log is None else (log.get("now_usec") or 0),
            "ecc_uncorrected": ecc}


def note_start(job: Job, snapshot: Snapshot) -> list[str]:
    """The note for the epilog; a state dir that cannot take it does not fail the job."""
    try:
        slurm_state.save_job_start(job.state_dir, job.job_id, position(snapshot))
    except OSError as exc:
        return [f"cannot note the job's start in {job.state_dir} ({exc.strerror or exc}): "
                "its epilog will say unknown"]
    return []


def prolog(job: Job, budget_s: float) -> tuple[int, list[str]]:
    judgement = Judgement(job.inputs)
    snapshot = judgement.snapshot()
    notes = note_start(job, snapshot)
    gpus = gpus_of(job, snapshot)
    notes += [f"UNKNOWN job GPU {u}: not probed" for u in gpus.unknown]
    if not gpus.indexes:
        what = "the job's GPU(s) could not be told" if gpus.unknown else \
            "no GPU allocated: nothing to probe"
        return 0, [f"job {job.job_id}: {what}", *notes]
    results = [r.to_json() for r in judgement.probe(gpus.indexes, budget_s)]
    failed = [r for r in results if r.get("status") == "critical"]
    lines = [*notes, *(f"{r['status'].upper()} {r['rule']} GPU "
                       f"{(r.get('gpu') or {}).get('index')}: {r['message']}"
                       for r in results if r.get("status") not in ("ok", "skipped"))]
    if not failed:
        return 0, [f"job {job.job_id}: GPU(s) {gpus.indexes} passed the probe", *lines]
    return fail(job, "prolog", failed, gpus.indexes,
                [f"job {job.job_id}: the probe failed on GPU(s) {gpus.indexes}: Slurm "
                 "drains the node and requeues the job", *lines])


def new_xids(log: dict[str, Any] | None, since_usec: int | None) -> list[dict[str, Any]]:
    if log is None or since_usec is None:
        return []
    return [e for e in log.get("xids") or [] if isinstance(e.get("usec"), int)
            and e["usec"] > since_usec]


def log_blind(log: dict[str, Any] | None, since_usec: int | None) -> str | None:
    """Why the kernel log cannot tell all that appeared since the job started (None: it
    can). A ring buffer that wrapped after the start lost records of the job: the first
    record after the latest loss (sources/kmsg_kept.py Lost) came after the start, so what
    lies between is unknown, never "no finding"."""
    if since_usec is None:
        return "the prolog could not read the kernel log: where the job began in it is unknown"
    if log is None:
        return "the kernel log cannot be read now"
    lost, after = log.get("records_lost") or 0, log.get("lost_before_usec")
    if not lost or (isinstance(after, int) and after <= since_usec):
        return None
    when = f"{after / 1e6:.6f}" if isinstance(after, int) else "an unknown time"
    return (f"{lost} record(s) were overwritten (the ring buffer wrapped) before the one at "
            f"{when} s since boot, after the job began at {since_usec / 1e6:.6f} s: an "
            "Xid among them is not seen")


def classify(xids: list[dict[str, Any]], snapshot: Snapshot,
             ruleset: RuleSet) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(hardware findings, application Xids) by each Xid's catalog action."""
    hardware: list[dict[str, Any]] = []
    application: list[dict[str, Any]] = []
    for event in xids:
        action = of_xid(event["xid"], event.get("text"), ruleset.xid_catalog)
        gpu = snapshot.gpu_at(event.get("pci"))
        found = {"rule": "xid.recent", "status": "critical", "action": action.value,
                 "gpu": None if gpu is None else gpu.identity().to_json(),
                 "message": f"Xid {event['xid']} during the job ({event.get('pci')})",
                 "xid": event["xid"], "pci": event.get("pci"), "text": event.get("text")}
        (hardware if action.rank >= Action.RESET_GPU.rank else application).append(found)
    return hardware, application


def ecc_growth(start: dict[str, Any], snapshot: Snapshot) -> list[dict[str, Any]]:
    before = start.get("ecc_uncorrected") or {}
    grown = []
    for gpu in snapshot.gpus:
        then, now = before.get(str(gpu.index)), gpu.ecc_volatile_uncorrected.value
        if isinstance(then, int) and isinstance(now, int) and now > then:
            grown.append({"rule": "ecc.uncorrected", "status": "critical",
                          "action": Action.RESET_GPU.value,
                          "gpu": gpu.identity().to_json(),
                          "message": f"{now - then} uncorrectable ECC error(s) during the job"})
    return grown


def epilog(job: Job) -> tuple[int, list[str]]:
    try:
        start, missing = slurm_state.job_start(job.state_dir, job.job_id), \
            "no record of its start (no prolog ran)"
    except slurm_state.RecordLost as exc:  # nothing of it is taken: not even the ECC counts
        start, missing = None, str(exc)
    judgement = Judgement(job.inputs)
    snapshot = judgement.snapshot()
    slurm_state.forget_job(job.state_dir, job.job_id)
    if start is None:
        return 0, [f"job {job.job_id}: {missing}: what appeared during it is unknown"]
    _, ruleset = judgement.configure()
    log = _kernel_log(snapshot)
    hardware, application = classify(new_xids(log, start.get("kmsg_usec")), snapshot,
                                     ruleset)
    hardware += ecc_growth(start, snapshot)
    record_xids(job, application + hardware)
    blind = log_blind(log, start.get("kmsg_usec"))
    lines = [f"{'HARDWARE' if f in hardware else 'application'} {f['message']}: "
             f"{f['action']}" for f in hardware + application]
    lines += [] if blind is None else [f"UNKNOWN kernel log during job {job.job_id}: {blind}"]
    if not hardware:
        what = "no hardware finding during the job" if blind is None else \
            "no hardware finding in what could be read; the rest of the job is unknown"
        return 0, [f"job {job.job_id}: {what}", *lines]
    return fail(job, "epilog", hardware, gpus_of(job, snapshot).indexes,
                [f"job {job.job_id}: hardware finding(s) during the job: Slurm drains the "
                 "node", *lines])


def record_xids(job: Job, findings: list[dict[str, Any]]) -> None:
    """Each Xid of the job into the event store, with the job id (never fatal)."""
    xids = [f for f in findings if "xid" in f]
    if not xids:
        return
    from gpuguard.events import store
    from gpuguard.events.recording import xid_event
    from gpuguard.events.writer import EventWriter

    writer = EventWriter(store.path_in(job.state_dir), integrity_check=False)
    try:
        for f in xids:
            event = xid_event(f["xid"], "critical" if f["action"] in (
                "reset_gpu", "reboot", "inspect_hardware") else "warning", f["action"], None,
                "slurm-epilog", time.time(), text=f.get("text"), bus_id=f.get("pci"))
            event.gpu_index = (f.get("gpu") or {}).get("index")
            event.data = {"job_id": job.job_id, "node": job.node}
            writer.record(event)
        writer.flush()
    finally:
        writer.close()


def node_name(given: str | None) -> str:
    """--node, else slurmd's SLURMD_NODENAME, else the short host name."""
    import socket

    return given or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
