"""NVML GPM (GPU performance monitoring; Hopper and later): how much of the GPU a job fills over a window.

Not only whether some kernel was running: two GPM samples bracket the window, and nvmlGpmMetricsGet gives percentages.
Where the GPU or driver has no GPM, start() says why and returns None."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# name -> (NVML_GPM_METRIC_* id, what it measures); every figure is a percentage of the whole GPU
METRICS = {
    "sm_active": (2, "SM activity: share of SM cycles with at least one warp resident"),
    "sm_occupancy": (3, "SM occupancy: resident warps as a share of the most the SMs can hold"),
    "tensor_active": (5, "tensor activity: share of cycles any tensor pipe was busy"),
    "dram_active": (10, "DRAM activity: share of the peak memory bandwidth used"),
}


@dataclass
class GpmWindow:
    handle: Any
    first: Any
    note: str = ""
    _nvml: Any = field(default=None, repr=False)

    def stop(self) -> dict[str, float] | None:
        """Take the second sample; the metrics over the window in percent (None with .note on failure)."""
        nv = self._nvml
        second = None
        try:
            second = nv.nvmlGpmSampleAlloc()
            nv.nvmlGpmSampleGet(self.handle, second)
            get = nv.c_nvmlGpmMetricsGet_t()
            get.version = nv.NVML_GPM_METRICS_GET_VERSION
            get.numMetrics = len(METRICS)
            get.sample1, get.sample2 = self.first, second
            for i, (metric_id, _) in enumerate(METRICS.values()):
                get.metrics[i].metricId = metric_id
            nv.nvmlGpmMetricsGet(get)
            out = {}
            for i, name in enumerate(METRICS):
                if get.metrics[i].nvmlReturn == 0:
                    out[name] = float(get.metrics[i].value)
            return out or None
        except Exception as exc:  # an NVML error here means no GPM figures, never a failed run
            self.note = f"GPM read failed: {exc or type(exc).__name__}"
            return None
        finally:
            for s in (self.first, second):
                if s is not None:
                    try:
                        nv.nvmlGpmSampleFree(s)
                    except Exception:
                        pass


def start(index: int) -> tuple[GpmWindow | None, str]:
    """Open a GPM window on GPU `index`: (window, "") or (None, why GPM is not available here)."""
    try:
        import pynvml as nv

        nv.nvmlInit()
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        if not nv.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
            return None, "this GPU has no GPM (NVML GPM needs Hopper or later)"
        first = nv.nvmlGpmSampleAlloc()
        nv.nvmlGpmSampleGet(handle, first)
        return GpmWindow(handle, first, _nvml=nv), ""
    except Exception as exc:
        return None, f"NVML GPM not available here: {exc or type(exc).__name__}"
