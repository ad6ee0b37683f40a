"""How the iteration tracker learns each rank's period (Greyhound §4.2, "Iteration time
analysis"; :class:`PeriodLearning`, a part of :class:`~.tracker.IterationTracker`): a
learning rank's calls are buffered and its period is tried at exact call counts, in the
time order of those attempts, so the result does not depend on how the records were cut
into batches; the period of the symbols (:mod:`.period`, cached per role), completed for
ranks of very few ops by the timing of their rounds (:mod:`.fewops`), is reconciled with
the reference rank's iterations before it is committed with its anchor (:mod:`.rank_state`);
a rank that sees a longer period than the reference becomes the reference, and the others
learn again."""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from failslow import events
from failslow.detectors.iterations import fewops
from failslow.detectors.iterations.period import find_period, symbols
from failslow.detectors.iterations.rank_state import _Rank, commit_anchor

if TYPE_CHECKING:
    from failslow.detectors.iterations.tracker import IterationConfig


class PeriodLearning:
    """The period learning of :class:`~.tracker.IterationTracker` (a mixin: the tracker's
    ``__init__`` sets the attributes declared here, the tracker has the methods declared
    under ``TYPE_CHECKING``)."""

    config: IterationConfig
    ranks: dict[int, _Rank]
    ref_rank: int
    ref_bounds: np.ndarray
    _buf: dict[int, list[np.ndarray]]
    _nbuf: dict[int, int]
    _pend: np.ndarray
    _committed_all: bool | None
    _few: Callable[[int], bool]
    _spans: fewops.SpanSteps
    _kind_ids: np.ndarray
    _kind_codes: np.ndarray
    _periods: dict[bytes, int]
    _resets: int
    _reset_t: int
    _reset_ranks: list[int]

    if TYPE_CHECKING:  # IterationTracker's
        def _anchors(self, rank: np.ndarray, comm: np.ndarray, seq: np.ndarray,
                     t: np.ndarray) -> np.ndarray: ...
        def _invalidate(self) -> None: ...

    def _learn_batch(self, ranks: np.ndarray, starts: np.ndarray, counts: np.ndarray,
                     block: np.ndarray) -> list[np.ndarray]:
        """Feed the calls of learning ranks to their buffers. A rank tries to learn when its
        buffer reaches ``next_try`` calls (exactly); attempts run in the order of the time
        of that call, so the first rank to commit (the reference) and what the others see
        of it are the same whatever the batching. A rank that commits has its later calls
        of the batch tested for anchors."""
        c = self.config
        out: list[np.ndarray] = []
        pos = {}  # rank -> next unconsumed column of block
        heap: list[tuple[int, int]] = []
        get, nbuf, top = self.ranks.get, self._nbuf.get, c.max_buffer
        for r, s0, cnt in zip(ranks.tolist(), starts.tolist(), counts.tolist(), strict=True):
            st = get(r)
            if st is None:
                st = self.ranks[r] = _Rank(next_try=self._first_try(r))
                self._committed_all = False
            end = s0 + cnt
            pos[r] = (s0, end)
            # :meth:`_push_attempt`, inline (once per learning rank and batch)
            cut = s0 + max(min(st.next_try, top) - nbuf(r, 0), 1)
            if cut <= end:
                heapq.heappush(heap, (int(block[4, cut - 1]), r))
        while heap:
            _, r = heapq.heappop(heap)
            st = self.ranks[r]
            p0, end = pos[r]
            need = min(st.next_try, c.max_buffer) - self._nbuf.get(r, 0)
            cut = p0 + max(need, 1)
            if cut > end:
                continue
            self._buf.setdefault(r, []).append(block[:, p0:cut])
            self._nbuf[r] = self._nbuf.get(r, 0) + (cut - p0)
            pos[r] = (cut, end)
            found = self._learn(r, st, t_now=int(block[4, cut - 1]))
            if found is not None:
                out.append(found)
                if cut < end:  # the rest of the batch, as a committed rank
                    rest = block[:, cut:end]
                    b = self._anchors(np.full(end - cut, r, dtype=np.int64),
                                      rest[0].view(np.uint64), rest[1], rest[4])
                    out.append(b)
                pos[r] = (end, end)
            else:
                self._push_attempt(heap, r, st, cut, end, block)
        ranks_st, bufs, counts_n = self.ranks, self._buf, self._nbuf
        for r, (p0, end) in pos.items():
            if end > p0 and not ranks_st[r].period:
                bufs.setdefault(r, []).append(block[:, p0:end])
                counts_n[r] = counts_n.get(r, 0) + (end - p0)
        return out

    def _push_attempt(self, heap: list[tuple[int, int]], r: int, st: _Rank, p0: int,
                      end: int, block: np.ndarray) -> None:
        need = min(st.next_try, self.config.max_buffer) - self._nbuf.get(r, 0)
        cut = p0 + max(need, 1)
        if cut <= end:
            heapq.heappush(heap, (int(block[4, cut - 1]), r))

    def _learn(self, rank: int, st: _Rank, t_now: int) -> np.ndarray | None:
        """Try to find and commit the period of ``rank``'s buffer (its calls up to the one
        at ``t_now``); on success return the boundaries found in the whole buffer and drop
        the buffer. Only the reference's boundaries up to ``t_now`` are used."""
        c = self.config
        buf = np.concatenate(self._buf[rank], axis=1)
        self._buf[rank] = [buf]
        n = self._nbuf[rank] = buf.shape[1]
        comm, seq, opc, nbytes, t = (buf[0].view(np.uint64), buf[1], buf[2],
                                     buf[3].view(np.uint64), buf[4])
        few = self._few(rank) and not np.any(opc >= events.OP["send"])  # no send/recv
        period = self._period(comm, opc, None if st.nobytes else nbytes, few)
        if period == 0 and not st.nobytes and \
                n >= 4 * (c.few_commit_ops if few else c.min_commit_ops):
            # bytes that vary between iterations (e.g. sequence lengths) break exact
            # repetition: fall back to (communicator, op)
            st.nobytes = True
            period = self._period(comm, opc, None, few)
        need = max(c.min_commit_ops, c.min_commit_periods * period)
        if few and period:
            # very few ops per iteration (:mod:`.fewops`): commit after a few periods,
            # the symbol period completed by the timing of the rounds
            t_need = fewops.timing_need(period, c.few_max_period, c.few_min_rows)
            per = self._spans.calls_per_step(rank, t, t_now) if len(self._spans.rows) else 0
            if per and per % period == 0:
                period, t_need = per, 0  # calls per framework step
            elif n >= t_need:
                period, t_need = fewops.timing_period(
                    period, t, c.few_max_period, c.few_ratio, c.few_min_rows,
                    c.few_confirm_rows)
            need = max(c.few_commit_ops, c.few_commit_periods * period, t_need)
        if period == 0 or n < need:
            self._defer(rank, st, buf, n, need if period else 0)
            return None
        # reconcile with the reference in time: a rank whose calls repeat every micro-batch
        # (e.g. the last pipeline stage without DP sync) has a sub-period of the iteration
        # (not a rank of very few ops: no micro-batches; its own timing decided)
        promote = False
        ref = self.ref_bounds[self.ref_bounds[:, 1] <= t_now] if self.ref_rank >= 0 else None
        if ref is not None and len(ref) >= 2 and not few:
            # the reference's iterations and this rank's periods counted over the same
            # stretch of time: a slow-down that starts while the ranks learn (iterations of
            # two lengths) or a pause then weighs on both alike
            inside = ref[(ref[:, 1] >= t[0]) & (ref[:, 1] <= t[-1]), 1]
            if len(inside) < 2 and ref[-1, 1] >= t[0]:
                # the buffer spans less than one reference iteration: learn later
                self._defer(rank, st, buf, n, need)
                return None
            if len(inside) >= 2:  # (a reference silent since before the buffer: none)
                own = int(np.searchsorted(t, inside[-1]) - np.searchsorted(t, inside[0]))
                per_ref = own / (len(inside) - 1)  # operations per reference iteration
                if per_ref > 1.5 * period:  # calls repeat every micro-batch: whole periods
                    period *= max(1, int(round(per_ref / period)))
                    if n < 2 * period:
                        st.next_try = 2 * period
                        return None
                promote = 1.5 * per_ref < period
        if promote:
            self._reset_others(rank, t_now)
        commit_anchor(st, period, comm, seq, t, ref if self.ref_rank >= 0 else None)
        self._invalidate()
        self._spans.drop(rank)
        if self.ref_rank < 0:
            self.ref_rank = rank
        self._buf.pop(rank, None)
        self._nbuf.pop(rank, None)
        return self._anchors(np.full(n, rank, dtype=np.int64), comm, seq, t)

    def _defer(self, rank: int, st: _Rank, buf: np.ndarray, n: int, need: int) -> None:
        """No period committed from ``rank``'s ``n`` buffered calls yet: try again after
        more calls; a full buffer keeps its newer half and goes on learning."""
        c = self.config
        st.next_try = max(int(n * 1.5) + 1, need)
        if st.next_try > c.max_buffer:
            keep = c.max_buffer // 2
            self._buf[rank] = [buf[:, -keep:]]
            self._nbuf[rank] = keep
            st.next_try = c.max_buffer

    def _add_spans(self, span: pa.Table) -> None:
        """Keep the span rows of learning ranks of very few ops (:class:`.SpanSteps`)."""
        rank = span.column("rank").fill_null(-1).to_numpy().astype(np.int64)
        ranks = self.ranks
        ok = [r for r in np.unique(rank).tolist()
              if r >= 0 and self._few(r) and not (r in ranks and ranks[r].period)]
        if ok:
            sel = np.isin(rank, ok)
            cols = [span.column(k).to_numpy()[sel] for k in ("step", "t_start", "t_end")]
            self._spans.add(rank[sel], *cols)

    def _first_try(self, rank: int) -> int:
        """Buffered calls of the first attempt to learn ``rank``'s period."""
        c = self.config
        return c.few_min_ops if self._few(rank) else c.min_ops

    def _period(self, comm: np.ndarray, opc: np.ndarray, nbytes: np.ndarray | None,
                few: bool = False) -> int:
        """:func:`find_period` of the symbols, cached by sequence (ranks of one role);
        with ``few``, 1 for a single repeated symbol (:func:`.fewops.symbol_period`)."""
        c = self.config
        channel = comm
        if len(self._kind_ids):
            pos = np.minimum(np.searchsorted(self._kind_ids, comm), len(self._kind_ids) - 1)
            channel = np.where(self._kind_ids[pos] == comm, self._kind_codes[pos], comm)
        sym = symbols(channel, opc, nbytes)
        key = hashlib.blake2b(sym.tobytes(), digest_size=16).digest()
        if key not in self._periods:
            if len(self._periods) > 4096:
                self._periods.clear()
            self._periods[key] = find_period(sym, c.threshold, c.max_lag, c.multiple_slack,
                                             c.projections)
        return fewops.symbol_period(sym, self._periods[key]) if few else self._periods[key]

    def _reset_others(self, rank: int, t_now: int) -> None:
        """``rank`` sees a longer period than the reference: it becomes the reference and
        every other rank learns again."""
        self._reset_ranks = []
        for r in list(self.ranks):
            if r != rank and self.ranks[r].period:
                self.ranks[r] = _Rank(next_try=self._first_try(r))
                self._buf[r] = []
                self._nbuf[r] = 0
                self._reset_ranks.append(r)
        self._resets += 1
        self._reset_t = t_now
        self.ref_rank = -1
        self.ref_bounds = np.zeros((0, 2), dtype=np.int64)
        self._pend = self._pend[:0]
        self._invalidate()
