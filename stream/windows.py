"""Batching of a job's records: event-time windows (as ``failslow analyze`` replays a
trace), splitting at an alignment horizon, and the small table helpers of the processor."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from failslow import events
from failslow.detectors.base import EventBatch
from failslow.replay import TIME_COLUMN
from failslow.stream.transport import H_WATERMARK, Message


def windows(batch: EventBatch, window_ns: int) -> list[tuple[int, EventBatch]]:
    """``failslow.replay.replay`` of one batch (windows ``(edge - window_ns, edge]`` from the
    batch's first event time, ``now`` = the window's end or the last event time), without
    sorting kinds whose rows are already in time order (they usually are)."""
    timed = {k: t for k, t in batch.items() if k in TIME_COLUMN and t.num_rows}
    if not timed:
        return []
    times: dict[str, np.ndarray] = {}
    for kind, table in timed.items():
        column = table.column(TIME_COLUMN[kind])
        t = column.to_numpy() if column.null_count == 0 else \
            pc.fill_null(column, events.NULL_TIME).to_numpy()
        if t.size > 1 and bool((t[1:] < t[:-1]).any()):
            order = np.argsort(t, kind="stable")
            timed[kind] = table.take(pa.array(order))
            t = t[order]
        times[kind] = t
    t0 = min(int(t[0]) for t in times.values())
    t1 = max(int(t[-1]) for t in times.values())
    edges = np.arange(t0 - 1, t1 + window_ns, window_ns, dtype=np.int64)
    edges[-1] = max(edges[-1], t1)
    cuts = {k: np.searchsorted(t, edges, side="right") for k, t in times.items()}
    out: list[tuple[int, EventBatch]] = []
    for i in range(1, len(edges)):
        window: EventBatch = {}
        for kind, table in timed.items():
            lo, hi = int(cuts[kind][i - 1]), int(cuts[kind][i])
            if hi > lo:
                window[kind] = table.slice(lo, hi - lo)
        if window:
            out.append((min(int(edges[i]), t1), window))
    return out


def split_at(table: pa.Table, column: str, horizon: int) -> tuple[pa.Table, pa.Table]:
    """Rows with ``column <= horizon`` and the others; zero-copy slices when the column is
    in order (it usually is: messages arrive in time order)."""
    t = table.column(column)
    if t.null_count == 0:
        values = t.to_numpy()
        if values.size < 2 or not bool((values[1:] < values[:-1]).any()):
            cut = int(np.searchsorted(values, horizon, side="right"))
            return table.slice(0, cut), table.slice(cut)
    mask = pc.fill_null(pc.less_equal(t, horizon), True)
    return table.filter(mask), table.filter(pc.invert(mask))


def watermark(message: Message) -> int | None:
    """The producer's ``failslow-watermark`` header (ns), if any."""
    value = message.headers.get(H_WATERMARK)
    try:
        return int(value) if value else None
    except ValueError:
        return None


def time_span(batch: EventBatch) -> tuple[int, int] | None:
    """Smallest and largest event time of ``batch`` (None: no timed rows)."""
    lows, highs = [], []
    for kind, table in batch.items():
        column = TIME_COLUMN.get(kind)
        if column and table.num_rows:
            mm = pc.min_max(table.column(column)).as_py()
            if mm["min"] is not None:
                lows.append(int(mm["min"]))
                highs.append(int(mm["max"]))
    return (min(lows), max(highs)) if lows else None


def last_step(result: Mapping[str, Any], default: int) -> int:
    """The last step a what-if result covers (its ``steps`` list), else ``default``."""
    steps = result.get("steps") if isinstance(result, Mapping) else None
    if isinstance(steps, list) and steps:
        try:
            return int(max(steps))
        except (TypeError, ValueError):
            pass
    return int(default)


def concat_tables(tables: list[pa.Table]) -> pa.Table:
    if len(tables) == 1:
        return tables[0]
    return pa.concat_tables(tables, promote_options="permissive")
