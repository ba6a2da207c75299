"""nvlink.state and nvlink.errors on the real 2 x H200 NVLink host, and the real
single H200 recording as a GPU without NVLink."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpuguard.judge.engine import evaluate
from gpuguard.model.profile import Profile
from gpuguard.model.results import Status
from gpuguard.model.samples import Samples
from gpuguard.model.snapshot import Reading, Snapshot
from tests.checks import h200x2
from tests.checks.test_memory import overridden
from tests.conftest import set_gpu

NEW_RULES = ("nvlink.state", "nvlink.errors", "fabric.state", "fabric.manager", "p2p.status",
             "memory.temperature", "mig.mode", "clocks.applications", "sxid.recent")


@pytest.fixture
def pair() -> Snapshot:
    return h200x2.snapshot()


def links(snapshot: Snapshot, index: int) -> list[dict[str, Any]]:
    return copy.deepcopy(snapshot.gpus[index].nvlink_links.get())


def with_links_down(snapshot: Snapshot, index: int, *down: int) -> Snapshot:
    changed = links(snapshot, index)
    for link in changed:
        if link["link"] in down:
            link["up"] = False
    return set_gpu(snapshot, index, nvlink_links=changed)


def test_the_real_nvlink_host_is_healthy_in_check_and_in_the_daemon(pair, default_rules):
    """Idle and healthy: every new rule ok or skipped, CRC data 23 on a link included."""
    assert links(pair, 0)[0]["crc_data"] == 23
    results = evaluate(pair, default_rules, Profile(), only=list(NEW_RULES))
    history = Samples()
    for t in (0.0, 5.0, 10.0):
        history.add(pair, t)
    results += evaluate(pair, default_rules, Profile(), only=list(NEW_RULES), samples=history)
    assert {r.rule for r in results} == set(NEW_RULES)
    assert {r.status for r in results} <= {Status.OK, Status.SKIPPED}, \
        [(r.rule, r.status, r.message) for r in results if r.status is not Status.OK]
    state = next(r for r in results if r.rule == "nvlink.state")
    assert state.message == "18 NVLinks up (the most up among its 1 peer(s) of the same model: 18)"


def test_a_gpu_without_nvlink_is_skipped_with_the_reason(h200, run_rule):
    for rule in ("nvlink.state", "nvlink.errors"):
        set_gpu(h200, nvlink_links=Reading.not_supported("NVML: Not Supported"))
        [result] = run_rule(rule, h200)
        assert result.status is Status.SKIPPED
        assert result.message == ("no NVLink on this GPU (NVML: not supported): nothing to "
                                  "judge")


def test_an_unread_link_list_is_unknown(pair, run_rule):
    set_gpu(pair, 0, nvlink_links=Reading.failed("nvmlDeviceGetNvLinkState: timeout"))
    for rule in ("nvlink.state", "nvlink.errors"):
        result = run_rule(rule, pair)[0]
        assert result.status is Status.UNKNOWN and "timeout" in result.message


def test_a_link_down_against_the_peers_is_critical_naming_it(pair, run_rule):
    with_links_down(pair, 1, 7)
    good, bad = run_rule("nvlink.state", pair)
    assert good.status is Status.OK
    assert bad.status is Status.CRITICAL
    assert bad.message == ("17 of 18 NVLinks up (the most up among its 1 peer(s) of the same "
                           "model); down: 7")
    assert bad.observed["down"] == [7]


def test_peers_of_another_model_are_not_compared(pair, run_rule):
    with_links_down(pair, 1, *range(6))
    set_gpu(pair, 0, name="NVIDIA H100 80GB HBM3")
    results = run_rule("nvlink.state", pair)
    assert [r.status for r in results] == [Status.OK, Status.OK]
    assert results[1].message == ("12 NVLinks up (no peer of the same model to compare "
                                  "with: 12)")


def test_the_profile_sets_the_number_of_links(pair, run_rule):
    # at the line: 18 wanted, 18 up
    assert {r.status for r in run_rule("nvlink.state", pair,
                                       Profile(nvlink_links_per_gpu=18))} == {Status.OK}
    # just above what the GPUs have: both critical, though they agree with each other
    results = run_rule("nvlink.state", pair, Profile(nvlink_links_per_gpu=19))
    assert {r.status for r in results} == {Status.CRITICAL}
    assert results[0].message == ("18 of 19 NVLinks up (the profile's nvlink_links_per_gpu); "
                                  "down: none listed")
    # below: a GPU with a link down passes a profile that asks for fewer
    with_links_down(pair, 1, 0)
    assert {r.status for r in run_rule("nvlink.state", pair,
                                       Profile(nvlink_links_per_gpu=17))} == {Status.OK}


def test_all_gpus_equally_down_pass_without_a_profile(pair, run_rule):
    """Without a profile the peers are the reference: what they all have is the number."""
    with_links_down(pair, 0, 17)
    with_links_down(pair, 1, 17)
    assert {r.status for r in run_rule("nvlink.state", pair)} == {Status.OK}


def grow(pair: Snapshot, history: Samples, t: float, **by: int) -> None:
    """Add `by[counter]` to link 0's counter on GPU 0, then record the cycle at `t`."""
    changed = links(pair, 0)
    for name, n in by.items():
        changed[0][name] += n
    set_gpu(pair, 0, nvlink_links=changed)
    history.add(pair, t)


