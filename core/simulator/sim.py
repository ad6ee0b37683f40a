"""``simulate``: run a scenario and collect its trace tables and ground truth."""

from __future__ import annotations

import copy
import logging
import time
from pathlib import Path

from failslow.simulator.engine import Engine
from failslow.simulator.output import SimResult, TraceBuilder, build_truth, job_meta
from failslow.simulator.scenario import Scenario, load_scenario, validate

log = logging.getLogger(__name__)

def simulate(scenario: Scenario | str | Path, seed: int = 0) -> SimResult:
    """Simulate ``scenario`` (a :class:`Scenario`, a preset name or a scenario file).

    Deterministic: the same scenario and seed give identical tables and truth.
    """
    sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    validate(sc, sc.name)
    t_start = time.perf_counter()
    eng = Engine(sc, seed)
    eng.run()
    t_sim = time.perf_counter() - t_start

    def counterfactual() -> Engine:
        healthy = copy.deepcopy(sc)
        healthy.faults = []
        cf = Engine(healthy, seed, record=False)
        cf.run()
        return cf

    truth, tstats = build_truth(eng, counterfactual)
    for i in tstats["unobserved_faults"]:
        log.warning("%s: fault %d (%s) never took effect within %d iterations; it is not in "
                    "the truth", sc.name, i, sc.faults[i].cause, eng.iterations_run)
    builder = TraceBuilder(eng, seed)
    stats = {
        "ranks": eng.topo.world,
        "iterations": eng.iterations_run,
        "operations": len(eng.rec.meta) * eng.S,
        "simulate_seconds": round(t_sim, 3),
        "hung": builder.hung,
        **tstats,
    }
    return SimResult(scenario=sc, seed=seed, meta=job_meta(eng), truth=truth, stats=stats,
                     builder=builder)
