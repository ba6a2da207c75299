"""The inference engines' own metrics, read each fast cycle for the service.engine rules
(issue 23; gpuguard/checks/service.py judges them).

For each supervised service with an engine (`engine:` in gpuguard.yaml, default `auto`):
the active variant's metrics URL (`engine.metrics`, else the probe URL's origin and the
profile's path) is read in the service watch's request threads, one read in flight per
service under `engine.timeout`, and the values kept, one per read, for the current run:
another variant or run identity starts them over, as the memory samples do. Times are the
daemon's monotonic clock.

`auto` looks for an engine gpuguard knows once the run has answered its probe: at most
one try every AUTO_RETRY_S, and after AUTO_TRIES tries that got no Prometheus page (no
answer, a 503 while the engine loads, a 404 from a proxy), none for the rest of the run;
only a Prometheus page that is no engine it knows settles it (the service is judged by
its probe). A page that holds two engines' names alike is read every cycle and judged
unknown until it can be told.

The run identity (a pid file's PID and start, a container, a unit's invocation) only
starts the reads over after a restart: a service without one (an exec service with no
`pid_file_*`) is read all the same, its reads kept per variant (issue 28). Whenever no
engine is judged, `why_not` says what is true: not tried yet, trying, no metrics URL,
no Prometheus page, no engine gpuguard knows on this page.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from gpuguard.config.engine_profiles import load_catalog
from gpuguard.model.engine_profile import SIGNALS, EngineCatalog
from gpuguard.sources import engine_metrics
from gpuguard.supervisor.service import Supervisor

AUTO_RETRY_S = 30.0
AUTO_TRIES = 5
# reads kept per service: 30 minutes at the default 5 s cadence, whatever the cadence
MAX_READS = 400
KEEP_S = 1860.0


@dataclass
class _Watch:
    key: tuple[str, str | None]  # (variant, run identity): another one starts over
    engine: str | None = None  # named or recognised
    settled: bool = False  # auto: the page answered and is no engine gpuguard knows
    tries: int = 0
    last_try: float | None = None
    reads: deque[list[Any]] = field(default_factory=lambda: deque(maxlen=MAX_READS))
    last: dict[str, Any] = field(default_factory=dict)
    ambiguous: str | None = None  # auto: why the page's engine cannot be told
    missed: str | None = None  # auto: what the last try that found no page got
    on_finish: bool = False  # the progress name last read counts finished requests only


class EngineWatch:
    def __init__(self, catalog: EngineCatalog | None = None) -> None:
        self.catalog = catalog or load_catalog()
        self._watches: dict[str, _Watch] = {}

    def due(self, supervisor: Supervisor, identity: str | None, now: float,
            answered: bool = True) -> bool:
        """Whether the service's engine is read this cycle. `auto` first looks once the
        run has answered its probe: before, an engine that is still loading answers no
        /metrics, and a try that finds nothing waits AUTO_RETRY_S."""
        engine = supervisor.service.engine
        if engine is None or self.url(supervisor) is None:
            return False
        watch = self._watch(supervisor, identity)
        if watch.engine is not None or watch.ambiguous is not None:
            return True
        if watch.settled or watch.tries >= AUTO_TRIES or not answered:
            return False
        return watch.last_try is None or now - watch.last_try >= AUTO_RETRY_S

    def why_not(self, supervisor: Supervisor, identity: str | None, now: float,
                answered: bool = True) -> str:
        """Why the service's engine is not judged this cycle, as it is: service.engine's
        message (skipped: the service is judged by its probe)."""
        engine = supervisor.service.engine
        variant = supervisor.view().state.active
        if engine is None:
            return "not read (`engine: none`): judged by its probe alone"
        url = self.url(supervisor)
        if url is None:
            return (f"no metrics URL for its {variant} variant (its probe has no http URL: "
                    "set engine.metrics): judged by its probe alone")
        watch = self._watch(supervisor, identity)
        if watch.settled:
            return (f"no engine gpuguard knows on {url} ({', '.join(sorted(self.catalog.profiles))}"
                    "): judged by its probe alone")
        if watch.tries >= AUTO_TRIES:
            return (f"no Prometheus page at {url} in {AUTO_TRIES} tries (the last: "
                    f"{watch.missed}): judged by its probe alone")
        if watch.tries == 0 and not answered:
            return (f"not tried yet: its engine is looked for at {url} once its {variant} "
                    "variant answers its probe")
        if watch.tries == 0:
            return f"not tried yet: {url} is read in the next cycle"
        wait = max(AUTO_RETRY_S - (now - (watch.last_try or now)), 0.0)
        return (f"trying: {watch.tries} of {AUTO_TRIES} tries at {url} found no Prometheus "
                f"page (the last: {watch.missed}); the next in {wait:.0f} s")

    def url(self, supervisor: Supervisor) -> str | None:
        service, variant = supervisor.service, supervisor.view().state.active
        engine = service.engine
        if engine is None:
            return None
        if engine.metrics is not None:
            given = engine.metrics if isinstance(engine.metrics, str) \
                else engine.metrics.get(variant)
            return given
        probe = service.probe.http
        url = probe if isinstance(probe, str) else (probe or {}).get(variant)
        if url is None:
            return None
        path = self.catalog.profiles[engine.name].metrics_path if engine.name else "/metrics"
        return engine_metrics.metrics_url(url, path)

    def read(self, supervisor: Supervisor, engine: str | None) -> dict[str, Any]:
        """One read of the active variant's metrics (in a request thread; never raises)."""
        url = self.url(supervisor)
        if url is None:
            return {"error": "no metrics URL"}
        cfg = supervisor.service.engine
        timeout = cfg.timeout if cfg is not None else engine_metrics.DEADLINE_S
        return engine_metrics.read(url, self.catalog, engine, timeout)

    def engine_of(self, supervisor: Supervisor, identity: str | None) -> str | None:
        return self._watch(supervisor, identity).engine

    def record(self, supervisor: Supervisor, identity: str | None, answer: dict[str, Any],
               now: float) -> dict[str, Any] | None:
        """The read of this cycle added to the run's reads; what the snapshot's service
        entry holds under `engine` (None: no engine to judge, the probe judges)."""
        watch = self._watch(supervisor, identity)
        if watch.engine is None:
            self._recognise(watch, answer, now)
            if watch.ambiguous is not None and watch.engine is None:
                return {"engine": None, "title": "its engine", "unit": "progress",
                        "url": answer.get("url"), "metrics": {},
                        "reads": [[now, watch.ambiguous, *(None for _ in SIGNALS)]]}
            if watch.engine is None:
                return None
        if "values" in answer:
            values = answer["values"]
            watch.reads.append([now, None, *(values.get(s) for s in SIGNALS)])
            watch.on_finish = answer.get("on_finish") is True
        else:
            why = answer.get("error") or "its page holds none of the engine's metrics"
            watch.reads.append([now, str(why)[:300], *(None for _ in SIGNALS)])
        while watch.reads and now - watch.reads[0][0] > KEEP_S:
            watch.reads.popleft()
        watch.last = answer
        profile = self.catalog.profiles[watch.engine]
        return {"engine": profile.name, "title": profile.title, "unit": profile.progress_unit,
                "url": answer.get("url"), "metrics": answer.get("metrics") or {},
                "reads": [list(r) for r in watch.reads],
                # how its progress counter moves (judge/engine_state.Progress)
                "progress": {"on_finish": watch.on_finish, "floor_per_s": profile.floor_per_s,
                             "per_request": profile.floor_per_request}}

    def _recognise(self, watch: _Watch, answer: dict[str, Any], now: float) -> None:
        watch.last_try = now
        watch.ambiguous = str(answer["error"]) if answer.get("ambiguous") else None
        if watch.ambiguous is not None:
            return  # read again next cycle, unknown meanwhile: not a try that found nothing
        watch.tries += 1
        if answer.get("engine"):
            watch.engine = answer["engine"]
        elif answer.get("answered"):
            watch.settled = True  # it answered: no engine gpuguard knows is there
        else:
            watch.missed = str(answer.get("error") or "no answer")[:300]

    def _watch(self, supervisor: Supervisor, identity: str | None) -> _Watch:
        """The service's watch; a new one for another variant or run. A run not known
        this cycle (its processes could not be read) is taken to be the same one."""
        name = supervisor.service.name
        variant = supervisor.view().state.active
        watch = self._watches.get(name)
        if identity is None and watch is not None and watch.key[0] == variant:
            identity = watch.key[1]
        key = (variant, identity)
        if watch is None or watch.key != key:
            engine = supervisor.service.engine
            watch = self._watches[name] = _Watch(
                key, engine.name if engine is not None else None)
        return watch
