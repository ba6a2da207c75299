"""nvlink.*: NVLink links up and their error counters.

A GPU without NVLink (NVML: not supported, every PCIe GPU) is skipped with the reason: the
top complaint about other checkers is NVLink alarms on hardware that has none. Links are
counted, never judged one by one against a fixed number: how many a GPU has depends on the
model and the board, so the reference is the profile or the GPU's peers of the same model.
"""

from __future__ import annotations

from typing import Any

from gpuguard.checks import not_probed, probe_floor
from gpuguard.judge.registry import CheckContext, Finding, gpu_check, ok, skipped, unknown
from gpuguard.model.derived import NVLINK_COUNTERS, expected_links, links_up, nvlink_totals
from gpuguard.model.samples import Sample, window_growth
from gpuguard.model.snapshot import GpuSnapshot

NO_NVLINK = "no NVLink on this GPU (NVML: not supported): nothing to judge"
LABELS = {"replay": "replay", "recovery": "recovery", "crc_flit": "CRC flit",
          "crc_data": "CRC data"}


@gpu_check("nvlink.state")
def state(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    if gpu.nvlink_links.state == "not_supported":
        return skipped(NO_NVLINK)
    links = gpu.nvlink_links.get()
    up = sum(1 for link in links if link["up"])
    down = [link["link"] for link in links if not link["up"]]
    expected, basis = expected_links(gpu, ctx.snapshot, ctx.profile.nvlink_links_per_gpu)
    observed: dict[str, Any] = {"up": up, "expected": expected, "links": len(links),
                                "down": down}
    if links and up == 0 and expected == 0:
        # Every link down: also when its peers lost theirs too (a fabric or NVSwitch
        # fault takes all of them), which the comparison with peers cannot see.
        return ctx.fail(f"none of the GPU's {len(links)} NVLinks is up ({basis}: "
                        f"{expected})", **observed)
    if up < expected:
        named = ", ".join(str(n) for n in down[:18]) or "none listed"
        return ctx.fail(f"{up} of {expected} NVLinks up ({basis}); down: {named}",
                        **observed)
    return ok(f"{up} NVLinks up ({basis}: {expected})", **observed)


@gpu_check("nvlink.errors", thresholds=(
    "window_s", "max_replay_growth", "max_recovery_growth", "max_crc_flit_growth",
    "max_crc_data_growth"))
def errors(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    if gpu.nvlink_links.state == "not_supported":
        return skipped(NO_NVLINK)
    gpu.nvlink_links.get()  # an unreadable list is unknown, never "no errors"
    totals = nvlink_totals(gpu)
    shown = ", ".join(f"{LABELS[k]} {v}" for k, v in totals.items() if v is not None)
    observed: dict[str, Any] = {"totals": totals}
    if all(v is None for v in totals.values()):
        if ctx.samples is not None:  # the daemon reads them: none read is not "no errors"
            return unknown("no NVLink error counter could be read", **observed)
        # `gpuguard check` does not read them (most of an NVLink GPU's sweep): never ok
        # about what was not read.
        return skipped("NVLink error counters are read by the daemon, which judges their "
                       "growth, and by `gpuguard snapshot`; `check` leaves them out",
                       **observed)
    if ctx.samples is None:
        # One instant: counts since the driver loaded are not a rate (a healthy link
        # carries some CRC data errors); the daemon judges their growth.
        return ok(f"totals since the driver loaded: {shown or 'none read'} (the daemon "
                  "judges their growth)", **observed)
    window_s = ctx.threshold("window_s")
    limits = {"replay": ctx.threshold("max_replay_growth"),
              "recovery": ctx.threshold("max_recovery_growth"),
              "crc_flit": ctx.threshold("max_crc_flit_growth"),
              "crc_data": ctx.threshold("max_crc_data_growth")}
    over, grown = _growth_over(_comparable(ctx.samples.of(gpu)), window_s, limits)
    observed |= {"growth": grown, "window_s": window_s}
    if over:
        return ctx.fail("NVLink errors growing: " + ", ".join(over), **observed)
    return ok(f"NVLink error growth within limits over {window_s / 60:.0f} min "
              f"(totals: {shown or 'none read'})", **observed)


def _comparable(samples: list[Sample]) -> list[Sample]:
    """The samples whose sums cover the same links as the newest one (history.Sample): a
    link that came or went changes the sum without a single error."""
    if samples:
        samples = [s for s in samples if s.nvlink_read == samples[-1].nvlink_read]
    return samples


def _growth_over(samples: list[Sample], window_s: float, limits: dict[str, Any]
                 ) -> tuple[list[str], dict[str, int]]:
    """Each counter's growth over the window (a counter without two samples in it is left
    out) and, said as text, those that grew past their limit."""
    over: list[str] = []
    grown: dict[str, int] = {}
    for name in NVLINK_COUNTERS:
        grew = window_growth(samples, f"nvlink_{name}", window_s)
        if grew is None:
            continue
        grown[name] = grew[0]
        if grew[0] > limits[name]:
            over.append(f"{LABELS[name]} +{grew[0]} in {grew[1]:.0f} s (limit {limits[name]})")
    return over, grown


@gpu_check("nvlink.bandwidth", thresholds=("floor_fraction", "link_gbps"))
def bandwidth(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    """Peer copies (the active probe) with every other probed GPU it has peer access to,
    both ways, against a share of its links' rate: peer access can fall back to PCIe, or
    run over fewer links than are up."""
    gate = not_probed(gpu, "probe_peers")
    if gate is not None:
        return gate
    peers = gpu.probe_peers.get()
    if not peers:
        return skipped("no other GPU was probed: no pair to copy between")
    floor = probe_floor(ctx, gpu, "nvlink")
    up = links_up(gpu)
    observed: dict[str, Any] = {"peers": peers, "links_up": up}
    if floor is None and up:
        floor = up * ctx.threshold("link_gbps") * ctx.threshold("floor_fraction")
    if floor is not None:
        observed["floor_gbps"] = round(floor, 1)
    slow, unmeasured, measured = _copies(peers, floor)
    if slow:
        return ctx.fail(f"peer copies below the floor of {floor:.0f} GB/s: {', '.join(slow)}",
                        **observed)
    if unmeasured:
        return unknown("peer copies not measured with " + "; ".join(unmeasured), **observed)
    if not measured:
        return ok("no peer access to any other GPU: no pair to copy between "
                  "(p2p.status judges peer access)", **observed)
    if floor is None:
        return ok(f"peer copies with {', '.join(measured)}; no NVLink up on this GPU: "
                  "not judged against an NVLink floor", **observed)
    return ok(f"peer copies with {', '.join(measured)} (floor {floor:.0f} GB/s)", **observed)


def _copies(peers: list[dict[str, Any]], floor: float | None
            ) -> tuple[list[str], list[str], list[str]]:
    """The peer copies, said as text: those slower than the floor (none without one),
    those not measured (an error, or access not known), and every measured one at its
    slower direction. A peer without access is none of these: p2p.status judges access."""
    slow: list[str] = []
    unmeasured: list[str] = []
    measured: list[str] = []
    for peer in peers:
        if peer.get("error") or peer.get("access") is None:
            unmeasured.append(f"GPU {peer['peer']}: {peer.get('error') or 'not measured'}")
        elif peer.get("access"):
            rate = min(peer.get("gbps") or 0.0, peer.get("reverse_gbps") or 0.0)
            measured.append(f"GPU {peer['peer']} {rate:.0f} GB/s")
            if floor is not None and rate < floor:
                slow.append(f"GPU {peer['peer']} at {rate:.0f} GB/s")
    return slow, unmeasured, measured
