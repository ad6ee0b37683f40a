"""Ski-rental mitigation planner (Greyhound Algorithm 1)."""

from __future__ import annotations

import pyarrow as pa

from failslow import results
from failslow.detectors.planner import MitigationPlanner, PlannerConfig
from failslow.diagnosis import Anomaly

S = 1_000_000_000


def iterations(start: int, durations_s: list[float]) -> pa.Table:
    ends, t = [], start
    for d in durations_s:
        t += int(d * S)
        ends.append(t)
    n = len(durations_s)
    return pa.table({"job": ["j"] * n, "rank": [-1] * n, "iteration": list(range(n)),
                     "t_start": [e - int(d * S) for e, d in zip(ends, durations_s, strict=True)],
                     "t_end": ends, "duration_ns": [int(d * S) for d in durations_s]},
                    schema=results.SCHEMAS["iterations"])


def slow(cause: str, start: int, end: int | None = None) -> Anomaly:
    return Anomaly(id="a1", kind="slow", cause=cause, ranks=[3], start_ns=start, end_ns=end)


def test_escalates_when_impact_reaches_each_cost_and_reverts_on_relief() -> None:
    planner = MitigationPlanner("j", PlannerConfig(cost_s={"S2": 2.0, "S3": 10.0, "S4": 100.0}))
    assert planner.update(iterations(0, [1.0] * 20), []) == []
    start = 20 * S
    advice = planner.update(iterations(start, [1.5] * 3), [slow("compute", start)])
    assert advice == []                              # impact 1.5 s < S2's 2 s
    advice = planner.update(iterations(start + int(4.5 * S), [1.5] * 2), [])
    assert [(a.strategy, a.action) for a in advice] == [("S2", "apply")]
    assert advice[0].impact_s >= 2.0
    advice = planner.update(iterations(start + 8 * S, [1.5] * 20), [])
    assert [(a.strategy, a.action) for a in advice] == [("S3", "apply")]
    advice = planner.update(iterations(start + 40 * S, []), [slow("compute", start, 60 * S)])
    assert [(a.strategy, a.action) for a in advice] == [("S3", "revert"), ("S2", "revert")]


def test_communication_never_gets_microbatch_rebalancing() -> None:
    planner = MitigationPlanner("j", PlannerConfig(cost_s={"S2": 1.0, "S3": 2.0, "S4": 3.0}))
    planner.update(iterations(0, [1.0] * 10), [])
    advice = planner.update(iterations(10 * S, [3.0] * 5), [slow("communication", 10 * S)])
    assert [a.strategy for a in advice] == ["S3", "S4"]


def test_snapshot_restore_keeps_accumulated_impact() -> None:
    config = PlannerConfig(cost_s={"S2": 3.0, "S3": 50.0, "S4": 500.0})
    a = MitigationPlanner("j", config)
    a.update(iterations(0, [1.0] * 10), [])
    a.update(iterations(10 * S, [2.0] * 2), [slow("compute", 10 * S)])
    b = MitigationPlanner("j", config)
    b.restore(a.snapshot())
    advice = b.update(iterations(15 * S, [2.0]), [])
    assert [a.strategy for a in advice] == ["S2"]
