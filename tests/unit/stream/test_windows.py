"""``stream.windows.split_at``: a job's held rows cut at the alignment horizon. Rows arrive
out of time order when several agents' (or several stages' shards') messages interleave;
both parts come back in time order, ties in arrival order, which is the order
``failslow.replay.cut`` gives the windows."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pytest

from failslow.replay import cut
from failslow.stream.windows import split_at


def _table(t: Sequence[int | None]) -> pa.Table:
    return pa.table({"t": pa.array(t, pa.int64()), "i": pa.array(range(len(t)), pa.int64())})


@pytest.mark.parametrize("seed", range(6))
def test_interleaved_rows_split_in_time_order(seed: int) -> None:
    rng = np.random.default_rng(seed)
    # two sources, each in order, interleaved message by message (with equal times)
    a = np.sort(rng.integers(0, 50, 40))
    b = np.sort(rng.integers(0, 50, 30))
    parts = [a[:10], b[:12], a[10:25], b[12:], a[25:]]
    t = [int(x) for x in np.concatenate(parts)]
    horizon = int(rng.integers(10, 40))
    out, keep = split_at(_table(t), "t", horizon)
    want = sorted(range(len(t)), key=lambda i: (t[i], i))  # stable: ties in arrival order
    assert out.column("i").to_pylist() == [i for i in want if t[i] <= horizon]
    assert keep.column("i").to_pylist() == [i for i in want if t[i] > horizon]
    # the windows of the released rows are those of the unsorted rows
    windows = cut({"coll": out}, 5, -1)
    windows_of_unsorted = cut({"coll": _table(t).filter(
        pa.array([x <= horizon for x in t]))}, 5, -1)
    assert [(now, w["coll"].column("i").to_pylist()) for now, w in windows] == \
        [(now, w["coll"].column("i").to_pylist()) for now, w in windows_of_unsorted]


def test_rows_in_order_are_sliced_and_nulls_count_as_earliest() -> None:
    table = _table([1, 2, 2, 5, 9])
    out, keep = split_at(table, "t", 2)
    assert out.column("i").to_pylist() == [0, 1, 2] and keep.column("i").to_pylist() == [3, 4]
    out, keep = split_at(_table([4, None, 1, 7]), "t", 4)
    assert out.column("i").to_pylist() == [1, 2, 0] and keep.column("i").to_pylist() == [3]
    out, keep = split_at(_table([]), "t", 4)
    assert out.num_rows == keep.num_rows == 0
