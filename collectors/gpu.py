"""GPU sampler of the node agent: NVML clocks, temperature, power, utilization, throttle reasons.

Greyhound (greyhound.md §6) and MegaTrace (megatrace.md §III-B) correlate communication
slowdowns with device state: a thermally throttled GPU is a compute straggler. One row per
device and sample, the ``gpu`` kind of the event contract (events.md).

Without ``pynvml`` or without a GPU the collector reports itself *unavailable* (no data), which
the agent keeps apart from a collector that *failed* (an error while sampling), in the manner of
Prometheus node_exporter's per-collector success metric.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from typing import Any

import pyarrow as pa

from failslow import events

__all__ = ["GpuCollector"]


class GpuCollector:
    """Samples every NVML device on the node; ``available`` is False without NVML or GPUs."""

    name = "gpu"

    def __init__(self, job: str, node: str, rank_of_gpu: dict[int, int] | None = None) -> None:
        self.job, self.node = job, node
        self.rank_of_gpu = rank_of_gpu or {}
        self.reason = ""
        self._nvml: Any = None
        self._handles: list[Any] = []
        try:
            with warnings.catch_warnings():  # pynvml warns that it is deprecated
                warnings.simplefilter("ignore", FutureWarning)
                import pynvml  # type: ignore[import-untyped,unused-ignore]

            pynvml.nvmlInit()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                             for i in range(pynvml.nvmlDeviceGetCount())]
            self._nvml = pynvml
            if not self._handles:
                self.reason = "no GPU"
        except ImportError:
            self.reason = "pynvml not installed"
        except Exception as e:  # NVMLError_LibraryNotFound, driver not loaded, ...
            self.reason = f"NVML unavailable: {type(e).__name__}"

    @property
    def available(self) -> bool:
        return self._nvml is not None and bool(self._handles)

    def sample(self, now_ns: int | None = None) -> dict[str, pa.Table]:
        """One row per device (raises on an NVML error: the agent counts it as a failure)."""
        if not self.available:
            return {}
        nv = self._nvml
        t = now_ns or time.time_ns()
        rows = []
        for i, h in enumerate(self._handles):
            util = nv.nvmlDeviceGetUtilizationRates(h)
            rows.append({
                "job": self.job, "node": self.node, "rank": self.rank_of_gpu.get(i), "gpu": i,
                "t": t, "sm_clock_mhz": int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                "mem_clock_mhz": int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
                "temp_c": int(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
                "power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
                "util_pct": int(util.gpu),
                "throttle_reasons": int(nv.nvmlDeviceGetCurrentClocksThrottleReasons(h)),
            })
        return {"gpu": events.from_rows("gpu", rows)}

    def close(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(Exception):  # shutting down
                self._nvml.nvmlShutdown()
            self._nvml = None