def daemon_result(pair: Snapshot, rules: Any, history: Samples) -> Any:
    return evaluate(pair, rules, Profile(), only=["nvlink.errors"], samples=history)[0]


def test_check_reports_totals_and_never_fails_on_them(pair, run_rule):
    changed = links(pair, 0)
    for link in changed:
        link.update(replay=10**6, recovery=10**6, crc_flit=10**6, crc_data=10**6)
    set_gpu(pair, 0, nvlink_links=changed)
    [result, _] = run_rule("nvlink.errors", pair)
    assert result.status is Status.OK
    assert result.observed["totals"] == {"replay": 18 * 10**6, "recovery": 18 * 10**6,
                                         "crc_flit": 18 * 10**6, "crc_data": 18 * 10**6}
    assert "the daemon judges their growth" in result.message


@pytest.mark.parametrize(("counter", "limit"), [
    ("replay", 100), ("recovery", 0), ("crc_flit", 100), ("crc_data", 1000)])
def test_the_daemon_fails_growth_above_the_limit(pair, default_rules, counter, limit):
    history = Samples()
    history.add(pair, 0.0)
    grow(pair, history, 300.0, **{counter: limit})
    assert daemon_result(pair, default_rules, history).status is Status.OK  # at the limit
    grow(pair, history, 310.0, **{counter: 1})  # one above, in the window
    result = daemon_result(pair, default_rules, history)
    assert result.status is Status.WARNING
    assert f"+{limit + 1} in 310 s (limit {limit})" in result.message
    assert result.observed["growth"][counter] == limit + 1


def test_growth_older_than_the_window_and_resets_do_not_count(pair, default_rules):
    history = Samples()
    history.add(pair, 0.0)
    grow(pair, history, 5.0, recovery=3)
    grow(pair, history, 610.0)  # the recoveries were 605 s ago: outside the 600 s window
    assert daemon_result(pair, default_rules, history).status is Status.OK
    grow(pair, history, 615.0, crc_data=-23)  # the driver reloaded: link 0 back to 0
    grow(pair, history, 620.0)
    result = daemon_result(pair, default_rules, history)
    assert result.status is Status.OK and result.observed["growth"]["crc_data"] == 0


def test_the_growth_limits_come_from_the_rule(pair, tmp_path):
    rules = overridden(tmp_path, "nvlink.errors", max_crc_data_growth=5, window_s=60)
    history = Samples()
    history.add(pair, 0.0)
    grow(pair, history, 30.0, crc_data=6)
    result = daemon_result(pair, rules, history)
    assert result.status is Status.WARNING
    assert result.message == "NVLink errors growing: CRC data +6 in 30 s (limit 5)"
    grow(pair, history, 100.0)  # 100 s after the first: outside a 60 s window
    assert daemon_result(pair, rules, history).status is Status.OK


def test_more_than_18_links_down_names_the_first_18(pair, run_rule):
    """A bigger board (e.g. a future NVLink domain): the message names 18, observed all."""
    extra = [{**links(pair, 0)[0], "link": n} for n in range(18, 20)]
    set_gpu(pair, 0, nvlink_links=[{**link, "up": False} for link in links(pair, 0) + extra])
    result = run_rule("nvlink.state", pair, Profile(nvlink_links_per_gpu=20))[0]
    assert result.status is Status.CRITICAL
    assert result.message == ("0 of 20 NVLinks up (the profile's nvlink_links_per_gpu); down: "
                              + ", ".join(str(n) for n in range(18)))
    assert result.observed["down"] == list(range(20))


