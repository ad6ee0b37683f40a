"""S3 topology adjustment (Greyhound §5.2): consolidation, role swaps, placements and the
what-if prediction, checked against the training simulator."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from failslow import cli
from failslow.bench.mitigation import ground_truth_faults, node_map
from failslow.mitigation.topology import (
    Layout,
    PhysicalFaults,
    consolidate,
    crossing,
    estimate_faults,
    is_permutation,
    node_swap,
    plan_for_anomalies,
    plan_topology,
    rank_permutation,
    stage_preference,
    stages_needed,
    step_start_times,
)
from failslow.simulator import scenario_from_dict, simulate, write_sim
from failslow.whatif.analysis import build_ops

PAR = {"tp": 1, "pp": 4, "dp": 4, "cp": 1}


def sim(faults: list[dict[str, Any]], gpus_per_node: int = 16, iterations: int = 10,
        parallel: dict[str, int] | None = None) -> Any:
    sc = scenario_from_dict({"job": "s3", "parallel": parallel or PAR, "microbatches": 8,
                             "iterations": iterations, "gpus_per_node": gpus_per_node,
                             "faults": faults,
                             "sampling": {"progress_ms": 0, "link_ms": 0, "gpu_ms": 0}})
    return simulate(sc, 0)


def stages_of(layout: Layout, place: np.ndarray, blocks: list[int]) -> set[int]:
    return {int(np.argwhere(place == b)[0][0]) for b in blocks}


def test_minimal_number_of_stages() -> None:
    assert [stages_needed(n, 4) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


@pytest.mark.parametrize(("stragglers", "want"), [
    ([0, 13], 1),              # stages 0 and 3 -> one interior stage
    ([0, 5, 10, 15], 1),       # one per stage -> one stage
    ([0, 3, 4, 9, 13, 14], 2),  # six -> two stages
])
def test_consolidation_uses_the_fewest_interior_stages(stragglers: list[int], want: int) -> None:
    layout = Layout.regular(tp=1, pp=4, dp=4, gpus_per_node=16)
    place, targets = consolidate(layout, stragglers)
    assert len(targets) == want
    assert set(targets) <= {1, 2}                      # interior stages of 4
    assert stages_of(layout, place, stragglers) == set(targets)
    assert sorted(place.reshape(-1).tolist()) == list(range(16))


def test_stage_preference_interior_then_first_then_last() -> None:
    assert stage_preference(4) == [1, 2, 0, 3]
    assert stage_preference(8, [6, 6, 1])[:2] == [6, 1]   # already holding stragglers first
    assert stage_preference(2) == [0, 1]                   # no interior: the last one last


def test_consolidation_stays_put_when_already_consolidated() -> None:
    layout = Layout.regular(tp=1, pp=4, dp=4, gpus_per_node=16)
    place, targets = consolidate(layout, [4, 6])           # both in stage 1 already
    assert targets == [1]
    assert np.array_equal(place, layout.identity())


def test_no_room_when_stragglers_need_every_stage() -> None:
    layout = Layout.regular(tp=1, pp=2, dp=2, gpus_per_node=4)
    plan = plan_topology(layout, PhysicalFaults(compute={0: 2.0, 1: 2.0, 2: 2.0}))
    assert not plan.feasible and "no room" in plan.reason


def test_placement_is_a_permutation_moving_whole_tp_groups() -> None:
    layout = Layout.regular(tp=2, pp=4, dp=4, gpus_per_node=8)
    place, _ = consolidate(layout, [0, 15])
    swapped = node_swap(layout, place, 1, 2)
    assert swapped is not None
    for p in (place, swapped):
        perm = rank_permutation(layout, p)
        assert is_permutation(perm)
        pairs = perm.reshape(-1, 2)                    # TP pairs stay together, in order
        assert np.all(pairs[:, 1] == pairs[:, 0] + 1) and np.all(pairs[:, 0] % 2 == 0)
    assert not is_permutation([0, 0, 1])


def test_role_swap_moves_a_congested_dp_link_off_dp_traffic() -> None:
    # 2 GPUs per node: stage s on nodes 2s, 2s+1; its DP ring crosses them
    layout = Layout.regular(tp=1, pp=4, dp=4, gpus_per_node=2)
    ident = layout.identity()
    assert crossing(layout, ident, 0, 1)["dp"] > 0
    plan = plan_topology(layout, PhysicalFaults(links={(0, 1): 4.0}))
    assert plan.node_swaps and crossing(layout, plan.block_of, 0, 1)["dp"] == 0
    assert node_map(layout, plan.block_of) is not None   # whole nodes moved


def test_prediction_of_consolidation_matches_the_training_simulator() -> None:
    faults = [{"cause": "compute", "ranks": [0, 13], "start": 3, "severity": 2.0}]
    res = sim(faults)
    ops = build_ops(res.tables, res.meta)
    plan = plan_for_anomalies(ops, res.meta, res.truth.anomalies,
                              step_start_times(res.tables, ops, res.meta))
    assert plan.feasible and plan.stages_needed == 1
    assert plan.predicted_after_s is not None and plan.predicted_before_s is not None
    assert plan.predicted_after_s < plan.predicted_before_s
    assert is_permutation(plan.placement)
    moved = ground_truth_faults(plan.layout, plan.block_of, faults)
    after = sim(moved)
    ops_after = build_ops(after.tables, after.meta)
    measured = float(ops_after.actual[ops_after.steps >= 3].mean())
    before = float(ops.actual[ops.steps >= 3].mean())
    assert measured < before
    assert plan.predicted_after_s == pytest.approx(measured, rel=0.05)


def test_role_swap_prediction_and_scan_of_an_undiagnosed_second_link() -> None:
    faults = [{"cause": "communication", "nodes": n, "start": 3, "severity": 4.0}
              for n in ([0, 1], [2, 3])]
    res = sim(faults, gpus_per_node=2)
    ops = build_ops(res.tables, res.meta)
    first = [a for a in res.truth.anomalies if a.id == "fault-0"]
    starts = step_start_times(res.tables, ops, res.meta)
    assert starts is not None
    mask = starts >= starts[3] - 1
    layout = Layout.from_meta(res.meta)
    found, notes = estimate_faults(ops, layout, mask, [], [(0, 1)])
    assert set(found.links) == {(0, 1), (2, 3)} and any("scan" in n for n in notes)
    assert found.links[(0, 1)] == pytest.approx(4.0, rel=0.15)
    plan = plan_for_anomalies(ops, res.meta, first, starts)
    assert plan.feasible and plan.node_swaps
    assert plan.predicted_after_s is not None and plan.predicted_before_s is not None
    assert plan.predicted_after_s <= plan.predicted_before_s
    for a, b in plan.faults.links:
        assert crossing(layout, plan.block_of, a, b)["dp"] == 0


def test_cli_plan_topology(tmp_path: Path) -> None:
    res = sim([{"cause": "compute", "ranks": [0, 13], "start": 6, "severity": 2.0}],
              iterations=16)
    write_sim(res, tmp_path / "trace", "parquet")
    out = io.StringIO()
    truth = str(tmp_path / "trace" / "truth.json")   # the injected faults as the diagnosis
    with contextlib.redirect_stdout(out):
        code = cli.main(["plan", "topology", str(tmp_path / "trace"), "--json",
                         "--diagnosis", truth])
    assert code == 0
    doc = json.loads(out.getvalue())
    assert doc["plans"], doc
    plan = doc["plans"][0]
    assert is_permutation(plan["placement"]) and len(plan["node_of_rank"]) == 16
    assert plan["predicted_after_s"] <= plan["predicted_before_s"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["plan", "topology", str(tmp_path / "trace"), "--diagnosis",
                         truth]) == 0
    assert "predicted step time" in out.getvalue()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["plan", "microbatches", "--trace", str(tmp_path / "trace"),
                         "--diagnosis", truth, "--json"]) == 0
    s2 = json.loads(out.getvalue())["plans"][0]
    assert sum(s2["m"]) == 32 and s2["predicted_before_s"] > 0
