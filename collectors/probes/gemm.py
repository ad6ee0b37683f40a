"""``gemm``: one GPU's (here: the CPU's) matrix-multiply time, Greyhound's compute validation.

A fixed-size square multiply run ``repeats`` times after one warm-up, the median kept. The
runner compares it with the same rank's earlier runs and with its peers' (baseline_ns).

- CPU (numpy, float32, one core: ``einsum`` without BLAS threads, whose wake-ups on a shared
  node would measure the scheduler rather than the core): what this machine can test; a
  CPU-contention straggler (Greyhound's case 1) slows it.
- GPU (``torch.cuda``, float16, CUDA events around the multiply on the rank's device),
  selected when CUDA is present (``device="auto"``). Verify on a GPU node:
  ``python -c "from failslow.collectors.probes.gemm import GemmProbe; print(GemmProbe(
  device='cuda').time_once())"`` gives a few ms at n=4096 on an A100; with the clocks locked
  low (``nvidia-smi -lgc 300``) it grows several-fold, which the probe must report as slow.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import numpy as np

from failslow.collectors.probes.base import Deadline, ProbeFailed, ProbeTimeout
from failslow.engine.probes import ProbeRequest

__all__ = ["GemmProbe", "cuda_present"]


def cuda_present() -> bool:
    """A GPU driver is there (checked without importing torch)."""
    return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl")


class GemmProbe:
    """Median time of ``repeats`` ``n x n`` multiplies (module docstring). ``device``:
    ``cpu``, ``cuda`` or ``auto``; ``gpu_of(rank)``: the CUDA device of a local rank."""

    kind = "gemm"

    def __init__(self, n: int = 256, repeats: int = 5, device: str = "auto",
                 gpu_of: Any = None) -> None:
        self.n = n
        self.repeats = repeats
        self.device = ("cuda" if cuda_present() else "cpu") if device == "auto" else device
        self.gpu_of = gpu_of or (lambda rank: 0)
        self._cpu: tuple[np.ndarray, np.ndarray] | None = None

    def _time_cpu(self) -> int:
        if self._cpu is None:
            rng = np.random.default_rng(0)
            self._cpu = (rng.random((self.n, self.n), dtype=np.float32),
                         rng.random((self.n, self.n), dtype=np.float32))
        a, b = self._cpu
        t0 = time.perf_counter_ns()
        np.einsum("ij,jk->ik", a, b, optimize=False)
        return time.perf_counter_ns() - t0

    def _time_cuda(self, rank: int) -> int:
        import torch

        dev = torch.device("cuda", int(self.gpu_of(rank)))
        a = torch.randn(self.n, self.n, device=dev, dtype=torch.float16)
        b = torch.randn(self.n, self.n, device=dev, dtype=torch.float16)
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        torch.matmul(a, b)
        end.record()
        end.synchronize()
        return int(start.elapsed_time(end) * 1e6)

    def time_once(self, rank: int = 0) -> int:
        return self._time_cuda(rank) if self.device == "cuda" else self._time_cpu()

    def measure(self, request: ProbeRequest, deadline: Deadline) -> tuple[int, int | None]:
        times: list[int] = []
        try:
            deadline.check("warm-up")
            self.time_once(request.rank)
            for _ in range(self.repeats):
                deadline.check(f"repetition {len(times) + 1} of {self.repeats}")
                times.append(self.time_once(request.rank))
        except ProbeTimeout:
            raise
        except Exception as e:  # noqa: BLE001 - a GPU error is a failed probe
            raise ProbeFailed(f"gemm on {self.device}: {type(e).__name__}: {e}") from e
        return int(statistics.median(times)), None
