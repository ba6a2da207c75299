"""What a qualify run leaves behind: the bundle a vendor asks for with an RMA (the
boards' identities, the driver, every measurement, every failure and the sampled series),
one `qualify` event per GPU in the event store (`gpuguard events --kind qualify`: what
issue 30's return to service reads), and the chart of the run.

A run with the drill switch never records a pass: its flipped bit is a failure made on
purpose, and a pass recorded beside it would let a drill put a GPU back into service."""

from __future__ import annotations

import socket
import time

from gpuguard.model.results import Status

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

    from gpuguard.model.results import Result, Verdict
    from gpuguard.model.snapshot import GpuSnapshot, Snapshot
    from gpuguard.qualify.run import Outcome

BUNDLE_SCHEMA = 1
# Points per series kept in the bundle (the chart draws at most as many).
SERIES_POINTS = 1200
# What an event's data may hold (events/rows.py reads at most 64 KiB back).
EVENT_SECTIONS = ("level", "drill", "error", "targets", "compute", "memtest", "bandwidth",
                  "peers", "load", "refused")


def gpu_results(verdict: Verdict, index: int) -> list[Result]:
    return [r for r in verdict.results if r.gpu is not None and r.gpu.index == index]


def passed(results: list[Result], reading: dict[str, Any]) -> bool:
    """A pass: every qualify rule of the GPU ok (none skipped), and no drill."""
    qualify = [r for r in results if r.rule.startswith("qualify.")]
    return bool(qualify) and all(r.status == Status.OK for r in qualify) and \
        not reading.get("drill")


def worst(results: list[Result]) -> Result | None:
    """The result an event names: the worst; among equals qualify.run, which says why
    the others were not measured (a stop, a hang, a refusal)."""
    return max(results, key=lambda r: (r.status.rank, r.rule == "qualify.run"), default=None)


def identity(gpu: GpuSnapshot) -> dict[str, Any]:
    def text(reading: Any) -> Any:
        return reading.get() if reading.is_ok else None

    return {"index": gpu.index, "name": text(gpu.name), "uuid": text(gpu.uuid),
            "serial": text(gpu.serial), "pci_bus_id": text(gpu.pci_bus_id),
            "vbios": text(gpu.vbios_version), "inforom_image": text(gpu.inforom_image_version),
            "inforom": text(gpu.inforom)}


def bundle(snapshot: Snapshot, outcome: Outcome, verdict: Verdict) -> dict[str, Any]:
    """The whole evidence of the run, as JSON."""
    host = snapshot.host
    gpus = []
    for gpu in snapshot.gpus:
        if gpu.index not in outcome.readings:
            continue
        results = gpu_results(verdict, gpu.index)
        reading = outcome.readings[gpu.index]
        gpus.append({"gpu": identity(gpu), "passed": passed(results, reading),
                     "qualify": reading,
                     "results": [r.to_json() for r in results],
                     "series": {name: thin(points) for name, points in
                                outcome.series.get(gpu.index, {}).items()}})
    return {"schema": BUNDLE_SCHEMA, "kind": "gpuguard qualify bundle",
            "host": host.hostname or socket.gethostname(),
            "started_at": outcome.started_at, "seconds": outcome.seconds,
            "stopped": outcome.stopped, "freed_after_s": outcome.freed_after_s,
            "options": outcome.options,
            "driver_version": host.driver_version.get_or(None),
            "cuda_driver_version": host.cuda_driver_version.get_or(None),
            "sampler_error": outcome.sampler_error, "code": verdict.code, "gpus": gpus}


def thin(points: list[tuple[float, float | None]]) -> list[tuple[float, float | None]]:
    """At most SERIES_POINTS points, evenly spaced (the chart keeps the peaks itself)."""
    if len(points) <= SERIES_POINTS:
        return points
    step = len(points) / SERIES_POINTS
    return [points[int(i * step)] for i in range(SERIES_POINTS)]


def record(state_dir: Path, boot_id: str | None, snapshot: Snapshot, outcome: Outcome,
           verdict: Verdict, wait_s: float = 5.0) -> str | None:
    """One `qualify` event per GPU; None when written, else why not (the run's verdict
    stands either way: a store that cannot be written changes no result)."""
    from gpuguard.events import store
    from gpuguard.events.ack_command import flush_within
    from gpuguard.events.store import Event
    from gpuguard.events.writer import EventWriter

    writer = EventWriter(store.path_in(state_dir), boot_id, integrity_check=False)
    try:
        for gpu in snapshot.gpus:
            if gpu.index not in outcome.readings:
                continue
            reading = outcome.readings[gpu.index]
            results = gpu_results(verdict, gpu.index)
            top = worst(results)
            ok = passed(results, reading)
            words = "pass" if ok else (
                f"no pass: {top.rule} {top.status.value}: {top.message}" if top is not None
                else "no pass: no qualify rule judged")
            ids = identity(gpu)
            writer.record(Event(
                kind="qualify", source="qualify", time=time.time(), rule="qualify",
                gpu_index=gpu.index, gpu_uuid=ids["uuid"], gpu_serial=ids["serial"],
                gpu_bus_id=ids["pci_bus_id"],
                status="pass" if ok else (top.status.value if top else "unknown"),
                action=top.action if top is not None and not ok else "none",
                message=f"{reading.get('level')}: {words}"[:2000],
                data={"passed": ok, "level": reading.get("level"),
                      "started_at": outcome.started_at,
                      "purpose": outcome.options.get("purpose") or "",
                      "bundle": outcome.options.get("bundle"),
                      "drill": bool(reading.get("drill")),
                      "results": [[r.rule, r.status.value] for r in results],
                      "reading": compact(reading)}))
        if not flush_within(writer, wait_s):
            return f"the qualify events were not written to {writer.path}"
    finally:
        writer.close()
    return None


def compact(reading: dict[str, Any]) -> dict[str, Any]:
    """The reading without what makes it large (an event holds at most 64 KiB)."""
    out = {key: reading.get(key) for key in EVENT_SECTIONS if key in reading}
    compute = out.get("compute")
    if isinstance(compute, dict):
        out["compute"] = {**compute, "examples": compute.get("examples", [])[:2]}
    return out
