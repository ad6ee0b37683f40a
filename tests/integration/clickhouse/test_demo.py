"""``failslow demo`` end to end, in process."""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from support import stream_synth as synth

from failslow import cli
from failslow.cli.demo import DEMO_DATABASE
from failslow.diagnosis import Anomaly, Diagnosis
from failslow.events import JobMeta
from failslow.stream import clickhouse as ch
from failslow.stream.clickhouse import ClickHouseSink


def _stored_anomalies(data_dir: Path, job: str) -> list[Anomaly]:
    """Open the demo's chDB directory (after the demo closed it) and read the anomalies."""
    sink = ClickHouseSink(ch.connect(data_dir), DEMO_DATABASE, create=False)
    try:
        return [a for _, a in sink.anomalies(job)]
    finally:
        sink.close()


def _stored_advice(data_dir: Path, job: str) -> list[dict[str, Any]]:
    """The demo's ``advice`` rows (ADVICE_SCHEMA), read back after the demo closed chDB."""
    sink = ClickHouseSink(ch.connect(data_dir), DEMO_DATABASE, create=False)
    try:
        return sink.read("advice", job).to_pylist()
    finally:
        sink.close()


@dataclass
class _Sim:
    meta: JobMeta
    tables: dict[str, pa.Table]
    truth: Diagnosis


def test_demo_pipeline_with_a_stub_simulator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The demo's own plumbing (publish, process, store, read back, compare, report) with
    the synthetic job and the fake analyzer, so it is checked whatever the simulator does."""
    import failslow.simulator as simulator
    import failslow.stream.processor as processor

    calls: list[tuple[Any, int]] = []
    truth = Diagnosis("synth-1", anomalies=[
        Anomaly(id="t1", kind="slow", cause="compute", ranks=[6],
                start_ns=synth.T0 + 10 * synth.ITER_NS),
        Anomaly(id="t2", kind="slow", cause="communication", ranks=[1, 3], link=[1, 3],
                start_ns=synth.T0 + 30 * synth.ITER_NS)])

    def simulate(scenario: Any, seed: int) -> _Sim:
        calls.append((scenario, seed))
        return _Sim(synth.meta(), {"coll": synth.coll(iterations=40)}, truth)

    monkeypatch.setattr(simulator, "load_scenario", lambda name: f"scenario:{name}",
                        raising=False)
    monkeypatch.setattr(simulator, "simulate", simulate, raising=False)
    monkeypatch.setattr(processor, "default_analyzer", synth.FakeAnalyzer)
    for _ in range(2):  # re-running into the same directory starts clean
        assert cli.main(["demo", "--data-dir", str(tmp_path), "--seed", "7"]) == 0
    assert calls == [("scenario:demo", 7)] * 2
    out = capsys.readouterr().out
    assert "found 1 of 2 injected faults" in out and "missed" in out
    assert "read back from ClickHouse" in out and "slow-6" in out
    assert str(tmp_path / "report.html") in out.replace("\n", "")
    stored = _stored_anomalies(tmp_path, "synth-1")
    assert [(a.id, a.ranks) for a in stored] == [("slow-6", [6])]  # once, not twice
    html = (tmp_path / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 2 and "slow-6" in html
    assert "0 advice rows" in out  # the fake analyzer has no planner


def _real_pipeline_available() -> str | None:
    try:
        simulator = importlib.import_module("failslow.simulator")
        importlib.import_module("failslow.engine.analyzer")
    except ModuleNotFoundError as e:
        return f"{e.name} is not there yet"
    if not hasattr(simulator, "simulate") or not hasattr(simulator, "load_scenario"):
        return "failslow.simulator has no simulate/load_scenario yet"
    return None


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_demo_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = _real_pipeline_available()
    if missing:
        pytest.skip(missing)
    assert cli.main(["demo", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "report.html").is_file()
    assert (tmp_path / "clickhouse").is_dir()
    from failslow.dashboards.report import match_truth
    from failslow.simulator import load_scenario, simulate

    sim = simulate(load_scenario("demo"), 0)
    stored = _stored_anomalies(tmp_path, sim.meta.job)
    assert stored, f"no anomalies stored; demo output:\n{out}"
    matches, _ = match_truth(stored, sim.truth.anomalies)
    missed = [m.truth for m in matches if m.found is None]
    assert not missed, f"the demo's injected faults were not all found: {missed}\n{out}"
    assert f"found {len(matches)} of {len(matches)} injected faults" in out
    html = (tmp_path / "report.html").read_text()
    assert all(a.id in html for a in stored)
    # the planner's advice is stored next to the anomalies (issue 9): the compute straggler
    # gets S2 (re-balanced micro-batches, fewer for rank 21's DP group) and its revert
    advice = {r["advice_id"]: r for r in _stored_advice(tmp_path, sim.meta.job)}
    assert "Mitigation advice" in out and f"{len(advice)} advice rows" in out
    compute = next(a for a in stored if a.cause == "compute")
    s2 = advice.get(f"{compute.id}/S2/apply")
    assert s2 is not None, f"no S2 advice stored: {sorted(advice)}"
    assert f"{compute.id}/S2/revert" in advice
    assert s2["impact_s"] >= s2["cost_s"] and s2["t_ns"] >= (compute.start_ns or 0)
    m = json.loads(s2["plan"])["m"]
    dp_of_21 = (21 // sim.meta.tp) % sim.meta.dp
    assert sum(m) == sim.meta.microbatches * sim.meta.dp and m[dp_of_21] < max(m)
