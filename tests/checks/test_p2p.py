"""p2p.status on the real 2 x H200 host (NVLink, write and atomics OK; the probe could not
read READ) and on hosts without NVLink, where missing P2P is no fault."""

from __future__ import annotations

import copy

import pytest

from gpuguard.model.profile import Profile
from gpuguard.model.results import Status
from gpuguard.model.snapshot import Reading, Snapshot
from tests.checks import h200x2
from tests.conftest import set_gpu, with_gpus


@pytest.fixture
def pair() -> Snapshot:
    return h200x2.snapshot()


def peer(index: int, **kinds: str) -> dict[str, object]:
    return {"peer": index, **{k: "ok" for k in ("read", "write", "nvlink", "atomics")}, **kinds}


def test_the_real_pair_is_ok_and_its_unread_read_status_is_not_a_fault(pair, run_rule):
    assert pair.gpus[0].p2p_status.get()[0]["read"] == "unknown"
    results = run_rule("p2p.status", pair)
    assert [r.status for r in results] == [Status.OK, Status.OK]
    assert results[0].message == "P2P with 1 peer(s): NVLink where wired as expected"


def test_nvlink_wired_pair_without_nvlink_p2p_warns(pair, run_rule):
    set_gpu(pair, 0, p2p_status=[peer(1, nvlink="gpu_not_supported")])
    [bad, good] = run_rule("p2p.status", pair)
    assert bad.status is Status.WARNING and good.status is Status.OK
    assert bad.message.endswith("falls back to PCIe): GPU 1: nvlink gpu_not_supported")


def test_pcie_gpus_without_p2p_are_not_faulted(h200, run_rule):
    """No NVLink, P2P not supported across sockets: normal, unless the profile demands it."""
    with_gpus(h200, ["00000000:3B:00.0", "00000000:86:00.0"])
    for i in (0, 1):
        set_gpu(h200, i, nvlink_links=Reading.not_supported(),
                p2p_status=[peer(1 - i, read="topology_not_supported",
                                 write="topology_not_supported", nvlink="not_supported")])
    assert {r.status for r in run_rule("p2p.status", h200)} == {Status.OK}
    results = run_rule("p2p.status", h200, Profile(p2p_require_nvlink=True))
    assert {r.status for r in results} == {Status.CRITICAL}
    assert results[0].message == (
        "peer access over NVLink that the profile requires is missing: GPU 1: read "
        "topology_not_supported, write topology_not_supported, nvlink not_supported")


