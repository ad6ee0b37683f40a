"""Vectorised tables of the hang detector: keyed lookups, stable orders and the sorted
key-value table behind the per-(communicator, rank) state (CCL-D §4.2.1: the in-flight
operations and seq counters of every rank, matched per batch without per-row Python loops).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from failslow.detectors.iterations import stable_argsort

# Bit layout of the single int64 keys of the sorted tables.
_RANK_BITS = 32          # (comm index, global rank) and (comm index, comm rank)
_PAIR_PEER_BITS = 20     # point-to-point counters: comm index | rank | peer | direction
_PAIR_RANK_BITS = 24
_PAIR_COMM_BITS = 63 - 1 - _PAIR_PEER_BITS - _PAIR_RANK_BITS
_OP_SEQ_BITS = 40        # one batch's operations: (comm, rank) row | seq
_OP_CR_BITS = 63 - _OP_SEQ_BITS
_SIG_OP_BITS = 5         # completed-signature keys: comm index | op | bytes
_SIG_BYTES_BITS = 38
_SIG_COMM_BITS = 63 - _SIG_OP_BITS - _SIG_BYTES_BITS
_SIG_PENDING = 64        # batches of signature counts merged at once


def _match_ops(a_comm: np.ndarray, a_rank: np.ndarray, a_seq: np.ndarray, b_comm: np.ndarray,
               b_rank: np.ndarray, b_seq: np.ndarray) -> np.ndarray:
    """:func:`_match` of operations keyed by (communicator index, rank, seq)."""
    return _match((a_comm, a_rank, a_seq), (b_comm, b_rank, b_seq))


def _match(a: tuple[np.ndarray, ...], b: tuple[np.ndarray, ...]) -> np.ndarray:
    """For each row of the key columns ``b``, the index of the equal row of ``a`` (the
    first one when a row repeats), or -1. When every column is non-negative and together
    they fit in 63 bits (the usual case), one packed int64 and a hash lookup; else a
    joint sort."""
    na, nb = len(a[0]), len(b[0])
    out = np.full(nb, -1, dtype=np.int64)
    if na == 0 or nb == 0:
        return out
    packed = _pack_keys(a, b)
    if packed is not None:
        return _lookup(*packed)
    if len(a) == 3:
        a = (_cr_key(a[0], a[1]), a[2])
        b = (_cr_key(b[0], b[1]), b[2])
    a1, a2 = a
    b1, b2 = b
    k1 = np.concatenate([a1, b1])
    k2 = np.concatenate([a2, b2])
    src = np.concatenate([np.zeros(na, np.int8), np.ones(nb, np.int8)])
    order = np.lexsort((src, k2, k1))
    s1, s2 = k1[order], k2[order]
    start = np.ones(len(order), dtype=bool)
    start[1:] = (s1[1:] != s1[:-1]) | (s2[1:] != s2[:-1])
    head = np.maximum.accumulate(np.where(start, np.arange(len(order)), 0))
    first = order[head]
    hit = np.where(first < na, first, -1)
    is_b = order >= na
    out[order[is_b] - na] = hit[is_b]
    return out


def _lookup(ka: np.ndarray, kb: np.ndarray) -> np.ndarray:
    """For each int64 key of ``kb``, the index of the equal key of ``ka`` (the first one
    when a key repeats), or -1: a hash lookup."""
    index = pd.Index(ka)
    if index.is_unique:
        return np.asarray(index.get_indexer(kb), dtype=np.int64)
    codes, uniq = pd.factorize(ka)
    first = _first_positions(codes)
    hit = pd.Index(uniq).get_indexer(kb)
    return np.where(hit >= 0, first[np.maximum(hit, 0)], -1).astype(np.int64)


def _pack_keys(a: tuple[np.ndarray, ...], b: tuple[np.ndarray, ...]
               ) -> tuple[np.ndarray, np.ndarray] | None:
    """The key columns of ``a`` and ``b`` packed into one int64 each (each column given
    the bits of its largest value over both), or None when a value is negative or they do
    not fit in 63 bits."""
    widths = []
    for x, y in zip(a, b, strict=True):
        if int(x.min()) < 0 or int(y.min()) < 0:
            return None
        widths.append(max(int(x.max()), int(y.max())).bit_length())
    if sum(widths) > 63:
        return None
    ka = np.zeros(len(a[0]), dtype=np.int64)
    kb = np.zeros(len(b[0]), dtype=np.int64)
    for x, y, w in zip(a, b, widths, strict=True):
        ka = (ka << w) | x.astype(np.int64, copy=False)
        kb = (kb << w) | y.astype(np.int64, copy=False)
    return ka, kb


def _first_positions(codes: np.ndarray) -> np.ndarray:
    """Where each code of a factorization (codes numbered in order of first appearance)
    first appears."""
    return np.flatnonzero(np.diff(np.maximum.accumulate(codes), prepend=-1) > 0)


def _rank_time_order(rank: np.ndarray, t: np.ndarray, third: np.ndarray | None = None
                     ) -> np.ndarray:
    """``np.lexsort((third, t, rank))`` (or ``np.lexsort((t, rank))``): rows in time order
    (a replayed or time-windowed stream) need only a stable radix sort by rank."""
    if len(t) > 1 and int(rank.min()) >= 0 and bool(np.all(t[1:] >= t[:-1])):
        order = stable_argsort(rank)
        if third is None:
            return order
        r, tt, x = rank[order], t[order], third[order]
        if not np.any((r[1:] == r[:-1]) & (tt[1:] == tt[:-1]) & (x[1:] < x[:-1])):
            return order
    return np.lexsort((t, rank)) if third is None else np.lexsort((third, t, rank))


def _group_order(key: np.ndarray, second: np.ndarray, any_order: bool = False) -> np.ndarray:
    """``np.lexsort((second, key))``: rows grouped by ``key``, in order of ``second`` within
    a group (ties in input order). Rows of a stream usually have ``second`` (a seq) rising
    within each group already: then a stable radix sort of the key, or of its hash codes
    when only the grouping matters (``any_order``: groups in any order), is enough."""
    if len(key) > 1:
        if any_order or int(key.min()) < 0 or int(key.max()) >= 2**32:
            if not any_order:
                return np.lexsort((second, key))
            codes, _ = pd.factorize(key)
            order = stable_argsort(codes)
            k = codes[order]
        else:
            order = stable_argsort(key)
            k = key[order]
        x = second[order]
        if not np.any((k[1:] == k[:-1]) & (x[1:] < x[:-1])):
            return order
    return np.lexsort((second, key))


class _Sorted:
    """Columns keyed by a sorted unique int64 key; vectorised find (a hash lookup, the
    index rebuilt only when keys are added) and insert."""

    def __init__(self, spec: dict[str, tuple[Any, int]]) -> None:
        self.spec = spec
        self.keys = np.zeros(0, dtype=np.int64)
        self.cols: dict[str, np.ndarray] = {n: np.zeros(0, dtype=d) for n, (d, _) in spec.items()}
        self._index: pd.Index | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def find(self, q: np.ndarray) -> np.ndarray:
        if len(self.keys) == 0:
            return np.full(len(q), -1, dtype=np.int64)
        if self._index is None:
            self._index = pd.Index(self.keys)
        return np.asarray(self._index.get_indexer(np.asarray(q, dtype=np.int64)),
                          dtype=np.int64)

    def ensure(self, q: np.ndarray) -> np.ndarray:
        """Insert the missing keys of ``q`` (default column values); return their indices."""
        idx = self.find(q)
        if (idx < 0).any():
            new = np.unique(q[idx < 0])
            keys = np.concatenate([self.keys, new])
            order = np.argsort(keys, kind="stable")
            self.keys = keys[order]
            self._index = None
            for name, (dtype, default) in self.spec.items():
                col = np.concatenate([self.cols[name], np.full(len(new), default, dtype=dtype)])
                self.cols[name] = col[order]
            idx = self.find(q)
        return idx

    def range(self, lo: int, hi: int) -> slice:
        """Rows with ``lo <= key < hi``."""
        return slice(int(np.searchsorted(self.keys, lo)), int(np.searchsorted(self.keys, hi)))

    def to_state(self) -> dict[str, Any]:
        return {"keys": self.keys.copy(), **{n: c.copy() for n, c in self.cols.items()}}

    def load(self, state: dict[str, Any]) -> None:
        self.keys = np.asarray(state["keys"], dtype=np.int64)
        self._index = None
        for name, (dtype, _) in self.spec.items():
            self.cols[name] = np.asarray(state[name], dtype=dtype)


def _cr_key(comm: np.ndarray | int, rank: np.ndarray | int) -> Any:
    return (np.asarray(comm, dtype=np.int64) << _RANK_BITS) | np.asarray(rank, dtype=np.int64)


def _pair_key(comm: np.ndarray, rank: np.ndarray, peer: np.ndarray, is_recv: np.ndarray
              ) -> np.ndarray:
    if len(comm) and (comm.max() >= 1 << _PAIR_COMM_BITS or rank.max() >= 1 << _PAIR_RANK_BITS
                      or peer.max() >= 1 << _PAIR_PEER_BITS):
        raise ValueError("hang detector: too many communicators, ranks or peers for its keys")
    key = (comm.astype(np.int64) << _PAIR_RANK_BITS) | rank.astype(np.int64)
    key = (key << _PAIR_PEER_BITS) | np.maximum(peer, 0).astype(np.int64)
    return (key << 1) | is_recv.astype(np.int64)


def _stat_key(op: np.ndarray, nbytes: np.ndarray, small: int) -> np.ndarray:
    """Column of the duration statistics: the operation, and whether its buffer is larger
    than ``small`` bytes (payload) or not (metadata, flags, scalars)."""
    return 2 * np.maximum(op, 0) + (nbytes > small).astype(np.int64)


def _saturate(a: np.ndarray) -> np.ndarray:
    """Unsigned 64-bit counters read as int64 (wrapped above 2**63 - 1) saturated
    instead, as :func:`_u64_to_i64` does."""
    return np.where(a < 0, np.iinfo(np.int64).max, a) if len(a) and int(a.min()) < 0 else a


def _u64_to_i64(a: np.ndarray) -> np.ndarray:
    """Counters and sizes as int64 (saturating; nulls already replaced)."""
    return np.minimum(a.astype(np.uint64), np.uint64(2**63 - 1)).astype(np.int64)

