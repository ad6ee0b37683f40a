"""``failslow bench simulate``: simulate and write the 4096-rank preset (``large``: tp8 pp8
dp64, 50 iterations) and, as the in-process baseline, the 64-rank ``default`` preset."""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from typing import Any

from failslow.simulator.output import write_sim
from failslow.simulator.scenario import Scenario, preset
from failslow.simulator.sim import simulate


def _run(sc: Scenario) -> tuple[float, float, float, int, int]:
    """Simulate and write Parquet: (total s, simulate s, write s, rows, iterations)."""
    with tempfile.TemporaryDirectory(prefix="failslow-bench-") as tmp:
        t0 = time.perf_counter()
        result = simulate(sc, seed=0)
        t1 = time.perf_counter()
        write_sim(result, tmp, "parquet")
        t2 = time.perf_counter()
    return t2 - t0, t1 - t0, t2 - t1, int(result.stats["rows"]), int(result.stats["iterations"])


def _large(scale: float) -> Scenario:
    sc = preset("large")
    dp = max(1, min(64, round(64 * scale)))
    sc.parallel.dp = dp
    sc.faults[0].ranks = [sc.rank_of(tp=4, dp=min(14, dp - 1), pp=7)]
    return sc


def bench_simulate(args: argparse.Namespace) -> dict[str, Any]:
    scale = float(getattr(args, "scale", 1.0) or 1.0)
    base_s, _, _, base_rows, _ = _run(preset("default"))
    sc = _large(scale)
    seconds, sim_s, write_s, rows, iterations = _run(sc)
    return {
        "ranks": sc.world_size,
        "iterations": iterations,
        "rows": rows,
        "seconds": round(seconds, 3),
        "simulate_seconds": round(sim_s, 3),
        "write_seconds": round(write_s, 3),
        "rows_per_s": round(rows / seconds),
        "baseline_64rank_seconds": round(base_s, 3),
        "baseline_rows_per_s": round(base_rows / base_s),
        "ratio": round(seconds / base_s, 2),
        "scaling_efficiency": round((rows / seconds) / (base_rows / base_s), 3),
    }


BENCHMARKS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "simulate": bench_simulate,
}
