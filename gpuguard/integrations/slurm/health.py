"""`gpuguard slurm health`'s run: the verdict, the node, the plan (integrations/slurm/plan.py),
the fleet brake with its jittered recount (integrations/slurm/brake.py), then at most one
scontrol call. Slurm not answering is unknown (exit 3) and changes nothing.

The state dir is an aid, never a condition: a state dir that cannot be made, a lock that
cannot be had, a record that cannot be read or kept (integrations/slurm/state.py) is said
(`lose`: the output, stderr and gpuguard_slurm_state_lost) and the run decides without it,
so a critical fault still drains a node whose disk is read-only.

A drain for reset_gpu, reboot or inspect_hardware is resumed only after a passing
qualification (integrations/slurm/gate.py decides, qualifying.py starts it detached and
reads it back): a run never waits for one."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuguard.integrations.slurm import brake as slurm_brake
from gpuguard.integrations.slurm import clock as slurm_clock
from gpuguard.integrations.slurm import ctl as slurm_ctl
from gpuguard.integrations.slurm import gate, qualifying
from gpuguard.integrations.slurm import metrics as slurm_metrics
from gpuguard.integrations.slurm import plan as slurm
from gpuguard.integrations.slurm import resume as slurm_resume
from gpuguard.integrations.slurm import state as slurm_state
from gpuguard.integrations.slurm import verdict as slurm_verdict
from gpuguard.integrations.slurm.health_run import HealthRun, record

if TYPE_CHECKING:
    from gpuguard.model.results import Verdict

EXIT_BRAKE = 2
EXIT_UNKNOWN = 3
# A failure record is dropped once the node is seen not drained this long after it (the
# admin resumed it, or Slurm never drained): it must not claim a later "Prolog error" of
# someone else's. The slack covers Slurm draining a moment after the script exited.
FAILURE_STALE_S = 120.0


def verdict(run: HealthRun) -> Verdict:
    if run.socket_path is not None:
        found = slurm_verdict.from_daemon(run.socket_path, min(10.0, run.ctl.timeout_s))
        if found is not None:
            return found
        run.say("no daemon answers: a cold check")
    return run.judgement().verdict(source="a cold check")


def _reprobe(run: HealthRun, failure: dict[str, Any],
             results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """After a prolog failure, its GPUs probed again: the only evidence that it is gone."""
    gpus = [g for g in failure.get("gpus") or [] if isinstance(g, int)]
    if failure.get("script") != "prolog" or not gpus:
        return results
    probed = [r.to_json() for r in run.judgement().probe(gpus, run.probe_budget_s)]
    keys = {(r["rule"], slurm.gpu_of(r)) for r in probed}
    return [r for r in results if (r.get("rule"), slurm.gpu_of(r)) not in keys] + probed


def run_health(run: HealthRun) -> int:
    """The exit code: 0 done (whatever it did), 2 the brake held, 3 Slurm did not answer.
    One run at a time per host: a second one (slurmd starting the next while the last
    still waits on Slurm) would decide on the same node state twice."""
    from gpuguard.sources.active.host_lock import HostLock

    try:
        lock: HostLock | None = HostLock(str(slurm_state.folder(run.state_dir)
                                             / slurm_state.LOCK))
    except OSError as exc:
        run.lose(f"the state dir {run.state_dir} cannot be made ({exc.strerror or exc}): "
                 "no lock, no record kept; deciding without them")
        lock, run.stateless = None, True
    if lock is not None:
        held = lock.acquire(time.monotonic() + run.ctl.timeout_s)
        if held is False:
            run.say("another health run holds this node: nothing to do")
            return 0
        if held is None:
            run.lose(f"the lock {lock.path} cannot be had ({lock.why}): this run is not "
                     "kept from another")
    try:
        return _run_health(run)
    finally:
        if lock is not None:
            lock.release()


def _run_health(run: HealthRun) -> int:
    found = run.verdict = verdict(run)
    run.say(f"verdict: {found.source}")
    try:
        node = slurm_ctl.node(run.ctl, run.node)
    except slurm_ctl.SlurmUnavailable as exc:
        run.say(f"UNKNOWN slurm: {exc}: nothing changed")
        write_metrics(run, unknown=True)
        return EXIT_UNKNOWN
    failure = current_failure(run, node)
    record = drain_record(run, node)
    record = slurm_resume.still_expected(record, forgotten_gpus(run.state_dir))
    judged = [r.to_json() for r in found.results]
    results = judged if failure is None else _reprobe(run, failure, judged)
    taken_over = None
    if failure is not None and failure.get("findings"):
        taken_over = slurm.reason_for(slurm.drain_worthy(failure["findings"], set())
                                      or failure["findings"])
    failover_rules = set(found.failover_rules)
    step = qualifying.step(run, node, record, results)
    plan = slurm.plan(results, failover_rules, node, failure_time(failure), taken_over,
                      record, step)
    run.say(f"node {node.name} ({node.word}, reason {node.reason or 'none'}): "
            f"{plan.do}: {plan.why}")
    run.plan = {"do": plan.do, "reason": plan.reason, "why": plan.why}
    findings = slurm.drain_worthy(results, failover_rules) or \
        (failure or {}).get("findings") or []
    try:
        return act(run, node, plan, failure, Drained(findings, results, record))
    except slurm_ctl.SlurmUnavailable as exc:
        run.say(f"UNKNOWN slurm: {exc}: nothing changed")
        write_metrics(run, unknown=True)
        return EXIT_UNKNOWN


def forgotten_gpus(state_dir: Path) -> list[dict[str, Any]]:
    """The GPUs an ack of gpu.count took out (the GPUs-seen memory's, never fatal)."""
    from gpuguard.assess.gpus_seen import forgotten

    try:
        return forgotten(state_dir)
    except OSError:
        return []


def failure_time(failure: dict[str, Any] | None) -> float | None:
    """When the recorded failure was, on the clock of Slurm's reason times: slurmctld's,
    where the script read it (integrations/slurm/clock.py), else this node's."""
    if failure is None:
        return None
    ctld = failure.get("slurmctld_time")
    return float(failure["time"] if ctld is None else ctld)


def current_failure(run: HealthRun, node: slurm_ctl.NodeInfo) -> dict[str, Any] | None:
    """The recorded prolog/epilog failure, dropped once the node is seen not drained
    after it (a stale one must never claim another script's drain). One that cannot be
    used is none (Slurm's drain stays Slurm's), dropped the same way."""
    if run.stateless:
        return None
    try:
        failure = slurm_state.failure(run.state_dir, run.node)
    except slurm_state.RecordLost as exc:
        run.lose(f"{exc}: deciding without it")
        if not node.drained:
            clear(run, slurm_state.clear_failure, "the node is not drained: record dropped")
        return None
    if failure is None or node.drained or \
            time.time() - float(failure["time"]) < FAILURE_STALE_S:
        return failure
    clear(run, slurm_state.clear_failure, f"the {failure.get('script')} failure of job "
          f"{failure.get('job')} is past: the node is not drained (record dropped)")
    return None


def drain_record(run: HealthRun, node: slurm_ctl.NodeInfo) -> slurm_resume.DrainRecord | None:
    """What gpuguard drained for; none once the node is seen not drained (resumed by
    hand: a next drain starts anew). One that cannot be used is none: no resume."""
    if run.stateless:
        return None
    try:
        record = slurm_state.drain_record(run.state_dir, run.node)
    except slurm_state.RecordLost as exc:
        run.lose(f"{exc}: gpuguard will not resume a drain of its own without it")
        if not node.drained and not isinstance(exc, slurm_state.AnotherNodesRecord):
            clear(run, slurm_state.clear_drain, "the node is not drained: record dropped")
        return None
    if record is not None and not node.drained:
        clear(run, slurm_state.clear_drain, "")
        return None
    if record is not None and record.drained_at is None:
        # an older gpuguard's record: the drain's time is Slurm's reason time (never
        # later than now: a gate in the future would refuse every qualification)
        now = time.time()
        record = replace(record, drained_at=min(node.reason_time or now, now))
        qualifying.save(run, record)
    return record


def clear(run: HealthRun, how: Callable[[Path], None], why: str) -> None:
    """Remove a record (`how`: state.clear_*), saying `why`; one that cannot be removed
    is said as lost."""
    try:
        how(run.state_dir)
    except slurm_state.RecordLost as exc:
        run.lose(str(exc))
        return
    if why:
        run.say(why)


@dataclass
class Drained:
    """What a drain (or a rewritten reason) is for: kept in the state dir, for resume."""
    findings: list[dict[str, Any]]
    results: list[dict[str, Any]]
    before: slurm_resume.DrainRecord | None

    def keep(self, run: HealthRun, reason: str) -> slurm_resume.DrainRecord:
        """The record, kept (its time is the drain's: the gate counts from it)."""
        from gpuguard.sources.boot_state import boot_id

        record = slurm_resume.record_of(reason, self.findings, self.results, self.before,
                                        now=time.time(), boot_id=boot_id(run.inputs.paths()),
                                        serials=qualifying.serials_of(run))
        try:
            slurm_state.save_drain(run.state_dir, run.node, record)
        except OSError as exc:  # then it never resumes this drain: a person does
            run.lose(f"cannot keep the drain's record ({exc.strerror or exc}): gpuguard "
                     "will not resume this node")
        return record


def act(run: HealthRun, node: slurm_ctl.NodeInfo, plan: slurm.Plan,
        failure: dict[str, Any] | None, drained: Drained) -> int:
    if plan.step is not None and plan.do != "resume" and drained.before is not None:
        qualifying.carry_out(run, node, plan, drained.before)  # the node stays drained
        write_metrics(run, drained=True)
        return 0
    if plan.do == "drain":
        assert plan.reason is not None
        return drain(run, node, plan.reason, drained)
    if plan.do == "update":
        assert plan.reason is not None
        slurm_ctl.drain(run.ctl, node.name, plan.reason)
        drained.keep(run, plan.reason)
        run.say(f"reason now {plan.reason!r}")
    elif plan.do == "resume":
        slurm_ctl.resume(run.ctl, node.name)
        clear(run, slurm_state.clear_drain, "")
        if failure is not None:
            clear(run, slurm_state.clear_failure, "")
        resumed(run, node, plan, drained.before)
    write_metrics(run, drained=plan.do in ("drain", "update", "keep") and node.drained)
    return 0


def resumed(run: HealthRun, node: slurm_ctl.NodeInfo, plan: slurm.Plan,
            before: slurm_resume.DrainRecord | None) -> None:
    """The resume's event: after a gate, with the drain it ends and the passes it read."""
    if plan.step is None or before is None:
        record(run, "resume", node.reason, "ok")
    else:  # the qualify events' purpose, word for word: `gpuguard events` pairs them
        drained_at = before.drained_at if before.drained_at is not None else time.time()
        record(run, "resume", f"{node.reason}: {plan.step.why} "
               f"({gate.purpose(node.name, drained_at, node.reason)})", "ok",
               qualifying.evidence(before, plan.step))
    run.say("resumed")


def drain(run: HealthRun, node: slurm_ctl.NodeInfo, reason: str, drained: Drained) -> int:
    """Drain unless the brake holds, counted twice: now, and after the random wait (both
    on slurmctld's clock, read once: integrations/slurm/clock.py)."""
    clock = slurm_clock.read(run.ctl)
    run.say(f"brake: {clock.describe()}")
    for attempt in ("first", "recount"):
        nodes = slurm_ctl.partition_nodes(run.ctl, node.partitions or ["*"])
        count = slurm_brake.count(nodes, node.name, clock, run.brake.window_s)
        why = slurm_brake.why_held(count, run.brake)
        if why is not None:
            return brake(run, reason, count, why)
        if attempt == "first":
            interval = slurm_ctl.health_interval(run.ctl)
            wait = slurm_brake.jitter_s(run.brake, interval)
            run.say(f"brake: {count.describe()} drained by gpuguard within "
                    f"{run.brake.window_s:g} s; counting again in {wait:.1f} s")
            time.sleep(wait)
    slurm_ctl.drain(run.ctl, node.name, reason)
    kept = drained.keep(run, reason)
    record(run, "drain", reason, "critical", qualifying.evidence(kept, None))
    run.say(f"drained: {reason!r} ({count.describe()})")
    write_metrics(run, drained=True)
    return 0


def brake(run: HealthRun, reason: str, count: slurm_brake.Count, held: str) -> int:
    """Not drained: the critical fleet.brake result, an event and the metric say so."""
    why = (f"{held} (others: {', '.join((count.held_by_us or count.drained_by_us)[:5]) or 'none'}"
           f"): not draining for {reason!r}")
    run.say(f"CRITICAL {slurm.BRAKE_RULE}: {why}")
    record(run, slurm.BRAKE_RULE, why, "critical")
    write_metrics(run, braked=True)
    return EXIT_BRAKE


def write_metrics(run: HealthRun, drained: bool = False, braked: bool = False,
                  unknown: bool = False) -> None:
    """node_exporter's textfile (integrations/slurm/metrics.py), when one is asked for."""
    if run.metrics_file is None:
        return
    failed = slurm_metrics.write(run.metrics_file, slurm_metrics.HealthState(
        run.node, drained, braked, unknown, bool(run.lost)))
    if failed is not None:
        run.say(failed)
