"""A job's detectors that read nothing of each other's run side by side on threads
(``FAILSLOW_ENGINE_THREADS``), with the diagnosis of running them one after the other."""

from __future__ import annotations

import pytest

from failslow.engine.analyzer import JobAnalyzer, waves
from failslow.engine.offline import run_analyzer
from failslow.simulator import scenario_from_dict, simulate


def test_waves_follow_what_each_detector_reads() -> None:
    sim = simulate(scenario_from_dict({"preset": "healthy", "iterations": 2}), 0)
    analyzer = JobAnalyzer(sim.meta)
    # the slow-down detector reads the tracker's iterations; the hang detector nothing
    # derived; the link-rate detector reads the reports of both
    assert waves(analyzer.detectors) == [["iterations"], ["slowdown", "hang"], ["linkrate"]]


@pytest.mark.parametrize("preset", ["mixed", "hang-hardware"])
def test_threads_give_the_diagnosis_of_one_thread(preset: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    sim = simulate(scenario_from_dict({"preset": preset}), 0)
    tables = {k: t for k, t in sim.tables.items()}
    got = {}
    for threads in ("1", "2"):
        monkeypatch.setenv("FAILSLOW_ENGINE_THREADS", threads)
        got[threads] = run_analyzer(sim.meta, tables).diagnosis().to_dict()
    assert got["1"]["anomalies"], "nothing found"
    assert got["2"] == got["1"]
