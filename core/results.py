"""Derived records the detectors produce besides anomalies, stored next to the events
(ClickHouse tables ``rounds`` and ``iterations``). Like :mod:`failslow.events`, the one place
that knows these columns."""

from __future__ import annotations

import functools

import pyarrow as pa

SCHEMAS: dict[str, pa.Schema] = {
    # One row per completed collective round (comm, seq) or point-to-point operation.
    "rounds": pa.schema([
        pa.field("job", pa.string(), nullable=False),
        pa.field("comm", pa.uint64(), nullable=False),
        pa.field("seq", pa.uint64(), nullable=False),
        pa.field("op", pa.string(), nullable=False),
        pa.field("bytes", pa.uint64(), nullable=False),
        pa.field("members", pa.int32(), nullable=False),
        pa.field("t_first_enter", pa.int64(), nullable=False),
        pa.field("t_last_enter", pa.int64(), nullable=False),
        pa.field("t_end", pa.int64(), nullable=False),
        pa.field("last_rank", pa.int32(), nullable=False),       # the rank that entered last
        pa.field("duration_max_ns", pa.int64(), nullable=False),  # max over members of end-enter
        pa.field("duration_min_ns", pa.int64(), nullable=False),  # min over members of end-enter
    ]),
    # One row per detected training iteration of a rank (rank -1: the job as a whole).
    "iterations": pa.schema([
        pa.field("job", pa.string(), nullable=False),
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("iteration", pa.int64(), nullable=False),
        pa.field("t_start", pa.int64(), nullable=False),
        pa.field("t_end", pa.int64(), nullable=False),
        pa.field("duration_ns", pa.int64(), nullable=False),
    ]),
}


@functools.cache
def empty(kind: str) -> pa.Table:
    """An empty table of ``kind``, built once (Arrow tables are immutable; building one
    from its schema costs more than detecting on a small batch)."""
    return SCHEMAS[kind].empty_table()
