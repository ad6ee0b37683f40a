"""Evidence reducers in stages of their own (issue 13 item 3; detectors/slowdown/stage.py
and evidence_rows.py): shards that each reduce a block of the job's ranks, sum their rows
per key and bin, and hand them over as rows give the job's slow-down detector the bins,
the CCL-D baselines and the reports of one detector reducing every row itself."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from support.snapshots import roundtrip
from support.synth_jobs import SHARD_JOBS, Job, shard_job

from failslow.detectors.iterations import IterationTracker, coll_columns
from failslow.detectors.slowdown import SlowdownConfig, SlowdownDetector, stage
from failslow.detectors.slowdown.accounting import TABLE_NAMES, shift_for
from failslow.detectors.slowdown.evidence_rows import PARTS, evidence_of, evidence_table
from failslow.detectors.slowdown.reducer import Evidence, EvidenceReducer
from failslow.detectors.slowdown.stage import EvidenceStage, summed_windows
from failslow.engine.imports import EvidenceImport
from failslow.replay import replay
from failslow.stream.exports import with_emit_time

MS = 1_000_000

def _job(name: str) -> Job:
    return shard_job(name, seed=11)


#: CCL-D detection windows short enough for several to close in a synthetic job
SHORT_WINDOWS = SlowdownConfig(ccld_window_s=0.4)


def _one(job: Job, config: SlowdownConfig | None = None
         ) -> tuple[SlowdownDetector, list[dict[str, Any]]]:
    det = SlowdownDetector(job.meta, config or SlowdownConfig())
    reports = []
    for _, batch in replay(job.tables, 20 * MS):
        reports += [a.to_dict() for a in det.update(batch)]
    return det, reports


def _staged(job: Job, shards: int, cut_at: int | None = None,
            config: SlowdownConfig | None = None
            ) -> tuple[SlowdownDetector, list[dict[str, Any]], list[EvidenceStage],
                       Counter[str]]:
    """The tracking stage, ``shards`` evidence stages and the job's detector on the same
    batches, the rows handed over as they travel (with their ``t_emit``); ``cut_at``: the
    stages snapshot after that many batches and go on restored."""
    tracker = IterationTracker(job.meta)
    config = config or SlowdownConfig()
    stages = [EvidenceStage(job.meta, config, i, shards) for i in range(shards)]
    det = SlowdownDetector(job.meta, config, own_tracker=False, evidence_imported=True)
    taken = EvidenceImport()
    reports: list[dict[str, Any]] = []
    rows: Counter[str] = Counter()  # by part
    for i, (_, batch) in enumerate(replay(job.tables, 20 * MS)):
        if cut_at is not None and i == cut_at:
            states = [roundtrip(s.snapshot()) for s in stages]
            stages = [EvidenceStage(job.meta, config, k, shards) for k in range(shards)]
            for s, state in zip(stages, states, strict=True):
                s.restore(state)
        coll = batch.get("coll")
        now = int(coll_columns(coll)["t"].max()) if coll is not None and coll.num_rows \
            else 0
        iterations = with_emit_time("iterations", tracker.track(batch), now)
        parts = []
        for s in stages:
            s.update({**batch, "iterations": iterations})
            parts.append(with_emit_time("evidence", s.outputs()["evidence"], now))
            rows["rounds"] += s.outputs()["rounds"].num_rows
        evidence = taken.take(pa.concat_tables(parts * 2))  # delivered twice
        rows.update(PARTS[p] for p in evidence.column("part").to_pylist())
        reports += [a.to_dict() for a in det.update(
            {k: v for k, v in batch.items() if k != "coll"}
            | {"evidence": evidence, "iterations": iterations})]
    return det, reports, stages, rows


def _flush(stages: list[EvidenceStage], det: SlowdownDetector) -> None:
    """Hand the CCL-D window rows the stages still hold (their windows are not over) to
    the detector, summed as the stages sum them: nothing was lost, only held."""
    for s in stages:
        if s.ccld_held:
            rows = summed_windows(s.ccld_held)
            rows["cidx"] = det.registry.indices(
                np.asarray(s.reducer.registry.ids, dtype=np.uint64)[rows["cidx"]])
            det.stats.absorb(Evidence(det.stats.shift, ccld_windows=[rows]))


def _same_evidence(a: SlowdownDetector, b: SlowdownDetector) -> None:
    assert a.stats.shift == b.stats.shift
    for name in TABLE_NAMES:
        x, y = getattr(a.stats, name).data, getattr(b.stats, name).data
        assert x.keys() == y.keys()
        for col in x:
            np.testing.assert_array_equal(x[col], y[col], err_msg=name + "." + col)
    _same_state(a.stats.ccld.snapshot(), b.stats.ccld.snapshot())


def _same_state(x: Any, y: Any) -> None:
    """Snapshots equal, arrays (NaN included) compared element by element."""
    if isinstance(x, dict):
        assert x.keys() == y.keys()
        for k in x:
            _same_state(x[k], y[k])
    elif isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    elif isinstance(x, (list, tuple)):
        assert len(x) == len(y)
        for a, b in zip(x, y, strict=True):
            _same_state(a, b)
    else:
        assert x == y


@pytest.mark.parametrize("name", sorted(SHARD_JOBS))
@pytest.mark.parametrize("shards", [1, 3])
def test_stages_give_the_evidence_and_reports_of_one_detector(
        name: str, shards: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # the job's batches are the stages' here: an iteration of an earlier batch is safe
    monkeypatch.setattr(stage, "SHIFT_LAG_WINDOWS", 0)
    job = _job(name)
    config = SHORT_WINDOWS
    one, expected = _one(job, config)
    staged, reports, stages, rows = _staged(job, shards, config=config)
    assert expected and reports == expected
    first = int(job.tables["coll"].column("t").to_numpy().min()) // int(
        config.ccld_window_s * 1e9)
    assert staged.stats.ccld.closed == one.stats.ccld.closed > first + 2  # windows closed
    _flush(stages, staged)
    _same_evidence(one, staged)
    # the stages summed their rows in coarser bins once the detector had them, never in
    # coarser ones than the detector's
    for s in stages:
        assert s.settled > 3 and s.shift == shift_for(config, s.shortest) <= one.stats.shift
        assert s.shift > config.bin_shift or one.stats.shift == config.bin_shift
    # fewer rows than the job's in a pipeline job (a pure data-parallel one has a handful
    # of collectives per iteration: their rounds and bins are as many)
    total = sum(n for part, n in rows.items() if part != "rounds")
    assert 0 < total < (job.tables["coll"].num_rows if name != "pure-dp" else 2 * total)
    # the rounds of a class past CCL-D's baseline went summed per window, the others one
    # by one: at most a baseline's worth per class
    learned = config.baseline_rounds * len(staged.stats.ccld.keys)
    assert rows["ccld"] <= learned and rows["ccld"] + rows["ccldw"] <= rows["rounds"]
    if rows["rounds"] > learned:  # about one row per window and class
        assert 0 < rows["ccldw"] < (rows["rounds"] - rows["ccld"]) / 4
    assert staged.stats.unlearned_windows == 0


def test_a_job_stage_that_starts_after_the_baselines_says_what_it_lacks(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The reducers learned CCL-D's baselines before the job's stage read anything (it was
    deployed later, its input past retention): their window rows cannot teach it, so it
    says so once and counts them, instead of silently keeping no T_base."""
    monkeypatch.setattr(stage, "SHIFT_LAG_WINDOWS", 0)
    job = _job("pipeline-compute")
    tracker = IterationTracker(job.meta)
    config = SHORT_WINDOWS
    reducer = EvidenceStage(job.meta, config, 0, 1)
    late = SlowdownDetector(job.meta, config, own_tracker=False, evidence_imported=True)
    batches = list(replay(job.tables, 20 * MS))
    with caplog.at_level("WARNING", logger="failslow.detectors.slowdown.detector"):
        for i, (_, batch) in enumerate(batches):
            coll = batch["coll"]
            now = int(coll_columns(coll)["t"].max())
            iterations = with_emit_time("iterations", tracker.track(batch), now)
            reducer.update({**batch, "iterations": iterations})
            if i >= len(batches) // 2:  # the job's stage starts half way
                late.update({"evidence": with_emit_time(
                    "evidence", reducer.outputs()["evidence"], now), "iterations": iterations})
    assert late.stats.unlearned_windows > 0
    assert sum("whose baseline this stage never saw" in r.getMessage()
               for r in caplog.records) == 1


