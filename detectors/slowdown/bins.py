"""Time-binned statistics (:class:`BinTable`: sums per key and time bin, queried by time
window) and dense ids for int64 keys (:class:`_KeyIndex`), vectorized: a batch costs no
per-row Python."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from failslow.detectors.iterations import _group_starts, _pack


class _KeyIndex:
    """Dense ids ``0, 1, ...`` for int64 keys, in the order keys are first seen (new keys of
    one call in ascending order): a sorted key array, so a batch is looked up with one
    binary search per row and no per-key Python."""

    def __init__(self, pairs: Sequence[tuple[int, int]] = ()) -> None:
        self.keys = np.zeros(0, dtype=np.int64)  # sorted
        self.ids = np.zeros(0, dtype=np.int64)
        if pairs:
            arr = np.array(pairs, dtype=np.int64).reshape(-1, 2)
            o = np.argsort(arr[:, 0], kind="stable")
            self.keys, self.ids = arr[o, 0], arr[o, 1]

    def __len__(self) -> int:
        return len(self.keys)

    def _find(self, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if len(self.keys) == 0:
            return np.zeros(len(k), dtype=np.int64), np.zeros(len(k), dtype=bool)
        pos = np.minimum(np.searchsorted(self.keys, k), len(self.keys) - 1)
        return pos, self.keys[pos] == k

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """The id of every key, registering the new ones."""
        k = np.asarray(keys, dtype=np.int64).reshape(-1)
        pos, hit = self._find(k)
        if not hit.all():
            new = np.unique(k[~hit])
            keys_all = np.concatenate([self.keys, new])
            ids_all = np.concatenate([self.ids, len(self.keys) + np.arange(len(new))])
            o = np.argsort(keys_all, kind="stable")
            self.keys, self.ids = keys_all[o], ids_all[o]
            pos, hit = self._find(k)
        return self.ids[pos]

    def get(self, key: int) -> int | None:
        pos, hit = self._find(np.array([key], dtype=np.int64))
        return int(self.ids[pos[0]]) if hit[0] else None

    def pairs(self) -> list[list[int]]:
        """``[key, id]`` pairs in id order."""
        o = np.argsort(self.ids, kind="stable")
        return [[int(a), int(b)] for a, b in zip(self.keys[o].tolist(), self.ids[o].tolist(),
                                                  strict=True)]

    def key_of(self) -> np.ndarray:
        """The key of every id (indexed by id)."""
        out = np.zeros(len(self.keys), dtype=np.int64)
        out[self.ids] = self.keys
        return out


class BinTable:
    """Statistics summed per key and time bin (bin = time >> shift). ``arg`` names a column
    maximized per key whose row also supplies the ``carried`` columns (CCL-D's round with
    the largest range and its T_max, T_min).

    Rows are appended as they come (no sort per batch) and summed when the table compacts;
    the compacted part is sorted by bin, so a time-window query slices it by binary search
    and scans only the rows appended since."""

    def __init__(self, keys: tuple[str, ...], sums: tuple[str, ...], arg: str | None = None,
                 carried: tuple[str, ...] = ()) -> None:
        self.keys, self.sums, self.arg, self.carried = keys, sums, arg, carried
        self.floats = sums + ((arg,) if arg else ()) + carried
        self._names = ("bin", *keys, *self.floats)
        self._data: dict[str, np.ndarray] = {}
        self._chunks: list[dict[str, np.ndarray]] = []
        self._pending_rows = 0
        # query results by (lo, hi, by): a window no later row falls into is summed once
        # (the reference window of an anomaly is asked for at every iteration)
        self._cache: dict[tuple[Any, ...], dict[str, np.ndarray]] = {}
        self.clear()
        self._compacted = 0

    def clear(self) -> None:
        self._data = {k: np.zeros(0, dtype=np.int64) for k in ("bin", *self.keys)}
        self._data.update({f: np.zeros(0) for f in self.floats})
        self._chunks, self._pending_rows = [], 0
        self._cache = {}
        self._chunk_low = 2**62  # the least bin of the pending chunks

    @property
    def data(self) -> dict[str, np.ndarray]:
        """All rows, compacted (sorted by bin and keys, one row per bin and key)."""
        if self._chunks:
            self.compact()
        return self._data

    def __len__(self) -> int:
        return len(self._data["bin"]) + self._pending_rows

    def add(self, cols: dict[str, np.ndarray]) -> None:
        """Append rows; they are summed with the others when the table compacts (rows
        pending beyond twice the compacted size), so a batch costs no sort."""
        if len(cols["bin"]) == 0:
            return
        low = int(cols["bin"].min())
        if self._cache:
            self._cache = {k: v for k, v in self._cache.items() if k[1] <= low}
        self._chunk_low = min(self._chunk_low, low)
        self._chunks.append({k: cols[k] for k in self._names})
        self._pending_rows += len(cols["bin"])
        if self._pending_rows > 2 * self._compacted + 65536:
            self.compact()

    def compact(self, whole: bool = False) -> None:
        """Sum the pending rows into the compacted ones. Those are sorted by bin: the ones
        before the least pending bin cannot meet a pending row, so only the rest is summed
        again (the rows of one key keep their order: the sums are those of a whole
        re-aggregation, which ``whole`` forces)."""
        data = self._data
        cut = 0 if whole else int(np.searchsorted(data["bin"], self._chunk_low, side="left"))
        parts = [{k: v[cut:] for k, v in data.items()}, *self._chunks]
        allr = {k: np.concatenate([p[k] for p in parts]) for k in self._names}
        tail = _aggregate(allr, ("bin", *self.keys), self.sums, self.arg, self.carried)
        self._data = tail if cut == 0 else {
            k: np.concatenate([data[k][:cut], tail[k]]) for k in self._names}
        self._chunks, self._pending_rows = [], 0
        self._chunk_low = 2**62
        self._compacted = len(self._data["bin"])

    def rebin(self, delta: int) -> None:
        self._cache = {}
        if delta > 0:
            self.compact()
            self._data["bin"] = self._data["bin"] >> delta
            self.compact(whole=True)

    def prune(self, min_bin: int) -> None:
        """Drop the rows of bins before ``min_bin``."""
        self._cache = {k: v for k, v in self._cache.items() if k[0] >= min_bin}
        cut = int(np.searchsorted(self._data["bin"], min_bin, side="left"))
        if cut:
            self._data = {k: v[cut:] for k, v in self._data.items()}
            self._compacted = len(self._data["bin"])
        if min_bin <= self._chunk_low:
            return  # no pending row is that old
        kept = []
        for ch in self._chunks:
            keep = ch["bin"] >= min_bin
            if keep.all():
                kept.append(ch)
            elif keep.any():
                kept.append({k: v[keep] for k, v in ch.items()})
        self._chunks = kept
        self._pending_rows = sum(len(ch["bin"]) for ch in kept)
        self._chunk_low = min((int(ch["bin"].min()) for ch in kept), default=2**62)

    def window(self, lo: int, hi: int) -> dict[str, np.ndarray]:
        """The raw rows with ``lo <= bin < hi`` (not summed)."""
        b = self._data["bin"]
        i, j = int(np.searchsorted(b, lo, "left")), int(np.searchsorted(b, hi, "left"))
        parts = [{k: v[i:j] for k, v in self._data.items()}]
        for ch in self._chunks:
            sel = (ch["bin"] >= lo) & (ch["bin"] < hi)
            if sel.any():
                parts.append({k: v[sel] for k, v in ch.items()})
        if len(parts) == 1:
            return parts[0]
        return {k: np.concatenate([p[k] for p in parts]) for k in self._names}

    def query(self, lo: int, hi: int, by: tuple[str, ...]) -> dict[str, np.ndarray]:
        """Rows with ``lo <= bin < hi`` summed by the ``by`` keys (the caller must not
        modify the arrays: results are cached until a row falls into the window)."""
        key = (lo, hi, by)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = _aggregate(self.window(lo, hi), by, self.sums, self.arg,
                                                self.carried)
            if len(self._cache) > 64:
                del self._cache[next(iter(self._cache))]
        return hit

    def snapshot(self) -> dict[str, Any]:
        return {k: v.copy() for k, v in self.data.items()}

    def restore(self, state: dict[str, Any]) -> None:
        self._data = {k: np.array(state[k], dtype=np.float64 if k in self.floats else np.int64)
                      for k in self._names}
        self._chunks, self._pending_rows = [], 0
        self._chunk_low = 2**62
        self._compacted = len(self._data["bin"])
        self._cache = {}


def _aggregate(cols: dict[str, np.ndarray], by: tuple[str, ...], sums: tuple[str, ...],
               arg: str | None, carried: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Rows summed per distinct ``by`` key, in key order; ``arg``: the column maximized
    per key, whose row also gives the ``carried`` columns."""
    n = len(cols[by[0]])
    if n == 0:
        out = {k: cols[k][:0] for k in by}
        out.update({f: np.zeros(0) for f in (*sums, *((arg,) if arg else ()), *carried)})
        return out
    key = _pack(cols, by)
    if key is None:
        sort_keys = [cols[k] for k in reversed(by)]
        if arg:
            sort_keys.insert(0, -cols[arg])
        order = np.lexsort(sort_keys)
        srt = {k: cols[k][order] for k in by}
        starts = _group_starts(*[srt[k] for k in by])
    else:
        order = np.argsort(key, kind="stable")
        sk = key[order]
        starts = np.flatnonzero(np.concatenate(([True], sk[1:] != sk[:-1])))
        if arg:
            # per key the first row (in input order) with the largest ``arg``: the row a
            # stable sort by (key, -arg) puts first
            v = cols[arg][order]
            mx = np.maximum.reduceat(v, starts)
            counts = np.diff(np.append(starts, len(order)))
            at = np.flatnonzero(v == np.repeat(mx, counts))
            grp = np.searchsorted(starts, at, side="right") - 1
            keep = np.concatenate(([True], grp[1:] != grp[:-1]))
            best = order[at[keep]]
            out = {k: cols[k][order[starts]] for k in by}
            for f in sums:
                out[f] = np.add.reduceat(cols[f][order].astype(np.float64, copy=False), starts)
            out[arg] = cols[arg][best].astype(np.float64)
            for f in carried:
                out[f] = cols[f][best].astype(np.float64)
            return out
    first = order[starts]
    out = {k: cols[k][first] for k in by}
    for f in sums:
        out[f] = np.add.reduceat(cols[f][order].astype(np.float64, copy=False), starts)
    if arg:
        out[arg] = cols[arg][first].astype(np.float64)
        for f in carried:
            out[f] = cols[f][first].astype(np.float64)
    return out


def _lookup(keys: np.ndarray, table_keys: np.ndarray, values: np.ndarray,
            absent: float = 0.0) -> np.ndarray:
    """values of ``table_keys`` at ``keys`` (``absent`` where absent); keys are int64
    arrays."""
    if len(table_keys) == 0:
        return np.full(len(keys), absent)
    order = np.argsort(table_keys)
    sk = table_keys[order]
    pos = np.clip(np.searchsorted(sk, keys), 0, len(sk) - 1)
    hit = sk[pos] == keys
    return np.where(hit, values[order][pos], absent)
