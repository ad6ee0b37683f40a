"""Primitives of the what-if analysis (what-if paper §3.1-§3.2): operation kinds, the
OpDuration container, worker coordinates and ``coll`` operation pairing.

The what-if analysis (papers/whatif-stragglers.md) organizes the traced operations of each
type into a tensor indexed by [step, micro-batch, PP rank, DP rank] (§3.2, "Estimate
idealized operation durations"): :class:`OpTrace` holds them with each stage's program.
:mod:`.whatif_spans` builds it from ``span`` rows, :mod:`.whatif_coll` from ``coll`` rows.
Tensor parallelism is collapsed as in the paper (§7): one *worker* per (PP rank, DP rank),
represented by its first TP/CP member.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from failslow import events
from failslow.events import JobMeta

log = logging.getLogger(__name__)

#: Categories of diagnosis.md ``whatif.by_op_type`` (plus "other" and "gc").
CATEGORIES = ("forward-compute", "backward-compute", "pp-communication", "dp-communication",
              "tp-communication")


@dataclass(frozen=True)
class Kind:
    """An operation type (Table 1): its category, whether it is communication (idealized by
    the median transfer duration, else by the mean duration, §3.2), and its peers.

    ``group``: ``p2p`` (PP pair), ``dp`` (same stage, all DP ranks), ``world`` (all stages
    and DP ranks), ``stages`` (the listed stages of one DP rank, all DP ranks if
    ``dp_sync``), ``solo`` (no peers: TP-collapsed collective) or ``""`` (compute)."""

    name: str
    category: str
    comm: bool = False
    group: str = ""
    stages: tuple[int, ...] = ()
    dp_sync: bool = False


BASE_KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("forward-compute", "forward-compute"),
    Kind("backward-compute", "backward-compute"),
    Kind("forward-send", "pp-communication", True, "p2p"),
    Kind("forward-recv", "pp-communication", True, "p2p"),
    Kind("backward-send", "pp-communication", True, "p2p"),
    Kind("backward-recv", "pp-communication", True, "p2p"),
    Kind("params-sync", "dp-communication", True, "dp"),
    Kind("grads-sync", "dp-communication", True, "dp"),
    Kind("optimizer", "other"),
    Kind("other", "other"),
    Kind("forward-tp", "tp-communication", True, "part"),
    Kind("backward-tp", "tp-communication", True, "part"),
)}
#: Framework operation names (the ``optype`` column of imported NDTimeline traces) with
#: known semantics (StragglerAnalysis' Megatron dependency model).
NAMED_KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("optimizer-clip-main-grad", "other", True, "world", dp_sync=True),
    Kind("layernorm-grads-all-reduce", "tp-communication", True, "solo"),
    Kind("embedding-grads-all-reduce", "other", True, "stages"),
)}
P2P_KINDS = ("forward-send", "forward-recv", "backward-send", "backward-recv")
#: compute kind -> its TP part
TP_PART = {"forward-compute": "forward-tp", "backward-compute": "backward-tp"}
MB_INDEXED = {"forward-compute", "backward-compute", *P2P_KINDS}


class WhatIfInputError(ValueError):
    """The trace lacks what the what-if analysis needs (the message says what)."""


@dataclass
class OpTrace:
    """What the simulator needs: OpDuration tensors, programs and actual step times.

    ``dur[name]``: float64 seconds, shape (steps, index, pp, dp), NaN where a worker has no
    such operation; ``index`` is the micro-batch for compute and pipeline operations, else
    the occurrence in the step. ``parts[name]``: extra duration parts simulated inside an
    operation of kind ``name`` (TP transfer, GC pause), each with its own tensor in ``dur``.
    ``programs[p]``: the steps of stage ``p``, each a tuple of (kind, index) run together.
    """

    steps: np.ndarray
    pp: int
    dp: int
    kinds: dict[str, Kind]
    dur: dict[str, np.ndarray]
    parts: dict[str, list[str]]
    programs: list[list[tuple[tuple[str, int], ...]]]
    actual: np.ndarray                # (steps,) actual step time, s
    ranks: np.ndarray                 # (pp, dp) representative global rank of each worker
    members: list[list[list[int]]]    # [pp][dp] all global ranks of the worker
    source: str = "span"
    gc: dict[str, object] = field(default_factory=dict)
    #: per global rank, the share of its TP/CP rounds it entered last (None: no such rounds)
    late_share: np.ndarray | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def microbatches(self) -> int:
        f = self.dur.get("forward-compute")
        return 0 if f is None else int(f.shape[1])

    def op_durations(self) -> dict[str, np.ndarray]:
        """The OpDuration tensors [step, micro-batch/occurrence, PP rank, DP rank] (§3.2)."""
        return dict(self.dur)


# ---------------------------------------------------------------------------------------------
# coordinates


def _stage_chains(meta: JobMeta, pp_of: np.ndarray) -> np.ndarray:
    """Pipeline stages from per-pair ``pp`` communicators (one per pair of adjacent stages):
    each chain of pairs is one pipeline, ordered by rank (in any rank order a rank grows
    with its pipeline coordinate when the others are fixed). ``pp_of`` unchanged unless
    every rank lies on a chain of exactly ``pp`` ranks."""
    W = meta.world_size
    pairs = np.array([c.ranks for c in meta.comms if c.kind == "pp" and len(c.ranks) == 2
                      and max(c.ranks) < W], dtype=np.int64).reshape(-1, 2)
    if not len(pairs):
        return pp_of
    label = np.arange(W)
    for _ in range(meta.pp):  # a chain of pp ranks links up in pp - 1 rounds
        low = np.minimum(label[pairs[:, 0]], label[pairs[:, 1]])
        before = label.copy()
        np.minimum.at(label, pairs[:, 0], low)
        np.minimum.at(label, pairs[:, 1], low)
        if (label == before).all():
            break
    sizes = np.bincount(label, minlength=W)
    if not (sizes[label] == meta.pp).all():
        return pp_of
    order = np.lexsort((np.arange(W), label))
    first = np.searchsorted(label[order], label[order])
    out = np.empty(W, dtype=np.int64)
    out[order] = np.arange(W) - first
    return out


def worker_coords(meta: JobMeta) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(stage, dp rank, member index) of every global rank; member 0 represents the worker.

    From ``meta.comms`` (the rank's index in its ``pp`` and ``dp`` communicators, the
    chains of per-pair ``pp`` communicators, a single stage without a pipeline) when they
    cover every rank, else Megatron's order ``rank = tp + TP*(cp + CP*(dp + DP*pp))``."""
    W = meta.world_size
    group = meta.tp * meta.cp
    r = np.arange(W)
    stage = r // (group * meta.dp)
    dpr = (r // group) % meta.dp
    member = r % group
    pp_of = np.full(W, -1)
    dp_of = np.full(W, -1)
    for c in meta.comms:
        idx = np.asarray(c.ranks, dtype=np.int64)
        if idx.size == 0 or idx.max() >= W:
            continue
        if c.kind == "pp" and len(c.ranks) == meta.pp:
            pp_of[idx] = np.arange(idx.size)
        elif c.kind == "dp" and len(c.ranks) == meta.dp:
            dp_of[idx] = np.arange(idx.size)
    if meta.pp > 1 and not (pp_of >= 0).all():
        pp_of = _stage_chains(meta, pp_of)
    if meta.pp == 1:
        pp_of[:] = 0  # one stage: the DP communicators alone place the ranks
    if meta.dp > 1 and (pp_of >= 0).all() and (dp_of >= 0).all():
        key = pp_of * meta.dp + dp_of
        order = np.lexsort((r, key))
        first = np.ones(W, dtype=bool)
        first[1:] = key[order][1:] != key[order][:-1]
        rank_in = np.arange(W) - np.maximum.accumulate(np.where(first, np.arange(W), 0))
        member = np.empty(W, dtype=np.int64)
        member[order] = rank_in
        stage, dpr = pp_of, dp_of
    return stage.astype(np.int64), dpr.astype(np.int64), member.astype(np.int64)


def worker_table(meta: JobMeta) -> tuple[np.ndarray, list[list[list[int]]]]:
    stage, dpr, member = worker_coords(meta)
    reps = np.full((meta.pp, meta.dp), -1, dtype=np.int64)
    members: list[list[list[int]]] = [[[] for _ in range(meta.dp)] for _ in range(meta.pp)]
    for r in np.argsort(member, kind="stable").tolist():
        members[stage[r]][dpr[r]].append(r)
        if member[r] == 0:
            reps[stage[r], dpr[r]] = r
    return reps, members


# ---------------------------------------------------------------------------------------------
# coll operations (enter/end pairs)


@dataclass
class CollOps:
    """Complete ``coll`` operations (an ``enter`` and an ``end`` row), numpy columns."""

    rank: np.ndarray
    comm: np.ndarray
    comm_rank: np.ndarray
    seq: np.ndarray
    op: np.ndarray
    peer: np.ndarray
    enter: np.ndarray
    end: np.ndarray
    t_start: np.ndarray       # NULL_TIME when unknown
    kind: np.ndarray          # communicator kind code (index in events.COMM_KINDS, -1 unknown)
    comm_index: np.ndarray    # index into ``comm_ranks``
    comm_ranks: list[tuple[int, ...]]
    nbytes: np.ndarray | None = None  # bytes per operation (0 when unknown)

    def __len__(self) -> int:
        return int(self.rank.size)


def coll_ops(coll: pa.Table, meta: JobMeta) -> CollOps:
    """Pair the ``enter`` and ``end`` rows of every operation (by rank, comm, seq)."""
    from failslow.comms import infer_comms

    n = coll.num_rows
    rank = np.asarray(coll.column("rank").to_numpy(), dtype=np.int64)
    comm = np.asarray(coll.column("comm").to_numpy(), dtype=np.uint64)
    seq = np.asarray(coll.column("seq").to_numpy(), dtype=np.uint64)
    op = np.asarray(pc.index_in(coll.column("op"), value_set=pa.array(events.COLL_OPS))
                    .to_numpy(zero_copy_only=False), dtype=np.int8)
    phase = np.asarray(pc.index_in(coll.column("phase"), value_set=pa.array(events.PHASES))
                       .to_numpy(zero_copy_only=False), dtype=np.int8)
    t = np.asarray(coll.column("t").to_numpy(), dtype=np.int64)
    ts = np.asarray(pc.fill_null(coll.column("t_start"), events.NULL_TIME).to_numpy(),
                    dtype=np.int64)
    peer = np.asarray(coll.column("peer").to_numpy(), dtype=np.int64)
    crank = np.asarray(coll.column("comm_rank").to_numpy(), dtype=np.int64)
    nbytes = (np.asarray(pc.fill_null(coll.column("bytes"), 0).to_numpy(), dtype=np.int64)
              if "bytes" in coll.column_names else np.zeros(n, dtype=np.int64))
    # one int64 key per (comm, rank, seq, phase): sort once, enter/end rows become adjacent
    _, cinv = np.unique(comm, return_inverse=True)
    width = int(seq.max()) + 1 if n else 1
    key = ((cinv.reshape(-1).astype(np.int64) * (int(rank.max()) + 1 if n else 1) + rank)
           * width + seq.astype(np.int64)) * 2 + phase
    order = np.argsort(key, kind="stable")
    same = np.zeros(n, dtype=bool)
    if n > 1:
        k0, k1 = key[order[:-1]], key[order[1:]]
        same[:-1] = (k1 == k0 + 1) & (k0 % 2 == events.ENTER)
    a = order[np.flatnonzero(same)]
    b = order[np.flatnonzero(same) + 1]
    comms = list(meta.comms) or list(infer_comms(coll, meta))
    ids = np.array([c.comm for c in comms], dtype=np.uint64)
    srt = np.argsort(ids)
    cidx = np.full(a.size, -1, dtype=np.int64)
    if ids.size:
        pos = np.minimum(np.searchsorted(ids[srt], comm[a]), ids.size - 1)
        cidx = np.where(ids[srt][pos] == comm[a], srt[pos], -1)
    kcode = np.array([events.COMM_KINDS.index(c.kind) for c in comms] + [-1], dtype=np.int64)
    return CollOps(rank=rank[a], comm=comm[a], comm_rank=crank[a], seq=seq[a], op=op[a],
                   peer=peer[a], enter=t[a], end=t[b], t_start=ts[b], kind=kcode[cidx],
                   comm_index=cidx, comm_ranks=[c.ranks for c in comms], nbytes=nbytes[a])


def late_share(ops: CollOps, world: int) -> np.ndarray | None:
    """Per rank, the share of its TP/CP collective rounds it entered last: inside a
    collapsed worker, the member that keeps its peers waiting (CCL-D's slow rank)."""
    tp = np.flatnonzero(np.isin(ops.kind, [events.COMM_KINDS.index("tp"),
                                           events.COMM_KINDS.index("cp")]))
    if tp.size == 0:
        return None
    group = ops.comm_index[tp] * (int(ops.seq[tp].max()) + 1) + ops.seq[tp].astype(np.int64)
    order = np.lexsort((ops.enter[tp], group))
    g = group[order]
    last = np.ones(order.size, dtype=bool)
    last[:-1] = g[1:] != g[:-1]
    ranks = ops.rank[tp]
    rounds = np.bincount(ranks, minlength=world).astype(np.float64)
    latest = np.bincount(ranks[order][last], minlength=world).astype(np.float64)
    return np.divide(latest, rounds, out=np.zeros(world), where=rounds > 0)


def transfer_ns(ops: CollOps) -> np.ndarray:
    """Transfer duration of every coll operation: ``end - t_start`` when known, else ``end``
    minus the latest ``enter`` of the round (collectives: same comm and seq on every member;
    point-to-point: the matching k-th send/recv is not paired here, so its own enter)."""
    known = ops.t_start != events.NULL_TIME
    out = (ops.end - np.where(known, ops.t_start, ops.enter)).astype(np.float64)
    coll = (~known) & (ops.op != events.OP["send"]) & (ops.op != events.OP["recv"])
    if coll.any():
        idx = np.flatnonzero(coll)
        key = np.stack([ops.comm[idx], ops.seq[idx]], axis=1)
        _, inv = np.unique(key, axis=0, return_inverse=True)
        inv = inv.reshape(-1)
        latest = np.full(inv.max() + 1, np.iinfo(np.int64).min)
        np.maximum.at(latest, inv, ops.enter[idx])
        out[idx] = ops.end[idx] - latest[inv]
    return np.maximum(out, 0.0)


def str_codes(col: pa.ChunkedArray | pa.Array) -> tuple[list[str], np.ndarray]:
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    enc = pc.dictionary_encode(col)
    if isinstance(enc, pa.ChunkedArray):
        enc = enc.combine_chunks()
    names = [str(v) for v in enc.dictionary.to_pylist()]
    return names, np.asarray(enc.indices.to_numpy(zero_copy_only=False), dtype=np.int64)


def occurrence(keys: list[np.ndarray], t: np.ndarray) -> np.ndarray:
    """0, 1, 2, ... within each group of equal ``keys``, in order of ``t``."""
    gid = np.zeros(t.size, dtype=np.int64)
    for k in keys:
        _, inv = np.unique(k, return_inverse=True)
        gid = gid * (int(inv.max()) + 1 if inv.size else 1) + inv.reshape(-1)
    order = np.lexsort((t, gid))
    n = order.size
    new = np.ones(n, dtype=bool)
    new[1:] = gid[order][1:] != gid[order][:-1]
    starts = np.maximum.accumulate(np.where(new, np.arange(n), 0))
    out = np.empty(n, dtype=np.int64)
    out[order] = np.arange(n) - starts
    return out


def composite_key(rank: np.ndarray, t: np.ndarray, base: int, width: int) -> np.ndarray:
    return rank.astype(np.int64) * np.int64(width) + (t.astype(np.int64) - np.int64(base))


def match_ops(q_rank: np.ndarray, q_t: np.ndarray, o_rank: np.ndarray, o_t: np.ndarray,
              tol_ns: int) -> np.ndarray:
    """For each query (rank, time), the index of the operation of the same rank whose time
    is nearest, if within ``tol_ns``; else -1. Vectorized on a (rank, time) composite key."""
    out = np.full(q_rank.size, -1, dtype=np.int64)
    if q_rank.size == 0 or o_rank.size == 0:
        return out
    base = int(min(q_t.min(), o_t.min())) - tol_ns - 1
    width = int(max(q_t.max(), o_t.max())) - base + tol_ns + 2
    if width * (int(max(q_rank.max(), o_rank.max())) + 1) >= 2**62:
        raise WhatIfInputError("trace time range too long to index")
    okey = composite_key(o_rank, o_t, base, width)
    order = np.argsort(okey, kind="stable")
    sk = okey[order]
    qk = composite_key(q_rank, q_t, base, width)
    j = np.searchsorted(sk, qk)
    best = np.full(q_rank.size, np.iinfo(np.int64).max)
    for cand in (j - 1, j):
        c = np.clip(cand, 0, sk.size - 1)
        dist = np.abs(sk[c] - qk)
        ok = (cand >= 0) & (cand < sk.size) & (dist <= tol_ns) & (dist < best)
        best = np.where(ok, dist, best)
        out = np.where(ok, order[c], out)
    return out
