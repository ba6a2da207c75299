"""The engine's page cut to the names a read uses before it is parsed (issue 32):
engine_metrics.parse with the read's names gives exactly the readings the whole page's
parse gives, on every recorded page (tests/fixtures/engines), each read as every
engine's and as an engine to recognise, and on pages padded with histograms, with
summaries and with samples that a family of a read name could take in."""

from __future__ import annotations

import pytest

from gpuguard.config.engine_profiles import load_catalog
from gpuguard.sources import engine_metrics
from tests.conftest import FIXTURES

PAGES = sorted((FIXTURES / "engines").glob("*.prom"))
CATALOG = load_catalog()
ENGINES = [None, *sorted(CATALOG.profiles)]


def histograms(families: int, prefix: str = "vllm:pad") -> str:
    out = []
    for i in range(families):
        name = f"{prefix}_{i}_seconds"
        out.append(f"# HELP {name} padding\n# TYPE {name} histogram\n")
        for le in ("0.001", "0.01", "0.1", "1.0", "+Inf"):
            out.append(f'{name}_bucket{{engine="0",le="{le}",model_name="m"}} {i}.0\n')
        out.append(f'{name}_count{{engine="0",model_name="m"}} {i}.0\n')
        out.append(f'{name}_sum{{engine="0",model_name="m"}} 1.5\n')
    return "".join(out)


def readings(text: str, engine: str | None, names: frozenset[str] | None) -> object:
    """What a read takes from the page: the engine recognised and the values."""
    samples = engine_metrics.parse(text, names)
    profile = CATALOG.profiles.get(engine) if engine else engine_metrics.recognise(
        samples, CATALOG)
    if not isinstance(profile, type(next(iter(CATALOG.profiles.values())))):
        return ("recognised", profile)
    return ("values", engine_metrics.values(profile, samples))


def same(text: str) -> None:
    for engine in ENGINES:
        whole = readings(text, engine, None)
        cut = readings(text, engine, engine_metrics.wanted(CATALOG, engine))
        assert cut == whole, engine


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_each_recorded_page_reads_the_same_cut(page):
    text = page.read_text()
    same(text)
    same(histograms(200) + text + histograms(200, "sglang:pad"))


def test_a_page_of_histograms_reads_the_same_and_cuts_to_the_read_names():
    text = (FIXTURES / "engines" / "vllm-0.11.prom").read_text() + histograms(2000)
    assert len(text) > 1024 * 1024
    same(text)
    names = engine_metrics.wanted(CATALOG, "vllm")
    cut = engine_metrics.prefilter(text, names)
    assert "_bucket" not in cut.replace("vllm:time_to_first_token_seconds", "")
    assert len(cut) < len(text) // 50
    assert "vllm:generation_tokens_total{" in cut


def test_samples_a_family_of_a_read_name_takes_in_are_grouped_as_the_whole_page_does():
    running = "vllm:num_requests_running"
    # an undeclared `x_sum`/`x_count` after a histogram `x` belongs to it; a read name
    # after another family's comments stands alone; a summary's bare samples are its own
    text = (f"# TYPE {running} histogram\n{running}_sum 3\n{running}_count 2\n"
            f"{running}{{model_name=\"m\"}} 7\n"
            "# HELP other x\n# TYPE other summary\nother 1\nother_sum 2\n"
            "vllm:num_requests_waiting 4\nvllm:generation_tokens_total 9\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 0.5\n"
            "vllm:kv_cache_usage_perc_bucket{le=\"1\"} 3\n")
    same(text)
    same(text + histograms(50))


def test_a_page_that_is_not_prometheus_text_in_a_read_line_is_still_refused():
    names = engine_metrics.wanted(CATALOG, "vllm")
    with pytest.raises(ValueError):
        engine_metrics.parse("vllm:num_requests_running{model_name=\"m\" 7\n", names)
