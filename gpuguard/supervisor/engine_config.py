"""A service's `engine:` in the daemon's config file (issue 23): the inference engine whose
own metrics service.engine reads (gpuguard/daemon/service_engine.py). Either a name alone,
as the docs write it, or a mapping:

    engine: auto                     # or none, or vllm, sglang, tgi, triton, llamacpp
    engine: {name: vllm, metrics: "http://127.0.0.1:8002/metrics", timeout: 2}

Without it gpuguard looks for an engine it knows (`auto`) at the probe URL's /metrics.
A name it does not know, or a named engine with no URL to read it at, is
`file:line: what is wrong` (gpuguard/supervisor/config.py loads the file)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

from gpuguard.config.yamlfile import ConfigError

Text = Annotated[str, msgspec.Meta(min_length=1)]


class MetricsUrls(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    gpu: Text
    cpu: Text


class EngineSpec(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """`engine:` as a mapping (a scalar is its `name`)."""

    # vllm, sglang, tgi, triton, llamacpp (rules/engines/), auto, or none: do not look
    name: Text = "auto"
    # where its metrics are (one URL, or one per variant); default: the probe URL's
    # scheme, host and port with the engine's metrics path
    metrics: Text | MetricsUrls | None = None
    # the deadline of one read, connect to the last byte
    timeout: Annotated[float, msgspec.Meta(gt=0, le=30)] = 2.0


# `engine: auto` (the name alone) or the mapping; msgspec tells them by their YAML type
EngineField = EngineSpec | Text | None


@dataclass(frozen=True)
class Engine:
    """The service's engine as the supervisor's watch reads it (None name: recognise it)."""

    name: str | None = None
    metrics: str | dict[str, str] | None = None
    timeout: float = 2.0


def engine_of(given: EngineSpec | str | None, probe_http: Any,
              fail: Callable[[str, str], ConfigError]) -> Engine | None:
    """`engine:` checked against the engines gpuguard knows (rules/engines/); None for
    `none` (nothing is read)."""
    if given is None:
        return Engine()
    spec = EngineSpec(name=given) if isinstance(given, str) else given
    if spec.name == "none":
        return None
    name = None if spec.name == "auto" else spec.name
    if name is not None:
        from gpuguard.config.engine_profiles import load_catalog

        known = sorted(load_catalog().profiles)
        if name not in known:
            raise fail("engine", f"engine {name!r} is not one gpuguard knows: "
                       f"{', '.join(known)}, auto or none")
        if spec.metrics is None and probe_http is None:
            raise fail("engine", f"engine {name!r} needs `metrics: URL` (its probe has no "
                       "http URL to find /metrics at): else it would never be read")
    metrics = msgspec.to_builtins(spec.metrics) if isinstance(spec.metrics, msgspec.Struct) \
        else spec.metrics
    return Engine(name, metrics, spec.timeout)
