"""S2 micro-batch allocation: exact against brute force, fast at scale."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import random

import numpy as np
import pytest

from failslow import cli
from failslow.mitigation.microbatches import allocate_microbatches


def brute_force(times: list[float], total: int, multiple_of: int = 1) -> float:
    n = len(times)
    best = float("inf")
    choices = range(multiple_of, total + 1, multiple_of)
    for m in itertools.product(choices, repeat=n):
        if sum(m) == total:
            best = min(best, max(mi * ti for mi, ti in zip(m, times, strict=True)))
    return best


@pytest.mark.parametrize("seed", range(300))
def test_optimal_against_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 4)
    multiple_of = rng.choice([1, 1, 2])
    total = multiple_of * rng.randint(n, 9)
    # integer-ish times make ties (several optimal answers) common
    times = [rng.choice([1.0, 2.0, 3.0, rng.uniform(0.5, 4.0)]) for _ in range(n)]
    alloc = allocate_microbatches(times, total, multiple_of)
    assert sum(alloc.m) == total
    assert all(m >= multiple_of and m % multiple_of == 0 for m in alloc.m)
    assert alloc.max_time == pytest.approx(brute_force(times, total, multiple_of), rel=1e-12)


def test_slow_group_gets_fewer_microbatches() -> None:
    alloc = allocate_microbatches([1.0, 1.0, 1.0, 2.0], 16)
    assert alloc.m[3] < alloc.m[0]
    assert alloc.max_time < 2.0 * 4  # better than the even split


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="positive"):
        allocate_microbatches([1.0, -1.0], 4)
    with pytest.raises(ValueError, match="at least"):
        allocate_microbatches([1.0, 1.0, 1.0], 2)
    with pytest.raises(ValueError, match="multiple of 4"):
        allocate_microbatches([1.0, 1.0], 10, multiple_of=4)


def test_large_instance_is_consistent() -> None:
    rng = np.random.default_rng(1)
    times = rng.uniform(0.9, 1.1, 16384)
    times[:7] *= 1.8
    alloc = allocate_microbatches(times, 16384 * 8)
    m = np.array(alloc.m)
    assert m.sum() == 16384 * 8 and m.min() >= 1
    loads = m * times
    # optimality certificate: giving any group one more micro-batch would exceed max_time
    # for at least as many units as were needed (no group could take one more below T*)
    assert np.all((m + 1) * times >= loads.max() - 1e-9)


def test_cli_prints_json() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["plan", "microbatches", "--times", "1,1,2", "--total", "8", "--json"])
    assert code == 0
    doc = json.loads(out.getvalue())
    assert doc["m"] == [3, 3, 2] or sum(doc["m"]) == 8
    assert doc["max_time"] == 4.0 and doc["solve_ms"] >= 0


def test_bench_reports_figures_against_the_greedy_baseline() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["bench", "plan-microbatches", "--json", "--scale", "0.05"])
    assert code == 0
    doc = json.loads(out.getvalue())
    assert {"groups_25_solve_ms", "groups_25_speedup_vs_greedy"} <= set(doc)


# --- S2 from a trace: measured micro-batch times, replay with uneven counts ----------------


def _trace(faults: list[dict[str, object]], microbatches: int = 8,
           schedule: str = "1f1b") -> object:
    from failslow.simulator import scenario_from_dict, simulate
    from failslow.whatif.analysis import build_ops

    sc = scenario_from_dict({"job": "s2", "parallel": {"tp": 2, "pp": 2, "dp": 4, "cp": 1},
                             "microbatches": microbatches, "iterations": 6,
                             "gpus_per_node": 8, "schedule": schedule, "faults": faults,
                             "sampling": {"progress_ms": 0, "link_ms": 0, "gpu_ms": 0}})
    res = simulate(sc, 0)
    return build_ops(res.tables, res.meta)


SLOW_GROUP_0 = [{"cause": "compute", "ranks": [0, 1, 8, 9], "start": 0, "severity": 1.6}]


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_even_counts_replay_the_traced_schedule(schedule: str) -> None:
    from failslow.mitigation.microbatches import detect_schedule, predict_microbatches
    from failslow.whatif.sim import Plan, Variants

    ops = _trace(SLOW_GROUP_0, schedule=schedule)
    assert detect_schedule(ops) == schedule
    plan = Plan(ops)
    keep = np.ones((1, len(plan.kind_names), ops.pp, ops.dp), dtype=bool)
    original = plan.run(Variants(keep), {n: np.zeros(ops.steps.size) for n in plan.kind_names})
    np.testing.assert_allclose(predict_microbatches(ops, [8] * 4), original[0], rtol=1e-12)


def test_uneven_counts_predict_the_simulated_time() -> None:
    from failslow.mitigation.microbatches import predict_microbatches

    ops = _trace(SLOW_GROUP_0)
    for m in (4, 12):       # the training simulator runs one count for every DP group
        measured = float(_trace(SLOW_GROUP_0, microbatches=m).actual.mean())
        assert float(predict_microbatches(ops, [m] * 4).mean()) == pytest.approx(measured,
                                                                                 rel=0.03)


def test_plan_from_a_trace_gives_the_slow_group_fewer_microbatches() -> None:
    from failslow.mitigation.microbatches import dp_group_times, plan_from_ops

    ops = _trace(SLOW_GROUP_0)
    t = dp_group_times(ops)
    assert t[0] == pytest.approx(1.6 * np.median(t[1:]), rel=0.05)
    plan = plan_from_ops(ops)
    assert plan.m[0] < 8 < min(plan.m[1:]) + 1 and sum(plan.m) == 32
    assert plan.feasible
    assert plan.predicted_after_s is not None and plan.predicted_before_s is not None
    assert plan.predicted_after_s < 0.85 * plan.predicted_before_s
    healthy = plan_from_ops(_trace([]))
    assert not healthy.feasible and "no room" in healthy.reason
