"""S2 of Greyhound's mitigation (§5.2): re-balance micro-batches across DP groups.

Choose integers m_i >= 1 with sum m_i = M that minimize max_i m_i * t_i, where t_i is DP
group i's time per micro-batch. Greyhound solves this as a QP with cvxpy (36 s at 512
groups); it has an exact combinatorial solution: the optimal makespan T* is the larger of
max_i t_i and the M-th smallest element of the multiset {k * t_i : k >= 1, all i}, because
floor(T / t_i) is the number of group i's elements <= T. We find it from the continuous
bound T >= M / sum(1/t_i), which leaves at most n elements to pick with a heap, so the
whole solve is O(n log n).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Allocation:
    m: list[int]          # micro-batches per DP group
    max_time: float       # max_i m_i * t_i, the optimal makespan


def _count_upto(t: np.ndarray, bound: float) -> np.ndarray:
    """Exact floor(bound / t_i) for float products: #{k >= 1 : k * t_i <= bound}."""
    k = np.floor(bound / t)
    k += (k + 1) * t <= bound
    k -= k * t > bound
    return k.astype(np.int64)


def allocate_microbatches(times: np.ndarray | list[float], total: int,
                          multiple_of: int = 1) -> Allocation:
    """Optimal integer micro-batch counts per DP group (see module docstring).

    ``multiple_of`` = P restricts every m_i to a multiple of P (1F1B with P stages wants
    whole rounds); then ``total`` must be a multiple of P.
    """
    t = np.asarray(times, dtype=np.float64)
    if t.ndim != 1 or t.size == 0:
        raise ValueError("times: need a non-empty list of per-micro-batch times")
    if not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise ValueError("times: every time must be a positive finite number")
    if multiple_of < 1:
        raise ValueError("multiple_of must be >= 1")
    if total % multiple_of:
        raise ValueError(f"total {total} is not a multiple of {multiple_of}")
    units = total // multiple_of
    n = t.size
    if units < n:
        raise ValueError(f"total {total} cannot give every one of {n} groups at least "
                         f"{multiple_of} micro-batch(es)")
    step = t * multiple_of                      # time of one unit of P micro-batches
    floor_value = float(step.max())             # every group gets at least one unit
    lower = units / float(np.sum(1.0 / step))   # continuous bound: T* >= lower
    start = np.maximum(_count_upto(step, np.nextafter(lower, 0.0)), 0)
    need = units - int(start.sum())
    if need <= 0:
        best = lower
    else:
        heap = [(float((k + 1) * s), i) for i, (k, s) in enumerate(zip(start, step, strict=True))]
        heapq.heapify(heap)
        best = lower
        for _ in range(need):
            best, i = heapq.heappop(heap)
            start[i] += 1
            heapq.heappush(heap, (float((start[i] + 1) * step[i]), i))
    makespan = max(best, floor_value)
    k = np.maximum(_count_upto(step, makespan), 1)
    excess = int(k.sum()) - units
    if excess > 0:                               # ties at T*: take units back from the
        order = np.argsort(-(k * step), kind="stable")  # groups with the largest load
        for i in order:
            take = min(excess, int(k[i]) - 1)
            k[i] -= take
            excess -= take
            if excess == 0:
                break
    m = k * multiple_of
    return Allocation(m=[int(x) for x in m], max_time=float(np.max(m * t)))
