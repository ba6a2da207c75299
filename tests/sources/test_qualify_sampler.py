"""The qualify sampler (gpuguard/sources/qualify/sampler.py): its worker against the fake
NVML (in a process of its own: pynvml finds the fake through LD_LIBRARY_PATH, which the
loader reads once at start), then summarise(), series() and thin() on synthetic samples."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuguard.model import clock_events
from gpuguard.sources.qualify import sampler
from gpuguard.sources.qualify.sampler import EccRead, Sample, Samples, Xid
from tests.conftest import REPO

# Runs the sampler for `run` seconds (creating `wedge` after `wedge_at` s, to hang a call of
# the fake mid-run), stops it and hands back (Samples, seconds stop() took).
DRIVER = """
import json, pickle, sys, time
from gpuguard.sources.qualify import sampler
o = json.loads(sys.argv[1])
s = sampler.start(o["gpus"], o["interval"], deadline_s=o["deadline"],
                  max_samples=o["max_samples"], stall_s=o["stall"])
if o["wedge"]:
    time.sleep(o["wedge_at"])
    open(o["wedge"], "w").close()
    time.sleep(o["run"] - o["wedge_at"])
else:
    time.sleep(o["run"])
began = time.monotonic()
got = s.stop()
sys.stdout.buffer.write(pickle.dumps((got, time.monotonic() - began)))
"""


def sample_run(fake_env: Any, run: float, gpus: tuple[int, ...] = (0,), interval: float = 0.05,
               deadline: float = 30.0, max_samples: int = sampler.MAX_SAMPLES,
               stall: float | None = None, wedge: Path | None = None, wedge_at: float = 0.0,
               **switches: str | int) -> tuple[Samples, float]:
    opts = {"gpus": list(gpus), "interval": interval, "deadline": deadline, "stall": stall,
            "max_samples": max_samples, "run": run, "wedge": str(wedge) if wedge else None,
            "wedge_at": wedge_at}
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO),
           **fake_env(gpus=max(gpus) + 1, **switches)}
    proc = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(opts)], env=env, cwd=REPO,
                          capture_output=True, timeout=run + 30, check=False)
    assert proc.returncode == 0, proc.stderr.decode()
    got, took = pickle.loads(proc.stdout)
    assert isinstance(got, Samples)
    return got, took


def whole(got: Samples, gpu: int, ramp_s: float = 0.0) -> dict[str, Any]:
    return sampler.summarise(got, gpu, (got.started, got.stopped), ramp_s=ramp_s)


# --- the worker, on the fake NVML --------------------------------------------------


def test_samples_come_at_the_interval_with_the_gpus_values(fake_env):
    got, took = sample_run(fake_env, 1.2, gpus=(0, 1), load=1, power_mw=612345,
                           clock_sm=1755, clock_mem=2619, temp=61, mem_temp=77)
    assert got.error is None and got.gpu_errors == {}, (got.error, got.gpu_errors)
    assert took < 1.0
    for gpu in (0, 1):
        kept = got.samples[gpu]
        assert 8 <= len(kept) <= 25, len(kept)  # 1.2 s at 50 ms, less the start
        # the worker's CLOCK_MONOTONIC is the parent's: its times lie inside the run's
        assert got.started < kept[0].mono < kept[-1].mono < got.stopped
        assert kept[0].mono - got.started < 1.0  # fork, import pynvml, nvmlInit
        assert {(s.power_w, s.power_limit_w, s.sm_mhz, s.mem_mhz, s.gpu_temp_c, s.hbm_temp_c,
                 s.reasons) for s in kept} == {(612.345, 700.0, 1755, 2619, 61, 77, 0x4)}
        # a fixed grid from the first sample: late ticks are skipped, never shift the rest
        offsets = sorted(abs((s.mono - kept[0].mono) / 0.05 - round((s.mono - kept[0].mono)
                                                                     / 0.05)) for s in kept)
        assert offsets[len(offsets) // 2] < 0.1, offsets
        assert whole(got, gpu)["interval_ms"] == pytest.approx(50, abs=5)
        reads = got.ecc[gpu]  # every ~1 s, the first with the first sample
        assert 1 <= len(reads) <= 3 and reads[0].mono == kept[0].mono
        assert (reads[0].corrected, reads[0].uncorrected, reads[0].remap_pending,
                reads[0].remap_failed, reads[0].hbm_temp_limit_c) == (0, 0, False, False, 95)
    assert got.xids == [] and got.decimated == {0: 1, 1: 1}
    assert any("no NVML Xid events" in note for note in got.notes)


def test_a_slow_interval_is_sampled_to_the_end(fake_env):
    got, _ = sample_run(fake_env, 1.5, interval=0.4, load=1)  # the pipe is quiet for 0.4 s
    assert [round(s.mono - got.samples[0][0].mono, 1) for s in got.samples[0]] == \
        [0.0, 0.4, 0.8, 1.2][:len(got.samples[0])]
    assert len(got.samples[0]) >= 3 and got.error is None


def test_a_call_that_fails_is_none_not_the_end_of_sampling(fake_env):
    """Without FAKE_NVML_LOAD the fake has none of the load calls (FunctionNotFound)."""
    got, _ = sample_run(fake_env, 0.5, temp=50)
    assert got.error is None
    first = got.samples[0][0]
    assert (first.power_w, first.sm_mhz, first.reasons, first.gpu_temp_c) == (None, None, None, 50)
    summary = whole(got, 0)
    assert summary["power_share"] is None and summary["power_w_median"] is None
    assert summary["reasons"] is None  # never read: no counts of zero
    assert summary["sm_clock_mhz"] is None and summary["gpu_temp_c_max"] == 50
    assert summary["ecc"]["uncorrectable_new"] is None
    assert summary["ecc"]["remap_pending"] is None and summary["hbm_temp_limit_c"] == 95


def test_a_reason_appearing_mid_run_is_counted(fake_env):
    got, _ = sample_run(fake_env, 1.2, gpus=(0, 1), load=1, later_ms=500, later_gpu=1,
                        later_reasons=clock_events.HW_SLOWDOWN | clock_events.HW_THERMAL)
    hit, calm = whole(got, 1), whole(got, 0)
    assert 0 < hit["reasons"]["hw_slowdown"] < hit["samples"]
    assert hit["reasons"]["hw_thermal"] == hit["reasons"]["hw_slowdown"]
    assert hit["reasons"]["sw_power_cap"] == hit["samples"]
    assert hit["reasons"]["hw_power_brake"] == hit["reasons"]["sw_thermal"] == 0
    assert calm["reasons"]["hw_slowdown"] == 0
    assert calm["reasons"]["sw_power_cap"] == calm["samples"]
    first = next(s for s in got.samples[1] if s.reasons and s.reasons & clock_events.HW_SLOWDOWN)
    assert first.mono > got.samples[1][0].mono + 0.3  # it came later, as the fake said


def test_new_ecc_errors_a_pending_remap_and_an_xid_during_the_run(fake_env):
    got, _ = sample_run(fake_env, 3.0, gpus=(0, 1), load=1, ecc_corrected=10,
                        ecc_uncorrected=1, later_ms=1200, later_gpu=0, later_uncorrected=3,
                        later_corrected=5, later_remap_pending=1, xid=48)
    hit, calm = whole(got, 0), whole(got, 1)
    assert hit["ecc"] == {"uncorrectable_new": 3, "correctable_new": 5, "remap_pending": True,
                          "remap_pending_before": False, "remap_failed": False,
                          "remap_failed_before": False}
    assert hit["xids"] == [{"code": 48, "text": ""}]
    assert calm["ecc"]["uncorrectable_new"] == 0 and calm["ecc"]["remap_pending"] is False
    assert calm["xids"] == []
    [xid] = got.xids
    assert xid.gpu == 0 and xid.code == 48 and got.started < xid.mono < got.stopped


def test_a_call_hung_mid_run_is_named_and_the_other_gpu_sampled(fake_env, tmp_path):
    wedge = tmp_path / "wedged"  # the fake hangs GPU 1's power reading while it exists
    got, took = sample_run(fake_env, 1.6, gpus=(0, 1), stall=0.5, wedge=wedge, wedge_at=0.6,
                           load=1, hang="nvmlDeviceGetPowerUsage", hang_gpu=1,
                           hang_file=str(wedge))
    assert took < 2.0
    assert set(got.gpu_errors) == {1}
    why = got.gpu_errors[1]
    assert why.startswith("NVML did not answer: no sample for ") and \
        why.endswith("(in nvmlDeviceGetPowerUsage (GPU 1))"), why
    assert got.error == f"GPU 1: {why}"
    silent = float(why.split(" for ")[1].split(" s ")[0])  # since its last sample
    assert silent == pytest.approx(got.stopped - got.samples[1][-1].mono, abs=0.06)
    assert 0.5 < silent < 1.3
    assert got.samples[0][-1].mono > got.stopped - 0.2  # GPU 0 went on


def test_each_hung_gpu_is_named_with_its_own_call(fake_env, tmp_path):
    wedge = tmp_path / "wedged"
    got, _ = sample_run(fake_env, 1.2, gpus=(0, 1), stall=0.5, wedge=wedge, wedge_at=0.3,
                        hang="nvmlDeviceGetTemperature", hang_file=str(wedge))
    for gpu in (0, 1):
        assert got.gpu_errors[gpu].endswith(f"(in nvmlDeviceGetTemperature (GPU {gpu}))")
    assert got.error == f"GPU 0: {got.gpu_errors[0]}; GPU 1: {got.gpu_errors[1]}"


def test_nvml_hung_from_the_start_is_an_error_and_the_parent_returns(fake_env):
    began = time.monotonic()
    got, took = sample_run(fake_env, 1.0, stall=0.5, hang="nvmlInit")
    assert took < 2.0 and time.monotonic() - began < 15
    assert got.samples == {}
    assert got.gpu_errors[0].startswith("NVML did not answer: no sample came for ")
    assert "(in nvmlInit)" in got.gpu_errors[0] and got.error == f"GPU 0: {got.gpu_errors[0]}"


def test_a_worker_that_dies_in_a_call_is_reported(fake_env):
    got, took = sample_run(fake_env, 0.8, load=1, crash="nvmlDeviceGetClockInfo")
    assert took < 2.0
    assert got.error == "the NVML sampler died of SIGSEGV in nvmlDeviceGetClockInfo (GPU 0)"
    assert got.gpu_errors == {0: got.error}


def test_nvml_that_does_not_start_is_reported(fake_env):
    got, _ = sample_run(fake_env, 0.5, init_error=9)
    assert got.error == "nvmlInit failed: NVMLError_DriverNotLoaded: Driver Not Loaded"
    assert got.gpu_errors == {0: got.error} and got.samples == {}


def test_sampling_ends_at_the_deadline_without_an_error(fake_env):
    got, took = sample_run(fake_env, 1.5, deadline=0.6, load=1)
    assert got.error is None and got.gpu_errors == {}
    assert took < 1.0
    assert got.samples[0][-1].mono <= got.started + 0.6


def test_the_number_of_samples_kept_is_bounded(fake_env):
    got, _ = sample_run(fake_env, 1.6, interval=0.02, max_samples=16, load=1)
    kept = got.samples[0]
    assert len(kept) <= 16
    assert got.decimated[0] >= 4  # about 75 came
    said = [note for note in got.notes if note.startswith("GPU 0: ")]  # once per halving
    assert said == [f"GPU 0: 1 sample kept in {2 ** k}"
                    for k in range(1, got.decimated[0].bit_length())]
    assert kept[-1].mono - kept[0].mono > 1.0  # thinned, not cut: the whole run is there


def test_the_number_of_ecc_reads_kept_is_bounded_first_and_last_kept(fake_env):
    got, _ = sample_run(fake_env, 2.8, max_samples=2, load=1, later_ms=1500,
                        later_uncorrected=2)  # reads at about 0, 1 and 2 s
    first, last = got.ecc[0]
    assert last.mono - first.mono > 1.5
    assert whole(got, 0)["ecc"]["uncorrectable_new"] == 2


# --- thin(), summarise(), series(): pure -----------------------------------------------


def fill(count: int, cap: int, hot: dict[int, Sample] | None = None) -> tuple[list[Sample], int]:
    kept: list[Sample] = []
    stride = 1
    for seen in range(1, count + 1):
        sample = (hot or {}).get(seen, Sample(float(seen), reasons=0, gpu_temp_c=50))
        stride = sampler.thin(kept, sample, seen, stride, cap)
    return kept, stride


def test_thin_keeps_every_sample_under_the_cap():
    kept, stride = fill(7, 8)
    assert [s.mono for s in kept] == [1, 2, 3, 4, 5, 6, 7] and stride == 1


def test_thin_halves_at_the_cap_and_keeps_an_even_density():
    kept, stride = fill(8, 8)
    assert [s.mono for s in kept] == [1, 3, 5, 7] and stride == 2
    kept, stride = fill(64, 8)
    assert stride == 16 and len(kept) == 4
    assert [s.mono for s in kept] == [1, 17, 33, 49]  # the first of each group of 16


def test_thin_keeps_the_sample_the_rules_judge():
    slowdown = Sample(22.0, reasons=0x4 | clock_events.HW_SLOWDOWN, gpu_temp_c=50)
    sw_thermal = Sample(40.0, reasons=clock_events.SW_THERMAL, gpu_temp_c=50)
    hot_hbm, hot_gpu = Sample(50.0, hbm_temp_c=90), Sample(10.0, gpu_temp_c=85)
    kept, _ = fill(64, 8, {22: slowdown, 40: sw_thermal, 50: hot_hbm, 10: hot_gpu})
    assert kept == [hot_gpu, slowdown, sw_thermal, hot_hbm]  # one in each group of 16
    # sw power cap alone is no reason to keep one: the first of its group stays
    kept, _ = fill(8, 8, {2: Sample(2.0, reasons=clock_events.SW_POWER_CAP, gpu_temp_c=50)})
    assert [s.mono for s in kept] == [1, 3, 5, 7]
    # between two judged ones the hotter HBM, then the hotter GPU
    a, b = Sample(1.0, reasons=0x8, hbm_temp_c=70), Sample(2.0, reasons=0x8, hbm_temp_c=71)
    c, d = Sample(3.0, gpu_temp_c=60), Sample(4.0, gpu_temp_c=61)
    kept = []
    for seen, sample in enumerate((a, b, c, d), start=1):
        sampler.thin(kept, sample, seen, 1, 4)
    assert kept == [b, d]


def synthetic() -> Samples:
    """GPU 0 from t=9 to t=20 every second, window (10, 20), ramp 2: 10 and 11 are the ramp."""
    powers = {9: 999.0, 10: 100.0, 11: 100.0, 12: 600.0, 13: 690.0, 14: 610.0, 15: 680.0,
              16: 620.0, 17: 670.0, 18: 630.0, 19: 660.0, 20: 650.0}
    clocks = {9: 100, 10: 1980, 11: 1980, 12: 1400, 13: 1500, 14: 1410, 15: 1490, 16: 1420,
              17: 1480, 18: 1430, 19: 1470, 20: 1440}
    reasons = {9: clock_events.HW_THERMAL, 10: clock_events.HW_SLOWDOWN,
               12: clock_events.SW_POWER_CAP | clock_events.HW_POWER_BRAKE,
               13: clock_events.SW_POWER_CAP, 14: clock_events.SW_THERMAL}
    temps = {9: 99, 11: 85, 20: 70}
    samples = {0: [Sample(float(t), power_w=powers[t], power_limit_w=700.0, sm_mhz=clocks[t],
                          mem_mhz=3201 - (t == 15), gpu_temp_c=temps.get(t, 60),
                          hbm_temp_c=None if t < 19 else 80 + t, reasons=reasons.get(t, 0))
                   for t in range(9, 21)]}
    ecc = {0: [EccRead(5.0, corrected=None, uncorrected=1, remap_pending=False,
                       remap_failed=None, hbm_temp_limit_c=95),
               EccRead(15.0, corrected=None, uncorrected=2, remap_pending=None),
               EccRead(25.0, corrected=None, uncorrected=4, remap_pending=True,
                       hbm_temp_limit_c=94)]}
    xids = [Xid(15.0, 0, 79), Xid(15.5, 1, 48), Xid(26.0, 0, 64), Xid(3.0, 0, 13)]
    return Samples(interval_s=1.0, started=4.0, stopped=28.0, samples=samples, ecc=ecc,
                   xids=xids)


def test_summarise_is_the_specs_load_section():
    assert sampler.summarise(synthetic(), 0, (10.0, 20.0), ramp_s=2.0, run=(2.0, 24.0)) == {
        "samples": 11, "interval_ms": 1000.0,
        # the steady part only (12..20): the ramp's 100 W and the 999 W before it are out
        "power_w_median": 650.0, "power_w_max": 690.0, "power_limit_w": 700.0,
        "power_share": 0.9286,
        "sm_clock_mhz": {"min": 1400, "median": 1440, "max": 1500},
        "mem_clock_mhz": {"min": 3200, "median": 3201, "max": 3201},
        # the ramp's 85 C and its HW slowdown count; the 99 C and HW thermal before do not
        "gpu_temp_c_max": 85, "hbm_temp_c_max": 100, "hbm_temp_limit_c": 94,
        "reasons": {"hw_slowdown": 1, "hw_thermal": 0, "hw_power_brake": 1,
                    "sw_power_cap": 2, "sw_thermal": 1},
        # the run's reads (5, 15; not 25): 1 -> 2; pending: False before, none read after
        "ecc": {"uncorrectable_new": 1, "correctable_new": None, "remap_pending": False,
                "remap_pending_before": False, "remap_failed": None,
                "remap_failed_before": None},
        "xids": [{"code": 79, "text": ""}, {"code": 13, "text": ""}],
        "hours": round(22 / 3600, 6),
    }


def test_summarise_takes_the_whole_sampling_as_the_run_by_default():
    summary = sampler.summarise(synthetic(), 0, (10.0, 20.0))
    assert summary["power_w_median"] == 650.0  # the ramp is 2 s unless told (3 s: 655)
    assert summary["ecc"]["uncorrectable_new"] == 3
    assert summary["ecc"]["remap_pending"] is True
    assert summary["xids"] == [{"code": 79, "text": ""}, {"code": 64, "text": ""}]
    assert summary["hours"] == round(24 / 3600, 6)
    assert sampler.summarise(synthetic(), 1, (10.0, 20.0))["xids"] == [{"code": 48, "text": ""}]


def test_summarise_median_of_an_even_count_and_the_ramp_edge():
    got = Samples(interval_s=0.05, started=0.0, stopped=10.0, samples={0: [
        Sample(t * 0.05003, power_w=w, power_limit_w=800.0, sm_mhz=m)
        for t, w, m in ((0, 50.0, 900), (1, 600.001, 1001), (2, 700.0, 1002), (3, 710.0, 1010),
                        (4, 650.012, 1003))]})
    summary = sampler.summarise(got, 0, (0.0, 0.25), ramp_s=0.05003)  # 0.05003: past the ramp
    assert summary["power_w_median"] == 675.01 and summary["power_w_max"] == 710.0
    assert summary["power_share"] == round(675.006 / 800, 4)
    assert summary["sm_clock_mhz"] == {"min": 1001, "median": 1002, "max": 1010}
    assert summary["samples"] == 5 and summary["reasons"] is None
    assert summary["interval_ms"] == 50.0
    empty = sampler.summarise(got, 0, (20.0, 30.0))
    assert (empty["samples"], empty["interval_ms"], empty["power_share"],
            empty["sm_clock_mhz"], empty["gpu_temp_c_max"]) == (0, None, None, None, None)
    assert sampler.summarise(got, 3, (0.0, 4.0))["ecc"] == {
        "uncorrectable_new": None, "correctable_new": None, "remap_pending": None,
        "remap_pending_before": None, "remap_failed": None, "remap_failed_before": None}


def test_a_volatile_counter_that_drops_was_reset():
    got = Samples(interval_s=1.0, started=0.0, stopped=10.0, ecc={0: [
        EccRead(1.0, corrected=500, uncorrected=2), EccRead(2.0, corrected=7, uncorrected=2)]})
    assert sampler.summarise(got, 0, (0.0, 10.0))["ecc"]["correctable_new"] == 7
    assert sampler.summarise(got, 0, (0.0, 10.0))["ecc"]["uncorrectable_new"] == 0


def test_a_zero_power_limit_gives_no_share():
    got = Samples(interval_s=1.0, started=0.0, stopped=1.0,
                  samples={0: [Sample(0.5, power_w=100.0, power_limit_w=0.0)]})
    assert sampler.summarise(got, 0, (0.0, 1.0), ramp_s=0)["power_share"] is None
    got.stopped = got.started  # stopped as it started
    assert sampler.summarise(got, 0, (0.0, 1.0))["hours"] == 0.0


def test_series_for_a_chart():
    lines = sampler.series(synthetic(), 0)
    assert list(lines) == ["power_w", "sm_mhz", "mem_mhz", "gpu_temp_c", "hbm_temp_c"]
    assert all(len(points) == 12 for points in lines.values())
    assert lines["power_w"][:2] == [(0.0, 999.0), (1.0, 100.0)]
    assert lines["hbm_temp_c"][-3:] == [(9.0, None), (10.0, 99), (11.0, 100)]
    assert sampler.series(synthetic(), 0, origin=4.0004)["sm_mhz"][0] == (5.0, 100)
    assert sampler.series(synthetic(), 2) == {name: [] for name in sampler.SERIES}
