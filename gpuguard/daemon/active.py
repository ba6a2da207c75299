"""The daemon's active probe (docs/active-probe.md): at its own low cadence
(`--active-probe-interval`, off by default), on idle GPUs only (never forced), its
results kept between runs and laid onto every fast cycle's snapshot; a result older than
two intervals (on the monotonic clock: a step of the wall clock ages nothing) is stale,
and its rules unknown. The supervisor's `failback_probe: active`
asks for a fresh run on a service's GPUs (`passes`)."""

from __future__ import annotations

import copy
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from gpuguard.model.snapshot import Reading, Snapshot
from gpuguard.sources.active import workers
from gpuguard.sources.active.plan import FIELDS, LOCK_FILE, PROBE_RULES, options
from gpuguard.sources.active.workers import ActiveProbe

if TYPE_CHECKING:
    from gpuguard.model.profile import Profile
    from gpuguard.model.rule import RuleSet

KEPT = ("probe_skipped", *FIELDS)
# One probe at a time in the daemon: the scheduled one and a supervisor's failback probe
# each take the GPUs' PCIe and HBM; measured together, both would read low.
PROBE_LOCK = threading.Lock()
# ... and one per host: a `gpuguard check --active` (or slurm health) run beside the daemon
# takes the same lock file in the state dir (sources/active/host_lock.py); set at start.
HOST_LOCK: dict[str, Path | None] = {"state_dir": None}


def probe(snapshot: Snapshot, profile: Profile, gpus: list[int] | None = None) -> Snapshot:
    """A copy of `snapshot` (the last NVML sweep) with the probe run on its idle GPUs
    (only `gpus`, when given)."""
    chosen = [copy.deepcopy(g) for g in snapshot.gpus if gpus is None or g.index in gpus]
    probed = Snapshot(host=snapshot.host, nvml=snapshot.nvml, gpus=chosen)
    opts = options(profile.probe_settings)
    state_dir = HOST_LOCK["state_dir"]
    if state_dir is not None:
        opts.lock_path = str(state_dir / LOCK_FILE)
    with PROBE_LOCK:
        ActiveProbe(probed, opts).finish(probed)
    return probed


class ProbeKeeper:
    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._lock = threading.Lock()
        # GPU key -> (when: time.monotonic(), its probe readings)
        self._kept: dict[str, tuple[float, dict[str, Reading[object]]]] = {}

    def run(self, snapshot: Snapshot, profile: Profile) -> None:
        probed = probe(snapshot, profile)
        now = time.monotonic()
        with self._lock:
            for gpu in probed.gpus:
                self._kept[gpu.identity().key] = (now, {name: getattr(gpu, name) for name in KEPT})

    def apply(self, snapshot: Snapshot, now: float) -> None:
        """The kept results onto a fresh sweep's GPUs; none kept yet: absent (the rules
        are skipped, the probe has not run); older than two intervals: unknown. `now` is
        time.monotonic()."""
        with self._lock:
            kept = dict(self._kept)
        for gpu in snapshot.gpus:
            found = kept.get(gpu.identity().key)
            if found is None:
                continue
            when, readings = found
            age = now - when
            if age > 2 * self.interval_s:
                stale: Reading[object] = Reading.failed(
                    f"the active probe's last result is {age:.0f} s old (it runs every "
                    f"{self.interval_s:g} s): stale")
                readings = {name: stale for name in FIELDS}
                readings["probe_skipped"] = Reading.ok("")
            for name, reading in readings.items():
                setattr(gpu, name, reading)


def passes(snapshot: Snapshot, profile: Profile, ruleset: RuleSet,
           gpus: list[int] | None) -> tuple[bool, str]:
    """A fresh probe of `gpus` (every GPU: None): whether every probe rule is ok on
    each (nvlink.bandwidth may be skipped: no pair), and what stopped it if not."""
    from gpuguard.assess.once import judge
    from gpuguard.model.results import Status

    probed = probe(snapshot, profile, gpus)
    if not probed.gpus:
        return False, "none of the service's GPUs is in the last sweep"
    results = judge(probed, profile, ruleset, only=PROBE_RULES)
    bad = [r for r in results if r.status is not Status.OK and not (
        r.rule == "nvlink.bandwidth" and r.status is Status.SKIPPED)]
    if bad:
        return False, "; ".join(f"{r.rule} (GPU {r.gpu.index if r.gpu else '-'}) "
                                f"{r.status.value}: {r.message}" for r in bad[:3])
    return True, f"active probe passed on GPU(s) {', '.join(str(g.index) for g in probed.gpus)}"


def stop() -> list[int]:
    """The daemon stops: every probe worker killed now (a worker hung in a CUDA call would
    hold a probe until its deadline, past the unit's TimeoutStopSec), none started after;
    the pids killed."""
    return workers.stop_all()
