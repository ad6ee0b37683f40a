"""``failslow bench whatif``: the what-if analysis (what-if paper §3.2-§5) at scale.

Main figure: a 4096-worker job (dp 128 x pp 32, 1F1B, 16 micro-batches, 10 steps; one rank
computes 1.8x slower) simulated with :mod:`failslow.simulator`; we time reading its ``span``
and ``coll`` rows into OpDuration tensors, then the full analysis with the exact per-worker
slowdown S_w (one simulated variant per worker) and with only the paper's DP/PP
approximation. Scaling: the analysis alone on synthetic OpDuration tensors from 64 to 16384
workers. ``--scale`` shrinks (< 1) or grows the job and the scaling range.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from failslow.whatif.analysis import Options, analyze_ops, build_ops
from failslow.whatif.ops import BASE_KINDS, OpTrace
from failslow.whatif.sim import Plan, Variants

#: (pp, dp) of the scaling series: 64 ... 16384 workers
SERIES = ((4, 16), (8, 32), (16, 64), (32, 128), (64, 256))


def synthetic_ops(pp: int, dp: int, microbatches: int = 16, steps: int = 10,
                  seed: int = 0) -> OpTrace:
    """OpDuration tensors of a 1F1B job with log-normal noise, a 15 % heavier last stage and
    one worker 1.8x slower; the actual step time is set to the simulated original."""
    from failslow.simulator.schedule import BWD, DPSYNC, FWD, OPT, P2P, build_program

    rng = np.random.default_rng(seed)
    S, M, P, D = steps, microbatches, pp, dp
    stage_f = np.ones(P)
    stage_f[-1] = 1.15
    slow = np.ones((P, D))
    slow[P // 2, D // 3] = 1.8

    def noisy(base: float, n_idx: int, sigma: float) -> np.ndarray:
        return base * np.exp(sigma * rng.standard_normal((S, n_idx, P, D)))

    dur = {
        "forward-compute": noisy(0.008, M, 0.03) * stage_f[:, None] * slow,
        "backward-compute": noisy(0.016, M, 0.03) * stage_f[:, None] * slow,
        "params-sync": noisy(0.03, 1, 0.03), "grads-sync": noisy(0.03, 1, 0.03),
        "optimizer": noisy(0.004, 1, 0.02),
    }
    for name in ("forward-send", "forward-recv", "backward-send", "backward-recv"):
        dur[name] = noisy(0.0007, M, 0.05)
    compute = {FWD: "forward-compute", BWD: "backward-compute", OPT: "optimizer"}
    programs = []
    for p in range(P):
        prog: list[tuple[tuple[str, int], ...]] = []
        for st in build_program("1f1b", p, P, M):
            if st.kind == DPSYNC:
                prog.append((("params-sync" if st.dp_op == "allgather" else "grads-sync", 0),))
            elif st.kind == P2P:
                prog.append(tuple((("backward-" if o.grad else "forward-")
                                   + ("send" if o.send else "recv"), o.mb) for o in st.ops))
            else:
                prog.append(((compute[st.kind], max(st.mb, 0)),))
        programs.append(prog)
    ranks = np.arange(P * D).reshape(P, D)
    ops = OpTrace(steps=np.arange(S), pp=P, dp=D, kinds={n: BASE_KINDS[n] for n in dur},
                  dur=dur, parts={}, programs=programs, actual=np.ones(S),
                  ranks=ranks, members=[[[int(r)] for r in row] for row in ranks],
                  source="synthetic")
    plan = Plan(ops)
    keep = np.ones((1, len(plan.kind_names), P, D), dtype=bool)
    ops.actual = plan.run(Variants(keep), {n: np.zeros(S) for n in dur})[0]
    return ops


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def bench_whatif(args: argparse.Namespace) -> dict[str, Any]:
    from failslow.simulator import scenario_from_dict, simulate

    scale = float(getattr(args, "scale", 1.0) or 1.0)
    dp = max(2, round(128 * scale))
    pp = 32 if scale >= 0.25 else 4
    slow_rank = (pp // 2) * dp + dp // 3
    sc = scenario_from_dict({
        "job": "whatif-bench", "parallel": {"tp": 1, "pp": pp, "dp": dp, "cp": 1},
        "microbatches": 16, "schedule": "1f1b", "iterations": 10,
        "sampling": {"progress_ms": 0, "link_ms": 0, "gpu_ms": 0},
        "faults": [{"cause": "compute", "ranks": [slow_rank], "severity": 1.8}]})
    sim_s, res = _timed(lambda: simulate(sc, seed=0))
    tab_s, tables = _timed(lambda: {k: res.tables[k] for k in ("span", "coll")})
    ingest_s, ops = _timed(lambda: build_ops(tables, res.meta))
    exact_s, r = _timed(lambda: analyze_ops(ops, Options(exact_workers=True)))
    approx_s, ra = _timed(lambda: analyze_ops(ops, Options(exact_workers=False)))
    rows = sum(t.num_rows for t in tables.values())
    out: dict[str, Any] = {
        "workers": pp * dp, "pp": pp, "dp": dp, "microbatches": 16, "steps": int(ops.steps.size),
        "rows": rows,
        "simulate_trace_seconds": round(sim_s + tab_s, 3),
        "ingest_seconds": round(ingest_s, 3),
        "ingest_rows_per_s": round(rows / ingest_s),
        "analysis_exact_seconds": round(exact_s, 3),
        "analysis_approx_seconds": round(approx_s, 3),
        "seconds": round(ingest_s + exact_s, 3),
        "slowdown": round(r["slowdown"], 4),
        "discrepancy": round(r["discrepancy"], 5),
        "top_worker": r["workers"][0]["rank"],
        "top_worker_approx": ra["workers"][0]["rank"],
        "injected_rank": slow_rank,
        "M_W": round(r["M_W"], 4),
        "M_S": round(r["M_S"], 4),
    }
    limit = 16384 * max(scale, 1 / 256)
    for spp, sdp in SERIES:
        w = spp * sdp
        if w > limit:
            break
        syn = synthetic_ops(spp, sdp)
        te, _ = _timed(partial(analyze_ops, syn, Options(exact_workers=True)))
        ta, _ = _timed(partial(analyze_ops, syn, Options(exact_workers=False)))
        out[f"scaling_{w}_exact_seconds"] = round(te, 3)
        out[f"scaling_{w}_approx_seconds"] = round(ta, 3)
    return out


BENCHMARKS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "whatif": bench_whatif,
}
