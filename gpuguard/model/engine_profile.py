"""What gpuguard knows of an inference engine's own metrics (issue 23): which names mean
"requests running", "requests waiting", "progress" (a counter: generated tokens, or
completed requests or forward passes where the engine counts no tokens), "KV cache use"
(0 to 1) and "preemptions" (a counter), per engine, with every name a version used, as
rules/engines/*.yaml hold them (gpuguard/config/engine_profiles.py loads them), and the
log lines that say a CUDA context or a collective broke."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# The signals a profile may name, in the order an engine's read is recorded
# (gpuguard/daemon/service_engine.py keeps one tuple per read in this order).
SIGNALS = ("running", "waiting", "progress", "kv_cache", "preemptions")
# Signals that are counters: summed over their series, compared between reads.
COUNTERS = ("progress", "preemptions")


@dataclass(frozen=True)
class EngineProfile:
    name: str  # vllm, sglang, tgi, triton, llamacpp
    title: str
    metrics_path: str
    # sample names only this engine exposes: how an unnamed service's engine is recognised
    recognise: tuple[str, ...]
    # signal -> the metric names that carry it, the newest first (an engine whose names
    # changed between versions is read by whichever its answer holds)
    signals: dict[str, tuple[str, ...]] = field(default_factory=dict)
    progress_unit: str = "tokens"
    origin: str = ""
    # progress names that move only when a request finishes (llama.cpp's
    # tokens_predicted_total, SGLang's generation_tokens_total): a long answer holds them
    # flat on a healthy engine, so they alone never make it stuck
    on_finish: frozenset[str] = frozenset()
    # the least progress a busy engine that is not hung makes: per second, per running
    # request (or per engine); a counter that only creeps above 0 is no progress
    floor_per_s: float = 0.0
    floor_per_request: bool = True

    def names(self, signal: str) -> tuple[str, ...]:
        return self.signals.get(signal, ())


@dataclass(frozen=True)
class LogError:
    """A kind of line in a service's log that says its GPU work broke."""

    kind: str
    pattern: re.Pattern[str]


@dataclass(frozen=True)
class EngineCatalog:
    profiles: dict[str, EngineProfile] = field(default_factory=dict)
    log_errors: tuple[LogError, ...] = ()

    def error_kind(self, line: str) -> str | None:
        """The kind of GPU error a log line reports, or None."""
        return next((e.kind for e in self.log_errors if e.pattern.search(line)), None)
