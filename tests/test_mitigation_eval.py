"""``failslow bench mitigation`` at a small scale: it runs, and the mitigations help where
Greyhound says they do."""

from __future__ import annotations

import argparse
import json

import pytest

from failslow.detectors.mitigation_eval import BENCHMARKS, schedule_12


@pytest.fixture(scope="module")
def figures() -> dict:
    doc = BENCHMARKS["mitigation"](argparse.Namespace(scale=0.2))
    json.dumps(doc)                                    # one JSON object
    return doc


def test_s2_improves_one_slow_dp_group(figures: dict) -> None:
    s2 = figures["s2_one_slow_dp_group"]
    ours = s2["ours"]
    assert s2["paper"]["before_s"] == 1.31
    assert ours["after_s"] < 0.8 * ours["before_s"]
    assert ours["m"][0] < min(ours["m"][1:])
    sweep = {r["slow_groups"]: r for r in s2["sweep_slow_groups"]}
    assert sweep[0]["after_x"] == pytest.approx(1.0, abs=0.02)
    assert sweep[4]["after_x"] == sweep[4]["before_x"]          # no room when all are slow
    assert sweep[1]["before_x"] / sweep[1]["after_x"] > sweep[3]["before_x"] / sweep[3]["after_x"]


def test_s3_consolidation_and_role_swap_help(figures: dict) -> None:
    rows = figures["s3_consolidation"]["ours"]
    assert [r["stages_needed"] for r in rows] == [1, 1, 2]
    for r in rows:
        assert r["after_x"] < r["before_x"]
        assert r["prediction_error"] is not None and r["prediction_error"] < 0.1
    for r in figures["s3_links"]["role_swap"]["ours"]:
        assert r["node_swaps"] and r["after_x"] < r["before_x"]


def test_end_to_end_ski_rental_beats_s1_and_always_s4(figures: dict) -> None:
    e2e = figures["end_to_end"]["ours"]
    assert e2e["ski_rental_vs_s1"] > 1.0 and e2e["ski_rental_vs_always_s4"] > 1.0
    assert e2e["S1-only"]["actions"] == {}
    assert e2e["ski-rental"]["actions"].get("S2-apply", 0) >= 1
    assert e2e["healthy"]["it_per_min"] > e2e["ski-rental"]["it_per_min"]


def test_schedule_matches_greyhound_table_6() -> None:
    events = schedule_12()
    assert len(events) == 12
    comm = [e for e in events if e.cause == "communication"]
    comp = [e for e in events if e.cause == "compute"]
    assert len(comm) == 2 and all(e.level == "medium" for e in comm)
    assert sorted(e.level for e in comp).count("weak") == 3
    assert [e.level for e in comp].count("medium") == 5
    assert [e.level for e in comp].count("severe") == 2
