"""An inference engine's own metrics (issue 23): one bounded GET of its /metrics under one
deadline (gpuguard/io/http_get.py), the text parsed by prometheus-client's parser (never
by hand), and the values its profile names (rules/engines/*.yaml) taken out: requests
running and waiting, the progress counter, KV cache use and preemptions.

The page is cut to the names a read can use before it is parsed (issue 32: a page of
vLLM's histograms is mostly `_bucket` lines, and the parser costs 0.2 s a MiB): the
sample lines of the profile's names (every profile's, to recognise an engine) and the
comment lines of their families and of any family those names could be taken into,
which is what decides how the parser groups a sample. The lines left out are not
parsed, so a malformed line of a histogram no longer makes the read an error; every
line read is parsed as before, and a page that holds none of those names is parsed
whole, so that what it is (no Prometheus text, or no engine gpuguard knows) is told as
before.

A read never raises: whatever the engine answers, or does not, is an error in the read
(the service.engine rule says unknown), never the cycle's."""

from __future__ import annotations

import functools
import math
import re
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
    # only a Prometheus page of no engine it knows settles `auto`
    # (daemon/service_engine.py); a 503 while the engine loads is tried again
    if status != 200:
        return {"error": f"answered {status}", "url": url}
    try:
        samples = parse(body.decode("utf-8", errors="replace"), wanted(catalog, engine))
    except ValueError as exc:
        return {"error": f"not Prometheus text: {str(exc)[:200]}", "url": url}
    profile = catalog.profiles.get(engine) if engine else recognise(samples, catalog)
    if isinstance(profile, list):
        # a page with two engines' names in equal measure: which one is not known
        return {"error": f"the page holds the names of {' and '.join(profile)} alike",
                "ambiguous": True, "answered": True, "url": url}
    if profile is None:
        return {"engine": None, "answered": True, "url": url}
    return {**values(profile, samples), "answered": True, "url": url}


class Samples(dict[str, list[float]]):
    """Every sample's value by bare name, and the names with more series than MAX_SERIES
    (their values are not all here: a sum of them would be a guess)."""

    def __init__(self) -> None:
        super().__init__()
        self.overflowed: set[str] = set()


def wanted(catalog: EngineCatalog, engine: str | None) -> frozenset[str]:
    """The bare names a read uses: the named engine's signals, or, to recognise the
    engine, every profile's recognising and signal names."""
    profiles = [catalog.profiles[engine]] if engine in catalog.profiles \
        else list(catalog.profiles.values())
    names = {n for p in profiles for names in p.signals.values() for n in names}
    if engine not in catalog.profiles:
        names.update(n for p in profiles for n in p.recognise)
    return frozenset(_bare(n) for n in names)


# a family whose type lets it hold a sample of this suffix (the parser's allowed names)
_FAMILY_SUFFIXES = ("_count", "_sum", "_bucket")
# whitespace within a line (the parser splits the text at "\n" alone, then strips)
_WS = r"[^\S\n]"


def prefilter(text: str, names: frozenset[str]) -> str:
    """The lines of the text the parser needs to give the samples of `names` (bare) as
    it gives them from the whole text: their sample lines, the HELP and TYPE lines of
    their families and of a family that could take one of them in (`x` for `x_sum`),
    and any comment line of fewer than three words (the parser starts a family at one).
    One compiled pattern over the whole text (issue 32: a pass over every line in
    Python cost 5 ms a MiB, as much as the daemon's cycle)."""
    kept = _pattern(names).findall("\n" + text)
    # none of the names: the whole page, which says what it is
    if any(not line.lstrip().startswith("#") for line in kept):
        return "\n".join(kept)
    return text


