"""What completed before: durations per (communicator, operation, size class), from which
``T_expected`` and the hang threshold follow (CCL-D §4.2.1, MEGATRACE Algorithm 1 line 3),
and how often each (communicator, operation, bytes) completed, which breaks ties between the
two sides of an inconsistent round (CCL-D §2.2 H2)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from failslow.detectors.hang.config import N_KEYS, HangConfig
from failslow.detectors.hang.tables import (
    _SIG_BYTES_BITS,
    _SIG_COMM_BITS,
    _SIG_OP_BITS,
    _SIG_PENDING,
    _first_positions,
    _pack_keys,
    _stat_key,
)
from failslow.detectors.iterations import stable_argsort


class Durations:
    """Ring buffers of the last ``history`` durations per (communicator, operation, size
    class) row, their quantile (``exp``) and the longest ever (``tail``); ``stat_row`` maps
    (communicator index, statistics key) to a row (-1: none yet)."""

    def __init__(self, config: HangConfig) -> None:
        self.config = config
        self.stat_row = np.full((0, N_KEYS), -1, dtype=np.int64)
        self.dur = np.full((0, config.history), -1, dtype=np.int64)
        self.pos = np.zeros(0, dtype=np.int64)
        self.n = np.zeros(0, dtype=np.int64)
        self.exp = np.full(0, -1, dtype=np.int64)
        self.tail = np.full(0, -1, dtype=np.int64)

    def fit(self, comms: int) -> None:
        """Room for ``comms`` communicators."""
        if comms > len(self.stat_row):
            grow = np.full((comms - len(self.stat_row), N_KEYS), -1, dtype=np.int64)
            self.stat_row = np.concatenate([self.stat_row, grow])

    def expectations(self, ci: np.ndarray, op: np.ndarray, nbytes: np.ndarray,
                     comm_size: list[int]) -> np.ndarray:
        """``T_expected`` per operation (float ns, ``inf`` when unknown): the quantile of the
        recent durations of its (communicator, operation, size class), at least the longest
        it ever took (``long_tail``), once ``min_history`` were seen. With fewer, the
        communicators of the same size (the same parallel dimension) pool their history for
        that operation and size class; with no such history it is unknown (first calls
        include connection set-up: the ceiling applies)."""
        cfg = self.config
        key = _stat_key(op, nbytes, cfg.small_bytes)
        exp = np.full(len(ci), np.inf)
        if not len(self.n) or not len(ci):
            return exp
        eff = self.exp.astype(np.float64)
        if cfg.long_tail:
            eff = np.maximum(eff, self.tail.astype(np.float64))
        rows = self.stat_row[ci, key]
        safe = np.maximum(rows, 0)
        ok = (rows >= 0) & (self.n[safe] >= cfg.min_history)
        exp[ok] = eff[safe[ok]]
        if ok.all():
            return self._host_sync(exp, key)
        # pooled over communicators of the same size
        sizes = np.asarray(comm_size, dtype=np.int64)
        ci_r, key_r = np.nonzero(self.stat_row >= 0)
        row_r = self.stat_row[ci_r, key_r]
        pool = sizes[ci_r] * N_KEYS + key_r
        order = np.argsort(pool, kind="stable")
        pool, row_r = pool[order], row_r[order]
        uniq, first = np.unique(pool, return_index=True)
        count = np.add.reduceat(self.n[row_r], first)
        best = np.maximum.reduceat(eff[row_r], first)
        want = sizes[ci[~ok]] * N_KEYS + key[~ok]
        pos = np.minimum(np.searchsorted(uniq, want), len(uniq) - 1)
        found = (uniq[pos] == want) & (count[pos] >= cfg.min_history)
        exp[~ok] = np.where(found, best[pos], np.inf)
        return self._host_sync(exp, key)

    def _host_sync(self, exp: np.ndarray, key: np.ndarray) -> np.ndarray:
        """A small (control) operation that has already blocked as long as a host pause is a
        synchronisation point, like CCL-D's barriers: ranks wait in it while one does
        host-side work (a checkpoint write, an evaluation) of any length, so its
        expectation is unknown and the ceiling applies."""
        small = key % 2 == 0
        return np.where(small & (exp >= self.config.idle_floor_ns), np.inf, exp)

    def thresholds(self, ci: np.ndarray, op: np.ndarray, nbytes: np.ndarray,
                   comm_size: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Per operation: ``clamp(n x T_expected, floor, ceiling)``, and whether
        ``T_expected`` is known (else the threshold is the ceiling)."""
        cfg = self.config
        exp = self.expectations(ci, op, nbytes, comm_size)
        known = np.isfinite(exp)
        thr = np.clip(cfg.n_expected * np.where(known, exp, 0.0), cfg.floor_ns, cfg.ceiling_ns)
        thr = np.where(known, thr, cfg.ceiling_ns)
        return thr.astype(np.int64), known

    def learn(self, ci: np.ndarray, op: np.ndarray, nbytes: np.ndarray, dur: np.ndarray
              ) -> None:
        """Append completed durations to the ring buffer of their (comm, op, size class) and
        raise its longest duration (the caller leaves out what is not history: hangs)."""
        if not len(ci):
            return
        key = _stat_key(op, nbytes, self.config.small_bytes)
        rows = self.stat_row[ci, key]
        missing = rows < 0
        if missing.any():
            pairs = np.unique(ci[missing] * N_KEYS + key[missing])
            start = len(self.n)
            self.stat_row[pairs // N_KEYS, pairs % N_KEYS] = np.arange(start,
                                                                       start + len(pairs))
            width = self.config.history
            self.dur = np.concatenate([self.dur, np.full((len(pairs), width), -1, np.int64)])
            self.pos = np.concatenate([self.pos, np.zeros(len(pairs), np.int64)])
            self.n = np.concatenate([self.n, np.zeros(len(pairs), np.int64)])
            self.exp = np.concatenate([self.exp, np.full(len(pairs), -1, np.int64)])
            self.tail = np.concatenate([self.tail, np.full(len(pairs), -1, np.int64)])
            rows = self.stat_row[ci, key]
        np.maximum.at(self.tail, rows, dur)
        order = stable_argsort(rows)
        g = rows[order]
        first = np.ones(len(g), dtype=bool)
        first[1:] = g[1:] != g[:-1]
        heads = np.flatnonzero(first)
        counts = np.diff(np.append(heads, len(g)))
        uniq = g[heads]
        pos = np.arange(len(g)) - np.repeat(heads, counts)
        k = self.config.history
        keep = pos >= np.repeat(counts, counts) - k
        slot = (self.pos[g] + pos) % k
        rows_w, slots_w, vals = g[keep], slot[keep], dur[order][keep]
        evicted = self.dur[rows_w, slots_w]
        self.dur[rows_w, slots_w] = vals
        self.pos[uniq] = (self.pos[uniq] + counts) % k
        self.n[uniq] += counts
        if self.config.quantile >= 1.0:
            # the largest filled slot (empty slots hold -1, durations are >= 0): the old
            # largest or a new value, unless a value as large as the old largest left
            at = np.searchsorted(rows_w, uniq)
            old = self.exp[uniq]
            top = np.maximum(old, np.maximum.reduceat(vals, at))
            gone = np.maximum.reduceat(evicted, at)
            again = (gone >= 0) & (gone >= old)
            if again.any():
                top[again] = self.dur[uniq[again]].max(axis=1)
            self.exp[uniq] = top
            return
        # quantile ("higher" method) of the filled slots, vectorised over the touched rows
        block = self.dur[uniq]
        filled = np.minimum(self.n[uniq], k)
        block = np.sort(np.where(block < 0, np.iinfo(np.int64).max, block), axis=1)
        at = np.ceil(self.config.quantile * (filled - 1)).astype(np.int64)
        self.exp[uniq] = np.take_along_axis(block, at[:, None], axis=1)[:, 0]

    def to_state(self) -> dict[str, Any]:
        return {"row": self.stat_row.copy(), "dur": self.dur.copy(),
                "pos": self.pos.copy(), "n": self.n.copy(),
                "exp": self.exp.copy(), "tail": self.tail.copy()}

    def load(self, st: dict[str, Any]) -> None:
        self.stat_row = np.asarray(st["row"], dtype=np.int64).reshape(-1, N_KEYS)
        self.dur = np.asarray(st["dur"], dtype=np.int64).reshape(-1, self.config.history)
        self.pos = np.asarray(st["pos"], dtype=np.int64)
        self.n = np.asarray(st["n"], dtype=np.int64)
        self.exp = np.asarray(st["exp"], dtype=np.int64)
        self.tail = np.asarray(st["tail"], dtype=np.int64)


