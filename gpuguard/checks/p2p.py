"""p2p.status: peer-to-peer access between GPUs, as NVML reports it per pair.

Many PCIe hosts have no P2P at all (across CPU sockets, consumer boards, a VM): that is
no fault by itself, so without a profile only one case is judged, a pair that is wired
over NVLink yet cannot peer over it (traffic silently falls back to PCIe). The profile's
`p2p: {require_nvlink: true}` demands NVLink peer access between every pair.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuguard.judge.registry import CheckContext, Finding, gpu_check, ok, unknown, warning
from gpuguard.model.pci import normalise_pci
from gpuguard.model.snapshot import GpuSnapshot

KINDS = ("read", "write", "nvlink")


def _up_remotes(gpu: GpuSnapshot) -> set[str]:
    """Remote PCI ids of the GPU's links that are up (normalised; empty without NVLink)."""
    if not gpu.nvlink_links.is_ok:
        return set()
    out = set()
    for link in gpu.nvlink_links.get():
        remote = link.get("remote_pci")
        if link["up"] and remote:
            try:
                out.add(normalise_pci(remote))
            except (ValueError, IndexError):
                continue
    return out


def wired(a: GpuSnapshot, b: GpuSnapshot, gpu_pcis: set[str]) -> bool:
    """The pair is wired over NVLink: a link of one ends at the other (a bridge), or both
    have links up to something that is not a GPU of this host (an NVSwitch; a VM shows
    it as FFFFFFFF:FF:FF.0)."""
    ra, rb = _up_remotes(a), _up_remotes(b)
    pa = normalise_pci(a.pci_bus_id.get()) if a.pci_bus_id.is_ok else None
    pb = normalise_pci(b.pci_bus_id.get()) if b.pci_bus_id.is_ok else None
    if (pb is not None and pb in ra) or (pa is not None and pa in rb):
        return True
    return bool(ra - gpu_pcis) and bool(rb - gpu_pcis)


@dataclass
class Wiring:
    """What wired() reads of every GPU of one snapshot, worked out once: each GPU's own
    PCI id, the remotes of its links that are up, and whether one of them is not a GPU of
    this host, each by the GPU object's id (a recorded snapshot may repeat an index).
    Why: wired() per pair read both GPUs' links again, so the rule did N(N-1) x 2 x links
    PCI normalisations (0.4 s of a 64-GPU check's 0.5 s of judging, 18 links a GPU)."""
    own: dict[int, str | None]
    remotes: dict[int, set[str]]
    past_gpus: dict[int, bool]

    @classmethod
    def of(cls, gpus: list[GpuSnapshot]) -> Wiring:
        # gpu_pcis first: a malformed PCI id raises here as it did in the rule (unknown)
        gpu_pcis = {normalise_pci(g.pci_bus_id.get()) for g in gpus if g.pci_bus_id.is_ok}
        own = {id(g): normalise_pci(g.pci_bus_id.get()) if g.pci_bus_id.is_ok else None
               for g in gpus}
        remotes = {id(g): _up_remotes(g) for g in gpus}
        return cls(own, remotes,
                   {key: bool(r - gpu_pcis) for key, r in remotes.items()})

    def wired(self, a: GpuSnapshot, b: GpuSnapshot) -> bool:
        """wired(a, b, gpu_pcis) for two of the snapshot's GPUs, from what was worked out."""
        pa, pb = self.own[id(a)], self.own[id(b)]
        if (pb is not None and pb in self.remotes[id(a)]) \
                or (pa is not None and pa in self.remotes[id(b)]):
            return True
        return self.past_gpus[id(a)] and self.past_gpus[id(b)]


# The wiring of the snapshot one rule run judges (its CheckContext is made once a rule run
# and shared by the GPUs it judges): worked out at its first GPU, reused for the rest.
_last_wiring: tuple[CheckContext, Wiring] | None = None


def _wiring(ctx: CheckContext) -> Wiring:
    global _last_wiring
    last = _last_wiring
    if last is not None and last[0] is ctx:
        return last[1]
    wiring = Wiring.of(ctx.snapshot.gpus)
    _last_wiring = (ctx, wiring)
    return wiring


@dataclass
class Pairs:
    """A GPU's pairs that are not as expected, each a line naming the peer."""
    failed: list[str] = field(default_factory=list)    # refused, the profile requires it
    fallback: list[str] = field(default_factory=list)  # wired over NVLink, refused over it
    unread: list[str] = field(default_factory=list)    # cannot be told


@gpu_check("p2p.status")
def status(gpu: GpuSnapshot, ctx: CheckContext) -> Finding:
    peers = {p["peer"]: p for p in gpu.p2p_status.get()}
    others = [g for g in ctx.snapshot.gpus if g.index != gpu.index]
    observed: dict[str, Any] = {"peers": {str(k): {kind: v.get(kind) for kind in KINDS}
                                          for k, v in sorted(peers.items())}}
    if not others:
        return ok("no other GPU to peer with", **observed)
    require = ctx.profile.p2p_require_nvlink
    pairs = _judge_pairs(gpu, others, peers, require, _wiring(ctx))
    if pairs.failed:
        return ctx.fail("peer access over NVLink that the profile requires is missing: "
                        + "; ".join(pairs.failed), **observed)
    if pairs.fallback:
        return warning("NVLink is up to these peers, but NVML refuses P2P over it (peer "
                       "traffic falls back to PCIe): " + "; ".join(pairs.fallback), **observed)
    if pairs.unread:
        return unknown("cannot tell P2P status: " + "; ".join(pairs.unread), **observed)
    basis = "read, write and NVLink" if require else "NVLink where wired"
    return ok(f"P2P with {len(others)} peer(s): {basis} as expected", **observed)


def _judge_pairs(gpu: GpuSnapshot, others: list[GpuSnapshot], peers: dict[int, Any],
                 require: bool, wiring: Wiring) -> Pairs:
    """The GPU's pair with each other GPU that is not as expected, by verdict (a pair
    that is fine, or not judged, is in none)."""
    pairs = Pairs()
    for other in others:
        # Judged: every pair when the profile requires NVLink, else pairs wired over it;
        # whether a pair is wired cannot be told when either GPU's links were not read.
        if not require and not wiring.wired(gpu, other):
            if gpu.nvlink_links.state == "error" or other.nvlink_links.state == "error":
                pairs.unread.append(f"GPU {other.index}: NVLinks not read, wiring unknown")
            continue
        entry = peers.get(other.index)
        if entry is None:
            pairs.unread.append(f"GPU {other.index}: no P2P status")
            continue
        bad = _refused(entry, require)
        if any(v in (None, "unknown") for v in bad.values()):
            pairs.unread.append(f"GPU {other.index}: " + ", ".join(f"{k} {v or 'unread'}"
                                                                   for k, v in bad.items()))
        elif bad:
            text = f"GPU {other.index}: " + ", ".join(f"{k} {v}" for k, v in bad.items())
            (pairs.failed if require else pairs.fallback).append(text)
    return pairs


def _refused(entry: dict[str, Any], require: bool) -> dict[str, Any]:
    """The kinds of peer access judged for a pair that NVML does not report ok (None: not
    reported): all three when the profile requires NVLink, else NVLink alone."""
    wanted = KINDS if require else ("nvlink",)
    return {kind: entry.get(kind) for kind in wanted if entry.get(kind) != "ok"}