@functools.lru_cache(maxsize=16)
def _pattern(names: frozenset[str]) -> re.Pattern[str]:
    """Lines (each after the "\\n" before it) that are a sample of one of the names
    (`_total` or not) or a comment the parser could group one by. Each alternative is
    a trie of the names, so a line that starts with none fails within a few letters."""
    families = set(names)
    families.update(n[:-len(s)] for n in names for s in _FAMILY_SUFFIXES if n.endswith(s))
    # a sample's name ends at its labels or a blank; a comment's word at a blank
    end = r"(?:_total)?(?=[\s{]|\Z)"
    line_end = rf"{_WS}*(?=\n|\Z)"
    family = rf"{_trie(sorted(families))}(?:_total)?(?=\s|\Z)"
    # a comment of fewer than three words, or whose third word is one of the families
    comment = rf"#\S*(?:{line_end}|{_WS}+\S+(?:{line_end}|{_WS}+{family}))"
    # "\n" first, not "^" with re.MULTILINE: a literal first lets the engine skip to
    # each line's start in C (five times faster a MiB)
    return re.compile(rf"\n({_WS}*(?:{_trie(sorted(names))}{end}|{comment})[^\n]*)")


def _trie(words: list[str]) -> str:
    """A pattern matching exactly `words`, their common beginnings written once."""
    if words == [""]:
        return ""
    heads: dict[str, list[str]] = {}
    for word in words:
        heads.setdefault(word[:1], []).append(word[1:])
    branches = [re.escape(head) + _trie(rest) if head else "" for head, rest in heads.items()]
    optional = "" in heads
    branches = [b for b in branches if b]
    body = branches[0] if len(branches) == 1 and not optional \
        else "(?:" + "|".join(branches) + ")"
    return body + ("?" if optional else "")


def parse(text: str, names: frozenset[str] | None = None) -> Samples:
    """Every gauge, counter or untyped sample of the text by name (`_total` taken off a
    counter's name, as prometheus-client writes it either way), as written: NaN, Inf
    and negative values too (the signals that hold one are unknown, values() says);
    with `names`, those (bare) alone, the rest of the text left unparsed. Raises
    ValueError when the text (of those names) is not Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families

    if names is not None:
        text = prefilter(text, names)
    found = Samples()
    for family in text_string_to_metric_families(text):
        if family.type not in ("gauge", "counter", "unknown", "untyped"):
            continue  # histograms and summaries carry no signal gpuguard reads
        for sample in family.samples:
            name = _bare(sample.name)
            series = found.setdefault(name, [])
            if len(series) >= MAX_SERIES:
                found.overflowed.add(name)
            elif isinstance(sample.value, (int, float)):
                series.append(float(sample.value))
    return found


def recognise(samples: dict[str, list[float]], catalog: EngineCatalog
              ) -> EngineProfile | list[str] | None:
    """The profile whose recognising names the page holds (the most of them), None when
    it holds none, or the names of the engines that tie (the page cannot be told)."""
    hits = {profile.name: sum(1 for name in profile.recognise if _bare(name) in samples)
            for profile in catalog.profiles.values()}
    most = max(hits.values(), default=0)
    if most == 0:
        return None
    best = sorted(name for name, found in hits.items() if found == most)
    return catalog.profiles[best[0]] if len(best) == 1 else best


def values(profile: EngineProfile, samples: dict[str, list[float]]) -> dict[str, Any]:
    """Each signal's value: the first of its names the page holds (the newest
    generation first), summed over its series (KV cache use: the highest); {"error"}
    when a named one holds a value that is no count (NaN, Inf, negative) or more series
    than MAX_SERIES: the read cannot tell, never a silent 0."""
    out: dict[str, float | None] = {}
    used: dict[str, str] = {}
    overflowed: set[str] = getattr(samples, "overflowed", set())
    for signal, names in profile.signals.items():
        name = next((n for n in names if samples.get(_bare(n))), None)
        if name is None:
            out[signal] = None
            continue
        series = samples[_bare(name)]
        if _bare(name) in overflowed:
            return {"engine": profile.name,
                    "error": f"{name} has more than {MAX_SERIES} series: not read whole"}
        bad = next((v for v in series if not math.isfinite(v) or v < 0), None)
        if bad is not None:
            return {"engine": profile.name,
                    "error": f"{name} holds {bad!r}: {signal} cannot be told"}
        out[signal] = max(series) if signal == "kv_cache" else sum(series)
        used[signal] = name
    return {"engine": profile.name, "values": out, "metrics": used,
            "on_finish": used.get("progress") in profile.on_finish}


def _bare(name: str) -> str:
    return name[:-6] if name.endswith("_total") else name
