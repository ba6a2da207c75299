"""NVML's clock event reasons (nvmlClocksEventReasons*, once "throttle reasons"): the one
table of their bits. The XML reader maps nvidia-smi's element names through it, the
checks and the history test bits with it, the metrics name them from it."""

from __future__ import annotations

# nvidia-smi -q -x element name -> bit (the same names the metrics use as `reason`).
BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clocks_setting": 0x100,
}
GPU_IDLE = BITS["gpu_idle"]
SW_POWER_CAP = BITS["sw_power_cap"]
HW_SLOWDOWN = BITS["hw_slowdown"]
SW_THERMAL = BITS["sw_thermal_slowdown"]
HW_THERMAL = BITS["hw_thermal_slowdown"]
HW_POWER_BRAKE = BITS["hw_power_brake_slowdown"]
# The board protecting itself: any of these is hardware slowdown.
HW_ANY = HW_SLOWDOWN | HW_THERMAL | HW_POWER_BRAKE
HW_NAMES = {HW_SLOWDOWN: "HW slowdown", HW_THERMAL: "HW thermal slowdown",
            HW_POWER_BRAKE: "HW power brake"}
# Exported as gpuguard_gpu_clock_event_reason{reason}: the ones an operator acts on. Idle
# (0x1) is normal and is left out: 8 series on an 8-GPU host that no panel or alert uses.
EXPORTED = ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
            "hw_power_brake_slowdown")
