"""Iteration tracking (Greyhound §4.2): ACF period of the op sequence, boundaries, times."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from support.snapshots import roundtrip
from support.synth_jobs import generate

from failslow.detectors.iterations import IterationTracker, find_period, symbols
from failslow.replay import replay


def _interleaved(iterations: int, microbatches: int = 4, seed: int = 0,
                 swaps: int = 0) -> np.ndarray:
    """TP collectives, PP send/recv and a DP all-reduce interleaved on one rank."""
    tp, pp, dp = 11, 22, 33  # communicator ids
    one: list[tuple[int, int, int]] = []
    for _ in range(microbatches):
        one += [(pp, 7, 1 << 20)] + [(tp, 0, 1 << 22)] * 4 + [(pp, 6, 1 << 20)]
        one += [(pp, 7, 1 << 20)] + [(tp, 0, 1 << 22)] * 4 + [(pp, 6, 1 << 20)]
    one += [(dp, 2, 1 << 26), (dp, 1, 1 << 26)]
    seq = np.array(one * iterations, dtype=np.uint64)
    rng = np.random.default_rng(seed)
    for i in rng.integers(0, len(seq) - 1, swaps):  # jitter: neighbouring calls swap
        seq[[i, i + 1]] = seq[[i + 1, i]]
    return symbols(seq[:, 0], seq[:, 1], seq[:, 2])


def test_period_of_interleaved_communicators() -> None:
    sym = _interleaved(10)
    assert find_period(sym) == len(sym) // 10


def test_period_survives_jitter() -> None:
    sym = _interleaved(12, swaps=6)
    assert find_period(sym) == len(sym) // 12


def test_microbatch_sub_period_is_not_the_iteration() -> None:
    # 16 identical micro-batches and one DP sync: the micro-batch pattern alone reaches a
    # high autocorrelation, but its multiples do not
    sym = _interleaved(6, microbatches=16)
    assert find_period(sym) == len(sym) // 6


def test_no_period_in_noise() -> None:
    rng = np.random.default_rng(1)
    sym = symbols(rng.integers(0, 5, 600).astype(np.uint64), np.zeros(600, np.int64), None)
    assert find_period(sym) == 0


def _track(job, window_ns: int = 20_000_000) -> tuple[IterationTracker, pa.Table]:
    tracker = IterationTracker(job.meta)
    rows = [tracker.track(b) for _, b in replay(job.tables, window_ns)]
    return tracker, pa.concat_tables(rows)


def test_job_iteration_time_matches_truth() -> None:
    job = generate(tp=2, pp=2, dp=2, iterations=30, jitter=0.03)
    tracker, rows = _track(job)
    summary = tracker.summary()
    assert summary is not None
    truth = np.median(job.true_iter_ns) / 1e9
    assert abs(summary["median_s"] - truth) / truth < 0.01
    assert summary["count"] >= 25
    job_rows = rows.filter(pc.equal(rows["rank"], -1))
    idx = job_rows["iteration"].to_numpy()
    assert np.all(np.diff(idx) == 1)
    # every rank reports its iterations too, with consistent numbering
    per_rank = rows.filter(pc.greater_equal(rows["rank"], 0))
    assert set(per_rank["rank"].to_pylist()) == set(range(job.meta.world_size))
    assert np.all(per_rank["duration_ns"].to_numpy() > 0)


@pytest.mark.parametrize("dp", [1, 2])
def test_batch_size_does_not_change_the_result(dp: int) -> None:
    # dp=1: the last stage's calls repeat every micro-batch; the reference rank's iteration
    # time sets its period whichever rank learns first
    job = generate(tp=2, pp=2, dp=dp, iterations=20)
    truth = np.median(job.true_iter_ns) / 1e9
    for window in (5_000_000, 1_000_000_000):
        tracker, _ = _track(job, window)
        summary = tracker.summary()
        assert summary is not None and summary["count"] >= 17
        assert abs(summary["median_s"] - truth) / truth < 0.005
        assert len({st.period for st in tracker.ranks.values()}) == 1


def test_snapshot_restore_mid_learning() -> None:

    job = generate(tp=2, pp=1, dp=2, iterations=20)
    batches = list(replay(job.tables, 20_000_000))
    ref = IterationTracker(job.meta)
    ref_rows = pa.concat_tables([ref.track(b) for _, b in batches])
    a = IterationTracker(job.meta)
    rows = [a.track(b) for _, b in batches[:5]]  # still learning the period
    b = IterationTracker(job.meta)
    b.restore(roundtrip(a.snapshot()))
    rows += [b.track(x) for _, x in batches[5:]]
    assert pa.concat_tables(rows).equals(ref_rows)


@pytest.mark.parametrize("seed", [3, 4])
def test_straggler_lengthens_job_iterations(seed: int) -> None:
    from support.synth_jobs import Fault

    job = generate(tp=2, pp=2, dp=2, iterations=30, seed=seed,
                   faults=[Fault("compute", 15, None, 1.5, rank=3)])
    tracker, _ = _track(job)
    d = np.array([x[2] for x in tracker.job], dtype=float)
    assert np.median(d[18:]) > 1.1 * np.median(d[3:13])


def test_stable_argsort_and_median_equal_numpy() -> None:
    """The radix sort and the one-sort median of the hot paths give numpy's results."""
    from failslow.detectors.iterations import _median, stable_argsort

    rng = np.random.default_rng(11)
    for top in (1, 300, 70_000, 2**31, 2**40):
        key = rng.integers(0, top, 20_000)
        assert (stable_argsort(key) == np.argsort(key, kind="stable")).all()
    assert (stable_argsort(np.array([-3, 5, -3, 2])) == np.array([0, 2, 3, 1])).all()
    assert len(stable_argsort(np.zeros(0, dtype=np.int64))) == 0
    for n in (1, 2, 7, 64):
        for x in (rng.integers(-10**12, 10**12, n), rng.normal(size=n) * 1e9):
            assert _median(x) == float(np.median(x))


def test_column_median_equals_numpy_median_axis0() -> None:
    """``_median0`` (the anchor-phase choice of Greyhound §4.2 iteration boundaries) is
    ``np.median(x, axis=0)`` exactly: odd and even row counts, huge ints, -inf."""
    from failslow.detectors.iterations import _median0

    rng = np.random.default_rng(11)
    for rows in range(1, 10):
        for cols in (1, 2, 7):
            x = rng.integers(-10**15, 10**15, (rows, cols))
            assert np.array_equal(_median0(x), np.median(x, axis=0))
            y = rng.normal(size=(rows, cols))
            y[rng.random((rows, cols)) < 0.3] = -np.inf
            assert np.array_equal(_median0(y), np.median(y, axis=0))
