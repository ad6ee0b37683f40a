"""Iteration periods of jobs with very few collectives per iteration (Greyhound §4.2,
"Iteration time analysis", when the ACF has little to bite on).

A pure data-parallel rank enters one to three collectives per iteration (the gradient
all-reduce; or reduce-scatter + all-gather; plus a small loss all-reduce). Its symbol
sequence is then degenerate (one symbol: no variance, no ACF) or periodic with a lag of
2-3 operations, which the commit rules meant for long periods (``min_ops``,
``min_commit_ops`` operations) only accept after tens of iterations, or never. For such
ranks (:func:`few_ops_ranks`: a pure-DP job, no TP, PP, CP or EP communicator, no
point-to-point call, so the sequence cannot be a sub-period of a longer schedule) the
tracker tries early and commits after a few periods,
and the period is completed by the *timing* of the rounds (:func:`timing_period`): the
iteration holds one dominant pause (the forward and backward compute before the gradient
sync), so a symbol period of ``p`` operations is really ``m * p`` when the gap before the
same symbol alternates between the compute pause and a short one. A period of one
operation makes every operation an iteration boundary.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from failslow.detectors.iterations.columns import _median0
from failslow.events import JobMeta

#: communicator kinds whose calls repeat within an iteration (micro-batches, layers)
_INNER_KINDS = frozenset(("tp", "pp", "cp", "ep"))


def few_ops_ranks(meta: JobMeta) -> tuple[Callable[[int], bool], bool]:
    """Whether a rank may have a period of very few operations: the job's degrees say pure
    DP (``tp``, ``pp``, ``cp`` at most 1) and the rank belongs to no TP, PP, CP or EP
    communicator in ``meta.comms``. Also whether any rank may. (The tracker also requires
    that the rank makes no point-to-point call.)"""
    if max(meta.tp, meta.pp, meta.cp) > 1:
        return lambda rank: False, False
    blocked = {r for c in meta.comms if c.kind in _INNER_KINDS for r in c.ranks}
    return (lambda rank: rank not in blocked), True


def symbol_period(sym: np.ndarray, period: int) -> int:
    """The ACF period, or 1 for a sequence of a single repeated symbol (every operation
    is the same call: the ACF of a constant is undefined)."""
    if period == 0 and len(sym) >= 2 and bool(np.all(sym == sym[0])):
        return 1
    return period


def timing_need(p_sym: int, max_period: int, min_rows: int) -> int:
    """Operations :func:`timing_period` needs to test every multiple of ``p_sym`` up to
    ``max_period`` on ``min_rows`` periods."""
    top = (max_period // p_sym) * p_sym if p_sym else 0
    return min_rows * top + 1 if top > p_sym else 0


def timing_period(p_sym: int, t: np.ndarray, max_period: int = 4, ratio: float = 1.25,
                  min_rows: int = 4, confirm_rows: int = 8) -> tuple[int, int]:
    """The iteration period from the symbol period ``p_sym`` and the enter times ``t``
    (Greyhound §4.2 on the timing of the rounds), and the operations still needed to
    decide it (0: decided). A multiple ``k = m * p_sym`` (``m >= 2``, ``k <= max_period``,
    smallest first) holds when in *every* period the gap before one phase exceeds
    ``ratio`` times the gaps before the other phases of the same symbol: one period that
    lacks it refutes ``k``; ``confirm_rows`` periods that all show it confirm it (pauses
    such as GC are heavy-tailed and may hit one phase in a few periods by chance, and a
    wrong multiple would halve the iteration count). Every multiple refuted: ``p_sym``."""
    if p_sym <= 0 or len(t) < 3:
        return p_sym, 0
    gaps = np.diff(t).astype(np.float64)  # gaps[i]: the pause before operation i + 1
    for k in range(2 * p_sym, max_period + 1, p_sym):
        rows = len(gaps) // k
        if rows < min_rows:
            return p_sym, min_rows * k + 1
        g = gaps[len(gaps) - rows * k:].reshape(rows, k)
        j = int(np.argmax(_median0(g)))
        same = (np.arange(k) % p_sym) == (j % p_sym)
        same[j] = False
        if bool(np.all(g[:, j] >= ratio * g[:, same].max(axis=1))):
            return (k, 0) if rows >= confirm_rows else (p_sym, confirm_rows * k + 1)
    return p_sym, 0


class SpanSteps:
    """Step starts of framework ``span`` rows (events.md: ``step`` is the training
    iteration) for ranks still learning: with them, the period of a rank of very few ops
    is the number of its calls per step (Greyhound §4.2's period, read off the framework
    instead of the call sequence). Only spans that ended by the time of an attempt are
    used, so the result does not depend on the batching of a time-ordered replay."""

    def __init__(self, max_rows: int = 200000) -> None:
        self.rows = np.zeros((0, 4), dtype=np.int64)  # rank, step, t_start, t_end
        self.max_rows = max_rows

    def add(self, rank: np.ndarray, step: np.ndarray, t_start: np.ndarray,
            t_end: np.ndarray) -> None:
        """Keep these span rows (the caller picks the learning ranks)."""
        if len(rank):
            new = np.stack([rank, step, t_start, t_end], axis=1).astype(np.int64)
            self.rows = np.concatenate([self.rows, new])[-self.max_rows:]

    def drop(self, rank: int) -> None:
        """Forget a rank (it committed its period)."""
        if len(self.rows):
            self.rows = self.rows[self.rows[:, 0] != rank]

    def calls_per_step(self, rank: int, t: np.ndarray, t_now: int,
                       min_steps: int = 3) -> int:
        """Calls (enter times ``t``, sorted) per step of ``rank``: the count between the
        starts of consecutive steps, when at least ``min_steps`` steps inside the calls'
        time range agree on it (three quarters of them); else 0."""
        r = self.rows[(self.rows[:, 0] == rank) & (self.rows[:, 3] <= t_now)]
        if len(r) == 0 or len(t) == 0:
            return 0
        steps, inv = np.unique(r[:, 1], return_inverse=True)
        start = np.full(len(steps), np.iinfo(np.int64).max)
        np.minimum.at(start, inv.reshape(-1), r[:, 2])
        pair = (np.diff(steps) == 1) & (start[:-1] >= t[0]) & (start[1:] <= t[-1])
        if int(pair.sum()) < min_steps:
            return 0
        pos = np.searchsorted(t, start)
        counts = np.diff(pos)[pair]
        vals, freq = np.unique(counts, return_counts=True)
        best = int(np.argmax(freq))
        return int(vals[best]) if freq[best] * 4 >= 3 * len(counts) and vals[best] > 0 else 0

    def snapshot(self) -> list[list[int]]:
        return self.rows.tolist()

    def restore(self, rows: list[list[int]]) -> None:
        self.rows = np.array(rows, dtype=np.int64).reshape(-1, 4)