def _sig_tuples(keys: np.ndarray) -> list[tuple[int, int, int]]:
    """(comm index, op, bytes) of packed signature keys (:meth:`SignatureBook.count`)."""
    c = keys >> (_SIG_OP_BITS + _SIG_BYTES_BITS)
    o = (keys >> _SIG_BYTES_BITS) & ((1 << _SIG_OP_BITS) - 1)
    b = keys & ((1 << _SIG_BYTES_BITS) - 1)
    return list(zip(c.tolist(), o.tolist(), b.tolist(), strict=True))


class SignatureBook:
    """How often each (comm, op, bytes) completed; a batch is counted in numpy and merged
    into the dict when read (:attr:`book`) or every ``_SIG_PENDING`` batches."""

    def __init__(self, config: HangConfig) -> None:
        self.config = config
        self._book: dict[tuple[int, int, int], int] = {}
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []

    @property
    def book(self) -> dict[tuple[int, int, int], int]:
        """How often each (comm, op, bytes) completed (pending batches merged first)."""
        self._merge()
        return self._book

    @book.setter
    def book(self, book: dict[tuple[int, int, int], int]) -> None:
        self._book = book
        self._pending = []

    def count(self, ci: np.ndarray, op: np.ndarray, nbytes: np.ndarray) -> None:
        """How often each (comm, op, bytes) completed: breaks ties between the two sides of
        an inconsistent round (the usual signature is not the deviating one). Counted per
        batch in numpy on one packed key (comm index, op, bytes) and merged into the book
        later, in the order the per-batch merges would have given."""
        if (len(ci) and int(ci.min()) >= 0 and int(ci.max()) < 1 << _SIG_COMM_BITS
                and int(op.min()) >= 0 and int(op.max()) < 1 << _SIG_OP_BITS
                and int(nbytes.min()) >= 0 and int(nbytes.max()) < 1 << _SIG_BYTES_BITS):
            key = ((ci << (_SIG_OP_BITS + _SIG_BYTES_BITS)) | (op << _SIG_BYTES_BITS)
                   | nbytes)
            codes, uniq = pd.factorize(key)
            self._pending.append((np.asarray(uniq, dtype=np.int64),
                                      np.bincount(codes, minlength=len(uniq))))
            if len(self._pending) >= _SIG_PENDING:
                self._merge()
            return
        self._merge()
        self.count_now(ci, op, nbytes)

    def _merge(self) -> None:
        """Merge the pending per-batch counts into the book. Without an eviction on the way
        (the book stays within ``4 x max_signatures``) all at once: new signatures enter in
        order of their first batch, then of (comm, op, bytes), as batch by batch; else batch
        by batch."""
        pending = self._pending
        if not pending:
            return
        self._pending = []
        keys = np.concatenate([k for k, _ in pending])
        counts = np.concatenate([c for _, c in pending])
        batch = np.repeat(np.arange(len(pending)), [len(k) for k, _ in pending])
        codes, uniq = pd.factorize(keys)
        uniq = np.asarray(uniq, dtype=np.int64)
        total = np.zeros(len(uniq), dtype=np.int64)
        np.add.at(total, codes, counts)
        first = batch[_first_positions(codes)]
        order = np.lexsort((uniq, first))
        sigs = _sig_tuples(uniq[order])
        book = self._book
        fresh = sum(1 for k in sigs if k not in book)
        if len(book) + fresh <= 4 * self.config.max_signatures:
            for k, n in zip(sigs, total[order].tolist(), strict=True):
                book[k] = book.get(k, 0) + n
            return
        for k_b, c_b in pending:
            by_key = np.argsort(k_b, kind="stable")
            self._add(_sig_tuples(k_b[by_key]), c_b[by_key].tolist())

    def count_now(self, ci: np.ndarray, op: np.ndarray, nbytes: np.ndarray) -> None:
        """:meth:`count` of one batch straight into the book."""
        packed = _pack_keys((ci, op, nbytes), (ci[:1], op[:1], nbytes[:1]))
        if packed is not None:
            # group by hashing; the groups in key order, as sorting would give them
            codes, uniq = pd.factorize(packed[0])
            counts = np.bincount(codes, minlength=len(uniq))
            heads = _first_positions(codes)
            by_key = np.argsort(np.asarray(uniq), kind="stable")
            heads, counts = heads[by_key], counts[by_key]
            c_s, o_s, b_s = ci, op, nbytes
        else:
            order = np.lexsort((nbytes, op, ci))
            c_s, o_s, b_s = ci[order], op[order], nbytes[order]
            start = np.ones(len(order), dtype=bool)
            start[1:] = (c_s[1:] != c_s[:-1]) | (o_s[1:] != o_s[:-1]) | (b_s[1:] != b_s[:-1])
            heads = np.flatnonzero(start)
            counts = np.diff(np.append(heads, len(order)))
        sigs = list(zip(c_s[heads].tolist(), o_s[heads].tolist(), b_s[heads].tolist(),
                        strict=True))
        self._add(sigs, counts.tolist())

    def _add(self, sigs: list[tuple[int, int, int]], counts: list[int]) -> None:
        """Add one batch's counts (signatures in key order); keep the ``max_signatures``
        most frequent when the book grows beyond four times that."""
        book = self._book
        for k, n in zip(sigs, counts, strict=True):
            book[k] = book.get(k, 0) + n
        if len(book) > 4 * self.config.max_signatures:
            keep = sorted(book.items(), key=lambda kv: -kv[1])[: self.config.max_signatures]
            self._book = dict(keep)

    def to_state(self) -> list[list[int]]:
        return [[*k, v] for k, v in self.book.items()]

    def load(self, rows: list[list[int]]) -> None:
        self.book = {(int(c), int(o), int(b)): int(n) for c, o, b, n in rows}
