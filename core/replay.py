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


#: :func:`coalesce`: a batch of fewer rows than this is merged with the next ones, over at
#: most ``MAX_MERGED_WINDOWS`` windows of trace time.
MIN_BATCH_ROWS = 2000
MAX_MERGED_WINDOWS = 10


def coalesce(batches: Iterator[tuple[int, EventBatch]], window_ns: int = DEFAULT_WINDOW_NS,
             min_rows: int = MIN_BATCH_ROWS) -> Iterator[tuple[int, EventBatch]]:
    """Replayed batches with the sparse ones merged: a batch is held until it has
    ``min_rows`` rows or spans :data:`MAX_MERGED_WINDOWS` windows, then handed on at the
    latest window's time. A dense trace keeps its windows; a sparse one (a job of few ranks
    and long steps, such as ByteDance's 16-worker trial with 46 s steps: 15,000 windows of a
    few rows) is analysed in batches big enough to amortise the detectors' per-batch cost.
    Ticks stay at most ``MAX_MERGED_WINDOWS`` windows apart, far below the hang detector's
    5 s idle floor."""
    pending: dict[str, list[pa.Table]] = {}
    rows, first, now = 0, 0, 0
    for now, batch in batches:
        if not pending:
            first = now
        for kind, table in batch.items():
            pending.setdefault(kind, []).append(table)
            rows += table.num_rows
        if rows >= min_rows or now - first >= (MAX_MERGED_WINDOWS - 1) * window_ns:
            yield now, _merged(pending)
            pending, rows = {}, 0
    if pending:
        yield now, _merged(pending)


def _merged(parts: dict[str, list[pa.Table]]) -> EventBatch:
    return {kind: tables[0] if len(tables) == 1 else pa.concat_tables(tables)
            for kind, tables in parts.items()}
