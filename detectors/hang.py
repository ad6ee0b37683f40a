"""Hang detection, classification and localisation (CCL-D §2.2, §4.2; MEGATRACE §III-C).

Detection (CCL-D §4.2.1, MEGATRACE Algorithm 1 line 3): an operation with an ``enter`` and no
``end`` that has been in flight longer than ``n x T_expected`` is stuck. ``T_expected`` is
learned per (communicator, operation, size class) from completed history (a high quantile of
the last ``history`` end-enter durations, at least the longest ever: a periodic long
collective is normal after its first occurrence), pooled over the communicators of the same
size while a communicator's own history is short, and clamped to ``[floor_ns, ceiling_ns]``;
CCL-D's 5-minute cutoff is the ceiling and the threshold of operations never seen completing
and of small operations that once blocked for seconds (synchronisation points where ranks wait
while one works on the host: checkpoint writes, evaluation). Tiny allreduces
(<= ``barrier_bytes``, CCL-D's barrier filter) never trigger. A rank that emits nothing for
``n x`` its longest usual gap while a peer waits for it is a hang too (MEGATRACE's heartbeat
timeout); nobody waiting (a pause with nothing in flight) is not. Detection runs on
``on_tick`` as time passes, and on ``update`` at the latest record time.

Time is judged per rank up to its *horizon*, ``now`` less its delivery lag (how far its newest
records trail the job's newest when they arrive): a rank whose records come late (a slow
collector, a lagging partition) is not taken for one that stopped, and its operations do not
age early.

Classification (CCL-D §4.2.2, Figure 7) over the Trace ID ``(comm, seq)`` of the stuck round
(for send/recv: the k-th operation between a sender and a receiver, events.md):

* H1 ``not_entered``: a member's seq counter on the communicator is behind the round (for
  send/recv: the peer has not posted the matching k-th operation). That member is the root,
  once it has been silent for ``idle_floor_ns``: only H1 can be mimicked by a healthy rank
  that is merely busy on the host (a GC pause, a checkpoint write) while its peers wait.
* H2 ``inconsistent``: everyone entered but with different operations or byte counts (the
  deviating minority is the root; a tie goes against the signature the sibling
  communicators called at that seq, else against the one the members called one iteration
  earlier, else against the rarer in history), or some members completed the round while
  the others hang (CCL-D: "the non-hang ranks are the root cause").
* H3 ``hardware``: everyone entered consistently and nothing completes. The rank with the
  fewest send/recv steps (``progress`` rows, compared within the round) is the root; a queue
  pair whose posted work requests accumulate without completions (MEGATRACE §III-B2, §III-C
  step 2) names the link, and the report waits a few link samples for that evidence. A member
  that holds in flight rounds its peers completed *and passed* stopped completing work (its
  device: a GPU error), which is H3 with that member as root, not H2.
  An all-entered round is stuck from its *last* entry on (the transfer cannot start before:
  CCL-D §4.1), so a member that arrives late and then completes is neither H1 nor H3.

Cascades: the wait graph goes rank -> its head operations (the earliest in flight: a rank runs
its calls in order, later ones are queued behind) -> the members missing from those rounds.
It is followed from every stuck operation to a root: an idle rank (H1), a round every member
entered (H2/H3), or a hang already reported (the operation is a victim: no new report). One
anomaly is reported per root, with MEGATRACE's *halt point*: the first operation the root
failed to call or complete in its own program order (a pipeline or data-parallel round
counts only once a rank in lockstep with the root, a member of its TP or CP group, reached
the same point), and the training stage (§III-C step 3). The halt point is placed in the
1F1B or GPipe schedule rebuilt from ``meta`` (:func:`stage_program`): for pipeline send/recv
from the direction and the pair index, for tensor- and context-parallel collectives from the
last pipeline transfer or data-parallel sync before them among the rank's recent operations;
``extra`` carries ``pass`` (forward/backward), ``microbatch`` and ``schedule_phase``
(warmup/steady/cooldown).
"""

from __future__ import annotations

import base64
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from failslow import events
from failslow.detectors.base import EventBatch
from failslow.detectors.iterations import coll_columns, stable_argsort
from failslow.diagnosis import Anomaly
from failslow.events import JobMeta

SEND, RECV = events.OP["send"], events.OP["recv"]
ALLREDUCE = events.OP["allreduce"]
N_OPS = len(events.COLL_OPS)
N_KEYS = 2 * N_OPS       # duration statistics per (operation, size class)
NO_TIME = int(np.iinfo(np.int64).min)

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
    the halt point.
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
    max_orphans: int = 100_000
    max_signatures: int = 10_000


# ---------------------------------------------------------------------------------------------
# small vectorised tables


def _match2(a1: np.ndarray, a2: np.ndarray, b1: np.ndarray, b2: np.ndarray) -> np.ndarray:
    """For each key (b1, b2), the index of the equal key in the keys (a1, a2) (the first
    one when a key repeats), or -1."""
    return _match((a1, a2), (b1, b2))


def _match_ops(a_comm: np.ndarray, a_rank: np.ndarray, a_seq: np.ndarray, b_comm: np.ndarray,
               b_rank: np.ndarray, b_seq: np.ndarray) -> np.ndarray:
    """:func:`_match2` of operations keyed by (communicator index, rank, seq)."""
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
        return {"keys": self.keys.tolist(), **{n: c.tolist() for n, c in self.cols.items()}}

    def load(self, state: dict[str, Any]) -> None:
        self.keys = np.asarray(state["keys"], dtype=np.int64)
        self._index = None
        for name, (dtype, _) in self.spec.items():
            self.cols[name] = np.asarray(state[name], dtype=dtype)


_INFLIGHT: dict[str, Any] = {
    "rank": np.int64, "comm": np.int64, "seq": np.int64, "op": np.int64, "bytes": np.int64,
    "peer": np.int64, "crank": np.int64, "t": np.int64, "pidx": np.int64, "steps": np.int64,
    "steps_t": np.int64, "hang": np.int64,
}
#: Columns of the per-rank ring of recent operations (halt-point placement in the schedule).
_RING = ("comm", "seq", "op", "t", "pidx", "peer", "bytes")
_CR_SPEC: dict[str, tuple[Any, int]] = {
    "crank": (np.int64, -1), "last_seq": (np.int64, -1), "last_t": (np.int64, NO_TIME),
    "done_seq": (np.int64, -1), "done_op": (np.int64, -1), "done_bytes": (np.int64, -1),
    "seq0": (np.bool_, 0),
}


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


def _pack(a: np.ndarray) -> str:
    """An int64 array as base64 text (compact in JSON snapshots)."""
    return base64.b64encode(np.ascontiguousarray(a, dtype="<i8").tobytes()).decode("ascii")


