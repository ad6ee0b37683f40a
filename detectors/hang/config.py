"""Configuration of the hang detector (CCL-D §4.2.1 thresholds, MEGATRACE Algorithm 1) and
the constants its tables share."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from failslow import events

SEND, RECV = events.OP["send"], events.OP["recv"]
ALLREDUCE = events.OP["allreduce"]
N_OPS = len(events.COLL_OPS)
N_KEYS = 2 * N_OPS       # duration statistics per (operation, size class)
NO_TIME = int(np.iinfo(np.int64).min)


@dataclass
class HangConfig:
    """Thresholds of the hang detector.

    ``n_expected``: MEGATRACE's ``n`` (Algorithm 1, ``t > n x T_expected``, e.g. 2).
    ``floor_ns``: the smallest threshold; collectives of microseconds do not alarm after a
    millisecond of host jitter. ``ceiling_ns``: CCL-D's hang threshold (§6.1: 5 minutes, "97 %
    of cases exceeding this limit cannot recover"); the threshold never exceeds it, and an
    operation type with no history waits this long. ``quantile`` of the last ``history``
    durations of a (communicator, operation) is ``T_expected`` once ``min_history`` of them
    were seen. ``long_tail``: ``T_expected`` is at least the longest duration the operation
    ever completed in (not counting reported hangs): a periodic long collective, e.g. ranks
    waiting in a collective while one rank writes a checkpoint, is learned as normal after its
    first occurrence (CCL-D §4.2.1 sets its threshold "considering such long operations").
    Durations are kept per (communicator, operation, size class): buffers of at most
    ``small_bytes`` (metadata, flags, losses) apart from payload buffers of the same
    operation, so a first small all-gather on a data-parallel group (as checkpoint code
    issues) does not borrow the expectation of the parameter all-gathers; an unseen
    (communicator, operation, size class) borrows from the communicators of the same size,
    else it waits for the ceiling; and a small operation that once blocked for
    ``idle_floor_ns`` or more is a synchronisation point (ranks wait in it while one works
    on the host for any length of time): the ceiling too. ``barrier_bytes``: CCL-D's
    barrier filter (allreduce of at most 4 bytes).
    ``idle_floor_ns``: the least time a member that never entered a round (H1) must have been
    silent before it is named the root. Only H1 can be mimicked by a healthy rank that is
    merely busy on the host (a Python GC pause, logging, a checkpoint write on one rank, a
    data-loader stall) while its peers wait; an all-entered round that stops completing (H2,
    H3) cannot, so it keeps the floor of ``floor_ns``. Set it to ``floor_ns`` for MEGATRACE's
    bare 2 x ``T_expected``.
    Silence (a rank emits nothing while a peer waits on it): threshold ``silence_n`` times the
    rank's longest gap between its own records, at least ``silence_floor_ns`` and
    ``idle_floor_ns``, learned after ``silence_min_gaps`` gaps; only for waits in operations
    with a learned expectation (an operation never seen before waits for its own threshold).
    ``lag_decay``: delivery lag per rank (how far its newest records trail the newest records
    of the job when they arrive, a slow collector or a lagging partition) is the decaying
    maximum of its samples; a rank's records are taken as complete only up to ``now - lag``
    (lags under ``lag_min_ns``, the granularity of batches and ticks, count as none), so a
    late rank is neither blamed as not entered nor its operations aged too early.
    ``recent_ops``: the last operations of each rank kept to place a tensor- or
    context-parallel halt point in the 1F1B schedule (pass, micro-batch).
    ``link_stall_ns``: how long a queue pair's completions must
    stand still while posted work requests grow to call the link broken; a hardware hang
    waits at most ``link_wait_ns`` for that evidence when queue pairs report. ``p2p_batch_ns``:
    sends/recvs posted this close together count as one ``batch_isend_irecv`` when choosing
    the halt point. ``ras_fresh_ns``: an NCCL RAS finding (``ras`` rows) is current while
    seen within this long, or three of the agent's report intervals if longer
    (:mod:`failslow.detectors.hang.ras`).
    """

    n_expected: float = 2.0
    floor_ns: int = 1_000_000_000
    ceiling_ns: int = 300_000_000_000
    quantile: float = 1.0
    history: int = 128
    min_history: int = 2
    long_tail: bool = True
    small_bytes: int = 65_536
    barrier_bytes: int = 4
    idle_floor_ns: int = 5_000_000_000
    silence: bool = True
    silence_n: float = 2.0
    silence_floor_ns: int = 1_000_000_000
    silence_min_gaps: int = 50
    lag_decay: float = 0.95
    lag_min_ns: int = 250_000_000
    recent_ops: int = 128
    link_stall_ns: int = 500_000_000
    p2p_batch_ns: int = 1_000_000
    link_wait_ns: int = 5_000_000_000
    max_listed_victims: int = 64
    ras_fresh_ns: int = 30_000_000_000
    max_orphans: int = 100_000
    max_signatures: int = 10_000