def test_stages_restored_from_a_snapshot_go_on_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stage, "SHIFT_LAG_WINDOWS", 0)
    job = _job("pipeline-link")
    whole, expected, _, _ = _staged(job, 2)
    resumed, reports, stages, _ = _staged(job, 2, cut_at=40)
    assert reports == expected
    _same_evidence(whole, resumed)
    assert stages[0].settled > 3


def test_the_bins_follow_iterations_only_once_the_detector_surely_has_them() -> None:
    """At least 3 job iterations, derived ``SHIFT_LAG_WINDOWS`` windows before the batch:
    until then the rows go at ``bin_shift``; then at the shortest iteration's eighth."""
    config = SlowdownConfig()
    job = _job("pipeline-compute")
    s = EvidenceStage(job.meta, config, 0, 1, window_ns=50 * MS)
    lag = stage.SHIFT_LAG_WINDOWS * 50 * MS
    durations = [400 * MS, 300 * MS, 500 * MS, 200 * MS]
    table = pa.table({"job": ["j"] * 4, "rank": [-1] * 4, "iteration": [1, 2, 3, 4],
                      "t_start": [0] * 4, "t_end": [0] * 4, "duration_ns": durations,
                      "t_emit": [1_000, 2_000, 3_000, 10 * lag]})
    s._learn(table)
    s._settle(3_000 + lag)  # the third is not older than the lag yet
    assert s.shift == config.bin_shift
    s._settle(3_001 + lag)
    assert s.settled == 3 and s.shift == shift_for(config, 300 * MS)
    s._settle(10 * lag + lag + 1)
    assert s.shift == shift_for(config, 200 * MS) < shift_for(config, 300 * MS)
    # rows derived beside it (no t_emit) are not the job stage's: they size nothing
    s._learn(table.drop_columns(["t_emit"]))
    assert s.recent == []


