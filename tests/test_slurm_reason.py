"""The one grammar of gpuguard's drain reasons (gpuguard/integrations/slurm/reason.py):
every reason it can write, for every action, every rule id (the pack's and any a site can
name) and any GPU and count, reads back as its own with the right action, rule and GPU,
and is counted by the fleet brake; anything else is refused. Property tests over the
whole space and its near-misses."""

from __future__ import annotations

import re
import time
from functools import cache
from typing import Any

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from gpuguard.config.shapes import RULE_ID_PATTERN
from gpuguard.integrations.slurm import brake as slurm_brake
from gpuguard.integrations.slurm import plan as slurm
from gpuguard.integrations.slurm import reason as grammar
from gpuguard.integrations.slurm.clock import Clock
from gpuguard.integrations.slurm.ctl import NodeInfo
from gpuguard.judge.actions import Action

LIMIT = 10 ** grammar.NUMBER_DIGITS - 1


@cache
def pack_rules() -> tuple[str, ...]:
    from gpuguard.config.ruleset import load_ruleset

    return tuple(sorted(load_ruleset().rules))


rule_ids = st.one_of(st.sampled_from(pack_rules()),
                     st.from_regex(re.compile(RULE_ID_PATTERN, re.ASCII), fullmatch=True))
gpus = st.one_of(st.none(), st.integers(0, 16), st.integers(0, LIMIT))
counts = st.one_of(st.integers(0, 20), st.integers(0, LIMIT))


def finding(action: Action, rule: str, gpu: int | None) -> dict[str, Any]:
    return {"rule": rule, "status": "critical", "action": action.value, "message": "x",
            "gpu": None if gpu is None else {"index": gpu, "uuid": f"GPU-{gpu}"}}


def brake_counts(reason: str) -> bool:
    """Is a node drained with this reason a minute ago one of gpuguard's for the brake?"""
    now = time.time()
    nodes = {"me": NodeInfo("me", "IDLE", "", None, ["main"]),
             "other": NodeInfo("other", "IDLE+DRAIN", reason, now - 60, ["main"])}
    found = slurm_brake.count(nodes, "me", Clock(0.0, "the test's: in step"), 600)
    return found.drained_by_us == ["other"] and found.held_by_us == ["other"]


def test_every_pack_rule_and_action_word_is_in_the_grammar() -> None:
    assert len(pack_rules()) > 50
    assert all(re.fullmatch(RULE_ID_PATTERN, r) for r in pack_rules())
    assert set(grammar.WORDS) == {a.value for a in Action} - {"none"} | {"failover"}
    assert RULE_ID_PATTERN.startswith("^") and RULE_ID_PATTERN.endswith("$")


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(list(Action)), rule_ids, gpus, counts)
@example(Action.RESTART_APP, "service.engine", None, 0)
@example(Action.UPDATE_SOFTWARE, "service.inference", 3, 0)
@example(Action.RESTART_APP, "recovery.action", 7, 2)
@example(Action.NONE, "gpu.lost", 0, 0)
@example(Action.INSPECT_HARDWARE, "site." + "x" * 200, LIMIT, LIMIT)
def test_every_reason_gpuguard_writes_reads_back_as_its_own(
        action: Action, rule: str, gpu: int | None, more: int) -> None:
    reason = grammar.Reason.of(action.value if action is not Action.NONE else "failover",
                               rule, gpu, more)
    text = reason.text()
    assert len(text) <= grammar.REASON_MAX
    parsed = grammar.parse(text)
    assert parsed == reason
    word = action.value if action is not Action.NONE else "failover"
    assert (parsed.word, parsed.gpu, parsed.more) == (word, gpu, more)
    if parsed.cut:
        assert len(text) == grammar.REASON_MAX and rule.startswith(parsed.rule)
        assert len(parsed.rule) >= 17  # the longest head and tail leave room
    else:
        assert parsed.rule == rule
    assert slurm.ours(text) and brake_counts(text)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(list(Action)), rule_ids, st.lists(st.integers(0, 15), min_size=1,
                                                        max_size=12))
def test_health_writes_its_reasons_through_the_grammar(action: Action, rule: str,
                                                       on: list[int]) -> None:
    """reason_for (what health drains with), on findings as the verdict has them."""
    findings = [finding(action, rule, g) for g in on]
    text = slurm.reason_for(findings)
    named = slurm.named_in(text)
    assert named is not None and named[1] == on[0]
    assert named[0] == rule or (named[0].endswith("~") and rule.startswith(named[0][:-1]))
    assert text.endswith(f" GPU {on[0]}" + (f" (+{len(on) - 1} more)" if len(on) > 1 else ""))
    assert brake_counts(text)


def whole_rule(parsed: grammar.Reason) -> str:
    """A rule id the writer cuts to the parsed start (a start may end with its dot)."""
    return parsed.rule + ("x" * 100 if parsed.rule.endswith(".") else "." + "x" * 100) \
        if parsed.cut else parsed.rule


def written(text: str) -> bool:
    """Whether the writer produces exactly this text, for the fields it parses to."""
    parsed = grammar.parse(text)
    if parsed is None:
        return False
    again = grammar.Reason.of(parsed.word, whole_rule(parsed), parsed.gpu, parsed.more)
    return again.text() == text