def test_bridged_pairs_are_judged_only_with_their_own_partner(h200, run_rule):
    """Two NVLink bridges (0-1, 2-3): 0 and 2 both have NVLink but are not wired together."""
    buses = ["00000000:3B:00.0", "00000000:3C:00.0", "00000000:86:00.0", "00000000:87:00.0"]
    with_gpus(h200, buses)
    for i in range(4):
        partner = i ^ 1
        links = [{"link": n, "up": True, "version": 3, "remote_pci": buses[partner],
                  "replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0} for n in range(4)]
        statuses = [peer(j, nvlink="ok" if j == partner else "not_supported")
                    for j in range(4) if j != i]
        set_gpu(h200, i, nvlink_links=links, p2p_status=statuses)
    assert {r.status for r in run_rule("p2p.status", h200)} == {Status.OK}
    set_gpu(h200, 2, p2p_status=[peer(0, nvlink="not_supported"), peer(1, nvlink="not_supported"),
                                 peer(3, nvlink="disabled_by_regkey")])
    results = run_rule("p2p.status", h200)
    assert [r.status for r in results] == [Status.OK, Status.OK, Status.WARNING, Status.OK]
    assert results[2].message.endswith("GPU 3: nvlink disabled_by_regkey")


def test_required_or_wired_status_that_cannot_be_read_is_unknown(pair, run_rule):
    set_gpu(pair, 0, p2p_status=[peer(1, nvlink="unknown")])
    assert run_rule("p2p.status", pair)[0].status is Status.UNKNOWN
    set_gpu(pair, 0, p2p_status=[])
    [result, _] = run_rule("p2p.status", pair, Profile(p2p_require_nvlink=True))
    assert result.status is Status.UNKNOWN and "GPU 1: no P2P status" in result.message
    set_gpu(pair, 0, p2p_status=Reading.failed("nvmlDeviceGetP2PStatus: x"))
    assert run_rule("p2p.status", pair)[0].status is Status.UNKNOWN


def test_the_profile_passes_a_host_that_has_it_all(pair, run_rule):
    for i in (0, 1):
        set_gpu(pair, i, p2p_status=[peer(1 - i)])
    results = run_rule("p2p.status", pair, Profile(p2p_require_nvlink=True))
    assert {r.status for r in results} == {Status.OK}
    assert results[0].message == "P2P with 1 peer(s): read, write and NVLink as expected"


def test_one_gpu_has_no_peer(h200, run_rule):
    set_gpu(h200, p2p_status=[])
    [result] = run_rule("p2p.status", copy.deepcopy(h200), Profile(p2p_require_nvlink=True))
    assert result.status is Status.OK and result.message == "no other GPU to peer with"


def bridged(snapshot: Snapshot, up: bool = True) -> Snapshot:
    """Two PCIe GPUs joined by an NVLink bridge (each link ends at the other GPU), with
    NVML refusing P2P over NVLink both ways."""
    buses = ["00000000:3B:00.0", "00000000:3C:00.0"]
    with_gpus(snapshot, buses)
    for i in (0, 1):
        links = [{"link": n, "up": up, "version": 3, "remote_pci": buses[1 - i],
                  "replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0} for n in range(4)]
        set_gpu(snapshot, i, nvlink_links=links,
                p2p_status=[peer(1 - i, nvlink="disabled_by_regkey")])
    return snapshot


def test_a_bridge_whose_links_are_down_is_not_wired(h200, run_rule):
    assert {r.status for r in run_rule("p2p.status", bridged(h200))} == {Status.WARNING}
    results = run_rule("p2p.status", bridged(h200, up=False))
    assert [r.status for r in results] == [Status.OK, Status.OK]
    assert results[0].message == "P2P with 1 peer(s): NVLink where wired as expected"


def test_a_bridge_seen_from_one_side_is_wired_for_both(h200, run_rule):
    """GPU 1's link list cannot be read: GPU 0's links still end at GPU 1, so the pair is
    wired, judged from either GPU."""
    bridged(h200)
    set_gpu(h200, 1, nvlink_links=Reading.failed("nvmlDeviceGetNvLinkState: timeout"))
    results = run_rule("p2p.status", h200)
    assert [r.status for r in results] == [Status.WARNING, Status.WARNING]
    assert results[0].message.endswith("): GPU 1: nvlink disabled_by_regkey")
    assert results[1].message.endswith("): GPU 0: nvlink disabled_by_regkey")


def test_switch_links_on_one_gpu_only_do_not_wire_the_pair(h200, run_rule):
    """GPU 0 has links up to an NVSwitch (a VM shows FFFFFFFF:FF:FF.0), GPU 1 no NVLink:
    the pair is not wired, so no P2P over NVLink is expected between them."""
    with_gpus(h200, ["00000000:3B:00.0", "00000000:86:00.0"])
    switch = [{"link": n, "up": True, "version": 4, "remote_pci": "FFFFFFFF:FF:FF.0",
               "replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0} for n in range(18)]
    set_gpu(h200, 0, nvlink_links=switch, p2p_status=[peer(1, nvlink="not_supported")])
    set_gpu(h200, 1, nvlink_links=Reading.not_supported(),
            p2p_status=[peer(0, nvlink="not_supported")])
    assert {r.status for r in run_rule("p2p.status", h200)} == {Status.OK}
    # the same links on both GPUs: wired through the switch, and the refusal is reported
    set_gpu(h200, 1, nvlink_links=switch)
    assert {r.status for r in run_rule("p2p.status", h200)} == {Status.WARNING}


def test_unread_statuses_are_named_as_read_or_missing(pair, run_rule):
    set_gpu(pair, 0, p2p_status=[{"peer": 1, "read": "unknown", "write": "ok"}])
    [result, _] = run_rule("p2p.status", pair, Profile(p2p_require_nvlink=True))
    assert result.status is Status.UNKNOWN
    assert result.message == ("cannot tell P2P status: GPU 1: read unknown, nvlink unread")


def test_unread_links_make_the_wiring_unknown_not_ok(pair, run_rule):
    for index in (0, 1):
        set_gpu(pair, index, nvlink_links=Reading.failed("nvmlDeviceGetNvLinkState: boom"))
    set_gpu(pair, 0, p2p_status=[peer(1, nvlink="not_supported")])
    results = run_rule("p2p.status", pair)
    assert {r.status for r in results} == {Status.UNKNOWN}
    assert "NVLinks not read, wiring unknown" in results[0].message


def test_links_unread_on_one_side_only_still_make_the_wiring_unknown(pair, run_rule):
    """GPU 0 has no NVLink, GPU 1's link list could not be read: the pair is not seen as
    wired, yet whether it is cannot be told from GPU 0 either (either side unread)."""
    set_gpu(pair, 0, nvlink_links=Reading.not_supported(),
            p2p_status=[peer(1, nvlink="not_supported")])
    set_gpu(pair, 1, nvlink_links=Reading.failed("nvmlDeviceGetNvLinkState: boom"))
    [first, _] = run_rule("p2p.status", pair)
    assert first.status is Status.UNKNOWN
    assert first.message == "cannot tell P2P status: GPU 1: NVLinks not read, wiring unknown"
