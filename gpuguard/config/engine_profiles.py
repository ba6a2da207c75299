"""Load the inference engines' profiles (rules/engines/*.yaml, issue 23): one file per
engine naming the metrics of each signal, and log-errors.yaml, the log lines that say a
CUDA context broke. Checked whole when loaded: an unknown key, a signal gpuguard does not
know, a pattern that is no regular expression is `file:line: what is wrong`."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from gpuguard.config import schema
from gpuguard.config.ruleset import default_pack_dir
from gpuguard.config.yamlfile import ConfigError, load
from gpuguard.model.engine_profile import EngineCatalog, EngineProfile, LogError

Text = Annotated[str, msgspec.Meta(min_length=1)]
MetricName = Annotated[str, msgspec.Meta(
    pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:]*$", description="a Prometheus metric name")]
EngineName = Annotated[str, msgspec.Meta(
    pattern=r"^[a-z][a-z0-9_]{0,31}$", description="a lowercase engine name")]
LOG_ERRORS_FILE = "log-errors.yaml"


class _Strict(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class MetricSpec(_Strict):
    metric: MetricName
    # which releases expose it, in words (the profile's comment cites the page)
    versions: Text
    # progress only: whether it moves at each engine step or only when a request finishes
    counts: Literal["each step", "on finish"] | None = None


Names = Annotated[list[MetricSpec], msgspec.Meta(min_length=1)]


class SignalsSpec(_Strict, kw_only=True):
    progress: Names
    running: Names | None = None
    waiting: Names | None = None
    kv_cache: Names | None = None
    preemptions: Names | None = None


class FloorSpec(_Strict):
    # the least progress per second of an engine that is not hung, generous: a slow
    # healthy engine (a long prefill, a huge model) stays well above it
    per_s: Annotated[float, msgspec.Meta(gt=0)]
    per: Literal["running request", "engine"]


class ProfileFile(_Strict):
    engine: EngineName
    title: Text
    metrics_path: Annotated[str, msgspec.Meta(pattern=r"^/", description="a path such as "
                                                                         "/metrics")]
    recognise: Annotated[list[MetricName], msgspec.Meta(min_length=1)]
    signals: SignalsSpec
    progress_unit: Literal["tokens", "requests", "forward passes"]
    progress_floor: FloorSpec


class LogErrorSpec(_Strict):
    kind: Annotated[str, msgspec.Meta(pattern=r"^[a-z][a-z0-9_]*$",
                                      description="a lowercase word such as launch_failure")]
    pattern: Text


class LogErrorsFile(_Strict):
    log_errors: Annotated[list[LogErrorSpec], msgspec.Meta(min_length=1)]


def engines_dir() -> Path:
    return default_pack_dir() / "engines"


@lru_cache(maxsize=4)
def load_catalog(directory: Path | None = None) -> EngineCatalog:
    """Every engine profile and the log errors; cached (they ship with gpuguard and never
    change while it runs)."""
    folder = directory or engines_dir()
    profiles: dict[str, EngineProfile] = {}
    errors: tuple[LogError, ...] = ()
    for path in sorted(folder.glob("*.yaml")):
        if path.name == LOG_ERRORS_FILE:
            errors = _log_errors(path)
            continue
        profile = _profile(path)
        if profile.name in profiles:
            raise ConfigError(path, None, f"engine {profile.name!r} is defined twice "
                              f"(also in {profiles[profile.name].origin})")
        profiles[profile.name] = profile
    if not profiles:
        raise ConfigError(folder, None, "no engine profile found")
    return EngineCatalog(profiles, errors)


def _profile(path: Path) -> EngineProfile:
    doc = load(path)
    spec = schema.convert(doc, ProfileFile, path)
    signals = {name: tuple(m.metric for m in names)
               for name, names in msgspec.structs.asdict(spec.signals).items() if names}
    if "running" not in signals and "waiting" not in signals:
        raise ConfigError(path, doc.line_of("signals"), f"{spec.engine}: signals need "
                          "running or waiting: without them a busy engine cannot be told")
    if any(m.counts is None for m in spec.signals.progress):
        raise ConfigError(path, doc.line_of("signals"), f"{spec.engine}: each progress "
                          "metric needs `counts: each step` or `counts: on finish`")
    on_finish = frozenset(m.metric for m in spec.signals.progress if m.counts == "on finish")
    return EngineProfile(spec.engine, spec.title, spec.metrics_path, tuple(spec.recognise),
                         signals, spec.progress_unit, str(path), on_finish,
                         spec.progress_floor.per_s,
                         spec.progress_floor.per == "running request")


def _log_errors(path: Path) -> tuple[LogError, ...]:
    doc = load(path)
    spec = schema.convert(doc, LogErrorsFile, path)
    found = []
    for index, entry in enumerate(spec.log_errors):
        try:
            pattern = re.compile(entry.pattern, re.IGNORECASE)
        except re.error as exc:
            raise ConfigError(path, doc["log_errors"][index].line_of("pattern"),
                              f"log_errors[{index}].pattern: {exc}") from exc
        found.append(LogError(entry.kind, pattern))
    return tuple(found)