def with_counters(pair: Snapshot, **values: int | None) -> Snapshot:
    """GPU 0's links with some counters set on every link (None: not read)."""
    changed = links(pair, 0)
    for link in changed:
        link.update(values)
    return set_gpu(pair, 0, nvlink_links=changed)


def test_check_shows_exactly_the_totals_that_were_read(pair, run_rule):
    with_counters(pair, replay=1, recovery=None, crc_flit=None, crc_data=2)
    [result, _] = run_rule("nvlink.errors", pair)
    assert result.status is Status.OK
    assert result.message == ("totals since the driver loaded: replay 18, CRC data 36 (the "
                              "daemon judges their growth)")
    with_counters(pair, replay=None, recovery=None, crc_flit=None, crc_data=None)
    [result, _] = run_rule("nvlink.errors", pair)
    assert result.status is Status.SKIPPED and "`check` leaves them out" in result.message


def test_the_daemon_ok_names_its_window_and_the_totals(pair, tmp_path):
    rules = overridden(tmp_path, "nvlink.errors", window_s=90)
    history = Samples()
    for t in (0.0, 10.0):
        history.add(pair, t)
    result = daemon_result(pair, rules, history)
    assert result.status is Status.OK
    crc_data = sum(link["crc_data"] for link in links(pair, 0))
    # minutes are rounded (1.5 -> 2)
    assert result.message == ("NVLink error growth within limits over 2 min (totals: replay 0, "
                              f"recovery 0, CRC flit 0, CRC data {crc_data})")


def test_the_daemon_with_no_counter_read_is_unknown_not_ok(run_rule):
    from gpuguard.config.ruleset import load_ruleset
    from gpuguard.judge.engine import evaluate
    from gpuguard.model.profile import Profile
    from gpuguard.model.samples import Samples
    from tests.checks.h200x2 import snapshot

    snap = snapshot()
    for gpu in snap.gpus:
        links = [{**link, "replay": None, "recovery": None, "crc_flit": None, "crc_data": None}
                 for link in gpu.nvlink_links.get()]
        gpu.nvlink_links = Reading.ok(links)
        gpu.__post_init__()
    history = Samples()
    history.add(snap, 0.0)
    results = evaluate(snap, load_ruleset(), Profile(), only=["nvlink.errors"], samples=history)
    assert {r.status for r in results} == {Status.UNKNOWN}
    assert "no NVLink error counter could be read" in results[0].message


def test_every_link_down_on_every_gpu_is_critical_not_ok(pair, run_rule):
    """Peers that lost all their links too (a fabric or NVSwitch fault) are no reference."""
    for index in (0, 1):
        with_links_down(pair, index, *range(18))
    results = run_rule("nvlink.state", pair)
    assert {r.status for r in results} == {Status.CRITICAL}
    assert results[0].message.startswith("none of the GPU's 18 NVLinks is up")


def test_a_link_whose_counters_drop_out_and_come_back_is_not_growth(pair, default_rules):
    history = Samples()
    grow(pair, history, 0.0)
    every = links(pair, 0)
    gone = [{**link, **dict.fromkeys(("replay", "recovery", "crc_flit", "crc_data"))}
            if link["link"] == 2 else link for link in every]
    for t in (5.0, 10.0):  # link 2's counters not read for two cycles
        set_gpu(pair, 0, nvlink_links=gone)
        history.add(pair, t)
    for t in (15.0, 20.0):  # back, unchanged
        set_gpu(pair, 0, nvlink_links=every)
        history.add(pair, t)
    assert daemon_result(pair, default_rules, history).status is Status.OK


# --- nvlink.bandwidth (the active probe) ----------------------------------------------


def _peer(peer: int, gbps: float, reverse: float) -> dict[str, Any]:
    return {"peer": peer, "access": True, "gbps": gbps, "reverse_gbps": reverse}


def test_nvlink_bandwidth_floor_is_half_of_18_links(pair, run_rule):
    from tests.checks.probed import probed

    assert run_rule("nvlink.bandwidth", pair)[0].status is Status.SKIPPED  # no --active
    probed(pair, 0, probe_peers=[_peer(1, 392.0, 390.0)])
    [result] = run_rule("nvlink.bandwidth", pair)[:1]
    assert result.status is Status.OK and result.observed["floor_gbps"] == 239.1
    probed(pair, 0, probe_peers=[_peer(1, 392.0, 239.0)])  # the slower way is judged
    [result] = run_rule("nvlink.bandwidth", pair)[:1]
    assert result.status is Status.WARNING and "GPU 1 at 239" in result.message
    with_links_down(pair, 0, *range(9))  # 9 links up: floor 119.5
    assert run_rule("nvlink.bandwidth", pair)[0].status is Status.OK


