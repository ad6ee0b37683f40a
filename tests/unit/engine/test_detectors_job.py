"""JobAnalyzer: the composed detectors, their outputs and snapshot/restore."""

from __future__ import annotations

import pyarrow as pa
from support.snapshots import roundtrip
from support.synth_jobs import Fault, generate

from failslow import results
from failslow.detectors.hang import HangDetector
from failslow.engine.analyzer import JobAnalyzer, Output
from failslow.replay import replay

MS = 1_000_000


def _run(analyzer: JobAnalyzer, batches: list) -> tuple[list[dict], list[pa.Table], list[pa.Table]]:
    reports, rounds, iterations = [], [], []
    for now, batch in batches:
        for out in (analyzer.update(batch), analyzer.on_tick(now)):
            assert isinstance(out, Output)
            reports += [a.to_dict() for a in out.anomalies]
            rounds.append(out.rounds)
            iterations.append(out.iterations)
    return reports, rounds, iterations


def test_outputs_and_diagnosis() -> None:
    job = generate(tp=2, pp=2, dp=2, iterations=40, faults=[Fault("compute", 15, 30, 1.5, rank=6)])
    analyzer = JobAnalyzer(job.meta)
    reports, rounds, iterations = _run(analyzer, list(replay(job.tables, 20 * MS)))
    assert [r["id"] for r in reports] == ["slow-0", "slow-0"]
    assert reports[0]["end_ns"] is None and reports[1]["end_ns"] is not None
    r = pa.concat_tables(rounds)
    it = pa.concat_tables(iterations)
    assert r.schema.equals(results.SCHEMAS["rounds"]) and r.num_rows > 0
    assert it.schema.equals(results.SCHEMAS["iterations"]) and it.num_rows > 0
    diag = analyzer.diagnosis().to_dict()
    assert set(diag) == {"version", "job", "iterations", "anomalies", "whatif"}
    assert set(diag["iterations"]) == {"period_ops", "median_s", "count"}
    (a,) = diag["anomalies"]  # deduplicated by id, latest state
    assert a["ranks"] == [6] and a["end_ns"] is not None and diag["whatif"] is None


def test_snapshot_restore_resumes_exactly() -> None:
    job = generate(tp=2, pp=2, dp=2, iterations=40, faults=[Fault("compute", 15, 30, 1.5, rank=3)])
    batches = list(replay(job.tables, 20 * MS))
    uninterrupted = JobAnalyzer(job.meta)
    ref = _run(uninterrupted, batches)
    ref_diag = uninterrupted.diagnosis().to_dict()
    # cut before the onset, in the middle of the anomaly, and after it closed
    for cut in (len(batches) // 4, len(batches) // 2):
        first = JobAnalyzer(job.meta)
        a = _run(first, batches[:cut])
        state = roundtrip(first.snapshot())
        second = JobAnalyzer(job.meta)
        second.restore(state)
        b = _run(second, batches[cut:])
        assert a[0] + b[0] == ref[0], cut  # no anomaly lost, none re-reported
        assert pa.concat_tables(a[1] + b[1]).equals(pa.concat_tables(ref[1]))
        assert pa.concat_tables(a[2] + b[2]).equals(pa.concat_tables(ref[2]))
        assert second.diagnosis().to_dict() == ref_diag


def test_batch_sizes_give_the_same_diagnosis() -> None:
    """Streaming (batches of any size) and offline (the whole trace at once) agree exactly:
    every decision is taken at a job iteration's end on the data before it."""
    from failslow.bench.accuracy import _job
    from failslow.engine.offline import KINDS, run_analyzer
    from failslow.simulator import scenario_from_dict, simulate

    spec = _job(2, 4, 4, iterations=36, noise={"gc_prob": 0.01, "gc_ms": [30.0, 120.0]},
                timing={"pp_bytes": 96 << 20},
                faults=[{"cause": "compute", "ranks": [26], "start": 8, "duration": 20,
                         "severity": 1.25},
                        {"cause": "communication", "nodes": [1, 2], "start": 16,
                         "duration": 8, "severity": 5.0}])
    sim = simulate(scenario_from_dict(spec, "batching"), 3)
    tables = {k: pa.concat_tables(list(sim.iter_tables(k))) for k in sim.kinds if k in KINDS}
    diags = [run_analyzer(sim.meta, tables, w).diagnosis().to_dict()
             for w in (7 * MS, 100 * MS, 1000 * MS, 10**12)]
    assert len(diags[0]["anomalies"]) == 2
    for d in diags[1:]:
        assert d == diags[0]


class _Broken:
    """A hang detector whose every call raises (a detector bug on some input)."""

    name = "hang"
    kinds = HangDetector.kinds
    produces = ()

    def update(self, batch: object) -> list:
        raise ValueError("cannot convert float NaN to integer")

    def on_tick(self, now: int) -> list:
        raise AssertionError("never called once failed")

    def __init__(self, meta: object) -> None:
        self.state = HangDetector(meta).snapshot()  # type: ignore[arg-type]

    def snapshot(self) -> dict:
        return self.state

    def outputs(self) -> dict:
        return {}


def test_a_failing_detector_is_isolated_and_the_diagnosis_says_so() -> None:
    job = generate(tp=2, pp=2, dp=2, iterations=40, faults=[Fault("compute", 15, 30, 1.5, rank=6)])
    healthy = JobAnalyzer(job.meta)
    _run(healthy, list(replay(job.tables, 20 * MS)))
    analyzer = JobAnalyzer(job.meta)
    analyzer.detectors["hang"] = _Broken(job.meta)  # type: ignore[assignment]
    reports, _, _ = _run(analyzer, list(replay(job.tables, 20 * MS)))
    diag = analyzer.diagnosis().to_dict()
    # the other detectors went on: the same slow-down as without the failure
    assert [a["ranks"] for a in diag["anomalies"]] == [[6]]
    assert diag["anomalies"] == healthy.diagnosis().to_dict()["anomalies"]
    assert diag["incomplete"] == [{"part": "hang",
                                   "reason": "ValueError: cannot convert float NaN to integer"}]
    assert "incomplete" not in healthy.diagnosis().to_dict()
    # the failure survives a restart: the restored analyzer still skips the detector
    again = JobAnalyzer(job.meta)
    again.restore(roundtrip(analyzer.snapshot()))
    assert again.failed == analyzer.failed


def test_repeated_coll_rows_do_not_change_the_diagnosis() -> None:
    job = generate(tp=2, pp=2, dp=2, iterations=40, faults=[Fault("compute", 15, 30, 1.5, rank=6)])
    once = JobAnalyzer(job.meta)
    _run(once, list(replay(job.tables, 20 * MS)))
    coll = job.tables["coll"]
    again = coll.slice(0, coll.num_rows // 2)
    twice_tables = {**job.tables, "coll": pa.concat_tables([coll, again])}
    twice = JobAnalyzer(job.meta)
    _run(twice, list(replay(twice_tables, 20 * MS)))
    assert twice.dedup.dropped == coll.num_rows // 2
    assert twice.diagnosis().to_dict() == once.diagnosis().to_dict()

