import pytest

from gpuguard.sources import nvidia_smi_xml
from tests.conftest import FIXTURES, H200_XML

V11 = FIXTURES / "nvidia-smi-v11-two-gpus.xml"


def test_h200_v13_values(h200):
    assert h200.host.driver_version.get() == "580.159.04"
    assert h200.host.cuda_driver_version.get() == "13.0"
    [gpu] = h200.gpus
    assert gpu.uuid.get() == "GPU-ecdbf726-cbc4-c900-ba50-458e4ab5db48"
    assert gpu.pci_bus_id.get() == "00000000:00:06.0"
    assert gpu.vbios_version.get() == "96.00.A5.00.1A"
    assert gpu.pcie_link_width_max.get() == 16 and gpu.pcie_link_gen_current.get() == 5
    # v13 gives thresholds relative to T.Limit only: kept as the margin, never turned into
    # absolute thresholds (T.Limit moves with load, see tests/fixtures/h200-live).
    assert gpu.temperature_tlimit_margin_c.get() == 48
    assert gpu.temperature_slowdown_c.state == "absent"
    assert gpu.clock_event_reasons.get() == 0x1  # "Active" idle, all else "Not Active"
    assert gpu.power_limit_default_w.get() == 700.0
    assert gpu.memory_reserved_bytes.get() == 616 * 1024 * 1024
    assert gpu.recovery_action.get() == "none"
    assert gpu.retired_pages_pending.state == "not_supported"  # "N/A" on Hopper
    assert gpu.ecc_volatile_sram_uncorrected.get() == 0  # parity + secded summed
    assert gpu.compute_processes.get() == []


def test_v11_layout_and_faults():
    snap = nvidia_smi_xml.parse(V11.read_text(), str(V11))
    ok, bad = snap.gpus
    assert ok.temperature_slowdown_c.get() == 89  # absolute threshold of the old DTD
    assert ok.clock_event_reasons.get() == 0x1
    assert ok.ecc_aggregate_corrected.get() == 12
    assert ok.memory_reserved_bytes.state == "not_supported"
    assert bad.pcie_link_width_current.get() == 8
    assert bad.clock_event_reasons.get() == 0x8
    assert bad.ecc_volatile_uncorrected.get() == 1
    assert bad.retired_pages_pending.get() is True
    assert bad.power_draw_w.get() == pytest.approx(395.1)
    assert bad.temperature_c.state == "error"
    assert "[Unknown Error]" in (bad.temperature_c.error or "")
    [proc] = bad.compute_processes.get()
    assert (proc.pid, proc.name, proc.used_memory_bytes) == (4242, "python3", 39990 * 1024**2)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("<nvidia_smi_log><gpu>", "not well-formed XML"),
        ("<html></html>", "root element is <html>"),
    ],
)
def test_bad_xml(text, words):
    with pytest.raises(nvidia_smi_xml.XmlDumpError, match=words):
        nvidia_smi_xml.parse(text, "dump.xml")


def test_h200_dump_is_the_shared_fixture():
    # The copy in tests/ must stay the real dump from ../shared (no hand edits).
    assert "nvsmi_device_v13.dtd" in H200_XML.read_text()


H200X2_XML = FIXTURES / "h200x2" / "nvidia-smi-q.xml"


def test_h200_pair_fabric_clocks_memory_temperature_gsp():
    snap = nvidia_smi_xml.parse(H200X2_XML.read_text(), str(H200X2_XML))
    assert [g.pci_bus_id.get() for g in snap.gpus] == ["00000000:00:06.0", "00000000:00:07.0"]
    assert [g.memory_temperature_c.get() for g in snap.gpus] == [36, 37]
    for gpu in snap.gpus:
        assert gpu.fabric_state.get() == "completed"
        assert gpu.fabric_status.get() == "Success"
        assert gpu.fabric_clique_id.get() == 0
        assert (gpu.clock_sm_app_mhz.get(), gpu.clock_mem_app_mhz.get()) == (1980, 3201)
        assert (gpu.clock_sm_app_default_mhz.get(), gpu.clock_mem_app_default_mhz.get()) \
            == (1980, 3201)
        assert gpu.gsp_firmware_version.get() == "580.159.04"
        assert (gpu.mig_mode_current.get(), gpu.mig_mode_pending.get()) == (False, False)
        # v13 gives the memory maximum relative to T.Limit only: no absolute value.
        assert gpu.memory_temperature_max_c.state == "absent"
        # per-link NVLink and P2P are not in the dump: absent, never invented
        assert gpu.nvlink_links.state == "absent" and gpu.p2p_status.state == "absent"


def test_fabric_states_and_older_memory_threshold():
    text = H200X2_XML.read_text()
    in_progress = text.replace("<state>Completed</state>", "<state>In Progress</state>", 1) \
        .replace("<status>Success</status>", "<status>N/A</status>", 1) \
        .replace("<memory_temp>36 C</memory_temp>",
                 "<memory_temp>36 C</memory_temp><gpu_temp_max_mem_threshold>95 C"
                 "</gpu_temp_max_mem_threshold>", 1)
    gpu = nvidia_smi_xml.parse(in_progress).gpus[0]
    assert gpu.fabric_state.get() == "in_progress"
    assert gpu.fabric_status.state == "not_supported"
    assert gpu.memory_temperature_max_c.get() == 95
    bogus = text.replace("<state>Completed</state>", "<state>Sideways</state>", 1)
    assert nvidia_smi_xml.parse(bogus).gpus[0].fabric_state.state == "error"
    no_fabric = nvidia_smi_xml.parse(text.replace("<state>Completed</state>", "<state>N/A</state>"))
    assert no_fabric.gpus[0].fabric_state.state == "not_supported"
