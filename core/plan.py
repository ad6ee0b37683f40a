"""`failslow plan`: mitigation plans (Greyhound §5)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

from failslow.detectors.microbatches import allocate_microbatches


def _times(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--times: not a comma-separated list of numbers: "
                                         f"{text!r}") from None


def _cmd_microbatches(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    try:
        alloc = allocate_microbatches(args.times, args.total, args.multiple_of)
    except ValueError as e:
        print(f"failslow plan microbatches: {e}")
        return 2
    solve_ms = (time.perf_counter() - started) * 1e3
    even = args.total / len(args.times)
    doc = {"m": alloc.m, "max_time": alloc.max_time, "solve_ms": solve_ms,
           "even_split_max_time": float(np.max(np.asarray(args.times) * even))}
    if args.json:
        print(json.dumps(doc))
    else:
        print(f"micro-batches per DP group: {' '.join(map(str, alloc.m))}")
        print(f"slowest group time: {alloc.max_time:.6g} (even split: "
              f"{doc['even_split_max_time']:.6g}); solved in {solve_ms:.2f} ms")
    return 0


def add_parser(sub: Any) -> None:
    plan = sub.add_parser("plan", help="compute a mitigation plan",
                          description="Compute mitigation plans (Greyhound §5).")
    plan_sub = plan.add_subparsers(dest="plan", metavar="PLAN", required=True)
    mb = plan_sub.add_parser(
        "microbatches", help="re-balance micro-batches across DP groups (S2)",
        description="Integer micro-batch counts per DP group, each >= 1 (or a multiple of "
                    "--multiple-of), summing to --total, minimizing the slowest group's time.")
    mb.add_argument("--times", type=_times, required=True,
                    help="per-micro-batch time of each DP group, comma-separated")
    mb.add_argument("--total", type=int, required=True, help="micro-batches in all (M)")
    mb.add_argument("--multiple-of", type=int, default=1, metavar="P",
                    help="every count a multiple of P (e.g. the pipeline depth for 1F1B)")
    mb.add_argument("--json", action="store_true", help="print one JSON object")
    mb.set_defaults(func=_cmd_microbatches)


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
