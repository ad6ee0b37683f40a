"""Decoded ``coll`` rows and the sorting and grouping helpers the detectors share (the
iteration tracker of Greyhound §4.2, the slow-down and hang detectors): columns decoded once
per table, packed sort keys, radix sorts of small integer keys, medians by one sort."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from failslow import events

#: the latest table and its columns, as one tuple (detectors of a job may run in threads)
_DECODED: list[Any] = [(None, None)]


def coll_columns(coll: pa.Table) -> dict[str, np.ndarray]:
    """The ``coll`` columns the detectors use as numpy arrays, decoded once per table
    (the detectors of one job see the same batch): ``rank``, ``comm_rank``, ``comm_size``,
    ``seq``, ``peer``, ``t``, ``t_start`` (``NULL_TIME`` when null) as int64, ``comm`` as
    uint64, ``bytes`` as int64, ``op`` as its index in ``events.COLL_OPS`` and
    ``is_enter``."""
    table, cached = _DECODED[0]
    if table is coll:
        return dict(cached)
    op = pc.index_in(coll.column("op"), value_set=pa.array(events.COLL_OPS))
    out = {
        "rank": coll.column("rank").to_numpy().astype(np.int64),
        "comm": coll.column("comm").to_numpy().astype(np.uint64),
        "comm_rank": coll.column("comm_rank").to_numpy().astype(np.int64),
        "comm_size": coll.column("comm_size").to_numpy().astype(np.int64),
        "seq": coll.column("seq").to_numpy().astype(np.int64),
        "op": pc.fill_null(op, -1).to_numpy(zero_copy_only=False).astype(np.int64),
        "bytes": coll.column("bytes").to_numpy().astype(np.uint64).view(np.int64),
        "peer": coll.column("peer").to_numpy().astype(np.int64),
        "is_enter": pc.equal(coll.column("phase"), "enter").to_numpy(zero_copy_only=False),
        "t": coll.column("t").to_numpy().astype(np.int64),
        "t_start": pc.fill_null(coll.column("t_start"), events.NULL_TIME).to_numpy()
        .astype(np.int64),
    }
    _DECODED[0] = (coll, out)
    return dict(out)


#: the latest table and its communicator codes (:func:`comm_codes`)
_CODES: list[Any] = [(None, None)]


def comm_codes(coll: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique(comm, return_index=True, return_inverse=True)`` of the table's ``comm``
    column (sorted distinct ids, each one's first row, each row's position among them),
    computed once per table with a hash factorization: a batch holds many rows of a few
    hundred communicators, so the detectors look up the distinct ids, not every row."""
    table, cached = _CODES[0]
    if table is coll:
        return cached
    comm = coll_columns(coll)["comm"]
    codes, uniq = pd.factorize(comm)
    first = np.flatnonzero(np.diff(np.maximum.accumulate(codes), prepend=-1) > 0)
    order = np.argsort(uniq)
    position = np.empty(len(order), dtype=np.int64)
    position[order] = np.arange(len(order))
    out = (np.asarray(uniq, dtype=np.uint64)[order], first[order],
           position[codes.astype(np.int64, copy=False)])
    _CODES[0] = (coll, out)
    return out


def _pack(cols: dict[str, np.ndarray], by: tuple[str, ...]) -> np.ndarray | None:
    """One int64 per row ordering like the ``by`` columns lexicographically (each column
    offset by its minimum and given just enough bits); None when they do not fit."""
    n = len(cols[by[0]])
    key = np.zeros(n, dtype=np.int64)
    used = 0
    for k in reversed(by):
        v = cols[k].astype(np.int64, copy=False)
        lo = int(v.min())
        bits = max(1, (int(v.max()) - lo).bit_length())
        if used + bits > 62:
            return None
        if used:
            key |= (v - lo) << used
        else:
            key = v - lo
        used += bits
    return key


def _sorted_groups(cols: dict[str, np.ndarray], by: tuple[str, ...]
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(order sorting the rows by the ``by`` columns lexicographically, start offsets of
    the groups of equal keys in that order): one int64 sort when the keys pack."""
    n = len(cols[by[0]])
    key = _pack(cols, by) if n else None
    if key is None:
        order = np.lexsort([cols[k] for k in reversed(by)])
        return order, _group_starts(*[cols[k][order] for k in by])
    order = np.argsort(key, kind="stable")
    sk = key[order]
    return order, np.flatnonzero(np.concatenate(([True], sk[1:] != sk[:-1])))


def rank_time_order(rank: np.ndarray, t: np.ndarray, third: np.ndarray) -> np.ndarray:
    """The order sorting rows by (rank, t, third). Rows usually come in time order (a
    replay, a time-windowed stream): then a stable sort by rank alone is enough (and much
    cheaper); ties in time fall back to the full sort."""
    if len(t) > 1 and int(rank.max()) < 2**31 and int(rank.min()) >= 0 and \
            bool(np.all(t[1:] >= t[:-1])):
        order = stable_argsort(rank)
        r, tt, x = rank[order], t[order], third[order]
        same = r[1:] == r[:-1]
        if not np.any(same & (tt[1:] == tt[:-1]) & (x[1:] < x[:-1])):
            return order
    order, _ = _sorted_groups({"r": rank, "t": t, "x": third}, ("r", "t", "x"))
    return order


def stable_argsort(key: np.ndarray) -> np.ndarray:
    """``np.argsort(key, kind="stable")`` for non-negative integer keys below 2**32 (ranks,
    codes) as one or two passes of numpy's radix sort on 16-bit digits: linear time, several
    times faster than a comparison sort; other keys take the comparison sort."""
    n = len(key)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    lo, hi = int(key.min()), int(key.max())
    if lo < 0 or hi >= 2**32:
        return np.argsort(key, kind="stable")
    if hi < 2**16:
        return np.argsort(key.astype(np.uint16), kind="stable")
    k = key.astype(np.uint32)
    order = np.argsort((k & 0xFFFF).astype(np.uint16), kind="stable")
    return order[np.argsort((k[order] >> 16).astype(np.uint16), kind="stable")]


def _median(x: np.ndarray) -> float:
    """``float(np.median(x))`` of a non-empty array without NaN, by one sort (cheaper for
    the short arrays of the learning phase)."""
    s = np.sort(x)
    n = len(s)
    if n % 2:
        return float(s[n // 2])
    return (float(s[n // 2 - 1]) + float(s[n // 2])) / 2.0


def _median0(x: np.ndarray) -> np.ndarray:
    """``np.median(x, axis=0)`` of a 2-d array with rows and no NaN, by one sort along the
    first axis (the median of an even count is the mean of the middle two, as numpy's)."""
    s = np.sort(x, axis=0)
    n = s.shape[0]
    if n % 2:
        return s[n // 2].astype(np.float64)
    return (s[n // 2 - 1].astype(np.float64) + s[n // 2].astype(np.float64)) / 2.0


def _group_starts(*keys: np.ndarray) -> np.ndarray:
    """Start offsets of runs of equal keys in arrays already sorted by them."""
    n = len(keys[0])
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    change = np.zeros(n, dtype=bool)
    change[0] = True
    for k in keys:
        change[1:] |= k[1:] != k[:-1]
    return np.flatnonzero(change)
