"""The GPU's state through NVML (nvidia-ml-py's `pynvml`): the SM clock around each timed
sample, and clocks, power limit, temperature and throttle reasons at the start and end of
a perf result. Without pynvml (or NVML) every reading is None and the result says why: a
figure is then not clock-checked, and the review shows that.
"""
from __future__ import annotations

import os

_REASONS = {   # nvmlClocksThrottleReason* bits (nvml.h), by name
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
    0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}


class Nvml:
    """One NVML handle for the GPU this process runs on (CUDA device 0 after
    CUDA_VISIBLE_DEVICES), matched by UUID."""

    def __init__(self):
        self.handle, self.why = None, None
        try:
            import pynvml
        except ImportError:
            self.why = "pynvml (nvidia-ml-py) is not installed: no clock readings"
            return
        self.nv = pynvml
        try:
            pynvml.nvmlInit()
            self.handle = self._handle()
        except Exception as exc:     # NVML missing, no permission: readings are None
            self.why = f"NVML unavailable: {exc}"
            self.handle = None

    def _handle(self):
        nv = self.nv
        uuid = None
        try:
            import torch
            u = getattr(torch.cuda.get_device_properties(0), "uuid", None)
            if u is not None:
                uuid = "GPU-" + str(u)
        except Exception:
            uuid = None
        visible = (os.environ.get("CUDA_VISIBLE_DEVICES") or "").split(",")[0].strip()
        if uuid:
            try:
                return nv.nvmlDeviceGetHandleByUUID(uuid)
            except Exception:
                pass
        if visible.startswith("GPU-"):
            return nv.nvmlDeviceGetHandleByUUID(visible)
        return nv.nvmlDeviceGetHandleByIndex(int(visible) if visible.isdigit() else 0)

    def _read(self, fn):
        """fn(pynvml, handle), or None without a handle or when NVML refuses the reading."""
        if self.handle is None:
            return None
        try:
            return fn(self.nv, self.handle)
        except Exception:
            return None

    def sm_clock(self) -> int | None:
        mhz = self._read(lambda nv, h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
        return None if mhz is None else int(mhz)

    def snapshot(self) -> dict:
        """Clocks (MHz), power (W), temperature (C) and the active throttle reasons now."""
        if self.handle is None:
            return {"available": False, "why": self.why}
        nv = self.nv
        reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons")
        out: dict = {"available": True, **{name: self._read(fn) for name, fn in {
            "sm_clock_mhz": lambda nv, h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            "mem_clock_mhz": lambda nv, h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
            "max_sm_clock_mhz": lambda nv, h: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
            "max_mem_clock_mhz": lambda nv, h: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM),
            "power_limit_w": lambda nv, h: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
            "power_w": lambda nv, h: nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "temperature_c": lambda nv, h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            "throttle_mask": lambda nv, h: int(reasons_fn(h)),
        }.items()}}
        mask = out.get("throttle_mask") or 0
        out["throttle_reasons"] = [name for bit, name in _REASONS.items() if mask & bit]
        return out
