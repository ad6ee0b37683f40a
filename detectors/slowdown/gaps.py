"""Per-rank compute from the gaps between its communication operations (events.md
``span``; MEGATRACE §III-B: the timing of communication calls shows the computational
state), each gap placed in the 1F1B pipeline schedule (MEGATRACE §III-C) when framework
spans are absent."""

from __future__ import annotations

from typing import Any

import numpy as np

from failslow.detectors.iterations import rank_time_order
from failslow.detectors.slowdown.kernel import GapKernel
from failslow.events import NULL_TIME

#: Pass of a gap (the compute before an operation) in the pipeline schedule.
PASS_OTHER, PASS_FWD, PASS_BWD = 0, 1, 2
#: The forward/backward compute table uses bins this many times coarser (~an iteration).
PASS_BIN_SHIFT = 3


class GapTracker:
    """Compute time per rank from the gaps between its communication operations (events.md
    ``span``: "derives compute spans from the gaps between communication operations on a
    rank"): the gap before an ``enter`` is its time minus the latest ``end`` of the same
    rank before it (0 when an operation was still running: batched point-to-point calls).
    Waiting for peers happens inside an operation's duration, so a rank's gaps grow when
    *it* computes slowly, not when it waits on a slow peer (MEGATRACE §III-B: the timing of
    communication calls is a robust indicator of the computational state).

    Each gap is also placed in the pipeline schedule (MEGATRACE §III-C, without framework
    spans): the compute after a receive from the previous stage is a forward pass, after a
    receive from the next stage a backward pass. The first and last stages run both passes
    between two pipeline transfers (1F1B: backward then forward on the first stage, forward
    then backward on the last); there the first half of the segment's operations (as long
    as the rank's previous such segment) is the first pass."""

    def __init__(self, microbatches: int = 0, kernel: GapKernel | None = None) -> None:
        #: micro-batches per iteration (meta; 0 unknown): the tensor-parallel rule below
        self.microbatches = microbatches
        #: the C form of :meth:`update` (None: the numpy form below)
        self.kernel = kernel
        self.last_end = np.zeros(0, dtype=np.int64)
        # per rank, without a pipeline: TP operations since the last other collective, and
        # the length of the latest such run
        self.tp_ctx = np.zeros((0, 2), dtype=np.int64)
        # per rank: kind of the latest point-to-point call (0 none, 1 recv from the previous
        # stage, 2 recv from the next, 3 send to the next, 4 send to the previous), calls
        # since it, the length of the latest segment after a receive of each direction,
        # and whether the rank has neighbours before / after it
        self.ctx = np.zeros((0, 6), dtype=np.int64)

    def _grow(self, top: int) -> None:
        if top > len(self.last_end):
            add = top - len(self.last_end)
            self.last_end = np.concatenate([self.last_end, np.full(add, NULL_TIME,
                                                                   dtype=np.int64)])
            self.ctx = np.concatenate([self.ctx, np.zeros((add, 6), dtype=np.int64)])
            self.tp_ctx = np.concatenate([self.tp_ctx, np.zeros((add, 2), dtype=np.int64)])

    def update(self, rank: np.ndarray, t: np.ndarray, is_enter: np.ndarray,
               p2p: np.ndarray | None = None, tp: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Rows of one batch -> (rank, enter time, gap ns, pass) of the enters with a known
        end before them. ``p2p``: per row the point-to-point kind (see ``ctx``; 0 for a
        collective); ``tp``: per row, a tensor-parallel collective (jobs without a
        pipeline: :meth:`_tp_passes`)."""
        if len(rank) == 0:
            z = np.zeros(0, dtype=np.int64)
            return z, z, z, z
        self._grow(int(rank.max()) + 1)
        # by rank, then time, ends before enters at equal times
        order = _rank_time_order(rank, t, is_enter)
        r, tt, en = rank[order], t[order], is_enter[order]
        kind = p2p[order] if p2p is not None else np.zeros(len(r), dtype=np.int64)
        if self.kernel is not None:
            pos, gap, passes = self.kernel(r, tt, en, kind, None if tp is None else tp[order],
                                           self.microbatches, self.last_end, self.ctx,
                                           self.tp_ctx)
            return r[pos], tt[pos], gap, passes
        n = len(r)
        pos = np.where(~en, np.arange(n), -1)
        last = np.maximum.accumulate(pos)
        same = (last >= 0) & (r[np.maximum(last, 0)] == r)
        prev = np.where(same, tt[np.maximum(last, 0)], self.last_end[r])
        sel = en & (prev != NULL_TIME)
        gap = np.maximum(tt[sel] - prev[sel], 0)
        passes = self._passes(r[en], kind[en])[sel[en]]
        if tp is not None:
            by_tp = self._tp_passes(r[en], tp[order][en])[sel[en]]
            passes = np.where(passes == 0, by_tp, passes)
        ends = ~en
        if ends.any():
            er, et = r[ends], tt[ends]
            # per rank the latest end of the batch (rows are sorted by rank, then time)
            lastpos = np.flatnonzero(np.append(er[1:] != er[:-1], True))
            self.last_end[er[lastpos]] = np.maximum(self.last_end[er[lastpos]], et[lastpos])
        return r[sel], tt[sel], gap, passes

    def _passes(self, r: np.ndarray, kind: np.ndarray) -> np.ndarray:
        """Pass of the gap before each enter (rows sorted by rank and time); updates the
        per-rank schedule context."""
        n = len(r)
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        is_p = kind > 0
        ordinal = np.arange(n)
        pos = np.where(is_p, ordinal, -1)
        # the latest point-to-point call strictly before each row, of the same rank
        before = np.concatenate(([-1], np.maximum.accumulate(pos)[:-1]))
        mine = (before >= 0) & (r[np.maximum(before, 0)] == r)
        first = np.concatenate(([True], r[1:] != r[:-1]))
        start = np.maximum.accumulate(np.where(first, ordinal, 0))  # first row of the rank
        ctx_kind = np.where(mine, kind[np.maximum(before, 0)], self.ctx[r, 0])
        # calls since that point-to-point call (excluding it)
        since = np.where(mine, ordinal - before - 1, self.ctx[r, 1] + ordinal - start)
        # Everything below is known from this row and the rank's earlier rows only, so a
        # gap gets the same pass however the stream is cut into batches.
        def latest(mask: np.ndarray, strict: bool) -> np.ndarray:
            """Per row: position of the latest ``mask`` row of its rank (up to and including
            it, or strictly before it), -1 when there is none in this batch."""
            last = np.maximum.accumulate(np.where(mask, ordinal, -1))
            if strict:
                last = np.concatenate(([-1], last[:-1]))
            return np.where(last >= start, last, -1)

        # neighbours seen so far: receives and sends tell where the rank sits in the pipeline
        has_prev = (self.ctx[r, 4] == 1) | (latest((kind == 1) | (kind == 4), False) >= 0)
        has_next = (self.ctx[r, 5] == 1) | (latest((kind == 2) | (kind == 3), False) >= 0)
        if is_p.any():
            self.ctx[r[(kind == 1) | (kind == 4)], 4] = 1
            self.ctx[r[(kind == 2) | (kind == 3)], 5] = 1
        # the length of the rank's latest closed segment after a receive of each direction
        segs = []
        for k, col in ((1, 2), (2, 3)):
            closed = latest(is_p & (ctx_kind == k) & (since > 0), True)
            segs.append(np.where(closed >= 0, since[np.maximum(closed, 0)], self.ctx[r, col]))
        seg1, seg2 = segs
        out = np.zeros(n, dtype=np.int64)
        c1, c2 = ctx_kind == 1, ctx_kind == 2
        last_stage = ~has_next
        first_stage = ~has_prev
        # after a receive the first pass is the forward (from the previous stage) or the
        # backward (from the next); on the last / first stage, once a segment length is
        # known, its second half is the other pass
        out[c1] = PASS_FWD
        out[c2] = PASS_BWD
        split1 = c1 & last_stage & (seg1 >= 2)
        out[split1] = np.where(2 * since[split1] < seg1[split1], PASS_FWD, PASS_BWD)
        split2 = c2 & first_stage & (seg2 >= 2)
        out[split2] = np.where(2 * since[split2] < seg2[split2], PASS_BWD, PASS_FWD)
        out[ctx_kind == 3] = PASS_FWD
        out[ctx_kind == 4] = PASS_BWD
        # a point-to-point call closes the segment of the context before it
        for k, col in ((1, 2), (2, 3)):
            done = is_p & (ctx_kind == k) & (since > 0)
            if done.any():
                rr, ll = r[done], since[done]
                lastpos = np.flatnonzero(np.append(rr[1:] != rr[:-1], True))
                self.ctx[rr[lastpos], col] = ll[lastpos]
        # carry the context of every rank to the next batch
        lastrow = np.flatnonzero(np.append(r[1:] != r[:-1], True))
        lr = r[lastrow]
        lp = np.where(is_p[lastrow], lastrow, before[lastrow])
        ok_p = (lp >= 0) & (r[np.maximum(lp, 0)] == lr)
        self.ctx[lr, 0] = np.where(ok_p, kind[np.maximum(lp, 0)], self.ctx[lr, 0])
        self.ctx[lr, 1] = np.where(is_p[lastrow], 0, since[lastrow] + 1)
        return out

    def _tp_passes(self, r: np.ndarray, is_tp: np.ndarray) -> np.ndarray:
        """Pass of the gap before each enter in a job without a pipeline (MEGATRACE §III-C's
        stages from the operations alone): a micro-batch's tensor-parallel collectives come
        half in its forward pass, half in its backward (Megatron: as many per layer in
        each), so within a run of them between two other collectives (the gradient sync),
        ``microbatches`` equal parts long, the gaps before the first half of each part's
        operations are forward compute and the others backward, as is the gap that ends a
        run. Unknown (0) until a run's length is known and splits so."""
        n, m = len(r), self.microbatches
        out = np.zeros(n, dtype=np.int64)
        if n == 0:
            return out
        ordinal = np.arange(n)
        first = np.concatenate(([True], r[1:] != r[:-1]))
        start = np.maximum.accumulate(np.where(first, ordinal, 0))
        other = ~is_tp
        last_other = np.concatenate(([-1], np.maximum.accumulate(
            np.where(other, ordinal, -1))[:-1]))
        mine = last_other >= start
        # TP operations of the current run before this row
        run = np.where(mine, ordinal - last_other - 1, self.tp_ctx[r, 0] + ordinal - start)
        closing = other & (run > 0)  # the row that ends a run: its length is ``run``
        last_close = np.concatenate(([-1], np.maximum.accumulate(
            np.where(closing, ordinal, -1))[:-1]))
        seg = np.where(last_close >= start, run[np.maximum(last_close, 0)], self.tp_ctx[r, 1])
        if m > 0:
            per = seg // m
            ok = (seg > 0) & (seg % m == 0) & (per >= 2) & (per % 2 == 0)
            q = run % np.maximum(per, 1)
            tp_rows = is_tp & ok
            out[tp_rows] = np.where(2 * q[tp_rows] < per[tp_rows], PASS_FWD, PASS_BWD)
            out[closing & ok] = PASS_BWD
        last = np.flatnonzero(np.append(r[1:] != r[:-1], True))
        lr = r[last]
        self.tp_ctx[lr, 0] = np.where(is_tp[last], run[last] + 1, 0)
        self.tp_ctx[lr, 1] = np.where(closing[last], run[last], seg[last])
        return out

    def snapshot(self) -> dict[str, Any]:
        return {"last_end": self.last_end.copy(), "ctx": self.ctx.copy(),
                "tp_ctx": self.tp_ctx.copy()}

    def restore(self, state: dict[str, Any]) -> None:
        self.last_end = np.array(state["last_end"], dtype=np.int64)
        n = len(self.last_end)
        self.ctx = np.array(state.get("ctx", []), dtype=np.int64).reshape(-1, 6)
        if len(self.ctx) < n:
            self.ctx = np.concatenate([self.ctx, np.zeros((n - len(self.ctx), 6), np.int64)])
        self.tp_ctx = np.array(state.get("tp_ctx", []), dtype=np.int64).reshape(-1, 2)
        if len(self.tp_ctx) < n:
            self.tp_ctx = np.concatenate([self.tp_ctx,
                                          np.zeros((n - len(self.tp_ctx), 2), np.int64)])


def _rank_time_order(rank: np.ndarray, t: np.ndarray, is_enter: np.ndarray) -> np.ndarray:
    """The order sorting rows by (rank, t, enter after end). Rows in time order (a replay,
    a time-windowed stream) need only a stable sort by rank: a radix sort when ranks fit 16
    bits; otherwise, or with ties in time, :func:`~failslow.detectors.iterations.
    rank_time_order`."""
    n = len(rank)
    if n > 1 and int(rank.min()) >= 0 and int(rank.max()) < 2**15 and \
            bool(np.all(t[1:] >= t[:-1])):
        order = np.argsort(rank.astype(np.int16), kind="stable")
        r, tt, x = rank[order], t[order], is_enter[order]
        if not np.any((r[1:] == r[:-1]) & (tt[1:] == tt[:-1]) & x[:-1] & ~x[1:]):
            return order
    return rank_time_order(rank, t, is_enter.astype(np.int64))
