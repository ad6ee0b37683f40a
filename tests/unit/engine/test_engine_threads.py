"""A job's detectors that read nothing of each other's run side by side on threads
(``FAILSLOW_ENGINE_THREADS``), with the diagnosis of running them one after the other."""

from __future__ import annotations

import pytest

from failslow.engine import analyzer as analyzer_module
from failslow.engine.analyzer import JobAnalyzer, waves
from failslow.engine.offline import run_analyzer
from failslow.simulator import scenario_from_dict, simulate
from failslow.stream.state import pack


def test_waves_follow_what_each_detector_reads() -> None:
    sim = simulate(scenario_from_dict({"preset": "healthy", "iterations": 2}), 0)
    analyzer = JobAnalyzer(sim.meta)
    # the slow-down detector reads the tracker's iterations; the hang detector nothing
    # derived; the link-rate detector reads the reports of both, and takes its samples
    # from the records beside them
    assert waves(analyzer.detectors) == [
        [("iterations", "update")],
        [("slowdown", "update"), ("hang", "update"), ("linkrate", "prepare")],
        [("linkrate", "update")]]


def test_the_link_rate_samples_taken_beside_the_others_change_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The link-rate detector's ``prepare`` step is the first half of its ``update``: an
    engine that runs it in the wave before and one that runs every ``update`` alone, one
    after the other, end in the same state with the same reports."""
    from failslow.replay import replay

    # an absorbed PP link: the link-rate detector reports it (test_linkrate.py)
    sim = simulate(scenario_from_dict({
        "preset": "healthy", "iterations": 40, "timing": {"pp_bytes": 4 << 20},
        "faults": [{"cause": "communication", "nodes": [4, 6], "start": 15,
                    "duration": 20, "severity": 3.0}]}), 1)
    monkeypatch.setattr(analyzer_module, "PARALLEL_MIN_ROWS", 0)  # every batch on threads
    monkeypatch.setenv("FAILSLOW_ENGINE_THREADS", "2")
    ahead, serial = JobAnalyzer(sim.meta), JobAnalyzer(sim.meta)
    serial._waves = [[(name, "update")] for name in serial.detectors]
    for _, batch in replay(dict(sim.tables), 100_000_000):
        ahead.update(batch)
        serial.update(batch)
        assert ahead.linkrate is not None and ahead.linkrate._prepared is None
    assert serial.diagnosis().to_dict() == ahead.diagnosis().to_dict()
    (found,) = ahead.diagnosis().anomalies
    assert found.extra.get("absorbed") is True  # the link-rate detector's report
    assert pack(serial.linkrate.snapshot()) == pack(ahead.linkrate.snapshot())  # type: ignore[union-attr]


@pytest.mark.parametrize("preset", ["mixed", "hang-hardware"])
def test_threads_give_the_diagnosis_of_one_thread(preset: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    sim = simulate(scenario_from_dict({"preset": preset}), 0)
    tables = {k: t for k, t in sim.tables.items()}
    got = {}
    monkeypatch.setattr(analyzer_module, "PARALLEL_MIN_ROWS", 0)  # every batch on threads
    for threads in ("1", "2"):
        monkeypatch.setenv("FAILSLOW_ENGINE_THREADS", threads)
        got[threads] = run_analyzer(sim.meta, tables).diagnosis().to_dict()
    assert got["1"]["anomalies"], "nothing found"
    assert got["2"] == got["1"]


def test_a_forked_child_runs_the_engine_on_threads_of_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool's threads do not survive a fork: a child that analyses after its parent
    did must not wait on them."""
    import multiprocessing as mp

    monkeypatch.setattr(analyzer_module, "PARALLEL_MIN_ROWS", 0)  # every batch on threads
    monkeypatch.setenv("FAILSLOW_ENGINE_THREADS", "2")

    sim = simulate(scenario_from_dict({"preset": "mixed", "iterations": 20}), 0)
    tables = {k: t for k, t in sim.tables.items()}
    want = run_analyzer(sim.meta, tables).diagnosis().to_dict()  # the parent's pool exists
    ctx = mp.get_context("fork")
    with ctx.Pool(1) as pool:
        got = pool.apply_async(_diagnose, (sim.meta, tables)).get(timeout=120)
    assert got == want


def _diagnose(meta: object, tables: dict[str, object]) -> dict[str, object]:
    return run_analyzer(meta, tables).diagnosis().to_dict()  # type: ignore[arg-type]


@pytest.mark.skipif(not hasattr(__import__("os"), "sched_setaffinity"), reason="Linux only")
def test_a_process_pinned_to_one_core_runs_its_detectors_on_one_thread() -> None:
    """Threads on one core only take turns with the GIL: by default the engine counts the
    cores the process may run on (``failslow bench pipeline`` pins its processor)."""
    import os
    import subprocess
    import sys

    pin = "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
    threads = "from failslow.engine.analyzer import _threads; print(_threads())"
    env = {k: v for k, v in os.environ.items() if k != "FAILSLOW_ENGINE_THREADS"}

    def run(code: str) -> str:
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=60, check=True).stdout.strip()

    assert run(pin + threads) == "1"
    assert run(threads) == str(min(4, len(os.sched_getaffinity(0))))
