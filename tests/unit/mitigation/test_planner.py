"""Ski-rental mitigation planner (Greyhound Algorithm 1)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from support.snapshots import roundtrip

from failslow import results
from failslow.diagnosis import Anomaly
from failslow.mitigation.planner import (
    ADVICE_SCHEMA,
    Advice,
    AnomalyPlans,
    MitigationPlanner,
    PlannerConfig,
    TracePlans,
    advice_table,
)

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


# --- escalation ladder per cause, plans, skip, advice events ------------------------------


def run_ladder(cause: str, plans: Any = None, slow_s: float = 3.0) -> list[Advice]:
    planner = MitigationPlanner("j", PlannerConfig(cost_s={"S2": 1.0, "S3": 10.0, "S4": 100.0}),
                               plans=plans)
    planner.update(iterations(0, [1.0] * 10), [])
    out: list[Advice] = []
    out += planner.update(iterations(10 * S, []), [slow(cause, 10 * S)])
    t = 10 * S
    for _ in range(60):                         # 2 s of impact per iteration
        out += planner.update(iterations(t, [slow_s]), [])
        t += int(slow_s * S)
    out += planner.update(iterations(t, []), [slow(cause, 10 * S, t)])
    return out


@pytest.mark.parametrize(("cause", "ladder"), [
    ("compute", ["S2", "S3", "S4"]),
    ("communication", ["S3", "S4"]),
    ("mixed", ["S2", "S3", "S4"]),
])
def test_escalation_ladder_per_cause(cause: str, ladder: list[str]) -> None:
    advice = run_ladder(cause)
    applied = [a for a in advice if a.action == "apply"]
    assert [a.strategy for a in applied] == ladder
    for a in applied:                            # each when the impact reached its cost
        assert a.impact_s >= a.cost_s and a.cause == cause
    reverts = [a.strategy for a in advice if a.action == "revert"]
    assert reverts == [s for s in reversed(ladder) if s != "S4"]


class _NoS2:
    def __init__(self) -> None:
        self.asked: list[str] = []

    def plan(self, strategy: str, anomaly: Anomaly) -> dict[str, Any] | None:
        self.asked.append(strategy)
        if strategy == "S2":
            return {"strategy": "S2", "feasible": False, "reason": "no room to re-balance"}
        return {"strategy": strategy, "feasible": True, "placement": [1, 0]}


def test_infeasible_plan_is_skipped_and_plans_are_attached() -> None:
    source = _NoS2()
    advice = run_ladder("compute", source)
    assert [(a.strategy, a.action) for a in advice] == [
        ("S2", "skip"), ("S3", "apply"), ("S4", "apply"), ("S3", "revert")]
    assert "no room" in advice[0].reason
    assert advice[1].plan == {"strategy": "S3", "feasible": True, "placement": [1, 0]}
    assert advice[3].plan == advice[1].plan       # the revert names what to undo
    assert source.asked == ["S2", "S3"]            # S4 has no plan to compute


def test_advice_event_shape_and_arrow_rows() -> None:
    advice = run_ladder("compute", _NoS2())
    doc = advice[1].to_dict()
    assert {"version", "kind", "advice_id", "job", "anomaly_id", "cause", "ranks", "link",
            "strategy", "action", "t_ns", "impact_s", "cost_s", "slow_iterations", "t_slow_s",
            "t_healthy_s", "description", "reason", "plan"} == set(doc)
    assert doc["kind"] == "mitigation_advice" and doc["advice_id"] == "a1/S3/apply"
    assert doc["slow_iterations"] > 0 and doc["t_slow_s"] == pytest.approx(3.0)
    assert doc["t_healthy_s"] == pytest.approx(1.0)
    table = advice_table(advice)
    assert table.schema.equals(ADVICE_SCHEMA) and table.num_rows == len(advice)
    back = Advice.from_dict(table.to_pylist()[1])
    assert back.plan == advice[1].plan and back.advice_id == advice[1].advice_id
    assert json.loads(advice[1].to_json())["plan"]["placement"] == [1, 0]


def test_trace_plans_attach_s2_counts_and_s3_placement() -> None:
    from failslow.simulator import scenario_from_dict, simulate

    sc = scenario_from_dict({"job": "p", "parallel": {"tp": 1, "pp": 2, "dp": 4, "cp": 1},
                             "microbatches": 8, "iterations": 10, "gpus_per_node": 8,
                             "faults": [{"cause": "compute", "ranks": [1, 5], "start": 4,
                                         "severity": 1.8}],
                             "sampling": {"progress_ms": 0, "link_ms": 0, "gpu_ms": 0}})
    res = simulate(sc, 0)
    source = TracePlans.from_tables(res.tables, res.meta)
    anomaly = res.truth.anomalies[0]
    s2 = source.plan("S2", anomaly)
    assert s2 is not None and s2["feasible"]
    m = s2["m"]
    assert sum(m) == 32 and m[1] == min(m) and m[1] < 8          # DP group 1 is slow
    assert s2["predicted_after_s"] < s2["predicted_before_s"]
    s3 = source.plan("S3", anomaly)
    assert s3 is not None and sorted(s3["placement"]) == list(range(8))
    fallback = AnomalyPlans(res.meta).plan("S2", anomaly)
    assert fallback is not None and fallback["m"][1] == min(fallback["m"])


def test_snapshot_keeps_skips_and_plans() -> None:
    config = PlannerConfig(cost_s={"S2": 1.0, "S3": 50.0, "S4": 500.0})
    a = MitigationPlanner("j", config, plans=_NoS2())
    a.update(iterations(0, [1.0] * 10), [])
    advice = a.update(iterations(10 * S, [2.0] * 2), [slow("compute", 10 * S)])
    assert [x.action for x in advice] == ["skip"]
    b = MitigationPlanner("j", config, plans=_NoS2())
    b.restore(roundtrip(a.snapshot()))
    assert b.update(iterations(15 * S, [2.0] * 3), []) == []    # S2 not asked again
    assert np.isclose(b.snapshot()["open"]["a1"]["impact_s"], 5.0)


def test_costs_from_text_and_their_errors() -> None:
    config = PlannerConfig.from_costs("s2=0.5, S4=120")
    assert config.cost_s == {"S2": 0.5, "S3": 60.0, "S4": 120.0}  # S3 keeps its default
    assert PlannerConfig.from_costs("").cost_s == PlannerConfig().cost_s
    for bad in ("S5=1", "S2", "S2=-1", "S2=fast"):
        with pytest.raises(ValueError):
            PlannerConfig.parse_costs(bad)


def test_anomaly_plans_say_why_when_the_job_description_does_not_allow_one() -> None:
    from failslow.events import JobMeta

    meta = JobMeta(job="j", t=0, world_size=8, tp=1, pp=2, dp=4, cp=1, microbatches=0,
                   schedule="unknown", nodes={r: f"n{r // 4}" for r in range(8)}, comms=())
    plan = AnomalyPlans(meta).plan("S2", slow("compute", 0))
    assert plan is not None and not plan["feasible"] and "micro-batch" in plan["reason"]
    # the ladder then skips S2 and moves on at S3's cost
    planner = MitigationPlanner("j", PlannerConfig(cost_s={"S2": 1.0, "S3": 2.0, "S4": 99.0}),
                                plans=AnomalyPlans(meta))
    planner.update(iterations(0, [1.0] * 10), [])
    advice = planner.update(iterations(10 * S, [2.0] * 3), [slow("compute", 10 * S)])
    assert [(a.strategy, a.action) for a in advice][:1] == [("S2", "skip")]


def test_job_analyzer_runs_the_planner_and_snapshots_it() -> None:
    """Where the anomalies are produced (the job analyzer of the stream processor and of
    ``failslow analyze``), the planner follows them; its state is in the snapshot."""
    from failslow.engine.analyzer import JobAnalyzer, JobConfig
    from failslow.replay import replay
    from failslow.simulator import scenario_from_dict, simulate

    sc = scenario_from_dict({"job": "jp", "parallel": {"tp": 1, "pp": 2, "dp": 4, "cp": 1},
                             "microbatches": 4, "iterations": 40,
                             "faults": [{"cause": "compute", "ranks": [5], "start": 8,
                                         "duration": 20, "severity": 2.0}]}, "t")
    res = simulate(sc, 0)
    config = JobConfig(planner=PlannerConfig(cost_s={"S2": 0.1, "S3": 100.0, "S4": 1e4}))
    whole, first = JobAnalyzer(res.meta, config), JobAnalyzer(res.meta, config)
    windows = list(replay(res.tables))
    got_whole: list[Advice] = []
    got_split: list[Advice] = []
    for i, (now, batch) in enumerate(windows):
        got_whole += whole.update(batch).advice + whole.on_tick(now).advice
        if i == len(windows) // 2:  # restart half-way, from a JSON snapshot
            second = JobAnalyzer(res.meta, config)
            second.restore(roundtrip(first.snapshot()))
            first = second
        got_split += first.update(batch).advice + first.on_tick(now).advice
    assert [(a.strategy, a.action) for a in got_whole] == [("S2", "apply"), ("S2", "revert")]
    assert [a.to_dict() for a in got_split] == [a.to_dict() for a in got_whole]
    assert JobAnalyzer(res.meta, JobConfig(planner=None)).planner is None


def test_late_report_is_charged_the_slow_iterations_before_it() -> None:
    """Greyhound §7.5: a fail-slow is reported ~10 s after it began; the iterations in
    between were slow and count towards the impact (and leave the healthy baseline)."""
    config = PlannerConfig(cost_s={"S2": 2.0, "S3": 50.0, "S4": 500.0}, healthy_window=10)
    planner = MitigationPlanner("j", config)
    planner.update(iterations(0, [1.0] * 10), [])
    start = 10 * S
    # eight slow iterations arrive before the detector reports the anomaly
    assert planner.update(iterations(start, [1.5] * 8), []) == []
    assert planner.healthy_s == pytest.approx(1.5)     # polluted until the report comes
    advice = planner.update(iterations(start + 12 * S, []), [slow("compute", start)])
    assert [(a.strategy, a.action) for a in advice] == [("S2", "apply")]
    assert advice[0].impact_s == pytest.approx(4.0) and advice[0].slow_iterations == 8
    assert planner.healthy_s == pytest.approx(1.0)
    # the history survives a snapshot: a restored planner backfills the same way
    fresh = MitigationPlanner("j", config)
    fresh.update(iterations(0, [1.0] * 10), [])
    fresh.update(iterations(start, [1.5] * 8), [])
    restored = MitigationPlanner("j", config)
    restored.restore(roundtrip(fresh.snapshot()))
    again = restored.update(iterations(start + 12 * S, []), [slow("compute", start)])
    assert [a.to_dict() for a in again] == [a.to_dict() for a in advice]
