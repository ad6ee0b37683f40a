"""``failslow bench plan-microbatches``: the S2 micro-batch solver's speed against the textbook
greedy (:func:`failslow.mitigation.microbatches.allocate_microbatches`)."""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from failslow.mitigation.microbatches import allocate_microbatches


def _greedy_baseline(times: np.ndarray, total: int) -> float:
    """Textbook greedy (one heap step per micro-batch, O(M log n)): the baseline."""
    import heapq

    m = [1] * len(times)
    heap = [(2 * t, i) for i, t in enumerate(times.tolist())]
    heapq.heapify(heap)
    for _ in range(total - len(times)):
        _, i = heapq.heappop(heap)
        m[i] += 1
        heapq.heappush(heap, ((m[i] + 1) * times[i], i))
    return float(max(mi * ti for mi, ti in zip(m, times.tolist(), strict=True)))


def _bench_microbatches(args: argparse.Namespace) -> dict[str, Any]:
    """Solve time at 512 and 16384 DP groups (8 micro-batches each), against the greedy."""
    rng = np.random.default_rng(7)
    figures: dict[str, Any] = {}
    for groups in (512, 16384):
        groups = max(4, int(groups * args.scale))
        times = rng.uniform(0.9, 1.1, groups)
        times[: max(1, groups // 100)] *= 1.8
        total = groups * 8
        runs = []
        for _ in range(5):
            started = time.perf_counter()
            alloc = allocate_microbatches(times, total)
            runs.append(time.perf_counter() - started)
        started = time.perf_counter()
        greedy = _greedy_baseline(times, total)
        greedy_s = time.perf_counter() - started
        if abs(greedy - alloc.max_time) > 1e-9 * greedy:
            raise AssertionError("solver and greedy baseline disagree")
        figures[f"groups_{groups}_solve_ms"] = round(min(runs) * 1e3, 3)
        figures[f"groups_{groups}_greedy_ms"] = round(greedy_s * 1e3, 3)
        figures[f"groups_{groups}_speedup_vs_greedy"] = round(greedy_s / min(runs), 1)
    return figures


BENCHMARKS = {"plan-microbatches": _bench_microbatches}
