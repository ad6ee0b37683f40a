"""Which steps of a trace S3 plans over (Greyhound §5.2): step start times, the steps inside
a diagnosed fail-slow's window, and slow anomalies grouped by overlapping windows."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from failslow.diagnosis import Anomaly
from failslow.events import JobMeta
from failslow.whatif.ops import OpTrace


def step_start_times(tables: dict[str, pa.Table], ops: OpTrace, meta: JobMeta
                     ) -> np.ndarray | None:
    """Start time (ns) of every step of ``ops``: its first span, else the representative
    worker's params-sync enters in order; None when neither works."""
    import pyarrow.compute as pc

    span = tables.get("span")
    if span is not None and span.num_rows:
        step = np.asarray(span.column("step").to_numpy(), dtype=np.int64)
        t0 = np.asarray(span.column("t_start").to_numpy(), dtype=np.int64)
        uniq, inv = np.unique(step, return_inverse=True)
        lo = np.full(uniq.size, np.iinfo(np.int64).max)
        np.minimum.at(lo, inv.reshape(-1), t0)
        pos = np.searchsorted(uniq, ops.steps)
        if np.all(pos < uniq.size) and np.array_equal(uniq[np.minimum(pos, uniq.size - 1)],
                                                      ops.steps):
            return np.asarray(lo[pos])
    coll = tables.get("coll")
    if coll is None or coll.num_rows == 0 or meta.dp < 2:
        return None
    rank0 = int(ops.ranks[0, 0])
    mask = pc.and_(pc.and_(pc.equal(coll.column("rank"), rank0),
                           pc.equal(coll.column("op"), "allgather")),
                   pc.equal(coll.column("phase"), "enter"))
    t = np.sort(np.asarray(coll.filter(mask).column("t").to_numpy(), dtype=np.int64))
    first = int(ops.steps.min()) if ops.steps.size else 0
    idx = ops.steps - first
    if t.size == 0 or idx.max() >= t.size:
        return None
    return np.asarray(t[idx])


def steps_in_window(ops: OpTrace, step_starts: np.ndarray | None,
                    anomalies: Sequence[Anomaly]) -> np.ndarray:
    """Steps that spent at least half their time inside an anomaly's window (none when the
    step times are unknown)."""
    mask = np.zeros(ops.steps.size, dtype=bool)
    if step_starts is None:
        return mask
    begin = step_starts.astype(np.float64)
    end = begin + ops.actual * 1e9
    for a in anomalies:
        lo = float(a.start_ns or 0)
        hi = float(a.end_ns) if a.end_ns is not None else math.inf
        inside = np.clip(np.minimum(end, hi) - np.maximum(begin, lo), 0.0, None)
        mask |= inside >= 0.5 * (end - begin)
    return mask


def anomaly_groups(anomalies: Sequence[Anomaly]) -> list[list[Anomaly]]:
    """Slow anomalies grouped by overlapping time windows (planned together)."""
    slow = sorted((a for a in anomalies if a.kind == "slow"),
                  key=lambda a: (a.start_ns or 0, a.id))
    groups: list[list[Anomaly]] = []
    end = -1
    for a in slow:
        s = a.start_ns or 0
        e = a.end_ns if a.end_ns is not None else np.iinfo(np.int64).max
        if groups and s <= end:
            groups[-1].append(a)
            end = max(end, e)
        else:
            groups.append([a])
            end = e
    return groups
