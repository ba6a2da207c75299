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


def outcome(text: str, engine: str | None, names: frozenset[str] | None) -> object:
    try:
        return readings(text, engine, names)
    except ValueError:
        return "not Prometheus text"


def same_or_refused(text: str) -> None:
    """As same(), where the whole page's parse may refuse the text at a line of a read
    name: the cut refuses it too (a malformed line the cut leaves out is not parsed)."""
    for engine in ENGINES:
        whole = outcome(text, engine, None)
        assert outcome(text, engine, engine_metrics.wanted(CATALOG, engine)) == whole, engine


RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
TOKENS = "vllm:generation_tokens_total"

ADVERSARIAL = {
    # names that begin with a read name, and read names that begin another's
    "prefixes": (f"{RUNNING}_extra 5\nvllm:num_requests 3\n{RUNNING} 2\n{RUNNING}_totals 4\n"
                 f"{TOKENS}x 8\n{TOKENS} 9\n{WAITING}s 6\n{WAITING} 1\n"),
    # a read name inside another sample's labels, and inside a read sample's own
    "labels": (f'other{{name="{RUNNING}"}} 7\nother{{x="a\\n{RUNNING} 9"}} 7\n'
               f'{RUNNING}{{path="{WAITING} 9"}} 1\n{WAITING}{{a="}}"}} 2\n{TOKENS} 3\n'),
    # HELP text with an escaped newline followed by what looks like a sample
    "help escapes": (f"# HELP {RUNNING} Running\\n{RUNNING} 99\n# TYPE {RUNNING} gauge\n"
                     f"{RUNNING} 2\n# HELP other a\\n{WAITING} 5\n{WAITING} 1\n{TOKENS} 4\n"),
    "crlf": (f"# HELP {RUNNING} r\r\n# TYPE {RUNNING} gauge\r\n{RUNNING} 2\r\n"
             f"# TYPE {TOKENS} counter\r\n{TOKENS} 5\r\n{WAITING}\t1\r\n"),
    "no trailing newline": f"{TOKENS} 5\n# TYPE {RUNNING} gauge\n{RUNNING} 3",
    "first line read": f"{RUNNING} 3\nother 1\n{TOKENS} 5\n",
    # a read name present only as a histogram's buckets (and its count and sum)
    "only buckets": (f"# TYPE {RUNNING} histogram\n{RUNNING}_bucket{{le=\"1\"}} 3\n"
                     f"{RUNNING}_bucket{{le=\"+Inf\"}} 4\n{RUNNING}_count 4\n{RUNNING}_sum 2\n"
                     f"{TOKENS} 5\n"),
    # comments of fewer than three words end a family; other comments do not
    "short comments": (f"# TYPE {RUNNING} histogram\n#\n{RUNNING}_count 2\n# HELP\n"
                       f"{RUNNING}_sum 1\n#HELP {RUNNING}\n{RUNNING} 5\n# a comment here\n"
                       f"{TOKENS} 6\n# HELP {WAITING}_total w\n{WAITING} 1\n"),
    "blanks": f"  {RUNNING} 3\n\t{TOKENS}  5  \n\n \n{WAITING} {{}} 1\n",
    # a form feed or a line separator splits a line for str.splitlines, not for the parser
    "form feed": f"{TOKENS} 5\n{RUNNING} 1\x0c{WAITING} 2\n",
    "line separator": f"{TOKENS} 5\n{RUNNING} 1\u2028{WAITING} 2\n",
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_an_adversarial_page_reads_as_the_whole_page_does(name):
    text = ADVERSARIAL[name]
    same_or_refused(text)
    same_or_refused(histograms(20) + text)
    same_or_refused(text + "\n" + histograms(20))
