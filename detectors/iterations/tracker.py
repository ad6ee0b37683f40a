"""Per-rank and job iteration boundaries and times (Greyhound §4.2, "Iteration time
analysis"), incremental: :class:`IterationTracker` buffers each rank's calls until its
period (:mod:`.period`) is known, then finds the anchors (:mod:`.rank_state`) of every
batch with one vectorized test. The first rank to learn its period is the reference: the
others anchor at the operation closest in time to its boundaries and take its iteration
numbers. The job's iteration (rank -1) runs from the last rank crossing one boundary to the
last rank crossing the next, so a delay anywhere shows in exactly one job iteration. The
learning of the periods is in :mod:`.learning`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from failslow import events, results
from failslow.detectors.base import EventBatch
from failslow.detectors.iterations import fewops
from failslow.detectors.iterations.columns import coll_columns, rank_time_order
from failslow.detectors.iterations.learning import PeriodLearning
from failslow.detectors.iterations.rank_state import _Rank
from failslow.diagnosis import Anomaly
from failslow.events import JobMeta

#: job iterations and reference boundaries kept (the latest ones): bounded state
HISTORY = 4096


@dataclass
class IterationConfig:
    """Settings of :class:`IterationTracker`."""

    threshold: float = 0.95  # Greyhound's M
    multiple_slack: float = 0.05  # multiples of the period must reach threshold - slack
    min_ops: int = 96  # first attempt to find the period
    min_commit_ops: int = 96  # the period is committed only on this many ops ...
    min_commit_periods: int = 4  # ... covering at least this many periods
    max_lag: int = 20000  # longest period searched (operations)
    max_buffer: int = 100000  # operations kept per rank while learning
    projections: int = 4  # numeric embeddings of the symbols for the ACF
    lost_periods: float = 3.0  # relearn when no anchor was seen for this many periods
    # ranks with very few ops per iteration (pure DP, :mod:`.fewops`)
    few_min_ops: int = 8  # first attempt
    few_commit_ops: int = 12  # commit on this many ops ...
    few_commit_periods: int = 6  # ... covering at least this many periods
    few_max_period: int = 4  # longest period completed by the timing of the rounds
    few_ratio: float = 1.25  # the iteration's pause over the other gaps of its symbol
    few_min_rows: int = 4  # periods that may refute a multiple, and that confirm it
    few_confirm_rows: int = 8


class IterationTracker(PeriodLearning):
    """Per-rank and job iteration boundaries and times (Greyhound §4.2), incremental.

    ``track(batch)`` consumes ``coll`` rows (only ``enter`` rows are used) and returns the
    new rows of :data:`failslow.results.SCHEMAS` ``["iterations"]``: one per completed
    iteration of a rank, and one per completed iteration of the job (rank -1: median over
    the ranks' iterations of that number). As a detector (``update``) it reports nothing
    and derives those rows for the detectors after it (``outputs()["iterations"]``).
    """

    name: ClassVar[str] = "iterations"
    kinds: ClassVar[frozenset[str]] = frozenset({"coll", "span"})
    produces: ClassVar[tuple[str, ...]] = ("iterations",)

    def __init__(self, meta: JobMeta, config: IterationConfig | None = None) -> None:
        self.meta = meta
        self.config = config or IterationConfig()
        self._last = results.empty("iterations")
        self.ranks: dict[int, _Rank] = {}
        # learning buffers: rank -> list of arrays (comm, seq, op, bytes, t)
        self._buf: dict[int, list[np.ndarray]] = {}
        # job level: per-rank rows of iterations not yet summarized
        self._pend = np.zeros((0, 4), dtype=np.int64)  # idx, rank, t_start, duration
        self.job_last_idx = -1
        # (idx, t_start, duration) of the job's latest HISTORY iterations, and how many
        # there were: the state stays bounded for a job that runs for days
        self.job: list[tuple[int, int, int]] = []
        self.job_count = 0
        # the first rank to learn its period is the reference: the others anchor their
        # iterations at the operation closest in time to its boundaries, and number them
        # like it, so one delay falls into the same job iteration on every rank
        self.ref_rank = -1
        self.ref_bounds = np.zeros((0, 2), dtype=np.int64)  # (idx, t), the latest ones
        self._nbuf: dict[int, int] = {}  # operations buffered per learning rank
        # symbols use the communicator's kind when meta names it: ranks with the same role
        # then have the same sequence, and the period is computed once per role
        kinds = {c.comm: 1 + events.COMM_KINDS.index(c.kind) for c in meta.comms
                 if c.kind != "other"}
        self._kind_ids = np.array(sorted(kinds), dtype=np.uint64)
        self._kind_codes = np.array([kinds[c] for c in sorted(kinds)], dtype=np.uint64)
        self._periods: dict[bytes, int] = {}  # cache: symbol sequence digest -> period
        # ranks that may have periods of very few ops, whether any may, their spans
        self._few, self._any_few = fewops.few_ops_ranks(meta)
        self._spans = fewops.SpanSteps()
        self._since = np.zeros(0, dtype=np.int64)  # ops since the latest anchor, per rank
        self._period_cache: np.ndarray | None = None
        self._anchor_cache: np.ndarray | None = None  # (comm, mod, res, offset) by rank
        self._committed_all: bool | None = None  # every rank seen knows its period
        self._resets = 0  # references replaced so far
        self._reset_t = 0  # trace time of the latest replacement ...
        self._reset_ranks: list[int] = []  # ... and the ranks it sent back to learning

    # ------------------------------------------------------------------ public summary

    def period_ops(self) -> int | None:
        """Operations per iteration of the lowest rank whose period is known."""
        known = sorted(r for r, st in self.ranks.items() if st.period)
        return self.ranks[known[0]].period if known else None

    def summary(self) -> dict[str, Any] | None:
        """``{"period_ops", "median_s", "count"}`` of the job (diagnosis.md): ``count`` job
        iterations so far, ``median_s`` over the latest :data:`HISTORY` of them."""
        if not self.job:
            p = self.period_ops()
            return None if p is None else {"period_ops": p, "median_s": None, "count": 0}
        durations = np.array([d for _, _, d in self.job], dtype=np.float64)
        return {"period_ops": self.period_ops(),
                "median_s": round(float(np.median(durations)) / 1e9, 6),
                "count": self.job_count}

    # ------------------------------------------------------------------ update

    def update(self, batch: EventBatch) -> list[Anomaly]:
        """Detector protocol: :meth:`track`, its rows kept for :meth:`outputs`."""
        self._last = self.track(batch)
        return []

    def on_tick(self, now_ns: int) -> list[Anomaly]:
        return []  # iterations end on data

    def outputs(self) -> dict[str, pa.Table]:
        return {"iterations": self._last}

    def track(self, batch: EventBatch) -> pa.Table:
        """The new ``iterations`` rows of ``batch`` (class docstring)."""
        span = batch.get("span")
        if self._any_few and span is not None and span.num_rows:
            self._add_spans(span)
        coll = batch.get("coll")
        if coll is None or coll.num_rows == 0:
            return results.empty("iterations")
        cols = coll_columns(coll)
        sel = cols["is_enter"]
        if not sel.any():
            return results.empty("iterations")
        pick = np.flatnonzero(sel)
        rank = cols["rank"][pick]
        t = cols["t"][pick]
        seq = cols["seq"][pick]
        order = rank_time_order(rank, t, seq)
        rank, t, seq = rank[order], t[order], seq[order]
        pick = pick[order]
        comm = cols["comm"][pick]

        new_b: list[np.ndarray] = []  # boundaries (rank, idx, t)
        # ranks in order (rows are sorted by rank): each one's first row and row count
        starts = np.flatnonzero(np.concatenate(([True], rank[1:] != rank[:-1])))
        uranks = rank[starts]
        counts = np.diff(np.append(starts, len(rank)))
        periods = self._periods_of(uranks)
        committed = periods > 0
        # committed ranks: one vectorized anchor test over all their rows
        if committed.any():
            cm = np.repeat(committed, counts)
            new_b.append(self._anchors(rank[cm], comm[cm], seq[cm], t[cm]))
            self._count_ops(uranks[committed], counts[committed], new_b[-1])
        # learning ranks: buffer their calls and try to learn each one's period at exact
        # call counts, in the time order of those attempts (the result does not depend on
        # how the records were cut into batches)
        if not (self._periods_of(uranks) > 0).all():
            block = np.stack([comm.view(np.int64), seq, cols["op"][pick], cols["bytes"][pick],
                              t])
            ranks_now = uranks[~committed]
            st_now, cnt_now = starts[~committed], counts[~committed]
            resets = self._resets
            new_b.extend(self._learn_batch(ranks_now, st_now, cnt_now, block))
            if self._resets != resets:
                # a rank with a longer period became the reference at time T and the others
                # learn again: they drop this batch's boundaries and relearn from their
                # calls after T, as they would have in smaller batches
                t_reset = self._reset_t
                again = np.array(sorted(self._reset_ranks), dtype=np.int64)
                new_b = [b[~np.isin(b[:, 0], again)] for b in new_b]
                after = np.isin(uranks, again)
                if after.any():
                    firsts = np.array([s0 + int(np.searchsorted(t[s0:s0 + c0], t_reset,
                                                                "right"))
                                       for s0, c0 in zip(starts[after].tolist(),
                                                         counts[after].tolist(),
                                                         strict=True)], dtype=np.int64)
                    ends = starts[after] + counts[after]
                    new_b.extend(self._learn_batch(uranks[after], firsts, ends - firsts,
                                                   block))
        if not new_b:
            return results.empty("iterations")
        b = np.concatenate(new_b)
        rows = self._rank_rows(b)
        job_rows = self._job_rows(rows)
        return self._table(np.concatenate([rows, job_rows]))

    def _anchors(self, rank: np.ndarray, comm: np.ndarray, seq: np.ndarray,
                 t: np.ndarray) -> np.ndarray:
        """Boundaries (rank, idx, t) among rows of committed ranks (vectorized)."""
        if len(rank) == 0:
            return np.zeros((0, 3), dtype=np.int64)
        if int(rank[0]) == int(rank[-1]) and bool(np.all(rank == rank[0])):
            st = self.ranks[int(rank[0])]  # one rank (just committed): no table needed
            a_comm = np.array([st.anchor_comm], dtype=np.uint64)
            a_mod = np.array([st.anchor_mod], dtype=np.int64)
            a_res = np.array([st.anchor_res], dtype=np.int64)
            a_off = np.array([st.offset], dtype=np.int64)
            pos = np.zeros(len(rank), dtype=np.int64)
        else:
            table = self._anchor_table(int(rank.max()))
            a_comm, a_mod = table[0].view(np.uint64), table[1]
            a_res, a_off = table[2], table[3]
            pos = rank
        a_res_p, a_mod_p = a_res[pos], a_mod[pos]
        hit = (comm == a_comm[pos]) & ((seq - a_res_p) % a_mod_p == 0)
        idx = (seq[hit] - a_res_p[hit]) // a_mod_p[hit] + a_off[pos][hit]
        b = np.stack([rank[hit], idx, t[hit]], axis=1)
        if self.ref_rank >= 0:
            ref = b[b[:, 0] == self.ref_rank]
            if len(ref):
                allb = np.concatenate([self.ref_bounds, ref[:, 1:]])
                self.ref_bounds = allb[np.argsort(allb[:, 1], kind="stable")][-HISTORY:]
        return b

    def _anchor_table(self, top: int) -> np.ndarray:
        """Anchors of the committed ranks as a dense (4, ranks) int64 table: communicator
        (as int64 bits), calls per period, residue, iteration offset (cached until a rank
        commits or relearns)."""
        cache = self._anchor_cache
        if cache is None or cache.shape[1] <= top:
            size = max(top + 1, max(self.ranks) + 1 if self.ranks else 0)
            cache = np.zeros((4, size), dtype=np.int64)
            cache[1] = 1
            items = list(self.ranks.items())
            if items:
                idx = np.array([r for r, _ in items], dtype=np.int64)
                cache[0, idx] = np.array([st.anchor_comm for _, st in items],
                                         dtype=np.uint64).view(np.int64)
                cache[1, idx] = [st.anchor_mod for _, st in items]
                cache[2, idx] = [st.anchor_res for _, st in items]
                cache[3, idx] = [st.offset for _, st in items]
            self._anchor_cache = cache
        return cache

    def _count_ops(self, uranks: np.ndarray, counts: np.ndarray, b: np.ndarray) -> None:
        """Track ops since the latest anchor (vectorized over ranks); relearn a rank whose
        anchor disappeared (its call pattern changed)."""
        top = int(uranks.max()) + 1 if len(uranks) else 0
        if top > len(self._since):
            self._since = np.concatenate([self._since, np.zeros(top - len(self._since),
                                                                dtype=np.int64)])
        has = np.isin(uranks, b[:, 0])
        self._since[uranks] = np.where(has, 0, self._since[uranks] + counts)
        periods = self._periods_of(uranks)
        for r in uranks[self._since[uranks] > self.config.lost_periods * periods].tolist():
            st = self.ranks[r]
            self.ranks[r] = _Rank(next_try=self._first_try(r), last_idx=st.last_idx,
                                  last_t=st.last_t)
            self._buf[r] = []
            self._nbuf[r] = 0
            self._since[r] = 0
            self._invalidate()

    def _invalidate(self) -> None:
        """Forget the dense per-rank caches (a rank committed, relearns or was added)."""
        self._period_cache = None
        self._anchor_cache = None
        self._committed_all = None

    def _all_committed(self) -> bool:
        if self._committed_all is None:
            self._committed_all = all(st.period for st in self.ranks.values())
        return self._committed_all

    def _periods_of(self, ranks: np.ndarray) -> np.ndarray:
        """Committed period per rank (a cached dense array, rebuilt after commits)."""
        if self._period_cache is None or len(self._period_cache) <= int(ranks.max()):
            top = max(self.ranks) + 1 if self.ranks else 0
            arr = np.zeros(max(top, int(ranks.max()) + 1), dtype=np.int64)
            for r, st in self.ranks.items():
                arr[r] = st.period
            self._period_cache = arr
        return self._period_cache[ranks]

    def _rank_rows(self, b: np.ndarray) -> np.ndarray:
        """Rows (rank, idx, t_start, t_end) of iterations completed by new boundaries."""
        if len(b) == 0:
            return np.zeros((0, 4), dtype=np.int64)
        b = b[np.lexsort((b[:, 1], b[:, 0]))]
        # per rank with new boundaries: prepend its latest known boundary
        uranks = np.unique(b[:, 0])
        ranks = self.ranks
        prev = np.array([[r, ranks[r].last_idx, ranks[r].last_t] for r in uranks.tolist()],
                        dtype=np.int64).reshape(-1, 3)
        allb = np.concatenate([prev, b])
        allb = allb[np.lexsort((allb[:, 1], allb[:, 0]))]
        # drop stale or duplicate boundaries
        keep = np.ones(len(allb), dtype=bool)
        same = allb[1:, 0] == allb[:-1, 0]
        keep[1:] = ~(same & (allb[1:, 1] <= allb[:-1, 1]))
        allb = allb[keep]
        consecutive = (allb[1:, 0] == allb[:-1, 0]) & (allb[1:, 1] == allb[:-1, 1] + 1) & (
            allb[:-1, 1] >= 0)
        i = np.flatnonzero(consecutive)
        out = np.stack([allb[i, 0], allb[i, 1], allb[i, 2], allb[i + 1, 2]], axis=1)
        # remember the latest boundary per rank
        last = np.flatnonzero(np.append(allb[1:, 0] != allb[:-1, 0], True))
        for r, idx, tt in allb[last].tolist():
            st = self.ranks[r]
            if idx > st.last_idx:
                st.last_idx, st.last_t = idx, tt
        return out.reshape(-1, 4)

    def _job_rows(self, rows: np.ndarray) -> np.ndarray:
        """Job iterations (rank -1): from the last rank to cross each boundary (the job's
        iteration ends when its last rank's does), emitted once every rank seen completed
        the iteration. A rank that stays behind (stopped, or gone) would hold the job's
        iterations back: once some rank completed three more iterations, an iteration is
        emitted from the ranks that completed it before that moment (trace time), if they
        are at least half. Both rules depend on the data only, not on the batching."""
        if len(rows):
            fresh = rows[rows[:, 1] > self.job_last_idx]
            add = np.stack([fresh[:, 1], fresh[:, 0], fresh[:, 2], fresh[:, 3] - fresh[:, 2]],
                           axis=1)
            self._pend = np.concatenate([self._pend, add])
        if len(self._pend) == 0 or not self._all_committed():
            # job iterations only once every rank seen knows its period (and agrees with
            # the reference on the iteration time)
            return np.zeros((0, 4), dtype=np.int64)
        world = max(1, len(self.ranks))
        pend = self._pend
        ends = pend[:, 2] + pend[:, 3]
        out = []
        emitted = -1
        for idx in np.unique(pend[:, 0]).tolist():
            if idx <= self.job_last_idx:
                continue
            sel = pend[:, 0] == idx
            if int(sel.sum()) < world:
                later = pend[:, 0] == idx + 3
                if not later.any():
                    break
                cutoff = int(ends[later].min())
                seen = sel.copy()
                sel &= ends <= cutoff
                if int(sel.sum()) * 2 < world:
                    if self._never_complete(idx, pend[seen, 1]):
                        self.job_last_idx = emitted = idx  # skipped: a gap, not a lock
                        continue
                    break
            part = pend[sel]
            t0 = int(part[:, 2].max())
            dur = int((part[:, 2] + part[:, 3]).max()) - t0
            out.append((-1, idx, t0, t0 + dur))
            self.job.append((idx, t0, dur))
            self.job_count += 1
            self.job_last_idx = emitted = idx
        if emitted >= 0:
            self._pend = self._pend[self._pend[:, 0] > emitted]
            del self.job[:-HISTORY]
        # never let the pending set grow without bound (e.g. half the ranks are gone)
        if len(self._pend) and int(self._pend[:, 0].max()) - int(self._pend[:, 0].min()) > 64:
            top = int(self._pend[:, 0].max())
            self._pend = self._pend[self._pend[:, 0] > top - 64]
        return np.array(out, dtype=np.int64).reshape(-1, 4)

    def _never_complete(self, idx: int, reported: np.ndarray) -> bool:
        """Whether job iteration ``idx`` can no longer be emitted: the ranks that did not
        report it are already past it (a rank that learned its period again after a reset
        numbers its first boundary after ``idx`` and never reports the earlier ones), so
        waiting for them would hold back every later iteration."""
        ranks = np.fromiter(self.ranks, dtype=np.int64, count=len(self.ranks))
        last = np.fromiter((st.last_idx for st in self.ranks.values()), dtype=np.int64,
                           count=len(self.ranks))
        missing = ~np.isin(ranks, reported)
        return bool(missing.any()) and bool(np.all(last[missing] > idx)) \
            and len(np.unique(reported)) * 2 < len(ranks)

    def _table(self, rows: np.ndarray) -> pa.Table:
        n = len(rows)
        return pa.Table.from_arrays([
            pa.array([self.meta.job] * n, pa.string()),
            pa.array(rows[:, 0].astype(np.int32), pa.int32()),
            pa.array(rows[:, 1], pa.int64()),
            pa.array(rows[:, 2], pa.int64()),
            pa.array(rows[:, 3], pa.int64()),
            pa.array(rows[:, 3] - rows[:, 2], pa.int64()),
        ], schema=results.SCHEMAS["iterations"])

    # ------------------------------------------------------------------ state

    def snapshot(self) -> dict[str, Any]:
        return {
            "ranks": {str(r): st.to_dict() for r, st in self.ranks.items()},
            "buf": {str(r): np.concatenate(p, axis=1).tolist() if p else []
                    for r, p in self._buf.items()},
            "pend": self._pend.tolist(),
            "job_last_idx": self.job_last_idx,
            "job": [list(x) for x in self.job], "job_count": self.job_count,
            "ref_rank": self.ref_rank, "ref_bounds": self.ref_bounds.tolist(),
            "since": self._since.tolist(), "spans": self._spans.snapshot(),
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.ranks = {int(r): _Rank(**d) for r, d in state["ranks"].items()}
        self._buf = {int(r): ([np.array(v, dtype=np.int64).reshape(5, -1)] if v else [])
                     for r, v in state["buf"].items()}
        self._nbuf = {r: sum(p.shape[1] for p in parts) for r, parts in self._buf.items()}
        self._pend = np.array(state["pend"], dtype=np.int64).reshape(-1, 4)
        self.job_last_idx = int(state["job_last_idx"])
        self.job = [(int(a), int(b), int(c)) for a, b, c in state["job"]]
        self.job_count = int(state.get("job_count", len(self.job)))
        self.ref_rank = int(state["ref_rank"])
        self.ref_bounds = np.array(state["ref_bounds"], dtype=np.int64).reshape(-1, 2)
        self._since = np.array(state["since"], dtype=np.int64)
        self._spans.restore(state.get("spans", []))
        self._invalidate()


def median_iteration_s(tracker: IterationTracker) -> float:
    """The job's median iteration time in seconds (nan before the first iteration)."""
    if not tracker.job:
        return math.nan
    return float(np.median([d for _, _, d in tracker.job])) / 1e9
