"""Evidence reducers sharing one job (issue 13 item 3; detectors/slowdown/reducer.py and
shards.py): any number of shards gives the evidence, the rounds and the diagnosis of one."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from support.snapshots import roundtrip
from support.synth_jobs import SHARD_JOBS, Job, shard_job

from failslow.detectors.iterations import coll_columns
from failslow.detectors.slowdown import RECV, SEND, SlowdownConfig, SlowdownDetector
from failslow.detectors.slowdown.accounting import TABLE_NAMES
from failslow.detectors.slowdown.shards import ShardRouter
from failslow.events import NULL_TIME
from failslow.replay import replay

MS = 1_000_000

def _job(name: str) -> Job:
    return shard_job(name, seed=7)


def _run(job: Job, shards: int, cut_at: int | None = None
         ) -> tuple[SlowdownDetector, list[dict[str, Any]], int]:
    """The detector over the job in 20 ms batches; ``cut_at``: snapshot after that many
    batches and go on in a fresh detector restored from it."""
    config = SlowdownConfig(shards=shards)
    det = SlowdownDetector(job.meta, config)
    reports: list[dict[str, Any]] = []
    rounds = 0
    for i, (_, batch) in enumerate(replay(job.tables, 20 * MS)):
        if cut_at is not None and i == cut_at:
            state = roundtrip(det.snapshot())
            det = SlowdownDetector(job.meta, config)
            det.restore(state)
        reports += [a.to_dict() for a in det.update(batch)]
        rounds += det.last_rounds.num_rows
    return det, reports, rounds


def _tables(det: SlowdownDetector) -> dict[str, dict[str, np.ndarray]]:
    return {name: getattr(det.stats, name).data for name in TABLE_NAMES}


@pytest.mark.parametrize("name", sorted(SHARD_JOBS))
@pytest.mark.parametrize("shards", [2, 3, 5])
def test_shards_give_the_evidence_and_diagnosis_of_one_reducer(name: str, shards: int) -> None:
    job = _job(name)
    one, one_reports, one_rounds = _run(job, 1)
    many, many_reports, many_rounds = _run(job, shards)
    assert len(many.reducers) == shards
    assert one_reports and many_reports == one_reports
    assert many_rounds == one_rounds > 0
    a, b = _tables(one), _tables(many)
    for name_ in TABLE_NAMES:
        assert a[name_].keys() == b[name_].keys()
        for col in a[name_]:
            np.testing.assert_array_equal(a[name_][col], b[name_][col], err_msg=name_ + col)
    # each shard measured the gaps of its own block of ranks, and only those
    block = many.router.shard_of(np.arange(job.meta.world_size))
    for s, reducer in enumerate(many.reducers):
        seen = np.flatnonzero(reducer.gaps.last_end != NULL_TIME)
        np.testing.assert_array_equal(seen, np.flatnonzero(block == s))


def test_a_snapshot_of_sharded_reducers_restores_mid_stream() -> None:
    job = _job("pipeline-link")
    _, whole, _ = _run(job, 3)
    _, resumed, _ = _run(job, 3, cut_at=40)
    assert resumed == whole


def test_each_round_is_joined_by_one_shard_and_each_rank_measured_by_one() -> None:
    job = _job("pipeline-compute")
    coll = job.tables["coll"]
    router = ShardRouter(job.meta, 4)
    parts = router.split(coll)
    own = sum(g.num_rows for _, g in parts if g is not None)
    assert own == coll.num_rows
    c = coll_columns(coll)
    join = router.join_shard(coll)
    send, recv = c["op"] == SEND, c["op"] == RECV
    for comm in job.meta.comms:
        rows = c["comm"] == np.uint64(comm.comm)
        if comm.kind != "pp":  # a collective: the shard of its lowest rank
            assert set(join[rows]) == {router.shard_of(np.array([min(comm.ranks)]))[0]}
            continue
        # a point-to-point round: the receiving rank's shard (the send row travels there)
        dst = np.where(send, np.array(comm.ranks)[np.clip(c["peer"], 0, len(comm.ranks) - 1)],
                       c["rank"])
        sel = rows & (send | recv)
        assert sel.any()
        np.testing.assert_array_equal(join[sel], router.shard_of(dst[sel]))
    ranks = np.arange(job.meta.world_size)
    shards = router.shard_of(ranks)
    assert list(np.unique(shards)) == [0, 1, 2, 3]
    assert (np.diff(shards) >= 0).all()  # contiguous blocks


def test_a_job_without_communicators_in_its_meta_runs_one_reducer() -> None:
    job = _job("pure-dp")
    bare = dataclasses.replace(job.meta, comms=())
    det = SlowdownDetector(bare, SlowdownConfig(shards=4))
    assert len(det.reducers) == 1
    assert ShardRouter(bare, 4).split(pa.table({"x": [1]}))[0][1] is None


def test_the_setting_gives_every_job_of_the_engine_its_reducers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``FAILSLOW_EVIDENCE_SHARDS`` reaches the engine's slow-down detector (online and
    offline build it alike); the engine's diagnosis stays the same."""
    from failslow.engine.analyzer import JobAnalyzer

    job = _job("pipeline-compute")

    def diagnose() -> tuple[int, list[dict[str, Any]]]:
        engine = JobAnalyzer(job.meta)
        for _, batch in replay(job.tables, 20 * MS):
            engine.update(batch)
        return len(engine.slowdown.reducers), [a.to_dict()
                                               for a in engine.diagnosis().anomalies]

    monkeypatch.delenv("FAILSLOW_EVIDENCE_SHARDS", raising=False)
    one, expected = diagnose()
    monkeypatch.setenv("FAILSLOW_EVIDENCE_SHARDS", "3")
    three, got = diagnose()
    assert (one, three) == (1, 3)
    assert expected and got == expected
