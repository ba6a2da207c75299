"""An inference engine's own metrics (issue 23): one bounded GET of its /metrics under one
deadline (gpuguard/io/http_get.py), the text parsed by prometheus-client's parser (never
by hand), and the values its profile names (rules/engines/*.yaml) taken out: requests
running and waiting, the progress counter, KV cache use and preemptions.

A read never raises: whatever the engine answers, or does not, is an error in the read
(the service.engine rule says unknown), never the cycle's."""

from __future__ import annotations

import math
import urllib.parse
from typing import Any

from gpuguard.io.http_get import GetError, get
from gpuguard.model.engine_profile import EngineCatalog, EngineProfile

# An engine's metrics text: vLLM's is some 100-300 KiB with its histograms; 8 MiB is
# no metrics page.
MAX_BYTES = 8 * 1024 * 1024
DEADLINE_S = 2.0
# Series taken per metric name (a metric per model, per engine index, per LoRA): more is
# no engine's page, and summing them must stay cheap.
MAX_SERIES = 4096


def metrics_url(probe_url: str, path: str) -> str | None:
    """The metrics URL on the probe URL's own origin (scheme, host and port)."""
    parts = urllib.parse.urlsplit(probe_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return None
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def read(url: str, catalog: EngineCatalog, engine: str | None,
         deadline_s: float = DEADLINE_S) -> dict[str, Any]:
    """What the engine at `url` says: {"engine", "values": {signal: number or None},
    "metrics": {signal: the name read}} or {"error": why}; `engine` None: recognise it
    ({"engine": None} when the page is no engine gpuguard knows)."""
    try:
        status, body = get(url, deadline_s, MAX_BYTES)
    except GetError as exc:
        return {"error": str(exc), "url": url}
    # an answer came: a page that is no engine's settles `auto` (daemon/service_engine.py)
    if status != 200:
        return {"error": f"answered {status}", "answered": True, "url": url}
    try:
        samples = parse(body.decode("utf-8", errors="replace"))
    except ValueError as exc:
        return {"error": f"not Prometheus text: {str(exc)[:200]}", "answered": True,
                "url": url}
    profile = catalog.profiles.get(engine) if engine else recognise(samples, catalog)
    if profile is None:
        return {"engine": None, "answered": True, "url": url}
    return {**values(profile, samples), "answered": True, "url": url}


def parse(text: str) -> dict[str, list[float]]:
    """Every gauge, counter or untyped sample of the text by name (`_total` taken off a
    counter's name, as prometheus-client writes it either way), finite values only.
    Raises ValueError when the text is not Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        if family.type not in ("gauge", "counter", "unknown", "untyped"):
            continue  # histograms and summaries carry no signal gpuguard reads
        for sample in family.samples:
            series = found.setdefault(_bare(sample.name), [])
            if len(series) < MAX_SERIES and isinstance(sample.value, (int, float)) \
                    and math.isfinite(sample.value):
                series.append(float(sample.value))
    return found


def recognise(samples: dict[str, list[float]], catalog: EngineCatalog) -> EngineProfile | None:
    """The profile whose recognising names the page holds (the most of them), or None."""
    best, hits = None, 0
    for profile in catalog.profiles.values():
        found = sum(1 for name in profile.recognise if _bare(name) in samples)
        if found > hits:
            best, hits = profile, found
    return best


def values(profile: EngineProfile, samples: dict[str, list[float]]) -> dict[str, Any]:
    """Each signal's value: the first of its names the page holds (the newest
    generation first), summed over its series (KV cache use: the highest)."""
    out: dict[str, float | None] = {}
    used: dict[str, str] = {}
    for signal, names in profile.signals.items():
        name = next((n for n in names if samples.get(_bare(n))), None)
        if name is None:
            out[signal] = None
            continue
        series = samples[_bare(name)]
        out[signal] = max(series) if signal == "kv_cache" else sum(series)
        used[signal] = name
    return {"engine": profile.name, "values": out, "metrics": used}


def _bare(name: str) -> str:
    return name[:-6] if name.endswith("_total") else name