def test_rows_summed_coarser_than_the_detector_are_counted_not_lost() -> None:
    job = _job("pipeline-compute")
    reducer = EvidenceReducer(job.meta, SlowdownConfig())
    ev = reducer.update(job.tables["coll"].slice(0, 20_000), 26).summed()
    rows = evidence_table("j", ev, reducer.registry, 0)
    back = evidence_of(rows, reducer.registry, 24)
    assert back.coarser_rows == sum(len(p["bin"]) for ps in ev.tables.values() for p in ps) \
        + sum(len(r) for r in ev.rounds) > 0
    same = evidence_of(rows, reducer.registry, 26)
    assert same.coarser_rows == 0
    for name, parts in ev.tables.items():
        for col, values in parts[0].items():
            np.testing.assert_array_equal(same.tables[name][0][col], values, err_msg=col)


def test_the_importer_takes_each_row_once_per_shard_in_shard_order() -> None:
    def rows(shard: int, t: int, seqs: list[int]) -> pa.Table:
        return pa.table({"shard": pa.array([shard] * len(seqs), pa.int32()),
                         "seq": seqs, "t_emit": [t] * len(seqs)})

    imp = EvidenceImport()
    # one batch of shard 1 cut over two messages, and shard 0's rows after it
    first = imp.take(pa.concat_tables([rows(1, 10, [0, 1, 2]), rows(0, 10, [0, 1])]))
    assert list(zip(first.column("shard").to_pylist(), first.column("seq").to_pylist(),
                    strict=True)) == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]
    second = imp.take(pa.concat_tables([rows(1, 10, [2, 3, 4]), rows(1, 10, [3]),
                                        rows(0, 10, [1]), rows(0, 20, [0])]))
    assert list(zip(second.column("shard").to_pylist(), second.column("seq").to_pylist(),
                    second.column("t_emit").to_pylist(), strict=True)) == [
        (0, 0, 20), (1, 3, 10), (1, 4, 10)]
    again = EvidenceImport()
    again.restore(roundtrip(imp.snapshot()))
    assert again.take(rows(1, 10, [4, 5])).column("seq").to_pylist() == [5]
