"""The planner counts the training time lost to an anomaly's validation probes as impact
already paid (Greyhound §5.1 ski rental; issue 17)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from failslow import results
from failslow.diagnosis import Anomaly
from failslow.engine.probes import apply_probe_evidence, request_id
from failslow.mitigation.planner import MitigationPlanner, PlannerConfig

S = 1_000_000_000


def iterations(start: int, durations_s: list[float]) -> pa.Table:
    """Job-level iteration rows back to back from ``start``."""
    ends = [start + int(sum(durations_s[:i + 1]) * S) for i in range(len(durations_s))]
    n = len(ends)
    return pa.table({"job": ["j"] * n, "rank": [-1] * n, "iteration": list(range(n)),
                     "t_start": [e - int(d * S) for e, d in zip(ends, durations_s, strict=True)],
                     "t_end": ends, "duration_ns": [int(d * S) for d in durations_s]},
                    schema=results.SCHEMAS["iterations"])

COSTS = {"S2": 2.0, "S3": 60.0, "S4": 600.0}


def compute(detected: int, extra: dict[str, Any] | None = None) -> Anomaly:
    return Anomaly(id="a1", kind="slow", cause="compute", ranks=[3], start_ns=20 * S,
                   detected_ns=detected, extra=dict(extra or {}))


def probed(a: Anomaly, *runs: tuple[str, int | None, int | None]) -> Anomaly:
    """``a`` with the evidence of GEMM probes (status, elapsed ms, baseline ms) applied, as
    the engine reports it; a probe that ran took its measured time (``elapsed``) once more
    for warm-up, one that was skipped took no time of the job's."""
    rows = [{"request": request_id(a.id, "gemm", 3 + i, None, "suspect"), "probe": "gemm",
             "rank": 3 + i, "peer": None, "status": status,
             "duration_ns": 0 if status == "skipped" else (ms or 0) * 2_000_000,
             "elapsed_ns": None if ms is None else ms * 1_000_000,
             "baseline_ns": None if base is None else base * 1_000_000, "bytes": None,
             "detail": None if status == "ok" else "deadline"}
            for i, (status, ms, base) in enumerate(runs)]
    copy = Anomaly.from_dict(a.to_dict())
    assert apply_probe_evidence(copy, rows)
    return copy


def _start() -> tuple[MitigationPlanner, Anomaly]:
    """Impact 1.5 s after three 1.5 s iterations over a 1 s baseline: below S2's 2 s."""
    planner = MitigationPlanner("j", PlannerConfig(cost_s=dict(COSTS)))
    planner.update(iterations(0, [1.0] * 20), [])
    a = compute(21 * S)
    assert planner.update(iterations(20 * S, [1.5] * 3), [a]) == []
    return planner, a


def test_probe_time_lost_is_charged_once_and_can_escalate() -> None:
    planner, a = _start()
    # re-reported without probes, or with probes that did not run: nothing is charged
    assert planner.update(iterations(25 * S, []), [a]) == []
    not_run = probed(a, ("failed", None, None), ("skipped", None, None))
    assert not_run.extra["probe_cost"]["training_lost_s"] == 0
    assert planner.update(iterations(25 * S, []), [not_run]) == []
    assert planner._open["a1"].impact_s == 1.5
    # a GEMM probe that cost 0.6 s of shared GPU time (warm-up and its 0.3 s run):
    # 1.5 + 0.6 >= 2 -> S2 now
    report = probed(a, ("ok", 300, 150))
    assert report.extra["probe_cost"]["training_lost_s"] == 0.6
    assert report.extra["probe"]["verdict"] == "GPU slow on rank 3"
    advice = planner.update(iterations(25 * S, []), [report])
    assert [(x.strategy, x.action) for x in advice] == [("S2", "apply")]
    assert advice[0].impact_s == 1.5 + 0.6 and "(probes 0.6 s)" in advice[0].reason
    assert advice[0].t_ns == report.detected_ns
    # the same report again (a re-delivery, a detector's re-report) charges nothing more
    again = planner.update(iterations(25 * S, []), [report])
    assert again == [] and planner._open["a1"].impact_s == 1.5 + 0.6


def test_probe_charge_survives_snapshot_and_counts_only_growth() -> None:
    planner, a = _start()
    first = probed(a, ("ok", 150, 150))
    assert planner.update(iterations(25 * S, []), [first]) == []   # 1.5 + 0.3 < 2
    restored = MitigationPlanner("j", PlannerConfig(cost_s=dict(COSTS)))
    restored.restore(planner.snapshot())
    assert restored._open["a1"].probe_s == 0.3
    # a second probe: the cost grows to 0.6 s, only the 0.3 s more is charged
    second = probed(first, ("ok", 150, 150), ("ok", 150, 150))
    assert second.extra["probe_cost"]["training_lost_s"] == 0.6
    advice = restored.update(iterations(25 * S, []), [second])
    assert [(x.strategy, x.action) for x in advice] == [("S2", "apply")]
    assert advice[0].impact_s == pytest.approx(1.5 + 0.6)
