"""Replay a trace as a stream: batches of records in time order, as the stream processors
would receive them. The offline analyzer is this replay fed to the stream detectors
("batch = a stream replayed")."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from failslow.events import EventBatch
from failslow.tracedir import DATA_KINDS

#: The column that orders each kind in time.
TIME_COLUMN = {"coll": "t", "progress": "t", "link": "t", "gpu": "t", "span": "t_end"}

DEFAULT_WINDOW_NS = 100_000_000  # 100 ms of trace time per batch


def time_bounds(tables: Mapping[str, pa.Table]) -> tuple[int, int] | None:
    """Smallest and largest event time over all kinds, or None when there are no rows."""
    lows, highs = [], []
    for kind, table in tables.items():
        if kind in TIME_COLUMN and table.num_rows:
            mm = pc.min_max(table.column(TIME_COLUMN[kind])).as_py()
            lows.append(mm["min"])
            highs.append(mm["max"])
    return (min(lows), max(highs)) if lows else None


def replay(tables: Mapping[str, pa.Table], window_ns: int = DEFAULT_WINDOW_NS,
           ) -> Iterator[tuple[int, EventBatch]]:
    """Yield ``(now_ns, batch)``: every record with time in ``(now_ns - window_ns, now_ns]``,
    kinds sorted by time, windows in order. Windows with no records are skipped; ``now_ns``
    of the last batch is the last event time."""
    if window_ns <= 0:
        raise ValueError("window_ns must be positive")
    bounds = time_bounds(tables)
    if bounds is None:
        return
    t0, t1 = bounds
    edges = np.arange(t0 - 1, t1 + window_ns, window_ns, dtype=np.int64)
    edges[-1] = max(edges[-1], t1)
    sorted_tables: dict[str, pa.Table] = {}
    cuts: dict[str, np.ndarray] = {}
    for kind in DATA_KINDS:
        table = tables.get(kind)
        if table is None or not table.num_rows:
            continue
        key = TIME_COLUMN[kind]
        order = pc.sort_indices(table, sort_keys=[(key, "ascending")])
        table = table.take(order)
        sorted_tables[kind] = table
        cuts[kind] = np.searchsorted(table.column(key).to_numpy(), edges, side="right")
    for i in range(1, len(edges)):
        batch: EventBatch = {}
        for kind, table in sorted_tables.items():
            lo, hi = int(cuts[kind][i - 1]), int(cuts[kind][i])
            if hi > lo:
                batch[kind] = table.slice(lo, hi - lo)
        if batch:
            yield min(int(edges[i]), t1), batch
