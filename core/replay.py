"""Replay a trace as a stream: batches of records in time order, as the stream processors
would receive them. The offline analyzer is this replay fed to the stream detectors
("batch = a stream replayed")."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from failslow.events import NULL_TIME, EventBatch
from failslow.tracedir import DATA_KINDS

#: The column that orders each kind in time (``iterations``: rows imported from the stage
#: that derives them, by the event time they were derived at, failslow.stream.exports).
TIME_COLUMN = {"coll": "t", "progress": "t", "link": "t", "gpu": "t", "span": "t_end",
               "ras": "t", "probe": "t", "iterations": "t_emit",
               "evidence": "t_emit"}

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
    yield from cut(tables, window_ns, bounds[0] - 1, bounds[1])


def cut(tables: Mapping[str, pa.Table], window_ns: int, origin: int, horizon: int | None = None
        ) -> list[tuple[int, EventBatch]]:
    """The records of ``tables`` in the windows ``(origin + (k-1) w, origin + k w]`` of the
    grid that starts at ``origin`` (a job's first event time less one), in time order, as
    ``(now, batch)``: ``now`` is the window's end, or ``horizon`` (default: the last event
    time) when that comes first. Windows with no records are skipped. One implementation for
    both paths: :func:`replay` cuts a whole trace with it, the stream processor each release
    of a job's records (on the job's grid, so both see the same windows). Kinds whose rows
    are in time order are not sorted (they usually are)."""
    timed: dict[str, pa.Table] = {}
    times: dict[str, np.ndarray] = {}
    # the trace's kinds, then tables imported from another stage (``iterations``)
    kinds = (*DATA_KINDS, *(k for k in tables if k in TIME_COLUMN and k not in DATA_KINDS))
    for kind in kinds:
        table = tables.get(kind)
        if table is None or not table.num_rows:
            continue
        column = table.column(TIME_COLUMN[kind])
        t = column.to_numpy() if column.null_count == 0 else \
            pc.fill_null(column, NULL_TIME).to_numpy()
        if t.size > 1 and bool((t[1:] < t[:-1]).any()):
            order = np.argsort(t, kind="stable")
            table = table.take(pa.array(order))
            t = t[order]
        timed[kind], times[kind] = table, t
    if not timed:
        return []
    t0 = min(int(t[0]) for t in times.values())
    t1 = max(int(t[-1]) for t in times.values())
    last = t1 if horizon is None else max(int(horizon), t1)
    first = origin + (t0 - origin - 1) // window_ns * window_ns
    edges = np.arange(first, t1 + window_ns, window_ns, dtype=np.int64)
    cuts = {k: np.searchsorted(t, edges, side="right") for k, t in times.items()}
    out: list[tuple[int, EventBatch]] = []
    for i in range(1, len(edges)):
        window: EventBatch = {}
        for kind, table in timed.items():
            lo, hi = int(cuts[kind][i - 1]), int(cuts[kind][i])
            if hi > lo:
                window[kind] = table.slice(lo, hi - lo)
        if window:
            out.append((min(int(edges[i]), last), window))
    return out


#: :func:`coalesce`: a batch of fewer rows than this is merged with the next ones, over at
#: most ``MAX_MERGED_WINDOWS`` windows of trace time.
MIN_BATCH_ROWS = 2000
MAX_MERGED_WINDOWS = 10


class Coalescer:
    """Sparse windows merged into batches that amortise the detectors' per-batch cost: a
    window is held until the held ones have ``min_rows`` rows or span ``max_windows``
    windows, then they are handed on together at the latest window's time. A dense trace
    keeps its windows; a sparse one (a job of few ranks and long steps, such as ByteDance's
    16-worker trial with 46 s steps: 15,000 windows of a few rows) is analysed in batches of
    up to ``max_windows`` windows. Ticks stay at most that far apart, far below the hang
    detector's 5 s idle floor. Offline (:func:`coalesce`) and online (the stream processor,
    which saves :meth:`state` with its snapshot) merge the same windows."""

    def __init__(self, window_ns: int = DEFAULT_WINDOW_NS, min_rows: int = MIN_BATCH_ROWS,
                 max_windows: int = MAX_MERGED_WINDOWS) -> None:
        self.window_ns = window_ns
        self.min_rows = min_rows
        self.max_windows = max_windows
        self.pending: dict[str, list[pa.Table]] = {}
        self.rows = 0
        self.first = 0  # now of the first held window
        self.now = 0  # now of the latest held window

    def push(self, now: int, batch: EventBatch) -> tuple[int, EventBatch] | None:
        """Hold one window; returns the merged batch when it is complete."""
        if not self.pending:
            self.first = now
        self.now = now
        for kind, table in batch.items():
            self.pending.setdefault(kind, []).append(table)
            self.rows += table.num_rows
        if (self.rows >= self.min_rows
                or now - self.first >= (self.max_windows - 1) * self.window_ns):
            return self.flush()
        return None

    def flush(self) -> tuple[int, EventBatch] | None:
        """The held windows merged (None: none held)."""
        if not self.pending:
            return None
        out = self.now, _merged(self.pending)
        self.pending, self.rows = {}, 0
        return out


def coalesce(batches: Iterator[tuple[int, EventBatch]], window_ns: int = DEFAULT_WINDOW_NS,
             min_rows: int = MIN_BATCH_ROWS) -> Iterator[tuple[int, EventBatch]]:
    """Replayed batches with the sparse ones merged (:class:`Coalescer`)."""
    merger = Coalescer(window_ns, min_rows)
    for now, batch in batches:
        out = merger.push(now, batch)
        if out is not None:
            yield out
    last = merger.flush()
    if last is not None:
        yield last


def _merged(parts: dict[str, list[pa.Table]]) -> EventBatch:
    return {kind: tables[0] if len(tables) == 1 else pa.concat_tables(
        tables, promote_options="permissive") for kind, tables in parts.items()}
