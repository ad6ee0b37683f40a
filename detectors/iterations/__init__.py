"""Training iterations from the communication call sequence (Greyhound §4.2, "Iteration
time analysis").

Per rank, the sequence of operations it enters is periodic with one period per training
iteration. Each operation becomes a symbol (communicator, op, bytes), so several
communicators interleaving on one rank (TP collectives, PP send/recv, DP sync) still form
one sequence with one period. The period is the first lag ``k`` whose autocorrelation
reaches ``M = 0.95`` (Greyhound's ``argmin_k ACF(X)_k >= M``), computed with
``statsmodels.tsa.stattools.acf`` on a few deterministic numeric embeddings of the symbols
(a random projection of their one-hot encoding). We require every multiple of ``k`` to stay
near the threshold too, so that a sub-period (e.g. the micro-batch pattern of a long 1F1B
steady state) is not taken for the iteration.

Once the period is known, each iteration starts at one *anchor* operation: the operation
of the period preceded by the longest pause (typically the first call after the optimizer
step). The anchor is pinned by its communicator and its ``seq`` residue modulo the number of
calls on that communicator per period, so boundaries are found in each new batch with one
vectorized test, and the iteration number ``(seq - residue) // calls`` agrees across ranks
and across restarts. The first rank to learn its period is the reference: the others anchor
at the operation closest in time to its boundaries and take its iteration numbers. The
job's iteration (rank -1) runs from the last rank crossing one boundary to the last rank
crossing the next, so a delay anywhere shows in exactly one job iteration.

Jobs with very few collectives per iteration (pure DP: 1-3) leave the ACF little to bite
on: ranks in no TP/PP/CP/EP communicator try early, commit after a few periods, take a
single repeated call as a period of one, and complete the symbol period by the timing of
the rounds (one dominant pause per iteration) or by the calls per framework step of their
``span`` rows (:mod:`.fewops`).

Modules: :mod:`.columns` (decoded ``coll`` rows, sorting and grouping helpers shared with
the other detectors), :mod:`.period` (symbols and the ACF period), :mod:`.fewops` (periods
of very few operations), :mod:`.rank_state` (the per-rank state and its anchor) and
:mod:`.tracker` (:class:`IterationTracker`).
"""

from failslow.detectors.iterations.columns import (
    _group_starts,
    _median,
    _median0,
    _pack,
    _sorted_groups,
    coll_columns,
    comm_codes,
    rank_time_order,
    stable_argsort,
)
from failslow.detectors.iterations.period import find_period, pooled_acf, symbols
from failslow.detectors.iterations.tracker import (
    IterationConfig,
    IterationTracker,
    median_iteration_s,
)

__all__ = [
    "IterationConfig", "IterationTracker", "_group_starts", "_median", "_median0", "_pack",
    "_sorted_groups", "coll_columns", "comm_codes", "find_period", "median_iteration_s",
    "pooled_acf", "rank_time_order", "stable_argsort", "symbols",
]
