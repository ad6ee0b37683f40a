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


def test_a_forked_child_runs_the_engine_on_threads_of_its_own() -> None:
    """The pool's threads do not survive a fork: a child that analyses after its parent
    did must not wait on them."""
    import multiprocessing as mp

    sim = simulate(scenario_from_dict({"preset": "mixed", "iterations": 20}), 0)
    tables = {k: t for k, t in sim.tables.items()}
    want = run_analyzer(sim.meta, tables).diagnosis().to_dict()  # the parent's pool exists
    ctx = mp.get_context("fork")
    with ctx.Pool(1) as pool:
        got = pool.apply_async(_diagnose, (sim.meta, tables)).get(timeout=120)
    assert got == want


def _diagnose(meta: object, tables: dict[str, object]) -> dict[str, object]:
    return run_analyzer(meta, tables).diagnosis().to_dict()  # type: ignore[arg-type]