def test_nvlink_bandwidth_pcie_fallback_and_unmeasured_pairs(pair, h200, run_rule, tmp_path):
    from tests.checks.probed import probed

    probed(pair, 0, probe_peers=[_peer(1, 52.0, 51.0)])  # peer copies over PCIe
    assert run_rule("nvlink.bandwidth", pair)[0].status is Status.WARNING
    rules = overridden(tmp_path, "nvlink.bandwidth", floor_fraction=0.1)
    assert run_rule("nvlink.bandwidth", pair, rules=rules)[0].status is Status.OK
    probed(pair, 0, probe_peers=[{"peer": 1, "access": None,
                                  "error": "not measured: GPU 0's worker died of SIGSEGV"}])
    [result] = run_rule("nvlink.bandwidth", pair)[:1]
    assert result.status is Status.UNKNOWN and "SIGSEGV" in result.message
    probed(pair, 0, probe_peers=[])
    assert run_rule("nvlink.bandwidth", pair)[0].status is Status.SKIPPED
    # a GPU without NVLink: measured, not judged against an NVLink floor
    probed(h200, probe_peers=[_peer(1, 20.0, 20.0)])
    [result] = run_rule("nvlink.bandwidth", h200)
    assert result.status is Status.OK and "not judged" in result.message
    probed(pair, 0, probe_peers=[_peer(1, 200.0, 200.0)])
    profile = Profile(probe_floors_gbps={"NVIDIA H200": {"nvlink": 150.0}})
    assert run_rule("nvlink.bandwidth", pair, profile)[0].status is Status.OK


def test_nvlink_bandwidth_edges(pair, run_rule):
    from tests.checks.probed import probed

    profile = Profile(probe_floors_gbps={"NVIDIA H200": {"nvlink": 150.0}})
    probed(pair, 0, probe_peers=[_peer(1, 150.0, 150.0)])  # at the floor
    assert run_rule("nvlink.bandwidth", pair, profile)[0].status is Status.OK
    # an error on a pair with access is unmeasured, never a rate of 0 or a pass
    probed(pair, 0, probe_peers=[{"peer": 1, "access": True, "error": "cuMemcpyPeer 700"}])
    assert run_rule("nvlink.bandwidth", pair)[0].status is Status.UNKNOWN
    # a rate missing from a measured pair is not a pass
    low = Profile(probe_floors_gbps={"NVIDIA H200": {"nvlink": 0.5}})
    probed(pair, 0, probe_peers=[{"peer": 1, "access": True, "gbps": None,
                                  "reverse_gbps": 390.0}])
    assert run_rule("nvlink.bandwidth", pair, low)[0].status is Status.WARNING
    probed(pair, 0, probe_peers=[{"peer": 1, "access": True, "gbps": 390.0,
                                  "reverse_gbps": None}])
    assert run_rule("nvlink.bandwidth", pair, low)[0].status is Status.WARNING
    probed(pair, 0, probe_peers=[{"peer": 1, "access": False}])
    [result] = run_rule("nvlink.bandwidth", pair)[:1]
    assert result.status is Status.OK and "no peer access" in result.message


def test_growth_compares_only_samples_that_summed_the_same_links(pair, tmp_path):
    """Link 5's counters drop out of one cycle and come back: its CRC data errors leave
    the sum and return, which is no growth; the real +6 on link 0 is judged from the
    first sample that summed the same 18 links (20 s, not the 10 s since the dip)."""
    rules = overridden(tmp_path, "nvlink.errors", max_crc_data_growth=5, window_s=600)
    history = Samples()
    history.add(pair, 0.0)
    back = links(pair, 0)
    dipped = links(pair, 0)
    dipped[5].update(replay=None, recovery=None, crc_flit=None, crc_data=None)
    set_gpu(pair, 0, nvlink_links=dipped)
    history.add(pair, 10.0)
    back[0]["crc_data"] += 6
    set_gpu(pair, 0, nvlink_links=back)
    history.add(pair, 20.0)
    result = daemon_result(pair, rules, history)
    assert result.status is Status.WARNING
    assert result.message == "NVLink errors growing: CRC data +6 in 20 s (limit 5)"