reasons = st.builds(lambda a, r, g, m: grammar.Reason.of(a, r, g, m).text(),
                    st.sampled_from(grammar.WORDS), rule_ids, gpus, counts)


@settings(max_examples=400, deadline=None)
@given(reasons, st.data())
def test_a_character_added_or_dropped_is_refused_unless_it_is_another_written_reason(
        text: str, data: st.DataObject) -> None:
    """The grammar is exact: what it accepts is what the writer writes for those fields
    (dropping the last digit of "GPU 12" is "GPU 1", a reason of its own)."""
    at = data.draw(st.integers(0, len(text)))
    char = data.draw(st.characters(codec="utf-8") | st.sampled_from(" ~.:+()0_az9"))
    added = text[:at] + char + text[at:]
    dropped = text[:max(0, at - 1)] + text[at:]
    for near in (added, dropped):
        assert grammar.parse(near) is None or written(near), near


@settings(max_examples=300, deadline=None)
@given(reasons, st.text(min_size=1, max_size=3))
def test_anything_before_or_after_a_reason_is_someone_elses(text: str, extra: str) -> None:
    for near in (text + " " + extra, text + extra):
        assert grammar.parse(near) is None or written(near), near
    for near in (extra + text, text + "\n", " " + text, text + " "):
        assert grammar.parse(near) is None, near


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=20), rule_ids)
def test_another_action_word_is_refused(word: str, rule: str) -> None:
    assume(word not in grammar.WORDS)
    assert grammar.parse(f"gpuguard: {word}: {rule} GPU 0") is None
    for known in ("none", "Reboot", "REBOOT", "reboot ", "contact_vendor", "keep_out",
                  "restart-app"):
        assert grammar.parse(f"gpuguard: {known}: {rule} GPU 0") is None


@settings(max_examples=300, deadline=None)
@given(rule_ids.filter(lambda r: len(r) <= 40), st.data())  # short: refused for the character
def test_a_rule_id_with_a_character_outside_the_grammar_is_refused(
        rule: str, data: st.DataObject) -> None:
    bad = data.draw(st.characters(codec="utf-8").filter(
        lambda c: not re.fullmatch(r"[a-z0-9_.]", c) and c not in " ~"))
    at = data.draw(st.integers(0, len(rule)))
    odd = rule[:at] + bad + rule[at:]
    for text in (f"gpuguard: reboot: {odd}", f"gpuguard: reboot: {odd} GPU 1"):
        assert grammar.parse(text) is None, text
    assert grammar.parse(f"gpuguard: reboot: {rule} GPU 1") is not None
    # and the writer never names such a rule: its reason is one of gpuguard's still
    written_for = grammar.Reason.of("reboot", odd, 1, 0).text()
    assert grammar.parse(written_for) is not None and odd not in written_for


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(grammar.WORDS), rule_ids, st.integers(0, LIMIT),
       st.integers(1, 3))
def test_a_gpu_number_with_a_leading_zero_or_too_many_digits_is_refused(
        word: str, rule: str, gpu: int, zeros: int) -> None:
    base = grammar.Reason.of(word, rule[:30], None, 0).text()
    assume(not base.endswith("~"))
    padded = "0" * zeros + str(gpu)
    assert grammar.parse(f"{base} GPU {padded}") is None
    assert grammar.parse(f"{base} GPU 1 (+0{gpu + 1} more)") is None
    assert grammar.parse(f"{base} GPU 1 (+0 more)") is None
    assert grammar.parse(f"{base} GPU {'1' * 11}") is None
    assert grammar.parse(f"{base} GPU {gpu}") is not None


@pytest.mark.parametrize("text", [
    "gpuguard: reboot: xid.rec~ GPU 3",  # a cut mark in a reason that fits: typed
    "gpuguard: reboot: xid.recent GPU ３",  # a full-width digit
    "gpuguard: reboot: xid.recent GPU ٣",  # an Arabic-Indic digit (\d would take it)
    "gpuguard: reboot: xid.recent GPU -1",
    "gpuguard: reboot: xid GPU 3",  # no dot: no rule id
    "gpuguard: reboot: xid..recent GPU 3",
    "gpuguard: reboot: 1xid.recent GPU 3",
    "gpuguard: reboot: xid.recent  GPU 3",
    "gpuguard:  reboot: xid.recent GPU 3",
    "gpuguard: reboot: xid.recent GPU 3 (+1 more) hold",
    "gpuguard: reboot: xid.recent (+1 more) GPU 3",
    "gpuguard: reboot: " + "x." * 40 + "y",  # 99 characters, uncut
    "Gpuguard: reboot: xid.recent",
    "gpuguard: reboot:xid.recent",
    "gpuguard: reboot: xid.recent~",
])
def test_near_misses_are_refused(text: str) -> None:
    assert grammar.parse(text) is None
    assert not brake_counts(text)


def test_the_reasons_the_old_parser_refused_are_gpuguards_now() -> None:
    """restart_app and update_software drains (service.*, recovery.action asking for
    recover_imex_domain, a site's failover rule) were written, never recognised: never
    resumed, never counted by the brake."""
    for text in ("gpuguard: restart_app: service.engine",
                 "gpuguard: update_software: service.inference GPU 2",
                 "gpuguard: restart_app: recovery.action GPU 0 (+7 more)"):
        assert slurm.named_in(text) is not None and brake_counts(text), text