def _unpack(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<i8").astype(np.int64)


def _pack_z(a: np.ndarray) -> str:
    """:func:`_pack`, zstd-compressed first (the ring of recent operations of thousands of
    ranks is tens of megabytes raw, a few compressed)."""
    raw = np.ascontiguousarray(a, dtype="<i8").tobytes()
    return base64.b64encode(pa.compress(raw, codec="zstd", asbytes=True)).decode("ascii")


def _unpack_z(text: str, count: int) -> np.ndarray:
    """The ``count`` int64 values of :func:`_pack_z`."""
    raw = pa.decompress(base64.b64decode(text), decompressed_size=8 * count, codec="zstd",
                        asbytes=True)
    return np.frombuffer(raw, dtype="<i8").astype(np.int64)


def _sig_tuples(keys: np.ndarray) -> list[tuple[int, int, int]]:
    """(comm index, op, bytes) of packed signature keys (:meth:`HangDetector._count_signatures`)."""
    c = keys >> (_SIG_OP_BITS + _SIG_BYTES_BITS)
    o = (keys >> _SIG_BYTES_BITS) & ((1 << _SIG_OP_BITS) - 1)
    b = keys & ((1 << _SIG_BYTES_BITS) - 1)
    return list(zip(c.tolist(), o.tolist(), b.tolist(), strict=True))


def _saturate(a: np.ndarray) -> np.ndarray:
    """Unsigned 64-bit counters read as int64 (wrapped above 2**63 - 1) saturated
    instead, as :func:`_u64_to_i64` does."""
    return np.where(a < 0, np.iinfo(np.int64).max, a) if len(a) and int(a.min()) < 0 else a


def _u64_to_i64(a: np.ndarray) -> np.ndarray:
    """Counters and sizes as int64 (saturating; nulls already replaced)."""
    return np.minimum(a.astype(np.uint64), np.uint64(2**63 - 1)).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# pipeline schedules (MEGATRACE §III-C: the expected DAG is rebuilt from the configuration)


def stage_program(schedule: str, stage: int, stages: int, micro: int) -> list[tuple[str, Any]]:
    """The steps of pipeline ``stage`` of ``stages`` in one iteration of Megatron's
    non-interleaved schedules: ``("D", "allgather")`` params-sync first, ``("F", mb)`` /
    ``("B", mb)`` forward / backward compute of a micro-batch, ``("P", ops)`` one
    ``batch_isend_irecv`` with ops ``(send, grad, mb)`` (``grad``: a gradient of the
    backward pass, else an activation), ``("D", "reducescatter")`` grads-sync last.

    1F1B: ``w = min(P - s - 1, M)`` warm-up forwards, ``M - w`` steady (forward, send the
    activation with the receive of a gradient, backward, send the gradient with the receive
    of the next activation), ``w`` cool-down backwards. GPipe: every forward, then every
    backward."""
    first, last = stage == 0, stage == stages - 1
    recv_fwd = [] if first else [(False, False)]
    send_fwd = [] if last else [(True, False)]
    recv_bwd = [] if last else [(False, True)]
    send_bwd = [] if first else [(True, True)]
    steps: list[tuple[str, Any]] = [("D", "allgather")]

    def p2p(*parts: tuple[list[tuple[bool, bool]], int]) -> None:
        ops = tuple((send, grad, mb) for kinds, mb in parts for send, grad in kinds)
        if ops:
            steps.append(("P", ops))

    if schedule == "gpipe":
        for i in range(micro):
            p2p((recv_fwd, i))
            steps.append(("F", i))
            p2p((send_fwd, i))
        for i in range(micro):
            p2p((recv_bwd, i))
            steps.append(("B", i))
            p2p((send_bwd, i))
    else:
        warm = min(stages - stage - 1, micro)
        for i in range(warm):
            p2p((recv_fwd, i))
            steps.append(("F", i))
            p2p((send_fwd, i))
        if micro > warm:
            p2p((recv_fwd, warm))
        for i in range(micro - warm):
            steps.append(("F", warm + i))
            p2p((send_fwd, warm + i), (recv_bwd, i))
            steps.append(("B", i))
            if i == micro - warm - 1:
                p2p((send_bwd, i))
            else:
                p2p((send_bwd, i), (recv_fwd, warm + i + 1))
        for i in range(micro - warm, micro):
            p2p((recv_bwd, i))
            steps.append(("B", i))
            p2p((send_bwd, i))
    steps.append(("D", "reducescatter"))
    return steps


def _compute_between(prog: list[tuple[str, Any]], after: int, until: int | None,
                     has_dp: bool) -> list[tuple[str, Any]]:
    """The compute steps that follow step ``after`` of a stage program, cyclically (the
    next iteration follows), up to step ``until`` or the next boundary: a point-to-point
    batch, or a data-parallel sync when the job has one (else the iteration runs on)."""
    out: list[tuple[str, Any]] = []
    n = len(prog)
    for k in range(1, n):
        i = (after + k) % n
        if i == until:
            break
        kind, what = prog[i]
        if kind == "P" or (kind == "D" and has_dp):
            if until is None:
                break
            return []           # another boundary first: not a gap between the two
        if kind in ("F", "B"):
            out.append((kind, what))
    return out


def schedule_phase(schedule: str, stage: int, stages: int, micro: int, pas: str, mb: int
                   ) -> str | None:
    """``warmup``, ``steady`` or ``cooldown``: where the forward or backward of micro-batch
    ``mb`` falls in the 1F1B schedule of ``stage`` (None for other schedules or without
    pipeline parallelism)."""
    if schedule != "1f1b" or stages <= 1 or micro <= 0:
        return None
    warm = min(stages - stage - 1, micro)
    if pas == "forward":
        return "warmup" if mb < warm else "steady"
    return "cooldown" if mb >= micro - warm else "steady"


# ---------------------------------------------------------------------------------------------
# open hangs


@dataclass
class _Hang:
    anomaly: Anomaly
    index: int
    roots: list[int] = field(default_factory=list)        # idle roots (H1)
    round: list[Any] | None = None                         # the all-entered round (H2/H3)
    last_end: int = NO_TIME
    ended: bool = False


class HangDetector:
    """Hang detector of one job (see the module docstring for the method).

    ``update(batch)`` ingests ``coll``, ``progress`` and ``link`` records and reports hangs
    whose stuck operations completed (``end_ns`` set) plus hangs visible at the latest event
    time; ``on_tick(now_ns)`` detects as time passes with no new records.
    """

    def __init__(self, meta: JobMeta, config: HangConfig | None = None) -> None:
        self.meta = meta
        self.config = config or HangConfig()
        self.job = meta.job
        self._latest = NO_TIME
        # communicators
        self._comm_ids: dict[int, int] = {}
        self._comm_u64: list[int] = []
        self._comm_kind: list[str | None] = []
        self._comm_size: list[int] = []
        self._comm_p2p: list[bool] = []
        self._comm_sorted: tuple[np.ndarray, np.ndarray] | None = None  # ids sorted, index
        self._meta_members: dict[int, np.ndarray] = {}
        self._mcache: dict[int, np.ndarray] = {}
        # per (comm, rank) and per (comm, comm rank)
        self._cr = _Sorted(_CR_SPEC)
        self._crk = _Sorted({"rank": (np.int64, -1)})
        # point-to-point counters: operations entered per (comm, rank, peer, direction)
        self._pairs = _Sorted({"count": (np.int64, 0)})
        # in-flight operations
        self._fl: dict[str, np.ndarray] = {n: np.zeros(0, d) for n, d in _INFLIGHT.items()}
        self._orphans: dict[str, np.ndarray] = {n: np.zeros(0, np.int64)
                                                for n in ("comm", "rank", "seq", "t")}
        # durations per (comm, op, size class): ring buffers and the longest ever
        self._stat_row = np.full((0, N_KEYS), -1, dtype=np.int64)
        self._dur = np.full((0, self.config.history), -1, dtype=np.int64)
        self._dur_pos = np.zeros(0, dtype=np.int64)
        self._dur_n = np.zeros(0, dtype=np.int64)
        self._exp = np.full(0, -1, dtype=np.int64)
        self._tail = np.full(0, -1, dtype=np.int64)
        # per rank: last record, longest gap, delivery lag, recent operations
        self._rk_last = np.full(0, NO_TIME, dtype=np.int64)
        self._rk_gap = np.zeros(0, dtype=np.int64)
        self._rk_ngap = np.zeros(0, dtype=np.int64)
        self._rk_lag = np.zeros(0, dtype=np.int64)
        self._rk_new = np.full(0, NO_TIME, dtype=np.int64)   # newest record of this batch
        self._ring = np.zeros((0, self.config.recent_ops, len(_RING)), dtype=np.int64)
        self._ring_n = np.zeros(0, dtype=np.int64)
        self._first_t = NO_TIME
        self._now = NO_TIME
        # links (queue pairs)
        self._qp_ids: dict[str, int] = {}
        self._qp_info: list[tuple[str, str, str | None, int]] = []
        self._qp = {n: np.zeros(0, np.int64) for n in
                    ("last_t", "posted", "completed", "t_change", "posted_change")}
        # completed (comm, op, bytes) counts; this batch's counted in numpy, merged into the
        # dict when read (:attr:`_signatures`) or every ``_SIG_PENDING`` batches
        self._sig_book: dict[tuple[int, int, int], int] = {}
        self._sig_pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._link_period = 0
        # hangs
        self._hangs: list[_Hang] = []
        # silent ranks nobody waits on, valid while the in-flight operations do not change
        self._fl_version = 0
        self._quiet_cache: tuple[int, set[int]] = (-1, set())
        keys, ranks = [], []
        for c in meta.comms:
            ci = self._register_comm(c.comm, len(c.ranks))
            self._comm_kind[ci] = c.kind
            members = np.asarray(c.ranks, dtype=np.int64)
            self._meta_members[ci] = members
            keys.append(_cr_key(ci, np.arange(len(members))))
            ranks.append(members)
        if keys:
            idx = self._crk.ensure(np.concatenate(keys))
            self._crk.cols["rank"][idx] = np.concatenate(ranks)

    # -----------------------------------------------------------------------------------------
    # Detector protocol

    def update(self, batch: EventBatch) -> list[Anomaly]:
        coll = batch.get("coll")
        if coll is not None and coll.num_rows:
            self._ingest_coll(coll)
        prog = batch.get("progress")
        if prog is not None and prog.num_rows:
            self._ingest_progress(prog)
        link = batch.get("link")
        if link is not None and link.num_rows:
            self._ingest_link(link)
        self._note_lag()
        out = self._finished()
        if self._latest != NO_TIME:
            out += self._check(max(self._latest, self._now))
        return out

    def on_tick(self, now_ns: int) -> list[Anomaly]:
        self._now = max(self._now, int(now_ns))
        return self._finished() + self._check(int(now_ns))

    def expected_ns(self, comm: int, op: str, nbytes: int) -> tuple[int | None, int]:
        """``(T_expected, threshold)`` of an operation on communicator ``comm`` as it stands:
        ``T_expected`` learned from history (None: unknown, the threshold is the ceiling),
        the threshold ``clamp(n x T_expected, floor, ceiling)`` (module docstring)."""
        cfg = self.config
        ci = self._comm_ids.get(int(comm), -1)
        if ci < 0:
            return None, cfg.ceiling_ns
        exp = self._expectations(np.array([ci]), np.array([events.OP[op]]),
                                 np.array([int(nbytes)]))
        if not np.isfinite(exp[0]):
            return None, cfg.ceiling_ns
        thr = int(np.clip(cfg.n_expected * exp[0], cfg.floor_ns, cfg.ceiling_ns))
        return int(exp[0]), thr

    def horizon(self, now_ns: int) -> np.ndarray:
        """Per rank: the time up to which its records are taken as complete at ``now_ns``
        (``now`` less its delivery lag)."""
        lag = self._rk_lag
        return int(now_ns) - np.where(lag >= self.config.lag_min_ns, lag, 0)

    def _note_lag(self) -> None:
        """Delivery lag samples of the ranks whose records came in this batch: how far their
        newest record trails the newest record of the job (or the last tick)."""
        new = self._rk_new
        got = np.flatnonzero(new != NO_TIME)
        if not len(got):
            return
        front = max(self._latest, self._now)
        sample = np.maximum(front - new[got], 0)
        decayed = (self._rk_lag[got] * self.config.lag_decay).astype(np.int64)
        self._rk_lag[got] = np.maximum(sample, decayed)
        new[got] = NO_TIME

    def snapshot(self) -> dict[str, Any]:
        return {
            "version": 2, "latest": self._latest, "now": self._now, "first_t": self._first_t,
            "comms": {"u64": self._comm_u64, "kind": self._comm_kind, "size": self._comm_size,
                      "p2p": self._comm_p2p},
            "cr": self._cr.to_state(), "crk": self._crk.to_state(),
            "pairs": self._pairs.to_state(),
            "inflight": {n: a.tolist() for n, a in self._fl.items()},
            "orphans": {n: a.tolist() for n, a in self._orphans.items()},
            "stats": {"row": self._stat_row.tolist(), "dur": self._dur.tolist(),
                      "pos": self._dur_pos.tolist(), "n": self._dur_n.tolist(),
                      "exp": self._exp.tolist(), "tail": self._tail.tolist()},
            "ranks": {"last": self._rk_last.tolist(), "gap": self._rk_gap.tolist(),
                      "ngap": self._rk_ngap.tolist(), "lag": self._rk_lag.tolist(),
                      "ring_z": _pack_z(self._ring), "ring_n": self._ring_n.tolist()},
            "qp": {"keys": list(self._qp_ids), "info": [list(i) for i in self._qp_info],
                   **{n: a.tolist() for n, a in self._qp.items()}},
            "signatures": [[*k, v] for k, v in self._signatures.items()],
            "link_period": self._link_period,
            "hangs": [{"anomaly": h.anomaly.to_dict(), "index": h.index, "roots": h.roots,
                       "round": h.round, "last_end": h.last_end, "ended": h.ended}
                      for h in self._hangs],
        }

    def restore(self, state: dict[str, Any]) -> None:
        if state.get("version") != 2:
            raise ValueError("hang detector: unknown snapshot version")
        self._latest = int(state["latest"])
        self._now = int(state["now"])
        self._first_t = int(state["first_t"])
        comms = state["comms"]
        self._comm_u64 = [int(c) for c in comms["u64"]]
        self._comm_ids = {c: i for i, c in enumerate(self._comm_u64)}
        self._comm_sorted = None
        self._comm_kind = list(comms["kind"])
        self._comm_size = [int(s) for s in comms["size"]]
        self._comm_p2p = [bool(p) for p in comms["p2p"]]
        self._cr.load(state["cr"])
        self._crk.load(state["crk"])
        self._mcache.clear()
        self._pairs.load(state["pairs"])
        self._fl = {n: np.asarray(state["inflight"][n], dtype=d) for n, d in _INFLIGHT.items()}
        self._orphans = {n: np.asarray(a, dtype=np.int64) for n, a in state["orphans"].items()}
        st = state["stats"]
        self._stat_row = np.asarray(st["row"], dtype=np.int64).reshape(-1, N_KEYS)
        self._dur = np.asarray(st["dur"], dtype=np.int64).reshape(-1, self.config.history)
        self._dur_pos = np.asarray(st["pos"], dtype=np.int64)
        self._dur_n = np.asarray(st["n"], dtype=np.int64)
        self._exp = np.asarray(st["exp"], dtype=np.int64)
        self._tail = np.asarray(st["tail"], dtype=np.int64)
        rk = state["ranks"]
        self._rk_last = np.asarray(rk["last"], dtype=np.int64)
        self._rk_gap = np.asarray(rk["gap"], dtype=np.int64)
        self._rk_ngap = np.asarray(rk["ngap"], dtype=np.int64)
        self._rk_lag = np.asarray(rk["lag"], dtype=np.int64)
        self._rk_new = np.full(len(self._rk_last), NO_TIME, dtype=np.int64)
        shape = (len(self._rk_last), self.config.recent_ops, len(_RING))
        ring = (_unpack_z(rk["ring_z"], int(np.prod(shape))) if "ring_z" in rk
                else _unpack(rk["ring"]))  # snapshots before compression
        self._ring = ring.reshape(shape)
        self._ring_n = np.asarray(rk["ring_n"], dtype=np.int64)
        qp = state["qp"]
        self._qp_ids = {k: i for i, k in enumerate(qp["keys"])}
        self._qp_info = [(str(a), str(b), c, int(d)) for a, b, c, d in qp["info"]]
        self._qp = {n: np.asarray(qp[n], dtype=np.int64) for n in self._qp}
        self._link_period = int(state["link_period"])
        self._signatures = {(int(c), int(o), int(b)): int(n)
                            for c, o, b, n in state["signatures"]}
        self._hangs = [_Hang(Anomaly.from_dict(h["anomaly"]), int(h["index"]), list(h["roots"]),
                             h["round"], int(h["last_end"]), bool(h["ended"]))
                       for h in state["hangs"]]

    # -----------------------------------------------------------------------------------------
    # ingestion

    def _register_comm(self, comm: int, size: int) -> int:
        ci = self._comm_ids.get(comm)
        if ci is None:
            ci = len(self._comm_u64)
            self._comm_ids[comm] = ci
            self._comm_u64.append(comm)
            self._comm_kind.append(None)
            self._comm_size.append(size)
            self._comm_p2p.append(False)
            grow = np.full((ci + 1 - len(self._stat_row), N_KEYS), -1, dtype=np.int64)
            self._stat_row = np.concatenate([self._stat_row, grow])
        return ci

    def _comm_index(self, comm: np.ndarray, sizes: np.ndarray | None = None) -> np.ndarray:
        """Index of each row's communicator (-1: unknown); with ``sizes``, communicators not
        seen before are registered, in the order of their ids, with the size of their first
        row."""
        codes, uniq = pd.factorize(comm)
        uniq = np.asarray(uniq)
        ids = self._known_comms(uniq)
        if sizes is not None and (ids < 0).any():
            first = _first_positions(codes)
            new = np.flatnonzero(ids < 0)
            for j in new[np.argsort(uniq[new], kind="stable")].tolist():
                ids[j] = self._register_comm(int(uniq[j]), int(sizes[first[j]]))
        return ids[codes]

    def _known_comms(self, uniq: np.ndarray) -> np.ndarray:
        """Index of each communicator id of ``uniq`` (-1: not registered): a binary search
        in the registered ids kept sorted (rebuilt when one is registered)."""
        get = self._comm_ids.get
        if uniq.dtype != np.uint64 or not len(self._comm_u64):
            return np.array([get(c, -1) for c in uniq.tolist()], dtype=np.int64)
        if self._comm_sorted is None or len(self._comm_sorted[0]) != len(self._comm_u64):
            ids = np.asarray(self._comm_u64, dtype=np.uint64)
            by_id = np.argsort(ids, kind="stable")
            self._comm_sorted = (ids[by_id], by_id.astype(np.int64))
        keys, where = self._comm_sorted
        pos = np.minimum(np.searchsorted(keys, uniq), len(keys) - 1)
        return np.where(keys[pos] == uniq, where[pos], -1)

    def _grow_ranks(self, max_rank: int) -> None:
        n = max_rank + 1 - len(self._rk_last)
        if n > 0:
            self._rk_last = np.concatenate([self._rk_last, np.full(n, NO_TIME, np.int64)])
            self._rk_gap = np.concatenate([self._rk_gap, np.zeros(n, np.int64)])
            self._rk_ngap = np.concatenate([self._rk_ngap, np.zeros(n, np.int64)])
            self._rk_lag = np.concatenate([self._rk_lag, np.zeros(n, np.int64)])
            self._rk_new = np.concatenate([self._rk_new, np.full(n, NO_TIME, np.int64)])
            self._ring = np.concatenate([self._ring, np.zeros(
                (n, self.config.recent_ops, len(_RING)), np.int64)])
            self._ring_n = np.concatenate([self._ring_n, np.zeros(n, np.int64)])

    def _ingest_coll(self, table: pa.Table) -> None:
        cols = coll_columns(table)  # decoded once for all the detectors of the job
        rank, crank, csize = cols["rank"], cols["comm_rank"], cols["comm_size"]
        ci = self._comm_index(cols["comm"], csize)
        seq = _saturate(cols["seq"])
        op_a = cols["op"]
        enter = cols["is_enter"]
        nbytes = _saturate(cols["bytes"])
        peer = cols["peer"]
        t = cols["t"]
        self._latest = max(self._latest, int(t.max()))
        self._observe_ranks(rank, t)
        n_enter = int(np.count_nonzero(enter))
        # (comm, rank) rows of every record at once (enters first set theirs, then ends)
        cr_idx = self._cr.ensure(_cr_key(ci, rank))
        if n_enter == len(rank):
            e_sel: Any = slice(None)
            ends: np.ndarray | None = None
        elif n_enter == 0:
            e_sel, ends = None, None
        else:
            e_sel = np.flatnonzero(enter)
            ends = np.flatnonzero(~enter)
        # every record and earlier orphan end against the operations in flight before this
        # batch, in one lookup: enters already in flight are duplicates, ends complete them
        fl, orph = self._fl, self._orphans
        old_hit = old_orph = None
        if len(fl["t"]) and (n_enter < len(rank) or len(orph["t"])):
            hits = _match_ops(fl["comm"], fl["rank"], fl["seq"],
                              np.concatenate([ci, orph["comm"]]),
                              np.concatenate([rank, orph["rank"]]),
                              np.concatenate([seq, orph["seq"]]))
            old_hit, old_orph = hits[:len(rank)], hits[len(rank):]
        new = None
        if e_sel is not None:
            new = self._ingest_enters(rank[e_sel], ci[e_sel], crank[e_sel], seq[e_sel],
                                      op_a[e_sel], nbytes[e_sel], peer[e_sel], t[e_sel],
                                      cr_idx[e_sel],
                                      None if old_hit is None else old_hit[e_sel] >= 0)
        if n_enter < len(rank):
            sel: Any = slice(None) if ends is None else ends
            self._ingest_ends(rank[sel], ci[sel], seq[sel], op_a[sel], nbytes[sel], t[sel],
                              cr_idx[sel], new, None if old_hit is None or old_orph is None
                              else np.concatenate([old_orph, old_hit[sel]]))
        elif len(self._orphans["t"]):
            self._ingest_ends(*(np.zeros(0, np.int64),) * 7, new, old_orph)
        elif new is not None:
            self._fl = {n: np.concatenate([self._fl[n], new[n]]) for n in _INFLIGHT}

    def _observe_ranks(self, rank: np.ndarray, t: np.ndarray) -> None:
        """Last record time and longest gap between a rank's own records (silence baseline)."""
        self._grow_ranks(int(rank.max()))
        order = _rank_time_order(rank, t)
        r, ts = rank[order], t[order]
        prev = np.empty_like(ts)
        prev[1:] = ts[:-1]
        first = np.ones(len(r), dtype=bool)
        first[1:] = r[1:] != r[:-1]
        prev[first] = self._rk_last[r[first]]
        ok = prev != NO_TIME
        # per rank (contiguous groups): the longest gap and the number of gaps
        heads = np.flatnonzero(first)
        uniq = r[heads]
        gap = np.maximum.reduceat(np.where(ok, ts - prev, NO_TIME), heads)
        self._rk_gap[uniq] = np.maximum(self._rk_gap[uniq], gap)
        self._rk_ngap[uniq] += np.add.reduceat(ok.astype(np.int64), heads)
        last = np.ones(len(r), dtype=bool)
        last[:-1] = r[1:] != r[:-1]
        self._rk_last[r[last]] = np.maximum(self._rk_last[r[last]], ts[last])
        self._rk_new[r[last]] = np.maximum(self._rk_new[r[last]], ts[last])
        t_min = int(ts.min())
        self._first_t = t_min if self._first_t == NO_TIME else min(self._first_t, t_min)

    def _ingest_enters(self, rank: np.ndarray, ci: np.ndarray, crank: np.ndarray,
                       seq: np.ndarray, op: np.ndarray, nbytes: np.ndarray, peer: np.ndarray,
                       t: np.ndarray, idx: np.ndarray, dup: np.ndarray | None = None
                       ) -> dict[str, np.ndarray]:
        """Entered operations (``idx``: their (comm, rank) rows): membership, seq counters,
        point-to-point indices; returns the new in-flight rows (duplicates of operations
        already in flight dropped), which :meth:`_ingest_ends` appends after matching this
        batch's ends with them. ``dup``: which are already in flight (None: computed)."""
        # membership: (comm, comm rank) -> global rank; (comm, rank) state
        self._mcache.clear()
        k = self._crk.ensure(_cr_key(ci, crank))
        self._crk.cols["rank"][k] = rank
        cols = self._cr.cols
        cols["crank"][idx] = crank
        np.maximum.at(cols["last_seq"], idx, seq)
        np.maximum.at(cols["last_t"], idx, t)
        zero = seq == 0
        if zero.any():
            cols["seq0"][idx[zero]] = True
        # point-to-point: index k of the k-th operation per (comm, rank, peer, direction)
        p2p = (op == SEND) | (op == RECV)
        pidx = np.full(len(rank), -1, dtype=np.int64)
        if p2p.any():
            at = np.flatnonzero(p2p)
            ci_p = ci[at]
            flags = np.asarray(self._comm_p2p, dtype=bool)
            if not flags[ci_p].all():
                comms = pd.unique(ci_p)
                for c in comms[~flags[comms]].tolist():
                    self._comm_p2p[c] = True
            pk = _pair_key(ci_p, rank[at], peer[at], op[at] == RECV)
            codes, uniq = pd.factorize(pk)
            # grouped by pair, in seq order within a pair (ties in input order)
            seq_p = seq[at]
            order = stable_argsort(codes)
            g = codes[order]
            x = seq_p[order]
            if np.any((g[1:] == g[:-1]) & (x[1:] < x[:-1])):
                order = np.lexsort((seq_p, codes))
                g = codes[order]
            start = np.ones(len(g), dtype=bool)
            start[1:] = g[1:] != g[:-1]
            head = np.maximum.accumulate(np.where(start, np.arange(len(g)), 0))
            prow = self._pairs.ensure(np.asarray(uniq, dtype=np.int64))
            count = self._pairs.cols["count"]
            sub = np.empty(len(g), dtype=np.int64)
            sub[order] = count[prow][g] + (np.arange(len(g)) - head)
            pidx[at] = sub
            count[prow] += np.bincount(codes, minlength=len(prow))
        new = {"rank": rank, "comm": ci, "seq": seq, "op": op, "bytes": nbytes, "peer": peer,
               "crank": crank, "t": t, "pidx": pidx,
               "steps": np.full(len(rank), -1, np.int64),
               "steps_t": np.full(len(rank), NO_TIME, np.int64),
               "hang": np.full(len(rank), -1, np.int64), "_cr": idx}
        # duplicates of operations already in flight are ignored
        if len(self._fl["t"]):
            if dup is None:
                dup = _match_ops(self._fl["comm"], self._fl["rank"], self._fl["seq"],
                                 ci, rank, seq) >= 0
            if dup.any():
                new = {n: a[~dup] for n, a in new.items()}
        self._fl_version += 1
        self._remember(new)
        return new

    def _remember(self, new: dict[str, np.ndarray]) -> None:
        """Append entered operations to their rank's ring of recent operations (in order of
        time; the last ``recent_ops`` of a rank are kept)."""
        rank = new["rank"]
        width = self.config.recent_ops
        if not len(rank) or width <= 0:
            return
        order = _rank_time_order(rank, new["t"], new["seq"])
        r = rank[order]
        start = np.ones(len(r), dtype=bool)
        start[1:] = r[1:] != r[:-1]
        heads = np.flatnonzero(start)
        counts = np.diff(np.append(heads, len(r)))
        uniq = r[heads]
        pos = np.arange(len(r)) - np.repeat(heads, counts)
        keep = pos >= np.repeat(counts, counts) - width
        if not keep.all():
            order, r, pos = order[keep], r[keep], pos[keep]
        slot = (self._ring_n[r] + pos) % width
        vals = np.empty((len(_RING), len(order)), dtype=np.int64)
        for j, c in enumerate(_RING):
            np.take(new[c], order, out=vals[j])     # contiguous rows, written as columns
        self._ring[r, slot] = vals.T
        self._ring_n[uniq] += counts

    def recent_ops(self, rank: int) -> dict[str, np.ndarray]:
        """The rank's last entered operations (at most ``recent_ops``), in time order:
        communicator index, seq, op code, enter time, point-to-point index, peer, bytes."""
        if rank >= len(self._ring_n):
            return {c: np.zeros(0, np.int64) for c in _RING}
        width = self.config.recent_ops
        n = int(min(self._ring_n[rank], width))
        idx = (int(self._ring_n[rank]) - n + np.arange(n)) % width
        block = self._ring[rank, idx]
        block = block[np.lexsort((block[:, 1], block[:, 3]))]
        return {c: block[:, j] for j, c in enumerate(_RING)}

    def _ingest_ends(self, rank: np.ndarray, ci: np.ndarray, seq: np.ndarray, op: np.ndarray,
                     nbytes: np.ndarray, t: np.ndarray, idx: np.ndarray,
                     new: dict[str, np.ndarray] | None = None,
                     old_hit: np.ndarray | None = None) -> None:
        """Ended operations (``idx``: their (comm, rank) rows) and earlier orphan ends,
        matched with the operations in flight and ``new`` (this batch's entered operations,
        in flight after the earlier ones): completed ones leave, their durations are
        learned; ``new`` operations still open join the in-flight table. ``old_hit``: the
        match of the orphans, then the ends, among the earlier operations (None: computed)."""
        if len(rank):
            cols = self._cr.cols
            # per (comm, rank): the end of the highest seq (the last such row on a tie)
            top = np.full(len(self._cr), NO_TIME, dtype=np.int64)
            np.maximum.at(top, idx, seq)
            cand = np.flatnonzero(seq == top[idx])
            pick = np.full(len(top), -1, dtype=np.int64)
            np.maximum.at(pick, idx[cand], cand)
            sel = pick[pick >= 0]
            newer = seq[sel] > cols["done_seq"][idx[sel]]
            sel = sel[newer]
            cols["done_seq"][idx[sel]] = seq[sel]
            cols["done_op"][idx[sel]] = op[sel]
            cols["done_bytes"][idx[sel]] = nbytes[sel]
            self._count_signatures(ci, op, nbytes)
        # match ends (and earlier orphans) with in-flight operations: those in flight before
        # this batch first, then this batch's entered ones
        o = self._orphans
        e_comm = np.concatenate([o["comm"], ci])
        e_rank = np.concatenate([o["rank"], rank])
        e_seq = np.concatenate([o["seq"], seq])
        e_t = np.concatenate([o["t"], t])
        parts = [self._fl] if new is None else [self._fl, new]
        matched = np.zeros(len(e_t), dtype=bool)
        dones, end_ts = [], []
        for part in parts:
            n = len(part["t"])
            done = np.zeros(n, dtype=bool)
            end_t = np.full(n, NO_TIME, dtype=np.int64)
            if n and len(e_t):
                free = np.flatnonzero(~matched)
                if part is self._fl and old_hit is not None:
                    hit = old_hit
                elif part is new and not len(o["t"]) and len(self._cr) < 1 << _OP_CR_BITS \
                        and int(e_seq.max()) < 1 << _OP_SEQ_BITS \
                        and int(new["seq"].max()) < 1 << _OP_SEQ_BITS:
                    # this batch's ends with its enters: keyed by (comm, rank) row and seq
                    hit = _lookup((new["_cr"] << _OP_SEQ_BITS) | new["seq"],
                                  (idx[free] << _OP_SEQ_BITS) | seq[free])
                else:
                    hit = _match_ops(part["comm"], part["rank"], part["seq"], e_comm[free],
                                     e_rank[free], e_seq[free])
                ok = hit >= 0
                matched[free[ok]] = True
                done[hit[ok]] = True
                np.maximum.at(end_t, hit[ok], e_t[free[ok]])
            dones.append(done)
            end_ts.append(end_t)
        # an operation on a communicator whose later collective completed has completed
        # too (one stream per communicator runs in call order): its end row was lost
        losts = []
        for part, done, end_t in zip(parts, dones, end_ts, strict=True):
            lost = np.zeros(len(done), dtype=bool)
            open_ = np.flatnonzero((part["op"] != SEND) & (part["op"] != RECV) & ~done)
            if len(open_):
                crow = self._cr.find(_cr_key(part["comm"][open_], part["rank"][open_]))
                done_seq = np.where(crow >= 0, self._cr.cols["done_seq"][np.maximum(crow, 0)],
                                    -1)
                lost[open_[part["seq"][open_] < done_seq]] = True
                done |= lost
                end_t[lost] = self._latest
            losts.append(lost)
        if any(d.any() for d in dones):
            oks = [d & ~lost for d, lost in zip(dones, losts, strict=True)]

            def cat(name: str) -> np.ndarray:
                return np.concatenate([p[name][ok] for p, ok in zip(parts, oks, strict=True)])

            dur = np.concatenate([(e - p["t"])[ok] for p, e, ok in
                                  zip(parts, end_ts, oks, strict=True)])
            self._learn(cat("comm"), cat("op"), cat("bytes"), dur, cat("hang"))
            fl, done, end_t = self._fl, dones[0], end_ts[0]
            in_hang = done & (fl["hang"] >= 0)
            if in_hang.any():
                for h in np.unique(fl["hang"][in_hang]).tolist():
                    sel_h = done & (fl["hang"] == h)
                    self._hangs[h].last_end = max(self._hangs[h].last_end,
                                                  int(end_t[sel_h].max()))
            self._fl_version += 1
        if new is not None:
            self._fl = {n: np.concatenate([p[n][~d] for p, d in zip(parts, dones, strict=True)])
                        for n in _INFLIGHT}
        elif dones[0].any():
            self._fl = {n: a[~dones[0]] for n, a in self._fl.items()}
        # unmatched ends wait for their enter (records of a kind may come in any order)
        keep = ~matched & (e_t >= self._latest - self.config.ceiling_ns)
        keep_idx = np.flatnonzero(keep)[-self.config.max_orphans:]
        self._orphans = {"comm": e_comm[keep_idx], "rank": e_rank[keep_idx],
                         "seq": e_seq[keep_idx], "t": e_t[keep_idx]}

    @property
    def _signatures(self) -> dict[tuple[int, int, int], int]:
        """How often each (comm, op, bytes) completed (pending batches merged first)."""
        self._merge_signatures()
        return self._sig_book

    @_signatures.setter
    def _signatures(self, book: dict[tuple[int, int, int], int]) -> None:
        self._sig_book = book
        self._sig_pending = []

    def _count_signatures(self, ci: np.ndarray, op: np.ndarray, nbytes: np.ndarray) -> None:
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
            self._sig_pending.append((np.asarray(uniq, dtype=np.int64),
                                      np.bincount(codes, minlength=len(uniq))))
            if len(self._sig_pending) >= _SIG_PENDING:
                self._merge_signatures()
            return
        self._merge_signatures()
        self._count_now(ci, op, nbytes)

    def _merge_signatures(self) -> None:
        """Merge the pending per-batch counts into the book. Without an eviction on the way
        (the book stays within ``4 x max_signatures``) all at once: new signatures enter in
        order of their first batch, then of (comm, op, bytes), as batch by batch; else batch
        by batch."""
        pending = self._sig_pending
        if not pending:
            return
        self._sig_pending = []
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
        book = self._sig_book
        fresh = sum(1 for k in sigs if k not in book)
        if len(book) + fresh <= 4 * self.config.max_signatures:
            for k, n in zip(sigs, total[order].tolist(), strict=True):
                book[k] = book.get(k, 0) + n
            return
        for k_b, c_b in pending:
            by_key = np.argsort(k_b, kind="stable")
            self._add_signatures(_sig_tuples(k_b[by_key]), c_b[by_key].tolist())

    def _count_now(self, ci: np.ndarray, op: np.ndarray, nbytes: np.ndarray) -> None:
        """:meth:`_count_signatures` of one batch straight into the book."""
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
        self._add_signatures(sigs, counts.tolist())

    def _add_signatures(self, sigs: list[tuple[int, int, int]], counts: list[int]) -> None:
        """Add one batch's counts (signatures in key order); keep the ``max_signatures``
        most frequent when the book grows beyond four times that."""
        book = self._sig_book
        for k, n in zip(sigs, counts, strict=True):
            book[k] = book.get(k, 0) + n
        if len(book) > 4 * self.config.max_signatures:
            keep = sorted(book.items(), key=lambda kv: -kv[1])[: self.config.max_signatures]
            self._sig_book = dict(keep)

    def _learn(self, ci: np.ndarray, op: np.ndarray, nbytes: np.ndarray, dur: np.ndarray,
               hang: np.ndarray) -> None:
        """Append completed durations to the ring buffer of their (comm, op, size class) and
        raise its longest duration; operations that were part of a reported hang are not
        history, except the waits of a not-entered (H1) hang that completed after all: its
        root was busy on the host (a checkpoint written by one rank), which recurs and is
        then normal (CCL-D §4.2.1's long operations), so it is reported once only."""
        ok = (hang < 0) & (dur >= 0)
        in_hang = np.flatnonzero(hang >= 0)
        if len(in_hang):
            pause = {h: self._hangs[h].anomaly.cause == "not_entered"
                     for h in np.unique(hang[in_hang]).tolist()}
            ok[in_hang] = [pause[h] for h in hang[in_hang].tolist()]
            ok &= dur >= 0
        ci, dur = ci[ok], dur[ok]
        if not len(ci):
            return
        key = _stat_key(op[ok], nbytes[ok], self.config.small_bytes)
        rows = self._stat_row[ci, key]
        missing = rows < 0
        if missing.any():
            pairs = np.unique(ci[missing] * N_KEYS + key[missing])
            start = len(self._dur_n)
            self._stat_row[pairs // N_KEYS, pairs % N_KEYS] = np.arange(start,
                                                                         start + len(pairs))
            width = self.config.history
            self._dur = np.concatenate([self._dur, np.full((len(pairs), width), -1, np.int64)])
            self._dur_pos = np.concatenate([self._dur_pos, np.zeros(len(pairs), np.int64)])
            self._dur_n = np.concatenate([self._dur_n, np.zeros(len(pairs), np.int64)])
            self._exp = np.concatenate([self._exp, np.full(len(pairs), -1, np.int64)])
            self._tail = np.concatenate([self._tail, np.full(len(pairs), -1, np.int64)])
            rows = self._stat_row[ci, key]
        np.maximum.at(self._tail, rows, dur)
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
        slot = (self._dur_pos[g] + pos) % k
        rows_w, slots_w, vals = g[keep], slot[keep], dur[order][keep]
        evicted = self._dur[rows_w, slots_w]
        self._dur[rows_w, slots_w] = vals
        self._dur_pos[uniq] = (self._dur_pos[uniq] + counts) % k
        self._dur_n[uniq] += counts
        if self.config.quantile >= 1.0:
            # the largest filled slot (empty slots hold -1, durations are >= 0): the old
            # largest or a new value, unless a value as large as the old largest left
            at = np.searchsorted(rows_w, uniq)
            old = self._exp[uniq]
            top = np.maximum(old, np.maximum.reduceat(vals, at))
            gone = np.maximum.reduceat(evicted, at)
            again = (gone >= 0) & (gone >= old)
            if again.any():
                top[again] = self._dur[uniq[again]].max(axis=1)
            self._exp[uniq] = top
            return
        # quantile ("higher" method) of the filled slots, vectorised over the touched rows
        block = self._dur[uniq]
        filled = np.minimum(self._dur_n[uniq], k)
        block = np.sort(np.where(block < 0, np.iinfo(np.int64).max, block), axis=1)
        at = np.ceil(self.config.quantile * (filled - 1)).astype(np.int64)
        self._exp[uniq] = np.take_along_axis(block, at[:, None], axis=1)[:, 0]

    def _ingest_progress(self, table: pa.Table) -> None:
        rank_all = table.column("rank").to_numpy().astype(np.int64)
        t_all = table.column("t").to_numpy().astype(np.int64)
        self._grow_ranks(int(rank_all.max()))
        np.maximum.at(self._rk_new, rank_all, t_all)     # delivery evidence (lag)
        ci = self._comm_index(table.column("comm").to_numpy())
        known = ci >= 0
        if not known.any() or not len(self._fl["t"]):
            self._latest = max(self._latest, int(t_all.max()))
            return
        rank = rank_all[known]
        seq = _u64_to_i64(table.column("seq").to_numpy())[known]
        t = t_all[known]
        steps = (_u64_to_i64(table.column("send_count").to_numpy())
                 + _u64_to_i64(table.column("recv_count").to_numpy()))[known]
        self._latest = max(self._latest, int(t.max()))
        fl = self._fl
        hit = _match_ops(fl["comm"], fl["rank"], fl["seq"], ci[known], rank, seq)
        ok = hit >= 0
        hit, t, steps = hit[ok], t[ok], steps[ok]
        if not len(hit):
            return
        order = np.lexsort((t, hit))
        last = np.ones(len(order), dtype=bool)
        last[:-1] = hit[order][1:] != hit[order][:-1]
        sel = order[last]
        changed = steps[sel] != fl["steps"][hit[sel]]
        fl["steps_t"][hit[sel][changed]] = t[sel][changed]
        fl["steps"][hit[sel]] = steps[sel]

    def _ingest_link(self, table: pa.Table) -> None:
        """Queue-pair counters (MEGATRACE §III-B2): when did completions last advance."""
        sep = "\x1f"
        rank_s = pc.cast(table.column("rank"), pa.string())
        key = pc.binary_join_element_wise(
            table.column("node"), table.column("device"), table.column("peer_node"), rank_s,
            sep, null_handling="replace", null_replacement="")
        enc = pc.dictionary_encode(key).combine_chunks()
        codes = enc.indices.to_numpy().astype(np.int64)
        ids = np.empty(len(enc.dictionary), dtype=np.int64)
        before = len(self._qp_info)
        for j, k in enumerate(enc.dictionary.to_pylist()):
            qid = self._qp_ids.get(k)
            if qid is None:
                node, dev, peer, r = k.split(sep)
                qid = len(self._qp_info)
                self._qp_ids[k] = qid
                self._qp_info.append((node, dev, peer or None, int(r) if r else -1))
            ids[j] = qid
        added = len(self._qp_info) - before
        if added:
            for name, arr in self._qp.items():
                fill = NO_TIME if name in ("last_t", "t_change") else -1
                self._qp[name] = np.concatenate([arr, np.full(added, fill, np.int64)])
        q = ids[codes]
        t = table.column("t").to_numpy().astype(np.int64)
        posted = _u64_to_i64(table.column("posted").to_numpy())
        completed = _u64_to_i64(table.column("completed").to_numpy())
        self._latest = max(self._latest, int(t.max()))
        order = np.lexsort((t, q))
        q, t, posted, completed = q[order], t[order], posted[order], completed[order]
        first = np.ones(len(q), dtype=bool)
        first[1:] = q[1:] != q[:-1]
        prev = np.empty_like(completed)
        prev[1:] = completed[:-1]
        prev[first] = self._qp["completed"][q[first]]
        changed = completed != prev
        prev_t = np.empty_like(t)
        prev_t[1:] = t[:-1]
        prev_t[first] = self._qp["last_t"][q[first]]
        gaps = (t - prev_t)[(prev_t != NO_TIME) & (t > prev_t)]
        if len(gaps):
            self._link_period = int(np.median(gaps))
        st = self._qp
        ch = np.flatnonzero(changed)
        if len(ch):
            # the last change per queue pair (rows are sorted by queue pair, then time)
            last_ch = np.ones(len(ch), dtype=bool)
            last_ch[:-1] = q[ch][1:] != q[ch][:-1]
            sel = ch[last_ch]
            st["t_change"][q[sel]] = t[sel]
            st["posted_change"][q[sel]] = posted[sel]
        last = np.ones(len(q), dtype=bool)
        last[:-1] = q[1:] != q[:-1]
        st["last_t"][q[last]] = t[last]
        st["posted"][q[last]] = posted[last]
        st["completed"][q[last]] = completed[last]

    # -----------------------------------------------------------------------------------------
    # thresholds

    def _expectations(self, ci: np.ndarray, op: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        """``T_expected`` per operation (float ns, ``inf`` when unknown): the quantile of the
        recent durations of its (communicator, operation, size class), at least the longest
        it ever took (``long_tail``), once ``min_history`` were seen. With fewer, the
        communicators of the same size (the same parallel dimension) pool their history for
        that operation and size class; with no such history it is unknown (first calls
        include connection set-up: the ceiling applies)."""
        cfg = self.config
        key = _stat_key(op, nbytes, cfg.small_bytes)
        exp = np.full(len(ci), np.inf)
        if not len(self._dur_n) or not len(ci):
            return exp
        eff = self._exp.astype(np.float64)
        if cfg.long_tail:
            eff = np.maximum(eff, self._tail.astype(np.float64))
        rows = self._stat_row[ci, key]
        safe = np.maximum(rows, 0)
        ok = (rows >= 0) & (self._dur_n[safe] >= cfg.min_history)
        exp[ok] = eff[safe[ok]]
        if ok.all():
            return self._host_sync(exp, key)
        # pooled over communicators of the same size
        sizes = np.asarray(self._comm_size, dtype=np.int64)
        ci_r, key_r = np.nonzero(self._stat_row >= 0)
        row_r = self._stat_row[ci_r, key_r]
        pool = sizes[ci_r] * N_KEYS + key_r
        order = np.argsort(pool, kind="stable")
        pool, row_r = pool[order], row_r[order]
        uniq, first = np.unique(pool, return_index=True)
        count = np.add.reduceat(self._dur_n[row_r], first)
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

    def _thresholds(self) -> tuple[np.ndarray, np.ndarray]:
        """Per in-flight operation: ``clamp(n x T_expected, floor, ceiling)``, and whether
        ``T_expected`` is known (else the threshold is the ceiling)."""
        cfg = self.config
        fl = self._fl
        exp = self._expectations(fl["comm"], fl["op"], fl["bytes"])
        known = np.isfinite(exp)
        thr = np.clip(cfg.n_expected * np.where(known, exp, 0.0), cfg.floor_ns, cfg.ceiling_ns)
        thr = np.where(known, thr, cfg.ceiling_ns)
        return thr.astype(np.int64), known

    def _silence_thresholds(self) -> np.ndarray:
        cfg = self.config
        floor = max(cfg.silence_floor_ns, cfg.idle_floor_ns)
        thr = np.clip(cfg.silence_n * self._rk_gap.astype(np.float64), floor,
                      cfg.ceiling_ns).astype(np.int64)
        return np.where(self._rk_ngap >= cfg.silence_min_gaps, thr, cfg.ceiling_ns)

    # -----------------------------------------------------------------------------------------
    # membership and rounds

    def _members(self, ci: int) -> np.ndarray:
        """Global ranks of the communicator in comm-rank order (-1 where unknown)."""
        if ci in self._meta_members:
            return self._meta_members[ci]
        cached = self._mcache.get(ci)
        if cached is not None:
            return cached
        sl = self._crk.range(ci << _RANK_BITS, (ci + 1) << _RANK_BITS)
        cranks = self._crk.keys[sl] & ((1 << _RANK_BITS) - 1)
        out = np.full(max(self._comm_size[ci], int(cranks.max()) + 1 if len(cranks) else 0), -1,
                      dtype=np.int64)
        out[cranks] = self._crk.cols["rank"][sl]
        self._mcache[ci] = out
        return out

    def _comms_of(self, rank: int) -> set[int]:
        """Communicators the rank belongs to (seen entering, or listed in meta)."""
        keys = self._cr.keys
        mine = (keys & ((1 << _RANK_BITS) - 1)) == rank
        out = set((keys[mine] >> _RANK_BITS).tolist())
        out |= {ci for ci, m in self._meta_members.items() if rank in m}
        return out

    def _last_seq(self, ci: int, ranks: np.ndarray) -> np.ndarray:
        row = self._cr.find(_cr_key(ci, ranks))
        return np.where(row >= 0, self._cr.cols["last_seq"][np.maximum(row, 0)], -1)

    def _pair_count(self, ci: int, rank: int, peer_crank: int, recv: bool) -> int:
        key = _pair_key(np.array([ci]), np.array([rank]), np.array([peer_crank]),
                        np.array([recv]))
        row = self._pairs.find(key)
        return int(self._pairs.cols["count"][row[0]]) if row[0] >= 0 else 0

    def _round_keys(self) -> list[tuple[Any, ...]]:
        """Trace ID of every in-flight operation: ("c", comm, seq) for a collective round,
        ("p", comm, sender, receiver, k) for the k-th send/recv of a pair (events.md)."""
        fl = self._fl
        ci, op, rank = fl["comm"], fl["op"], fl["rank"]
        p2p = (op == SEND) | (op == RECV)
        keys: list[tuple[Any, ...]] = list(zip(["c"] * len(ci), ci.tolist(), fl["seq"].tolist(),
                                              strict=True))
        if p2p.any():
            idx = np.flatnonzero(p2p)
            row = self._crk.find(_cr_key(ci[idx], fl["peer"][idx]))
            other = np.where(row >= 0, self._crk.cols["rank"][np.maximum(row, 0)], -1)
            send = op[idx] == SEND
            sender = np.where(send, rank[idx], other)
            receiver = np.where(send, other, rank[idx])
            for j, c, a, b, k in zip(idx.tolist(), ci[idx].tolist(), sender.tolist(),
                                     receiver.tolist(), fl["pidx"][idx].tolist(), strict=True):
                keys[j] = ("p", c, a, b, k)
        return keys

    def _missing(self, rnd: tuple[Any, ...], ops: list[int]) -> list[int]:
        """Members that have not entered the round (CCL-D: seq counter behind)."""
        if rnd[0] == "c":
            ci, seq = rnd[1], rnd[2]
            members = self._members(ci)
            members = members[members >= 0]
            return members[self._last_seq(ci, members) < seq].tolist()
        _, ci, sender, receiver, k = rnd
        fl = self._fl
        present = {int(fl["rank"][i]) for i in ops}
        members = self._members(ci).tolist()
        out = []
        for r, other, recv in ((sender, receiver, False), (receiver, sender, True)):
            if r in present or r < 0 or other not in members:
                continue
            if self._pair_count(ci, r, members.index(other), recv) <= k:
                out.append(r)
        return out

    # -----------------------------------------------------------------------------------------
    # detection

    def _check(self, now: int) -> list[Anomaly]:
        fl = self._fl
        n = len(fl["t"])
        if n == 0:
            return []
        cfg = self.config
        thr, known = self._thresholds()
        horizon = self.horizon(now)
        # an operation's age counts up to its rank's horizon (its records may be late)
        age = horizon[fl["rank"]] - fl["t"]
        barrier = (fl["op"] == ALLREDUCE) & (fl["bytes"] <= cfg.barrier_bytes)
        stuck = (age > thr) & ~barrier & (fl["hang"] < 0)
        silent = self._silent_ranks(horizon) if cfg.silence else np.zeros(0, np.int64)
        if self._quiet_cache[0] == self._fl_version:
            silent = silent[~np.isin(silent, list(self._quiet_cache[1]))]
        if not stuck.any() and not len(silent):
            return []
        ctx = _Context(self, now, thr, horizon)
        triggers = [ctx.round_key[i] for i in np.flatnonzero(stuck).tolist()]
        if len(silent):
            sthr = self._silence_thresholds()
            if self._quiet_cache[0] != self._fl_version:
                self._quiet_cache = (self._fl_version, set())
            for r in silent.tolist():
                if r in self._quiet_cache[1]:
                    continue
                # waits in operations with a learned expectation only: how long an
                # operation never seen before may take is unknown (its own threshold rules)
                waiting = [w for w in ctx.waiting_on(r) if known[ctx.round_ops[w]].any()]
                if not waiting:     # nobody waits on it: not worth asking again until the
                    self._quiet_cache[1].add(r)   # operations in flight change
                if waiting:
                    # the silence that counts starts when a peer began waiting (a rank that
                    # resumes after a pause where nobody waited is not silent)
                    ref = max(int(self._rk_last[r]), min(ctx.round_t(w) for w in waiting))
                    if int(horizon[r]) - ref > int(sthr[r]):
                        ctx.silent_roots[r] = waiting
        return ctx.resolve(dict.fromkeys(triggers))

    def _silent_ranks(self, horizon: np.ndarray) -> np.ndarray:
        """Ranks with no operation in flight and no record up to their horizon for longer
        than their silence threshold (only worth following if someone waits on them)."""
        if not len(self._rk_last):
            return np.zeros(0, np.int64)
        busy = np.zeros(len(self._rk_last), dtype=bool)
        busy[self._fl["rank"]] = True
        roots = {r for h in self._hangs if not h.ended for r in h.roots}
        seen = self._rk_last != NO_TIME
        quiet = seen & ~busy & (horizon - self._rk_last > self._silence_thresholds())
        cand = np.flatnonzero(quiet)
        return np.array([r for r in cand.tolist() if r not in roots], dtype=np.int64)

    def _finished(self) -> list[Anomaly]:
        """Open hangs whose stuck operations all completed: report once more with end_ns."""
        out = []
        active = set(np.unique(self._fl["hang"]).tolist())
        for h in self._hangs:
            if not h.ended and h.index not in active and h.last_end != NO_TIME:
                h.ended = True
                h.anomaly.end_ns = h.last_end
                out.append(Anomaly.from_dict(h.anomaly.to_dict()))
        return out

    # -----------------------------------------------------------------------------------------
    # reporting helpers used by _Context

    def comm_kind(self, ci: int) -> str:
        """meta.comms kind, else inferred from size, stride and use (events.md, meta)."""
        kind = self._comm_kind[ci]
        if kind is not None:
            return kind
        m = self.meta
        size = self._comm_size[ci]
        members = self._members(ci)
        members = np.sort(members[members >= 0])
        stride = np.unique(np.diff(members)) if len(members) > 1 else np.zeros(0, np.int64)
        if size == m.world_size and size > 1:
            return "world"
        if self._comm_p2p[ci] and (size == m.pp or (size == 2 and m.pp > 1)):
            return "pp"
        if size == m.tp and m.tp > 1 and (len(stride) == 0 or stride.tolist() == [1]):
            return "tp"
        for name, degree in (("dp", m.dp), ("cp", m.cp), ("pp", m.pp), ("tp", m.tp)):
            if size == degree and degree > 1:
                return name
        return "other"

    def stage(self, ci: int, op: int) -> str:
        """MEGATRACE's "which stage" from the communicator kind and the operation."""
        kind = self.comm_kind(ci)
        if op in (SEND, RECV) or kind == "pp":
            return "pp_p2p"
        if kind == "dp":
            return "dp_sync"
        if kind in ("tp", "cp"):    # collectives inside forward/backward compute
            return "tp_collective"
        return "other"

    def new_hang(self, anomaly: Anomaly, roots: list[int], rnd: list[Any] | None) -> int:
        index = len(self._hangs)
        anomaly.id = f"hang-{index}-{anomaly.start_ns}"
        self._hangs.append(_Hang(anomaly, index, roots, rnd))
        return index


class _Context:
    """One detection pass: the wait graph over in-flight operations (CCL-D §4.2.2 decision
    tree, MEGATRACE §III-C partial graph), built lazily from the triggers."""

    def __init__(self, det: HangDetector, now: int, thr: np.ndarray, horizon: np.ndarray
                 ) -> None:
        self.det, self.now, self.thr, self.horizon = det, now, thr, horizon
        fl = det._fl
        self.barrier = (fl["op"] == ALLREDUCE) & (fl["bytes"] <= det.config.barrier_bytes)
        self.round_key = det._round_keys()
        # A rank runs its operations in call order: those it issued after its earliest
        # in-flight operation (beyond one batch_isend_irecv) are queued behind it, and the
        # rank is blocked on its head batch (MEGATRACE §III-C: the first operation missing
        # its completion).
        ranks = fl["rank"]
        first_t = np.full(int(ranks.max()) + 1, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(first_t, ranks, fl["t"])
        self.head = fl["t"] <= first_t[ranks] + det.config.p2p_batch_ns
        # a collective behind an earlier in-flight operation on its own communicator is
        # queued on that communicator's stream, batch or not
        key = _cr_key(fl["comm"], ranks)
        order = np.lexsort((fl["seq"], key))
        first_of = np.ones(len(order), dtype=bool)
        first_of[1:] = key[order][1:] != key[order][:-1]
        lowest = np.zeros(len(order), dtype=bool)
        lowest[order[first_of]] = True
        p2p = (fl["op"] == SEND) | (fl["op"] == RECV)
        self.head &= lowest | p2p
        self.round_ops: dict[tuple[Any, ...], list[int]] = {}
        self.rank_ops: dict[int, list[int]] = {}
        for i, rnd in enumerate(self.round_key):
            self.round_ops.setdefault(rnd, []).append(i)
            if self.head[i]:
                self.rank_ops.setdefault(int(ranks[i]), []).append(i)
        self.missing_cache: dict[tuple[Any, ...], list[int]] = {}
        self.memo: dict[tuple[Any, ...], set[tuple[Any, ...]]] = {}
        self.direct: dict[int, set[tuple[Any, ...]]] = {}   # idle rank -> rounds missing it
        self.silent_roots: dict[int, list[tuple[Any, ...]]] = {}
        self.open_roots = {r: h.index for h in det._hangs if not h.ended for r in h.roots}

    # graph --------------------------------------------------------------------------------

    def missing(self, rnd: tuple[Any, ...]) -> list[int]:
        if rnd not in self.missing_cache:
            self.missing_cache[rnd] = self.det._missing(rnd, self.round_ops.get(rnd, []))
        return self.missing_cache[rnd]

    def round_t(self, rnd: tuple[Any, ...]) -> int:
        return int(self.det._fl["t"][self.round_ops[rnd]].min())

    def complete_t(self, rnd: tuple[Any, ...]) -> tuple[int, int]:
        """When the last in-flight member entered the round (its transfer could start then:
        a member that entered waits with no progress until all have, CCL-D §4.1), and that
        member's operation."""
        ops = self.round_ops[rnd]
        i = ops[int(np.argmax(self.det._fl["t"][ops]))]
        return int(self.det._fl["t"][i]), i

    def waiting_on(self, rank: int) -> list[tuple[Any, ...]]:
        """Rounds in flight, not barriers and not yet part of a hang, whose missing members
        include ``rank``."""
        fl = self.det._fl
        comms = self.det._comms_of(rank)
        out = []
        for rnd, ops in self.round_ops.items():
            if rnd[1] not in comms or (rnd[0] == "p" and rank not in (rnd[2], rnd[3])):
                continue
            if self.barrier[ops].all() or (fl["hang"][ops] >= 0).any():
                continue
            if rank in self.missing(rnd):
                out.append(rnd)
        return out

    def terminals(self, start: tuple[Any, ...]) -> set[tuple[Any, ...]]:
        """Roots reachable from a round: ("idle", rank), ("group", round), ("hang", index)."""
        if start in self.memo:
            return self.memo[start]
        fl = self.det._fl
        found: set[tuple[Any, ...]] = set()
        seen_rounds = {start}
        seen_ranks: set[int] = set()
        stack = [start]
        while stack:
            rnd = stack.pop()
            if rnd in self.memo and rnd != start:
                found |= self.memo[rnd]
                continue
            ops = self.round_ops.get(rnd, [])
            hangs = {int(fl["hang"][i]) for i in ops if fl["hang"][i] >= 0}
            if hangs:
                found |= {("hang", h) for h in hangs}
                continue
            missing = self.missing(rnd)
            queued = [int(fl["rank"][i]) for i in ops if not self.head[i]]
            if not missing and not queued:
                found.add(("group", rnd))
                continue
            for m in missing + queued:
                if m in self.open_roots:
                    found.add(("hang", self.open_roots[m]))
                    continue
                mine = self.rank_ops.get(m, [])
                if not mine:
                    found.add(("idle", m))
                    self.direct.setdefault(m, set()).add(rnd)
                    continue
                if m in seen_ranks:
                    continue
                seen_ranks.add(m)
                for i in mine:
                    if fl["hang"][i] >= 0:
                        found.add(("hang", int(fl["hang"][i])))
                        continue
                    nxt = self.round_key[i]
                    if nxt not in seen_rounds:
                        seen_rounds.add(nxt)
                        stack.append(nxt)
        if not found:   # a wait cycle with no way out: ranks block each other (H2)
            found.add(("cycle", tuple(sorted(seen_ranks))))
        self.memo[start] = found
        return found

    def valid(self, term: tuple[Any, ...]) -> bool:
        """Enough evidence for a root: an idle rank silent, up to its horizon (its records
        may arrive late), for at least ``idle_floor_ns`` (a rank never seen: the job ran that
        long); an all-entered round stuck by its own threshold."""
        det, fl = self.det, self.det._fl
        floor = det.config.idle_floor_ns
        if term[0] == "idle":
            r = term[1]
            last = int(det._rk_last[r]) if r < len(det._rk_last) else NO_TIME
            if last == NO_TIME:
                return det._first_t != NO_TIME and self.now - det._first_t >= floor
            return int(self.horizon[r]) - last >= floor
        if term[0] == "group":
            # stuck since every member entered (before, a late member was the holdup), for
            # longer than the round's usual members take (a deviant's operation may be one
            # never seen, with the ceiling as its threshold)
            ops = self.round_ops[term[1]]
            t, _ = self.complete_t(term[1])
            seen_up_to = int(self.horizon[fl["rank"][ops]].min())
            return seen_up_to - t > int(self.thr[ops].min())
        return True

    # reports ------------------------------------------------------------------------------

    def resolve(self, triggers: dict[tuple[Any, ...], None]) -> list[Anomaly]:
        fl = self.det._fl
        out: list[Anomaly] = []
        idle_groups: list[tuple[set[int], set[tuple[Any, ...]]]] = []
        groups: dict[tuple[Any, ...], set[tuple[Any, ...]]] = {}
        to_hang: dict[int, set[tuple[Any, ...]]] = {}
        cycles: dict[tuple[Any, ...], set[tuple[Any, ...]]] = {}
        for rnd in triggers:
            terms = {t for t in self.terminals(rnd) if self.valid(t)}
            idle = {t[1] for t in terms if t[0] == "idle"}
            if idle:
                idle_groups.append((idle, {rnd}))
            for t in terms:
                if t[0] == "group":
                    groups.setdefault(t[1], set()).add(rnd)
                elif t[0] == "hang":
                    to_hang.setdefault(t[1], set()).add(rnd)
                elif t[0] == "cycle":
                    cycles.setdefault(t[1], set()).add(rnd)
        for r, waits in self.silent_roots.items():
            for rnd in waits:
                self.direct.setdefault(r, set()).add(rnd)
            idle_groups.append(({r}, set(waits)))
        # victims of open hangs: adopt their rounds, no new report
        for h, adopted in to_hang.items():
            self._mark(adopted, h)
        for roots, rounds in _merge(idle_groups):
            out.append(self._report_not_entered(sorted(roots), rounds))
        for grnd, via in groups.items():
            if any(fl["hang"][i] >= 0 for i in self.round_ops[grnd]):
                continue
            report = self._report_group(grnd, via)
            if report is not None:
                out.append(report)
        for ranks, via in cycles.items():
            out.append(self._report_cycle(list(ranks), via))
        return [Anomaly.from_dict(a.to_dict()) for a in out]

    def _mark(self, rounds: set[tuple[Any, ...]], h: int) -> None:
        fl = self.det._fl
        for rnd in rounds:
            for i in self.round_ops.get(rnd, []):
                if fl["hang"][i] < 0:
                    fl["hang"][i] = h

    def _victims(self, rounds: set[tuple[Any, ...]], roots: list[int]) -> dict[str, Any]:
        fl = self.det._fl
        ranks = sorted({int(fl["rank"][i]) for rnd in rounds for i in self.round_ops.get(rnd, [])}
                       - set(roots))
        cap = self.det.config.max_listed_victims
        return {"victims": ranks[:cap], "victims_count": len(ranks)}

    def _halt_point(self, rnd: tuple[Any, ...]) -> dict[str, Any]:
        """MEGATRACE §III-C step 3: the first operation missing its completion."""
        det, fl = self.det, self.det._fl
        ops = self.round_ops[rnd]
        first = min(ops, key=lambda i: int(fl["t"][i]))
        ci, op = rnd[1], int(fl["op"][first])
        hp: dict[str, Any] = {
            "comm": det._comm_u64[ci], "op": events.COLL_OPS[op],
            "bytes": int(fl["bytes"][first]), "t_enter": int(fl["t"][first]),
            "entered": sorted(int(fl["rank"][i]) for i in ops),
            "missing": self.missing(rnd),
        }
        if rnd[0] == "c":
            hp["seq"] = rnd[2]
        else:
            hp.update({"sender": rnd[2], "receiver": rnd[3], "pair_index": rnd[4]})
        return hp

    def _pass(self, rnd: tuple[Any, ...], roots: list[int]) -> dict[str, Any]:
        """1F1B position of a pipeline send/recv: activations flow to higher pipeline ranks
        in the forward pass, gradients to lower ones in the backward pass (MEGATRACE
        §III-B1); the k-th such transfer of a pair is micro-batch k mod microbatches; the
        1F1B phase is that of the compute step next to the transfer on the root's stage."""
        det = self.det
        if rnd[0] != "p" or det.comm_kind(rnd[1]) != "pp":
            return {}
        ci, sender, receiver, k = rnd[1], rnd[2], rnd[3], rnd[4]
        members = det._members(ci).tolist()
        if sender not in members or receiver not in members:
            return {}
        forward = members.index(sender) < members.index(receiver)
        pas = "forward" if forward else "backward"
        extra: dict[str, Any] = {"pass": pas}
        m = det.meta
        row = det._cr.find(_cr_key(ci, np.array([sender])))[0]
        from_start = row >= 0 and bool(det._cr.cols["seq0"][row])
        if m.microbatches > 0 and m.schedule in ("1f1b", "gpipe") and from_start:
            mb = k % m.microbatches
            extra["microbatch"] = mb
            extra["iteration_index"] = k // m.microbatches
            who = next((r for r in roots if r in (sender, receiver)), sender)
            phase = schedule_phase(m.schedule, members.index(who), len(members),
                                   m.microbatches, pas, mb)
            if phase is not None:
                extra["schedule_phase"] = phase
        return extra

    def _anomaly(self, cause: str, ranks: list[int], rnd: tuple[Any, ...], start: int,
                 link: list[int] | None, extra: dict[str, Any]) -> Anomaly:
        det = self.det
        ci = rnd[1]
        op = int(det._fl["op"][self.round_ops[rnd][0]])
        where = self._pass(rnd, ranks) if rnd[0] == "p" else self._position(rnd)
        return Anomaly(id="", kind="hang", cause=cause, ranks=ranks, link=link,
                       comm=det._comm_u64[ci], comm_kind=det.comm_kind(ci),
                       stage=det.stage(ci, op), start_ns=start, detected_ns=self.now,
                       extra={"halt_point": self._halt_point(rnd), **where, **extra})

    # placing a halt point in the pipeline schedule (MEGATRACE §III-C step 3) ----------------

    def _pipeline(self, rank: int) -> tuple[int, int, int | None] | None:
        """``(stage, stages, pipeline communicator)`` of a rank: its index in its pipeline
        communicator (members in stage order); stage 0 of 1 without pipeline parallelism."""
        det = self.det
        for c in sorted(det._comms_of(rank)):
            if det.comm_kind(c) == "pp":
                members = det._members(c).tolist()
                if rank in members:
                    return members.index(rank), len(members), c
        return (0, 1, None) if det.meta.pp <= 1 else None

    def _locate(self, rank: int, rec: dict[str, np.ndarray], j: int, prog: list[Any],
                stage: int, pp_ci: int | None) -> tuple[bool, int | None]:
        """Is the rank's recent operation ``j`` a schedule boundary (a pipeline send/recv or a
        data-parallel sync), and at which step of the stage program (None: unknown)?"""
        det = self.det
        ci, op = int(rec["comm"][j]), int(rec["op"][j])
        m = det.meta
        if pp_ci is not None and ci == pp_ci and op in (SEND, RECV):
            row = det._cr.find(_cr_key(ci, np.array([rank])))[0]
            if row < 0 or not det._cr.cols["seq0"][row]:
                return True, None
            send = op == SEND
            peer = int(rec["peer"][j])
            grad = peer < stage if send else peer > stage
            want = (send, grad, int(rec["pidx"][j]) % m.microbatches)
            for i, (kind, what) in enumerate(prog):
                if kind == "P" and want in what:
                    return True, i
            return True, None
        if op not in (SEND, RECV) and det.comm_kind(ci) == "dp":
            name = events.COLL_OPS[op]
            for i, (kind, what) in enumerate(prog):
                if kind == "D" and what == name:
                    return True, i
            return True, None
        return False, None

    def _position(self, rnd: tuple[Any, ...]) -> dict[str, Any]:
        """Pass, micro-batch and 1F1B phase of a collective inside forward or backward compute
        (tensor or context parallel): an entered member's last operations, back from the
        halt round to the last pipeline send/recv or data-parallel sync before it, place it
        in the stage program (Megatron's schedule, rebuilt from ``meta``); when that gap holds
        two compute steps (1F1B's forward and backward of the last stage, for instance), the
        communicator's operations per compute step, counted between earlier boundaries,
        tell which one."""
        det = self.det
        m = det.meta
        if (rnd[0] != "c" or m.microbatches <= 0 or m.schedule not in ("1f1b", "gpipe")
                or det.comm_kind(rnd[1]) in ("dp", "pp")):
            return {}
        for i in self.round_ops[rnd]:
            q = int(det._fl["rank"][i])
            found = self._place(q, rnd[1], rnd[2])
            if found:
                return found
        return {}

    def _place(self, rank: int, ci: int, seq: int) -> dict[str, Any]:
        det = self.det
        m = det.meta
        pl = self._pipeline(rank)
        if pl is None:
            return {}
        stage, stages, pp_ci = pl
        prog = stage_program(m.schedule, stage, stages, m.microbatches)
        rec = det.recent_ops(rank)
        hit = np.flatnonzero((rec["comm"] == ci) & (rec["seq"] == seq))
        if not len(hit):
            return {}
        h = int(hit[-1])
        located = [(j, self._locate(rank, rec, j, prog, stage, pp_ci)) for j in range(h)]
        bounds = [(j, pos) for j, (is_bound, pos) in located if is_bound]
        if not bounds:
            return {}
        last_j, last_pos = bounds[-1]
        if last_pos is None:
            return {}
        count = int(np.sum(rec["comm"][last_j + 1:h] == ci))
        has_dp = any(det.comm_kind(c) == "dp" and not det._comm_p2p[c]
                     for c in det._comms_of(rank))
        steps = _compute_between(prog, last_pos, None, has_dp)
        if not steps:
            return {}
        if len(steps) > 1:
            per = self._per_step(rec, ci, prog, bounds, has_dp)
            if per is None:
                return {}
            kind, mb = steps[min(count // per, len(steps) - 1)]
        else:
            kind, mb = steps[0]
        pas = "forward" if kind == "F" else "backward"
        out: dict[str, Any] = {"pass": pas, "microbatch": mb}
        phase = schedule_phase(m.schedule, stage, stages, m.microbatches, pas, mb)
        if phase is not None:
            out["schedule_phase"] = phase
        return out

    @staticmethod
    def _per_step(rec: dict[str, np.ndarray], ci: int, prog: list[Any],
                  bounds: list[tuple[int, int | None]], has_dp: bool) -> int | None:
        """Operations of the communicator per compute step, from complete gaps between two
        consecutive located boundaries among the rank's recent operations."""
        ops = steps = 0
        for (j1, p1), (j2, p2) in zip(bounds, bounds[1:], strict=False):
            if p1 is None or p2 is None or p2 == p1:
                continue
            n = len(_compute_between(prog, p1, p2, has_dp))
            if n:
                steps += n
                ops += int(np.sum(rec["comm"][j1 + 1:j2] == ci))
        if not steps or not ops:
            return None
        return max(1, round(ops / steps))

    def _report_not_entered(self, roots: list[int], rounds: set[tuple[Any, ...]]) -> Anomaly:
        """H1: the members that never entered the round are the root (CCL-D §4.2.2)."""
        direct = set().union(*(self.direct.get(r, set()) for r in roots)) or rounds
        reached = [rnd for rnd in direct if self._reached(rnd, roots)] or list(direct)
        first = min(self.round_t(rnd) for rnd in reached)
        window = self.det.config.p2p_batch_ns
        near = [rnd for rnd in reached if self.round_t(rnd) <= first + window]
        halt = min(near, key=lambda rnd: (self._batch_order(rnd, roots), self.round_t(rnd)))
        allr = rounds | direct
        a = self._anomaly("not_entered", roots, halt, self.round_t(halt), None,
                          self._victims(allr, roots))
        h = self.det.new_hang(a, roots, None)
        self._mark(allr, h)
        return a

    def _batch_order(self, rnd: tuple[Any, ...], roots: list[int]) -> int:
        """Position of the root's operation inside one ``batch_isend_irecv`` (Megatron's order:
        send-prev, recv-prev, send-next, recv-next): of several operations the partners
        posted together, the root would have called the first one first."""
        if rnd[0] == "c":
            return 4
        _, ci, sender, receiver, _k = rnd
        members = self.det._members(ci).tolist()
        if sender not in members or receiver not in members:
            return 4
        r_is_sender = sender in roots
        mine, other = (sender, receiver) if r_is_sender else (receiver, sender)
        nxt = members.index(other) > members.index(mine)
        return 2 * int(nxt) + int(not r_is_sender)

    def _reached(self, rnd: tuple[Any, ...], roots: list[int]) -> bool:
        """Would the root have called this operation by now? MEGATRACE §III-C's halt point is
        the first operation the root failed to call in its own program order. A peer may post
        a send or recv long before the root is due (pipeline ranks run ahead), so a
        point-to-point round counts only if a rank in lockstep with the root (a member of its
        TP, else CP, else DP group: same stage, same program) already passed the matching
        operation on its own pipeline communicator. Likewise a data-parallel (or world)
        round: its members are other model replicas, which may be an iteration ahead; it
        counts only if a lockstep peer (TP, else CP group) entered the round of the same seq
        on its own communicator of that kind. Rounds of the TP and CP groups are reached by
        definition: the members that entered are the root's lockstep peers."""
        det = self.det
        if rnd[0] == "c":
            return self._collective_reached(rnd, roots)
        _, ci, sender, receiver, k = rnd
        r = sender if sender in roots else receiver
        other = receiver if r == sender else sender
        members = det._members(ci).tolist()
        if other not in members:
            return True
        other_pos = members.index(other)
        kind = det.comm_kind(ci)
        mine = det._comms_of(r)
        for lock_kind in ("tp", "cp", "dp"):
            lock = [c for c in mine if not det._comm_p2p[c] and det.comm_kind(c) == lock_kind]
            if not lock:
                continue
            peers = [int(q) for q in det._members(lock[0]) if q >= 0 and q != r]
            for q in peers:
                for cq in det._comms_of(q):
                    if (det._comm_p2p[cq] and det.comm_kind(cq) == kind
                            and det._pair_count(cq, q, other_pos, r == receiver) > k):
                        return True
            return False
        return True

    def _lockstep_peers(self, rank: int, kinds: tuple[str, ...]) -> list[int]:
        """Members of the rank's first group of ``kinds`` (same stage, same program)."""
        det = self.det
        mine = det._comms_of(rank)
        for lock_kind in kinds:
            lock = [c for c in mine if not det._comm_p2p[c] and det.comm_kind(c) == lock_kind]
            if lock:
                return [int(q) for q in det._members(lock[0]) if q >= 0 and q != rank]
        return []

    def _collective_reached(self, rnd: tuple[Any, ...], roots: list[int]) -> bool:
        det = self.det
        ci, seq = rnd[1], rnd[2]
        kind = det.comm_kind(ci)
        if kind in ("tp", "cp"):
            return True
        r = next((x for x in roots if x in det._members(ci)), roots[0])
        peers = self._lockstep_peers(r, ("tp", "cp"))
        if not peers:
            return True
        for q in peers:
            for cq in det._comms_of(q):
                if (not det._comm_p2p[cq] and det.comm_kind(cq) == kind
                        and int(det._last_seq(cq, np.array([q]))[0]) >= seq):
                    return True
        return False

    def _report_cycle(self, ranks: list[int], rounds: set[tuple[Any, ...]]) -> Anomaly:
        halt = min(rounds, key=self.round_t)
        a = self._anomaly("inconsistent", ranks, halt, self.round_t(halt), None,
                          {"wait_cycle": True, **self._victims(rounds, ranks)})
        h = self.det.new_hang(a, [], list(halt))
        self._mark(rounds, h)
        return a

    def _report_group(self, grnd: tuple[Any, ...], rounds: set[tuple[Any, ...]]
                      ) -> Anomaly | None:
        """All members entered the round: H2 (inconsistent) or H3 (hardware). A hardware
        hang waits a little for work-request evidence of a broken link (MEGATRACE §III-C
        step 2, validation) when queue-pair samples of the members' nodes are flowing."""
        det = self.det
        ops = self.round_ops[grnd]
        cause, roots, link, extra = self._classify(grnd, ops)
        if (cause == "hardware" and link is None and grnd[0] == "c"
                and self._link_pending(grnd[1], ops, roots)):
            return None
        a = self._anomaly(cause, roots, grnd, self.complete_t(grnd)[0], link,
                          {**extra, **self._victims(rounds | {grnd}, roots)})
        h = det.new_hang(a, [], list(grnd))
        self._mark(rounds | {grnd}, h)
        return a

    def _classify(self, grnd: tuple[Any, ...], ops: list[int]
                  ) -> tuple[str, list[int], list[int] | None, dict[str, Any]]:
        det, fl = self.det, self.det._fl
        ci = grnd[1]
        stuck = {int(fl["rank"][i]): i for i in ops}
        if grnd[0] == "c":
            seq = grnd[2]
            members = [int(m) for m in det._members(ci) if m >= 0]
            sig: dict[int, tuple[int, int]] = {}
            done: list[int] = []
            for m in members:
                if m in stuck:
                    i = stuck[m]
                    sig[m] = (int(fl["op"][i]), int(fl["bytes"][i]))
                    continue
                done.append(m)
                row = det._cr.find(_cr_key(ci, np.array([m])))[0]
                if row >= 0 and det._cr.cols["done_seq"][row] == seq:
                    sig[m] = (int(det._cr.cols["done_op"][row]),
                              int(det._cr.cols["done_bytes"][row]))
        else:
            _, ci, sender, receiver, _k = grnd
            members = [r for r in (sender, receiver) if r >= 0]
            sig = {m: (0, int(fl["bytes"][stuck[m]])) for m in members if m in stuck}
            done = [m for m in members if m not in stuck]
        if len(set(sig.values())) > 1:
            deviating = (self._minority(ci, grnd[2], sig) if grnd[0] == "c"
                         else self._p2p_deviating(ci, {m: (int(fl["op"][stuck[m]]), b)
                                                       for m, (_, b) in sig.items()}))
            seen = {str(m): {"op": events.COLL_OPS[o] if grnd[0] == "c" else None, "bytes": b}
                    for m, (o, b) in sig.items() if m in deviating}
            return "inconsistent", deviating, None, {"deviating": seen}
        if done and grnd[0] == "c" and self._passed_later(ci, grnd[2], list(stuck), done):
            # the others completed this round and later ones these members still hold in
            # flight: the members' device stopped completing work (H3, e.g. a GPU error)
            return "hardware", sorted(stuck), None, {"stopped_completing": sorted(stuck)}
        if done:
            # CCL-D: all entered, some did not hang: the non-hang ranks are the root
            return "inconsistent", sorted(done), None, {"completed_round": sorted(done)}
        if grnd[0] == "p":
            link = self._p2p_link(grnd[2], grnd[3], stuck)
        else:
            link = self._broken_link(ci, list(stuck), int(fl["t"][ops].min()))
        steps = {m: int(fl["steps"][i]) for m, i in stuck.items() if fl["steps"][i] >= 0}
        extra: dict[str, Any] = {}
        roots: list[int] = []
        if steps and len(set(steps.values())) > 1:
            low = min(steps.values())
            roots = sorted(m for m, s in steps.items() if s == low)
            extra["steps"] = {str(m): s for m, s in sorted(steps.items())}
        if link is not None and (not roots or len(roots) > 1):
            lowest = [r for r in link if r in roots] or link
            roots = sorted(lowest)[:1] if roots else sorted(link)
        if not roots:
            roots = sorted(stuck)
        return "hardware", roots, link, extra

    def _passed_later(self, ci: int, seq: int, stuck: list[int], done: list[int]) -> bool:
        """Did a member that completed round ``seq`` also complete a later round of the
        communicator that a stuck member entered and still holds in flight? Then the stuck
        member's work is not completing at all (its device), rather than the completed
        member having called something else (H2 leaves the deviant unable to pass the next
        round, since the others never enter it)."""
        fl = self.det._fl
        on_comm = fl["comm"] == ci
        later = np.unique(fl["seq"][on_comm & np.isin(fl["rank"], stuck) & (fl["seq"] > seq)])
        if not len(later):
            return False
        last = self.det._last_seq(ci, np.asarray(done, dtype=np.int64))
        for d, last_d in zip(done, last.tolist(), strict=True):
            held = set(fl["seq"][on_comm & (fl["rank"] == d)].tolist())
            if any(s2 <= last_d and s2 not in held for s2 in later.tolist()):
                return True
        return False

    def _p2p_deviating(self, ci: int, sig: dict[int, tuple[int, int]]) -> list[int]:
        """The side of a mismatched send/recv pair (CCL-D §2.2 H2) whose (op, bytes) the
        pair's communicator completed less often before: the usual transfer is the expected
        one. Both sides when history cannot tell them apart."""
        book = self.det._signatures
        seen = {m: book.get((ci, o, b), 0) for m, (o, b) in sig.items()}
        if len(set(seen.values())) == 1:
            return sorted(sig)
        low = min(seen.values())
        return sorted(m for m, n in seen.items() if n == low)

    def _minority(self, ci: int, seq: int, sig: dict[int, tuple[int, int]]) -> list[int]:
        """The deviating ranks: those whose (op, bytes) is not the most common one in the
        round (CCL-D §2.2 H2). On a tie (two members, say), the signature the same round had
        on the sibling communicators (same kind and size, same pipeline stage: the same
        program, so the same operation at the same seq), else the one the members called one
        iteration earlier on this communicator, else the one more common in this
        communicator's completed history, is the expected one."""
        book = self.det._signatures
        counts = Counter(sig.values())
        top = max(counts.values())
        sibling = None
        if list(counts.values()).count(top) > 1:
            sibling = self._sibling_signature(ci, seq) or self._period_signature(ci, seq,
                                                                                  list(sig))
        keep = max(counts, key=lambda s: (counts[s], s == sibling,
                                          book.get((ci, s[0], s[1]), 0), -s[0], -s[1]))
        return sorted(m for m, s in sig.items() if s != keep)

    def _period_signature(self, ci: int, seq: int, ranks: list[int]) -> tuple[int, int] | None:
        """The (op, bytes) of round ``seq - N`` on the communicator, N its rounds per
        iteration: counted among a member's recent operations between two passes through
        the same step of its stage program (the schedule repeats every iteration)."""
        det = self.det
        m = det.meta
        if m.microbatches <= 0 or m.schedule not in ("1f1b", "gpipe"):
            return None
        for q in ranks:
            pl = self._pipeline(q)
            if pl is None:
                continue
            stage, stages, pp_ci = pl
            prog = stage_program(m.schedule, stage, stages, m.microbatches)
            rec = det.recent_ops(q)
            seen: dict[int, int] = {}
            prev = None
            for j in range(len(rec["t"])):
                is_bound, pos = self._locate(q, rec, j, prog, stage, pp_ci)
                if not is_bound or pos is None or pos == prev:
                    continue
                prev = pos
                if pos in seen:
                    n = int(np.sum(rec["comm"][seen[pos]:j] == ci))
                    hit = np.flatnonzero((rec["comm"] == ci) & (rec["seq"] == seq - n))
                    if n and len(hit):
                        return int(rec["op"][hit[-1]]), int(rec["bytes"][hit[-1]])
                seen[pos] = j
        return None

    def _sibling_signature(self, ci: int, seq: int, limit: int = 16
                           ) -> tuple[int, int] | None:
        """The (op, bytes) most members of sibling communicators called at round ``seq``
        (from their recent operations)."""
        det = self.det
        kind, size = det.comm_kind(ci), det._comm_size[ci]
        members = [int(m) for m in det._members(ci) if m >= 0]
        if not members:
            return None
        here = self._pipeline(members[0])
        votes: Counter[tuple[int, int]] = Counter()
        looked = 0
        for c2 in range(len(det._comm_u64)):
            if (c2 == ci or det._comm_p2p[c2] or det._comm_size[c2] != size
                    or det.comm_kind(c2) != kind):
                continue
            others = [int(m) for m in det._members(c2) if m >= 0]
            if not others:
                continue
            there = self._pipeline(others[0])
            if here is not None and there is not None and there[0] != here[0]:
                continue
            rec = det.recent_ops(others[0])
            hit = np.flatnonzero((rec["comm"] == c2) & (rec["seq"] == seq))
            if len(hit):
                votes[(int(rec["op"][hit[-1]]), int(rec["bytes"][hit[-1]]))] += 1
            looked += 1
            if looked >= limit:
                break
        return votes.most_common(1)[0][0] if votes else None

    def _link_pending(self, ci: int, ops: list[int], roots: list[int]) -> bool:
        """Could a broken network link still show? Only if the root has a communicator
        neighbour on another node (a ring sends to and receives from its neighbours), queue
        pairs on the members' nodes report, and the round has been stuck for less than a
        broken link needs to show: completions frozen for ``link_stall_ns`` plus a few
        sampling periods (capped by ``link_wait_ns``)."""
        det, fl = self.det, self.det._fl
        qp = det._qp
        if not len(qp["last_t"]):
            return False
        since = int(fl["t"][ops].min())
        node = det.meta.node_of
        nodes = {node(int(fl["rank"][i])) for i in ops}
        if len(nodes) < 2:          # every member on one node: no network link in between
            return False
        members = [int(m) for m in det._members(ci)]
        if len(roots) == 1 and roots[0] in members:
            pos, n = members.index(roots[0]), len(members)
            near = {members[(pos - 1) % n], members[(pos + 1) % n]}
            if all(m >= 0 and node(m) == node(roots[0]) for m in near):
                return False
        flowing = [q for q, info in enumerate(det._qp_info)
                   if info[0] in nodes and qp["last_t"][q] >= since]
        if not flowing:
            return False
        cfg = det.config
        t, _ = self.complete_t(self.round_key[ops[0]])
        stuck_at = t + int(self.thr[ops].min())
        wait = min(cfg.link_wait_ns, cfg.link_stall_ns + 3 * max(det._link_period, 0))
        return self.now < stuck_at + wait

    def _p2p_link(self, sender: int, receiver: int, stuck: dict[int, int]) -> list[int] | None:
        """A stalled send/recv between two nodes: the link is the pair itself, the end with
        the fewest steps first."""
        node = self.det.meta.node_of
        if sender < 0 or receiver < 0 or node(sender) == node(receiver):
            return None
        steps = self.det._fl["steps"]
        s_steps = int(steps[stuck[sender]]) if sender in stuck else -1
        r_steps = int(steps[stuck[receiver]]) if receiver in stuck else -1
        return [receiver, sender] if 0 <= r_steps < s_steps else [sender, receiver]

    def _broken_link(self, ci: int, ranks: list[int], since: int) -> list[int] | None:
        """A queue pair between nodes of the round's members whose posted work requests
        grow while its completions stand still (MEGATRACE §III-C step 2); its two ends as
        member ranks."""
        det = self.det
        qp = det._qp
        if not len(qp["last_t"]):
            return None
        cfg = det.config
        nodes = {r: det.meta.node_of(r) for r in ranks}
        by_node: dict[str, list[int]] = {}
        for r, nd in nodes.items():
            by_node.setdefault(nd, []).append(r)
        stalled = ((qp["posted"] - qp["completed"] > 0)
                   & (qp["posted"] - qp["posted_change"] > 0)
                   & (qp["last_t"] - qp["t_change"] >= cfg.link_stall_ns)
                   & (qp["last_t"] >= since))
        best: tuple[int, list[int]] | None = None
        members = det._members(ci).tolist()
        for q in np.flatnonzero(stalled).tolist():
            node, _dev, peer, owner = det._qp_info[q]
            if node not in by_node:
                continue
            a_cands = [owner] if owner in ranks else by_node[node]
            b_cands = by_node.get(peer or "", [])
            if not b_cands:
                continue
            def dist(pair: tuple[int, int]) -> int:
                if pair[0] in members and pair[1] in members:
                    d = abs(members.index(pair[0]) - members.index(pair[1]))
                    return min(d, len(members) - d)
                return len(members)
            pairs = [(x, y) for x in a_cands for y in b_cands if x != y]
            if not pairs:
                continue
            a, b = min(pairs, key=dist)
            score = int(qp["posted"][q] - qp["posted_change"][q])
            if best is None or score > best[0]:
                best = (score, [a, b])
        return best[1] if best else None


def _merge(groups: list[tuple[set[int], set[tuple[Any, ...]]]]
           ) -> list[tuple[set[int], set[tuple[Any, ...]]]]:
    """Union idle-root sets that share a rank (one anomaly per root cause)."""
    out: list[tuple[set[int], set[tuple[Any, ...]]]] = []
    for roots, rounds in groups:
        roots, rounds = set(roots), set(rounds)
        keep = []
        for r2, s2 in out:
            if r2 & roots:
                roots |= r2
                rounds |= s2
            else:
                keep.append((r2, s2))
        out = keep + [(roots, rounds)]
    return out


# ---------------------------------------------------------------------------------------------
# benchmark: ``failslow bench hang``


def replay_with_ticks(det: HangDetector, tables: dict[str, pa.Table],
                      tick_ns: int = 100_000_000, tail_ns: int = 0) -> list[Anomaly]:
    """Feed a trace to the detector as a stream would: ``update`` per replayed window and
    ``on_tick`` every ``tick_ns`` of trace time, also through windows with no records and
    for ``tail_ns`` after the last record (time passing is how hangs show)."""
    from failslow.replay import replay

    out: list[Anomaly] = []
    prev: int | None = None
    for now, batch in replay(tables, window_ns=tick_ns):
        if prev is not None:
            for t in range(prev + tick_ns, now, tick_ns):
                out += det.on_tick(t)
        out += det.update(batch) + det.on_tick(now)
        prev = now
    if prev is not None:
        for t in range(prev + tick_ns, prev + tail_ns + 1, tick_ns):
            out += det.on_tick(t)
    return out


def _bench_case(scenario: Any, seed: int, config: HangConfig | None, tail_ns: int
                ) -> dict[str, Any]:
    import time

    from failslow.simulator import simulate

    result = simulate(scenario, seed=seed)
    tables: dict[str, pa.Table] = {}
    for kind in ("coll", "progress", "link"):
        if kind in result.kinds:
            parts = list(result.iter_tables(kind))
            if parts:
                tables[kind] = pa.concat_tables(parts)
    det = HangDetector(result.meta, config)
    started = time.perf_counter()
    found = [a for a in replay_with_ticks(det, tables, tail_ns=tail_ns) if a.end_ns is None]
    seconds = time.perf_counter() - started
    truth = [a for a in result.truth.anomalies if a.kind == "hang"]
    rows = sum(t.num_rows for t in tables.values())
    figures: dict[str, Any] = {"rows": rows, "seconds": round(seconds, 3),
                               "reports": len(found)}
    if truth and found:
        want, got = truth[0], found[0]
        figures["correct"] = bool(
            len(found) == 1 and got.cause == want.cause and got.ranks == want.ranks
            and sorted(got.link or []) == sorted(want.link or []) and got.comm == want.comm)
        if got.detected_ns is not None and want.start_ns is not None:
            figures["latency_s"] = round((got.detected_ns - want.start_ns) / 1e9, 3)
    return figures


def _bench_hang(args: Any) -> dict[str, Any]:
    """Detection latency and root correctness on the three hang presets against CCL-D's
    fixed 5-minute threshold (the in-process baseline), and throughput on a 4096-rank job
    (``--scale`` shrinks its data-parallel degree) with a hardware hang."""
    from failslow.simulator import scenario_from_dict

    scale = float(getattr(args, "scale", 1.0) or 1.0)
    figures: dict[str, Any] = {}
    fixed = HangConfig(floor_ns=HangConfig().ceiling_ns, silence=False)
    for name in ("hang-not-entered", "hang-inconsistent", "hang-hardware"):
        ours = _bench_case(name, 0, None, 0)
        base = _bench_case(name, 0, fixed, fixed.ceiling_ns + 10**9)
        key = name.removeprefix("hang-").replace("-", "_")
        figures[f"{key}_correct"] = ours.get("correct", False)
        figures[f"{key}_latency_s"] = ours.get("latency_s")
        figures[f"{key}_baseline_5min_latency_s"] = base.get("latency_s")
    dp = max(2, min(64, round(64 * scale)))
    sc = scenario_from_dict({"preset": "large", "iterations": 10,
                             "parallel": {"tp": 8, "pp": 8, "dp": dp, "cp": 1},
                             "faults": [{"cause": "hardware", "ranks": [1234 % (64 * dp)],
                                         "start": 6, "comm": "dp", "op": "reducescatter"}]})
    big = _bench_case(sc, 1, None, 0)
    figures.update({"large_ranks": 64 * dp, "large_rows": big["rows"],
                    "large_seconds": big["seconds"],
                    "large_rows_per_s": round(big["rows"] / max(big["seconds"], 1e-9)),
                    "large_correct": big.get("correct", False),
                    "large_latency_s": big.get("latency_s")})
    return figures


BENCHMARKS = {"hang": _bench_hang}

__all__ = ["BENCHMARKS", "HangConfig", "HangDetector", "replay_with_ticks", "schedule_phase",
           "stage_program"]
