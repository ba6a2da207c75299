"""The active probe's lines as readings: a value for what was measured; for what was not,
an error naming why (the phase that hung, the CUDA error, the worker's death)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuguard.sources.active.plan import CANNOT_TELL, FIELDS, ProbeOptions

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpuguard.model.snapshot import Snapshot


@dataclass
class Outcome:
    """What one GPU's worker said: the values it measured, its phases' times, the pairs
    it copied with, the failure that stopped it (and its CUDA code), whether it ended."""

    values: dict[str, Any] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)
    pairs: dict[int, dict[str, Any]] = field(default_factory=dict)
    failure: str | None = None
    cuda_code: int | None = None
    ended: bool = False

    def take(self, msg: dict[str, Any]) -> None:
        kind = msg.get("t")
        if kind == "phase" and isinstance(msg.get("ms"), int | float):
            self.phases[str(msg.get("phase"))] = float(msg["ms"])
        elif kind == "result" and msg.get("field") in FIELDS:
            self.values[msg["field"]] = msg.get("value")
        elif kind == "pair":
            self.pairs[int(msg.get("peer", -1))] = msg
        elif kind == "cuda_error":
            self.failure = f"{msg.get('error')} (phase {msg.get('phase')})"
            self.cuda_code = msg.get("code") if isinstance(msg.get("code"), int) else None
        elif kind == "fatal":
            self.failure = str(msg.get("error"))
        elif kind == "end":
            self.ended = True


def readings(snapshot: Snapshot, opts: ProbeOptions, skipped: dict[int, str],
             ran: list[int], messages: list[dict[str, Any]], hung: dict[int, str],
             endings: dict[int, str | None], elapsed_s: float,
             stuck: dict[int, str] | None = None) -> None:
    """The workers' lines as readings: a value for what was measured; for what was not,
    an error naming why (the phase that hung, the CUDA error, the worker's death)."""
    from gpuguard.model.snapshot import Reading

    lines: dict[int, list[dict[str, Any]]] = {index: [] for index in ran}
    for msg in messages:
        if isinstance(msg, dict) and msg.get("gpu") in lines:
            lines[msg["gpu"]].append(msg)
    pairs: dict[tuple[int, int], dict[str, Any]] = {}
    for gpu in snapshot.gpus:
        if gpu.index in skipped:
            gpu.probe_skipped = Reading.ok(skipped[gpu.index])
            for name in FIELDS:
                setattr(gpu, name, Reading.not_supported(skipped[gpu.index]))
            continue
        outcome = Outcome()
        for msg in lines.get(gpu.index, []):
            outcome.take(msg)
        pairs.update({(gpu.index, peer): msg for peer, msg in outcome.pairs.items()})
        why = _why_not(gpu.index, outcome, lines.get(gpu.index, []), opts, hung, endings,
                       stuck or {})
        # a worker that did not come to its end (hung, killed, crashed) vouches for nothing
        _fill(gpu, outcome, why, gpu.index in hung or not outcome.ended, elapsed_s)
    _peer_readings(snapshot, ran, pairs, hung, endings)


def _why_not(index: int, outcome: Outcome, lines: list[dict[str, Any]],
             opts: ProbeOptions, hung: dict[int, str], endings: dict[int, str | None],
             stuck: dict[int, str]) -> str:
    """Why a reading this GPU's worker did not give is missing, the worst reason first."""
    if index in stuck:
        return stuck[index]
    if index in hung:
        return (f"the active probe did not finish within its {opts.deadline_s:g} s "
                f"deadline: {hung[index] or 'worker start'}")
    if not outcome.ended and endings.get(index):
        return f"the active probe's worker {endings[index]} in {_last_phase(lines)}"
    if outcome.failure is not None:
        return outcome.failure
    if not outcome.ended:
        return "the active probe's worker left without a result"
    return "not measured"


def _fill(gpu: Any, outcome: Outcome, why: str, unfinished: bool, elapsed_s: float) -> None:
    """The GPU's probe readings: each value measured, else an error saying why."""
    from gpuguard.model.snapshot import Reading

    # A worker that hung anywhere, releasing its context or memory included, leaves a GPU
    # in a state nobody can vouch for: what it measured before is not reported as ok.
    values = {} if unfinished else dict(outcome.values)
    if "probe_compute" not in values and outcome.failure is not None and \
            outcome.cuda_code is not None and outcome.cuda_code not in CANNOT_TELL and \
            not unfinished:
        # A CUDA error before or in the kernel is the answer: this GPU cannot compute.
        values["probe_compute"] = {"error": outcome.failure, "mismatches": None,
                                   "words": None}
    for name in FIELDS:
        if name == "probe_peers":
            continue
        if name in values:
            value = values[name]
            if name == "probe_compute" and isinstance(value, dict):
                value = {**value, "phases_ms": outcome.phases,
                         "elapsed_s": round(elapsed_s, 3)}
            setattr(gpu, name, Reading.ok(value))
        else:
            setattr(gpu, name, Reading.failed(why if name == "probe_compute"
                                              else f"not measured: {why}"))
    gpu.probe_skipped = Reading.ok("")


def _last_phase(lines: list[dict[str, Any]]) -> str:
    started = [m.get("phase") for m in lines if m.get("t") == "start"]
    return f"phase {started[-1]}" if started else "its start"


def _peer_readings(snapshot: Snapshot, ran: list[int], pairs: dict[tuple[int, int],
                   dict[str, Any]], hung: dict[int, str], endings: dict[int, str | None]
                   ) -> None:
    """Each pair's copies on both GPUs' probe_peers (a slow pair may be either end's
    fault); a pair the lower GPU did not reach is an entry with the reason."""
    from gpuguard.model.snapshot import Reading

    for gpu in snapshot.gpus:
        if gpu.index not in ran:
            continue
        entries: list[dict[str, Any]] = []
        for other in ran:
            if other == gpu.index:
                continue
            low, high = min(gpu.index, other), max(gpu.index, other)
            msg = pairs.get((low, high))
            if msg is None:
                reason = f"did not finish: {hung[low]}" if low in hung else \
                    (endings.get(low) or "stopped before it")
                entries.append({"peer": other, "access": None,
                                "error": f"not measured: GPU {low}'s worker {reason}"})
                continue
            forward, backward = msg.get("gbps"), msg.get("reverse_gbps")
            mine, theirs = (forward, backward) if gpu.index == low else (backward, forward)
            entry = {"peer": other, "access": msg.get("access"), "gbps": mine,
                     "reverse_gbps": theirs}
            if msg.get("error"):
                entry["error"] = msg["error"]
            entries.append(entry)
        gpu.probe_peers = Reading.ok(entries)

