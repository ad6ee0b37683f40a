"""Slow-down detection and root-cause localization (CCL-D §4.2, Greyhound §4.2-4.3,
MEGATRACE §III).

Accounting, per batch of records (vectorized; a batch costs no per-row Python):

1. :class:`RoundJoiner` joins ``enter``/``end`` rows into *rounds*: a collective round is
   one ``(comm, seq)`` on every member (CCL-D's Trace ID); a point-to-point round is the
   k-th ``send`` from a to b matched with the k-th ``recv`` on b from a. Only incomplete
   rounds are kept as state; completed ones become :data:`failslow.results` ``rounds`` rows.
2. Every member's *wait* in a round is its duration (``end - enter``, one host clock) minus
   the round's shortest duration: it waited for the member with the shortest duration, the
   last to enter (CCL-D: "the rank with minimal communication time is the root cause").
   Waits, transfer times (``end - t_start``, else the shortest duration) and CCL-D's
   ``T_max``/``T_min`` are summed into time bins (:class:`BinTable`).
3. :class:`GapTracker`: each rank's compute, the gaps between its operations, placed in the
   1F1B schedule (forward / backward) when spans are absent; :class:`LinkTracker`: RDMA
   queue-pair occupancy from ``link`` rows; GPU clocks and throttle reasons from ``gpu``
   rows; :class:`CCLDMonitor`: CCL-D's ``T_base``, detection windows, threshold and
   repetition count per round class.

Decisions, at the end of every job iteration (:class:`~failslow.detectors.iterations.
IterationTracker`), on the data before that end only -- so they do not depend on how the
records were batched, and ``detected_ns`` is the trace time of the evidence:

4. :class:`~failslow.detectors.changepoints.ChangeTracker` turns the iteration times into
   slow *levels* (onset, further onset during an open one, relief).
5. A level becomes an anomaly once its root *persists*: each slow iteration is localized
   on its own against the reference window before the onset, and a compute root (or a slow
   link) must be found again over the slow iterations (:meth:`SlowdownDetector._persistent`),
   more often than chance allows: noise names many ranks per iteration, so a rank shared
   by two such sets is no evidence (:func:`_persistence_chance`). An iteration whose window
   holds no round of the slow groups says nothing about them (a once-per-iteration sync
   that ends at the iteration boundary falls into every other window of whole time bins).
   A first slow iteration several healthy iterations long is judged by its two halves. A
   fail-slow is a persistent slow component; GC pauses and bursts of jitter hit random
   ranks, and such levels are dropped -- and once relieved, not proposed again. A further
   level with the same root is the same anomaly grown worse; with another root it is a
   second anomaly. A slow link and compute roots outside its slow groups found together
   are two faults, reported as two anomalies (CCL-D's S1 and S2, not S3).
6. Localization of a window against its reference window:
   * communication (Greyhound §4.3 cross-group comparison): groups (a communicator, or the
     pair of a point-to-point channel) whose transfer time grew by more than 10% over their
     own reference and beyond the median of their *comparable cluster* (same kind, op and
     bytes) -- or the whole cluster when a link every group crosses is slow; the link is
     the node pair the slow groups' edges share (ring-neighbour analysis, ties broken by
     queue-pair occupancy), named by two ranks at its ends (the edge whose queue pairs
     alone filled, with ``link`` rows); a group's noise is its own reference spread, at
     least its comparable cluster's pooled spread;
   * computation: ranks whose own compute per iteration grew by a share of the time lost
     and whom their peers wait on more (MEGATRACE: the timing of the calls shows the
     computation), else the sinks of the wait-for graph; the stage from spans or from the
     schedule;
   * both: mixed. CCL-D's ``R`` and ``P`` (:meth:`SlowdownDetector._rp`) are reported for
     the communicator that shows the anomaly (P near 1: late arrival, computation; near 0:
     transfer, communication), over the rounds from the anomaly's start on and against the
     ``T_base`` of the rounds before it, and used where the compute evidence is only the
     wait graph; a communication verdict needs ``P < alpha``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from failslow import events, results
from failslow.detectors.base import EventBatch
from failslow.detectors.changepoints import Change, ChangeConfig, ChangeTracker
from failslow.detectors.iterations import (
    _group_starts,
    _pack,
    _sorted_groups,
    coll_columns,
    rank_time_order,
)
from failslow.diagnosis import Anomaly
from failslow.events import NULL_TIME, Comm, JobMeta

SEND, RECV = events.OP["send"], events.OP["recv"]
KIND_STAGE = {"pp": "pp_p2p", "dp": "dp_sync", "tp": "tp_collective", "cp": "tp_collective"}
SPAN_PASSES = ("forward-compute", "backward-compute")
_DIMS = ("tp", "cp", "dp", "pp")


# ---------------------------------------------------------------------------------------------
# communicators


def infer_comm_kind(ranks: Sequence[int], meta: JobMeta, p2p_only: bool = False) -> str:
    """The kind of a communicator from its members and the job's parallel degrees.

    Ranks are laid out with one dimension varying fastest; we try Megatron's default
    order (tp, cp, dp, pp) first, then the other orders, and take the first under which the
    members differ in exactly one dimension and cover it. A communicator of the whole world
    is ``world``; point-to-point-only communicators that fit no layout are ``pp``.
    """
    n = len(ranks)
    if n == meta.world_size and n > 1:
        return "world"
    degrees = {"tp": meta.tp, "cp": meta.cp, "dp": meta.dp, "pp": meta.pp}
    arr = np.asarray(ranks, dtype=np.int64)
    orders = [_DIMS, *[o for o in itertools.permutations(_DIMS) if o != _DIMS]]
    for order in orders:
        stride = 1
        coords = {}
        for dim in order:
            coords[dim] = (arr // stride) % max(1, degrees[dim])
            stride *= max(1, degrees[dim])
        varying = [d for d in order if len(np.unique(coords[d])) > 1]
        if len(varying) == 1 and degrees[varying[0]] == n:
            return varying[0]
        if len(varying) == 1 and p2p_only and n == 2:
            return varying[0]
    return "pp" if p2p_only else "other"


def infer_comms(coll: pa.Table, meta: JobMeta) -> tuple[Comm, ...]:
    """Communicators from ``coll`` rows (events.md: ``comms`` may be empty): members from
    (comm, comm_rank, rank), kinds from membership and degrees."""
    if coll.num_rows == 0:
        return ()
    t = pa.table({"comm": coll.column("comm"), "cr": coll.column("comm_rank"),
                  "rank": coll.column("rank"), "op": coll.column("op")})
    members = t.group_by(["comm", "cr", "rank"]).aggregate([]).sort_by(
        [("comm", "ascending"), ("cr", "ascending")])
    ops = t.group_by(["comm", "op"]).aggregate([])
    p2p_comms: dict[int, bool] = {}
    for c, op in zip(ops.column("comm").to_pylist(), ops.column("op").to_pylist(), strict=True):
        p2p_comms[c] = p2p_comms.get(c, True) and op in ("send", "recv")
    out: list[Comm] = []
    comm_col = members.column("comm").to_numpy()
    rank_col = members.column("rank").to_numpy()
    uniq, starts = np.unique(comm_col, return_index=True)
    bounds = [*starts.tolist(), len(comm_col)]
    for i, c in enumerate(uniq.tolist()):
        ranks = tuple(int(r) for r in rank_col[bounds[i]:bounds[i + 1]])
        out.append(Comm(int(c), infer_comm_kind(ranks, meta, p2p_comms.get(c, False)), ranks))
    return tuple(out)


class CommRegistry:
    """Communicator index, kind and members: from ``meta.comms``, else learned from rows."""

    def __init__(self, meta: JobMeta) -> None:
        self.meta = meta
        self.ids: list[int] = []
        self.kinds: list[str] = []
        self.members: list[dict[int, int]] = []  # comm index -> {comm_rank: rank}
        self.sizes: list[int] = []
        self.p2p_only: list[bool] = []
        self._index: dict[int, int] = {}
        self._sorted: np.ndarray | None = None  # ids sorted, and their indices
        self._sorted_idx = np.zeros(0, dtype=np.int64)
        self._learning = True  # some communicator's members are still being learned
        for c in meta.comms:
            i = self._add(c.comm, len(c.ranks))
            self.members[i] = dict(enumerate(c.ranks))
            self.kinds[i] = c.kind
            # a communicator the job meta declares is a collective group (a ring) unless
            # it is a pipeline's
            self.p2p_only[i] = c.kind == "pp"

    def _add(self, comm: int, size: int) -> int:
        i = len(self.ids)
        self._index[comm] = i
        self.ids.append(comm)
        self.kinds.append("")
        self.members.append({})
        self.sizes.append(size)
        self.p2p_only.append(True)
        self._sorted = None
        self._learning = True
        return i

    def index(self, comm: int) -> int:
        return self._index[comm]

    def kind(self, i: int) -> str:
        return self.kinds[i] or "other"

    def ranks(self, i: int) -> list[int]:
        m = self.members[i]
        return [m[k] for k in sorted(m)]

    def observe(self, comm: np.ndarray, cr: np.ndarray, size: np.ndarray, rank: np.ndarray,
                op: np.ndarray) -> np.ndarray:
        """Register new communicators and members; return the comm index of every row."""
        comm = np.asarray(comm, dtype=np.uint64)
        pos, hit = self._find(comm)
        if not hit.all():
            uniq, first = np.unique(comm[~hit], return_index=True)
            sizes = size[np.flatnonzero(~hit)[first]]
            for c, sz in zip(uniq.tolist(), sizes.tolist(), strict=True):
                self._add(c, int(sz))
            pos, hit = self._find(comm)
        rows_idx = self._sorted_idx[pos]
        if self._learning:
            idx = np.unique(rows_idx)
            learning = np.array([not self.kinds[i] for i in idx.tolist()], dtype=bool)
            self._learning = bool(learning.any())
        else:
            learning = np.zeros(0, dtype=bool)
        if learning.any():
            sel = np.isin(rows_idx, idx[learning])
            key = np.unique(np.stack([rows_idx[sel], cr[sel], rank[sel],
                                      (op[sel] < SEND).astype(np.int64)], axis=1), axis=0)
            for i, c, r, coll in key.tolist():
                self.members[i][c] = r
                if coll:
                    self.p2p_only[i] = False
            for i in idx[learning].tolist():
                if len(self.members[i]) >= self.sizes[i]:
                    self.kinds[i] = infer_comm_kind(self.ranks(i), self.meta, self.p2p_only[i])
            self._learning = True
        return rows_idx

    def _find(self, comm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions of ``comm`` values in the sorted communicator ids, and which are known."""
        if self._sorted is None:
            ids = np.array(self.ids, dtype=np.uint64)
            o = np.argsort(ids, kind="stable")
            self._sorted, self._sorted_idx = ids[o], o.astype(np.int64)
        if len(self._sorted) == 0:
            return np.zeros(len(comm), dtype=np.int64), np.zeros(len(comm), dtype=bool)
        pos = np.minimum(np.searchsorted(self._sorted, comm), len(self._sorted) - 1)
        return pos, self._sorted[pos] == comm

    def snapshot(self) -> dict[str, Any]:
        return {"ids": list(self.ids), "kinds": list(self.kinds),
                "members": [[[c, r] for c, r in sorted(m.items())] for m in self.members],
                "sizes": list(self.sizes), "p2p_only": list(self.p2p_only)}

    def restore(self, state: dict[str, Any]) -> None:
        self.ids = [int(x) for x in state["ids"]]
        self.kinds = [str(x) for x in state["kinds"]]
        self.members = [{int(c): int(r) for c, r in m} for m in state["members"]]
        self.sizes = [int(x) for x in state["sizes"]]
        self.p2p_only = [bool(x) for x in state["p2p_only"]]
        self._index = {c: i for i, c in enumerate(self.ids)}
        self._sorted = None
        self._learning = True


# ---------------------------------------------------------------------------------------------
# joining enter/end rows into rounds

_POP = ("rank", "comm", "cidx", "cr", "size", "seq", "op", "nbytes", "peer", "te", "tx",
        "ts", "k")


def _empty_pending() -> dict[str, np.ndarray]:
    return {name: np.zeros(0, dtype=np.uint64 if name == "comm" else np.int64)
            for name in _POP}


@dataclass
class Rounds:
    """Completed rounds of one batch (arrays per round) and their members' waits."""

    cidx: np.ndarray
    comm: np.ndarray
    seq: np.ndarray
    op: np.ndarray
    nbytes: np.ndarray
    members: np.ndarray
    t_first: np.ndarray
    t_last: np.ndarray
    t_end: np.ndarray
    last_rank: np.ndarray
    dmax: np.ndarray
    dmin: np.ndarray
    transfer: np.ndarray
    group: np.ndarray  # -1 for a collective, src * 2^32 + dst (global ranks) for p2p
    # members (one entry per member of every round)
    m_round: np.ndarray
    m_rank: np.ndarray
    m_wait: np.ndarray

    def __len__(self) -> int:
        return len(self.comm)


class RoundJoiner:
    """Joins ``enter``/``end`` rows into collective and point-to-point rounds (CCL-D §5.1
    Trace ID). State: the member operations of incomplete rounds, and per point-to-point
    channel the number of calls seen (to match the k-th send with the k-th recv)."""

    def __init__(self, registry: CommRegistry, max_age_ns: int = 600_000_000_000) -> None:
        self.registry = registry
        self.max_age_ns = max_age_ns
        self.pending = _empty_pending()
        self.p2p_keys = np.zeros(0, dtype=np.int64)  # packed (cidx, rank, peer, is_recv)
        self.p2p_counts = np.zeros(0, dtype=np.int64)  # calls seen on that channel

    def update(self, coll: pa.Table) -> Rounds:
        n = coll.num_rows
        # decoded once per table for every detector of the job
        cols = coll_columns(coll)
        rank, comm, cr, size = cols["rank"], cols["comm"], cols["comm_rank"], cols["comm_size"]
        seq, opc, nbytes, peer = cols["seq"], cols["op"], cols["bytes"], cols["peer"]
        is_enter, t, ts_col = cols["is_enter"], cols["t"], cols["t_start"]
        cidx = self.registry.observe(comm, cr, size, rank, opc)
        null = np.full(n, NULL_TIME, dtype=np.int64)
        new = {
            "rank": rank, "comm": comm, "cidx": cidx, "cr": cr, "size": size, "seq": seq,
            "op": opc, "nbytes": nbytes, "peer": peer,
            "te": np.where(is_enter, t, null), "tx": np.where(is_enter, null, t),
            "ts": np.where(is_enter, null, ts_col), "k": np.full(n, -1, dtype=np.int64),
        }
        self._assign_k(new, is_enter)
        ops = self._merge(new)
        return self._complete(ops, int(t.max()) if n else 0)

    def _assign_k(self, new: dict[str, np.ndarray], is_enter: np.ndarray) -> None:
        """k-th call on a (comm, rank, peer, op) point-to-point channel, in seq order; the
        per-channel counts are a sorted key array (vectorized lookup and insert)."""
        sel = np.flatnonzero(is_enter & ((new["op"] == SEND) | (new["op"] == RECV)))
        if len(sel) == 0:
            return
        key = ((new["cidx"][sel] << 42) | (new["rank"][sel] << 21)
               | ((new["peer"][sel] & 0xFFFFF) << 1) | (new["op"][sel] == RECV))
        order = np.lexsort((new["seq"][sel], key))
        sel, key = sel[order], key[order]
        starts = _group_starts(key)
        sizes = np.diff(np.append(starts, len(key)))
        ukeys = key[starts]
        if len(self.p2p_keys):
            pos = np.minimum(np.searchsorted(self.p2p_keys, ukeys), len(self.p2p_keys) - 1)
            known = self.p2p_keys[pos] == ukeys
            base = np.where(known, self.p2p_counts[pos], 0)
        else:
            pos = np.zeros(len(ukeys), dtype=np.int64)
            known = np.zeros(len(ukeys), dtype=bool)
            base = np.zeros(len(ukeys), dtype=np.int64)
        within = np.arange(len(key)) - np.repeat(starts, sizes)
        new["k"][sel] = np.repeat(base, sizes) + within
        self.p2p_counts[pos[known]] += sizes[known]
        if (~known).any():
            keys = np.concatenate([self.p2p_keys, ukeys[~known]])
            counts = np.concatenate([self.p2p_counts, sizes[~known]])
            o = np.argsort(keys, kind="stable")
            self.p2p_keys, self.p2p_counts = keys[o], counts[o]

    def _merge(self, new: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Pending member operations plus new rows, one entry per (comm, rank, seq)."""
        if len(self.pending["rank"]):
            allr = {c: np.concatenate([self.pending[c], new[c]]) for c in _POP}
        else:
            allr = new
        if len(allr["rank"]) == 0:
            return allr
        key = _pack(allr, ("cidx", "rank", "seq"))
        if key is None:
            order, starts = _sorted_groups(allr, ("cidx", "rank", "seq"))
        else:
            # the rows of one operation are merged whatever their order: no stable sort
            order = np.argsort(key)
            sk = key[order]
            starts = np.flatnonzero(np.concatenate(([True], sk[1:] != sk[:-1])))
        first = order[starts]
        out = {c: allr[c][first] for c in _POP if c not in ("te", "tx", "ts", "k")}
        for c in ("te", "tx", "ts", "k"):
            out[c] = np.maximum.reduceat(allr[c][order], starts)
        return out

    def _complete(self, ops: dict[str, np.ndarray], now: int) -> Rounds:
        valid = (ops["te"] != NULL_TIME) & (ops["tx"] != NULL_TIME)
        is_p2p = (ops["op"] == SEND) | (ops["op"] == RECV)
        done = np.zeros(len(valid), dtype=bool)
        parts: list[tuple[np.ndarray, np.ndarray]] = []  # (rows, members per round)
        n_p2p = 0
        # collectives: all comm_size members have entered and ended
        c = np.flatnonzero(~is_p2p)
        if len(c):
            sub = {k: ops[k][c] for k in ("cidx", "seq", "rank")}
            order = c[_order_unique(sub, ("cidx", "seq", "rank"))]
            starts = _group_starts(ops["cidx"][order], ops["seq"][order])
            nvalid = np.add.reduceat(valid[order].astype(np.int64), starts)
            nrows = np.diff(np.append(starts, len(order)))
            ok = (nvalid == ops["size"][order][starts]) & (nrows == nvalid)
            sel_rows = np.repeat(ok, nrows)
            rows = order[sel_rows]
            done[rows] = True
            if len(rows):
                parts.append((rows, nrows[ok]))
        # point-to-point: the k-th send a->b with the k-th recv on b from a
        p = np.flatnonzero(is_p2p & (ops["k"] >= 0))
        if len(p):
            src = np.where(ops["op"][p] == SEND, ops["cr"][p], ops["peer"][p])
            dst = np.where(ops["op"][p] == SEND, ops["peer"][p], ops["cr"][p])
            sub = {"cidx": ops["cidx"][p], "src": src, "dst": dst, "k": ops["k"][p],
                   "op": ops["op"][p]}
            order = _order_unique(sub, ("cidx", "src", "dst", "k", "op"))
            q = p[order]
            src, dst = src[order], dst[order]
            starts = _group_starts(ops["cidx"][q], src, dst, ops["k"][q])
            nrows = np.diff(np.append(starts, len(q)))
            nvalid = np.add.reduceat(valid[q].astype(np.int64), starts)
            nsend = np.add.reduceat((ops["op"][q] == SEND).astype(np.int64), starts)
            ok = (nrows == 2) & (nvalid == 2) & (nsend == 1)
            rows = q[np.repeat(ok, nrows)]
            done[rows] = True
            if len(rows):
                parts.append((rows, nrows[ok]))
                n_p2p = int(ok.sum())
        keep = ~done
        if self.max_age_ns and now:
            last = np.maximum(ops["te"], ops["tx"])
            keep &= last >= now - self.max_age_ns
        self.pending = {c: v[keep] for c, v in ops.items()}
        if not parts:
            return _concat_rounds([])
        # collectives first, then point-to-point rounds: one pass over both
        rows = np.concatenate([r for r, _ in parts])
        sizes = np.concatenate([z for _, z in parts])
        gid = np.repeat(np.arange(len(sizes)), sizes)
        is_p2p_round = np.zeros(len(sizes), dtype=bool)
        if n_p2p:
            is_p2p_round[len(sizes) - n_p2p:] = True
        return self._rounds(ops, rows, gid, is_p2p_round)

    @staticmethod
    def _rounds(ops: dict[str, np.ndarray], rows: np.ndarray, gid: np.ndarray,
                p2p: np.ndarray) -> Rounds:
        """Round statistics; ``rows`` grouped contiguously by ``gid`` (increasing);
        ``p2p`` per round. In a point-to-point round the send sorts before the recv (op
        code order)."""
        te, tx, ts = ops["te"][rows], ops["tx"][rows], ops["ts"][rows]
        rank = ops["rank"][rows]
        dur = tx - te
        starts = _group_starts(gid)
        counts = np.diff(np.append(starts, len(gid)))
        dmax = np.maximum.reduceat(dur, starts)
        dmin = np.minimum.reduceat(dur, starts)
        # the member with the shortest duration entered last (clock-robust); rows of a
        # round are in rank order (collectives), so the first shortest is the lowest rank
        is_min = np.flatnonzero(dur == np.repeat(dmin, counts))
        g = gid[is_min]
        firsts = np.flatnonzero(np.concatenate(([True], g[1:] != g[:-1])))
        last_rank = rank[is_min[firsts]]
        # a transfer start is usable when it lies between the member's enter and end (same
        # host clock); some sources write 0 or another clock's time when they do not know it
        has_ts = (ts != NULL_TIME) & (ts >= te) & (ts <= tx)
        xfer = np.where(has_ts, tx - ts, 0).astype(np.float64)
        n_ts = np.add.reduceat(has_ts.astype(np.int64), starts)
        sum_ts = np.add.reduceat(xfer, starts)
        # whole nanoseconds: sums stay exact whatever the batching
        transfer = np.where(n_ts > 0, np.rint(sum_ts / np.maximum(n_ts, 1)),
                            dmin.astype(np.float64))
        first = rows[starts]
        # point-to-point: the send sorts first (op code order): its seq, bytes and rank name
        # the round, the pair of ranks its group
        second = np.minimum(starts + 1, len(rank) - 1)
        group = np.where(p2p, (rank[starts] << 32) | rank[second], -1)
        op = np.where(p2p, SEND, ops["op"][first])
        wait = dur - np.repeat(dmin, counts)
        return Rounds(
            cidx=ops["cidx"][first], comm=ops["comm"][first], seq=ops["seq"][first], op=op,
            nbytes=ops["nbytes"][first], members=counts,
            t_first=np.minimum.reduceat(te, starts), t_last=np.maximum.reduceat(te, starts),
            t_end=np.maximum.reduceat(tx, starts), last_rank=last_rank, dmax=dmax, dmin=dmin,
            transfer=transfer, group=group,
            m_round=gid, m_rank=rank, m_wait=wait,
        )

    def snapshot(self) -> dict[str, Any]:
        return {"pending": {c: (v.view(np.int64) if c == "comm" else v).tolist()
                            for c, v in self.pending.items()},
                "p2p_keys": self.p2p_keys.tolist(), "p2p_counts": self.p2p_counts.tolist()}

    def restore(self, state: dict[str, Any]) -> None:
        self.pending = {c: np.array(state["pending"][c], dtype=np.int64) for c in _POP}
        self.pending["comm"] = self.pending["comm"].view(np.uint64)
        self.p2p_keys = np.array(state["p2p_keys"], dtype=np.int64)
        self.p2p_counts = np.array(state["p2p_counts"], dtype=np.int64)


def _order_unique(cols: dict[str, np.ndarray], by: tuple[str, ...]) -> np.ndarray:
    """The order sorting rows by the ``by`` columns when they identify each row (so any
    sort gives the stable sort's order): one unstable sort of the packed key."""
    key = _pack(cols, by) if len(cols[by[0]]) else None
    if key is None:
        return _sorted_groups(cols, by)[0]
    return np.argsort(key)


def _concat_rounds(parts: list[Rounds]) -> Rounds:
    if not parts:
        z = np.zeros(0, dtype=np.int64)
        return Rounds(z, z.astype(np.uint64), z, z, z, z, z, z, z, z, z, z,
                      z.astype(np.float64), z, z, z, z)
    if len(parts) == 1:
        return parts[0]
    offset = 0
    fields = {}
    for name in Rounds.__dataclass_fields__:
        arrays = []
        offset = 0
        for p in parts:
            a = getattr(p, name)
            if name == "m_round":
                a = a + offset
                offset += len(p)
            arrays.append(a)
        fields[name] = np.concatenate(arrays)
    return Rounds(**fields)


def rounds_table(job: str, r: Rounds) -> pa.Table:
    """``rounds`` rows (failslow.results) of completed rounds."""
    n = len(r)
    ops = pa.array(events.COLL_OPS)
    return pa.Table.from_arrays([
        pa.repeat(pa.scalar(job, pa.string()), n),
        pa.array(r.comm, pa.uint64()),
        pa.array(r.seq.astype(np.uint64), pa.uint64()),
        pc.take(ops, pa.array(r.op.astype(np.int32))),
        pa.array(r.nbytes.view(np.uint64), pa.uint64()),
        pa.array(r.members.astype(np.int32), pa.int32()),
        pa.array(r.t_first, pa.int64()),
        pa.array(r.t_last, pa.int64()),
        pa.array(r.t_end, pa.int64()),
        pa.array(r.last_rank.astype(np.int32), pa.int32()),
        pa.array(r.dmax, pa.int64()),
        pa.array(r.dmin, pa.int64()),
    ], schema=results.SCHEMAS["rounds"])


# ---------------------------------------------------------------------------------------------
# dense ids


class _KeyIndex:
    """Dense ids ``0, 1, ...`` for int64 keys, in the order keys are first seen (new keys of
    one call in ascending order): a sorted key array, so a batch is looked up with one
    binary search per row and no per-key Python."""

    def __init__(self, pairs: Sequence[tuple[int, int]] = ()) -> None:
        self.keys = np.zeros(0, dtype=np.int64)  # sorted
        self.ids = np.zeros(0, dtype=np.int64)
        if pairs:
            arr = np.array(pairs, dtype=np.int64).reshape(-1, 2)
            o = np.argsort(arr[:, 0], kind="stable")
            self.keys, self.ids = arr[o, 0], arr[o, 1]

    def __len__(self) -> int:
        return len(self.keys)

    def _find(self, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if len(self.keys) == 0:
            return np.zeros(len(k), dtype=np.int64), np.zeros(len(k), dtype=bool)
        pos = np.minimum(np.searchsorted(self.keys, k), len(self.keys) - 1)
        return pos, self.keys[pos] == k

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """The id of every key, registering the new ones."""
        k = np.asarray(keys, dtype=np.int64).reshape(-1)
        pos, hit = self._find(k)
        if not hit.all():
            new = np.unique(k[~hit])
            keys_all = np.concatenate([self.keys, new])
            ids_all = np.concatenate([self.ids, len(self.keys) + np.arange(len(new))])
            o = np.argsort(keys_all, kind="stable")
            self.keys, self.ids = keys_all[o], ids_all[o]
            pos, hit = self._find(k)
        return self.ids[pos]

    def get(self, key: int) -> int | None:
        pos, hit = self._find(np.array([key], dtype=np.int64))
        return int(self.ids[pos[0]]) if hit[0] else None

    def pairs(self) -> list[list[int]]:
        """``[key, id]`` pairs in id order."""
        o = np.argsort(self.ids, kind="stable")
        return [[int(a), int(b)] for a, b in zip(self.keys[o].tolist(), self.ids[o].tolist(),
                                                  strict=True)]

    def key_of(self) -> np.ndarray:
        """The key of every id (indexed by id)."""
        out = np.zeros(len(self.keys), dtype=np.int64)
        out[self.ids] = self.keys
        return out


# ---------------------------------------------------------------------------------------------
# time-binned statistics


class BinTable:
    """Statistics summed per key and time bin (bin = time >> shift). ``arg`` names a column
    maximized per key whose row also supplies the ``carried`` columns (CCL-D's round with
    the largest range and its T_max, T_min).

    Rows are appended as they come (no sort per batch) and summed when the table compacts;
    the compacted part is sorted by bin, so a time-window query slices it by binary search
    and scans only the rows appended since."""

    def __init__(self, keys: tuple[str, ...], sums: tuple[str, ...], arg: str | None = None,
                 carried: tuple[str, ...] = ()) -> None:
        self.keys, self.sums, self.arg, self.carried = keys, sums, arg, carried
        self.floats = sums + ((arg,) if arg else ()) + carried
        self._names = ("bin", *keys, *self.floats)
        self._data: dict[str, np.ndarray] = {}
        self._chunks: list[dict[str, np.ndarray]] = []
        self._pending_rows = 0
        # query results by (lo, hi, by): a window no later row falls into is summed once
        # (the reference window of an anomaly is asked for at every iteration)
        self._cache: dict[tuple[Any, ...], dict[str, np.ndarray]] = {}
        self.clear()
        self._compacted = 0

    def clear(self) -> None:
        self._data = {k: np.zeros(0, dtype=np.int64) for k in ("bin", *self.keys)}
        self._data.update({f: np.zeros(0) for f in self.floats})
        self._chunks, self._pending_rows = [], 0
        self._cache = {}
        self._chunk_low = 2**62  # the least bin of the pending chunks

    @property
    def data(self) -> dict[str, np.ndarray]:
        """All rows, compacted (sorted by bin and keys, one row per bin and key)."""
        if self._chunks:
            self.compact()
        return self._data

    def __len__(self) -> int:
        return len(self._data["bin"]) + self._pending_rows

    def add(self, cols: dict[str, np.ndarray]) -> None:
        """Append rows; they are summed with the others when the table compacts (rows
        pending beyond twice the compacted size), so a batch costs no sort."""
        if len(cols["bin"]) == 0:
            return
        low = int(cols["bin"].min())
        if self._cache:
            self._cache = {k: v for k, v in self._cache.items() if k[1] <= low}
        self._chunk_low = min(self._chunk_low, low)
        self._chunks.append({k: cols[k] for k in self._names})
        self._pending_rows += len(cols["bin"])
        if self._pending_rows > 2 * self._compacted + 65536:
            self.compact()

    def compact(self) -> None:
        parts = [self._data, *self._chunks]
        allr = {k: np.concatenate([p[k] for p in parts]) for k in self._names}
        self._data = _aggregate(allr, ("bin", *self.keys), self.sums, self.arg, self.carried)
        self._chunks, self._pending_rows = [], 0
        self._chunk_low = 2**62
        self._compacted = len(self._data["bin"])

    def rebin(self, delta: int) -> None:
        self._cache = {}
        if delta > 0:
            self.compact()
            self._data["bin"] = self._data["bin"] >> delta
            self.compact()

    def prune(self, min_bin: int) -> None:
        """Drop the rows of bins before ``min_bin``."""
        self._cache = {k: v for k, v in self._cache.items() if k[0] >= min_bin}
        cut = int(np.searchsorted(self._data["bin"], min_bin, side="left"))
        if cut:
            self._data = {k: v[cut:] for k, v in self._data.items()}
            self._compacted = len(self._data["bin"])
        if min_bin <= self._chunk_low:
            return  # no pending row is that old
        kept = []
        for ch in self._chunks:
            keep = ch["bin"] >= min_bin
            if keep.all():
                kept.append(ch)
            elif keep.any():
                kept.append({k: v[keep] for k, v in ch.items()})
        self._chunks = kept
        self._pending_rows = sum(len(ch["bin"]) for ch in kept)
        self._chunk_low = min((int(ch["bin"].min()) for ch in kept), default=2**62)

    def window(self, lo: int, hi: int) -> dict[str, np.ndarray]:
        """The raw rows with ``lo <= bin < hi`` (not summed)."""
        b = self._data["bin"]
        i, j = int(np.searchsorted(b, lo, "left")), int(np.searchsorted(b, hi, "left"))
        parts = [{k: v[i:j] for k, v in self._data.items()}]
        for ch in self._chunks:
            sel = (ch["bin"] >= lo) & (ch["bin"] < hi)
            if sel.any():
                parts.append({k: v[sel] for k, v in ch.items()})
        if len(parts) == 1:
            return parts[0]
        return {k: np.concatenate([p[k] for p in parts]) for k in self._names}

    def query(self, lo: int, hi: int, by: tuple[str, ...]) -> dict[str, np.ndarray]:
        """Rows with ``lo <= bin < hi`` summed by the ``by`` keys (the caller must not
        modify the arrays: results are cached until a row falls into the window)."""
        key = (lo, hi, by)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = _aggregate(self.window(lo, hi), by, self.sums, self.arg,
                                                self.carried)
            if len(self._cache) > 64:
                del self._cache[next(iter(self._cache))]
        return hit

    def snapshot(self) -> dict[str, Any]:
        return {k: v.tolist() for k, v in self.data.items()}

    def restore(self, state: dict[str, Any]) -> None:
        self._data = {k: np.array(state[k], dtype=np.float64 if k in self.floats else np.int64)
                      for k in self._names}
        self._chunks, self._pending_rows = [], 0
        self._chunk_low = 2**62
        self._compacted = len(self._data["bin"])
        self._cache = {}


def _aggregate(cols: dict[str, np.ndarray], by: tuple[str, ...], sums: tuple[str, ...],
               arg: str | None, carried: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Rows summed per distinct ``by`` key, in key order; ``arg``: the column maximized
    per key, whose row also gives the ``carried`` columns."""
    n = len(cols[by[0]])
    if n == 0:
        out = {k: cols[k][:0] for k in by}
        out.update({f: np.zeros(0) for f in (*sums, *((arg,) if arg else ()), *carried)})
        return out
    key = _pack(cols, by)
    if key is None:
        sort_keys = [cols[k] for k in reversed(by)]
        if arg:
            sort_keys.insert(0, -cols[arg])
        order = np.lexsort(sort_keys)
        srt = {k: cols[k][order] for k in by}
        starts = _group_starts(*[srt[k] for k in by])
    else:
        order = np.argsort(key, kind="stable")
        sk = key[order]
        starts = np.flatnonzero(np.concatenate(([True], sk[1:] != sk[:-1])))
        if arg:
            # per key the first row (in input order) with the largest ``arg``: the row a
            # stable sort by (key, -arg) puts first
            v = cols[arg][order]
            mx = np.maximum.reduceat(v, starts)
            counts = np.diff(np.append(starts, len(order)))
            at = np.flatnonzero(v == np.repeat(mx, counts))
            grp = np.searchsorted(starts, at, side="right") - 1
            keep = np.concatenate(([True], grp[1:] != grp[:-1]))
            best = order[at[keep]]
            out = {k: cols[k][order[starts]] for k in by}
            for f in sums:
                out[f] = np.add.reduceat(cols[f][order].astype(np.float64, copy=False), starts)
            out[arg] = cols[arg][best].astype(np.float64)
            for f in carried:
                out[f] = cols[f][best].astype(np.float64)
            return out
    first = order[starts]
    out = {k: cols[k][first] for k in by}
    for f in sums:
        out[f] = np.add.reduceat(cols[f][order].astype(np.float64, copy=False), starts)
    if arg:
        out[arg] = cols[arg][first].astype(np.float64)
        for f in carried:
            out[f] = cols[f][first].astype(np.float64)
    return out


def _lookup(keys: np.ndarray, table_keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """values of ``table_keys`` at ``keys`` (0 where absent); keys are int64 arrays."""
    if len(table_keys) == 0:
        return np.zeros(len(keys))
    order = np.argsort(table_keys)
    sk = table_keys[order]
    pos = np.clip(np.searchsorted(sk, keys), 0, len(sk) - 1)
    hit = sk[pos] == keys
    return np.where(hit, values[order][pos], 0.0)


# ---------------------------------------------------------------------------------------------
# localization helpers


def ccld_ratios(t_base: float, dmax: np.ndarray, dmin: np.ndarray, skew_base: float = 0.0
                ) -> tuple[float | None, float | None]:
    """CCL-D §4.2: over the rounds of a window (their longest and shortest member
    durations), take the round with the largest range ``T_max(r) - T_min(r)`` (Eq. 2);
    ``R = (T_max - T_base) / T_base`` (Eq. 3) and ``P = (T_max - T_min) / (T_max - T_base)``
    (Eq. 4, clipped to [0, 1]; None when ``T_max <= T_base``). P > beta (0.6) points at
    computation (the last rank to enter), P < alpha (0.4) at communication.

    ``skew_base``: the range ``T_max - T_min`` of the class's healthy rounds (the rounds that
    made ``T_base``). CCL-D's collectives start nearly together when healthy, so their range
    is ~0 and Eq. 4 is used as is; where healthy rounds already have a range (a pipeline's
    receive is posted long before its send arrives), only the range beyond the healthy one
    is the late arrival's share: ``P = (T_max - T_min - skew_base) / (T_max - T_base)``."""
    if len(dmax) == 0 or t_base <= 0:
        return None, None
    j = int(np.argmax(np.asarray(dmax, dtype=np.float64) - np.asarray(dmin, dtype=np.float64)))
    t_max, t_min = float(dmax[j]), float(dmin[j])
    r_val = (t_max - t_base) / t_base
    p_val = None
    if t_max > t_base:
        share = (t_max - t_min - max(skew_base, 0.0)) / (t_max - t_base)
        p_val = round(min(max(share, 0.0), 1.0), 4)
    return round(r_val, 4), p_val


def cause_from_p(p: float | None, alpha: float = 0.4, beta: float = 0.6) -> str | None:
    """CCL-D's attribution from P: compute above beta, communication below alpha, mixed
    between; None when P is unknown."""
    if p is None:
        return None
    if p > beta:
        return "compute"
    if p < alpha:
        return "communication"
    return "mixed"


class CCLDMonitor:
    """CCL-D §4.2.1 slow detection per round class (communicator, op, bytes).

    * ``T_base``: the configured initial value (``t_base_init_ns``) until ``m`` rounds were
      seen, then the mean ``T_max`` of the first ``m = min(baseline_rounds, rounds in the
      first baseline_seconds)`` rounds (Eq. 1); the mean range ``T_max - T_min`` of the same
      rounds is kept too (the healthy skew, see :func:`ccld_ratios`).
    * Detection windows of ``window_s`` (one minute by default): in each, the round with the
      largest range gives ``R`` (Eqs. 2-3). A window is slow when ``R`` exceeds ``theta``,
      set from the observed distribution of the class's own past windows (median plus
      ``theta_k`` robust deviations, at least ``theta_min``; CCL-D's practical value 3
      until ``theta_windows`` windows were seen). An alarm is raised when ``repeat``
      consecutive windows are slow, so one-off jitter is not reported.

    The alarms are evidence for the fused diagnosis (they do not open anomalies: a slow
    anomaly is a slower job, diagnosis.md); ``T_base`` and the healthy skew give R and P.
    """

    def __init__(self, config: SlowdownConfig) -> None:
        self.config = config
        self.keys = _KeyIndex()  # class key -> dense index
        self.n = np.zeros(0)  # rounds in the baseline so far
        m = config.baseline_rounds
        # the baseline rounds themselves (end time, T_max, range), so a baseline still being
        # learned is read as of a given trace time
        self.b_t = np.zeros((0, m), dtype=np.int64)
        self.b_max = np.zeros((0, m))
        self.b_range = np.zeros((0, m))
        self.first_t = np.zeros(0, dtype=np.int64)
        self.frozen = np.zeros(0, dtype=bool)
        self.windows = BinTable(("key",), ("n",), arg="range", carried=("tmax", "tmin"))
        self.closed = -1  # last closed window index
        self.hist: dict[int, list[float]] = {}
        self.run: dict[int, int] = {}
        self.alarms: list[dict[str, Any]] = []

    def _dense(self, keys: np.ndarray) -> np.ndarray:
        before = len(self.keys)
        idx = self.keys.lookup(keys)
        grow = len(self.keys) - before
        if grow:
            m = self.config.baseline_rounds
            self.n = np.concatenate([self.n, np.zeros(grow)])
            self.b_t = np.concatenate([self.b_t, np.zeros((grow, m), dtype=np.int64)])
            self.b_max = np.concatenate([self.b_max, np.zeros((grow, m))])
            self.b_range = np.concatenate([self.b_range, np.zeros((grow, m))])
            self.first_t = np.concatenate([self.first_t, np.zeros(grow, dtype=np.int64)])
            self.frozen = np.concatenate([self.frozen, np.zeros(grow, dtype=bool)])
        return idx

    def update(self, key: np.ndarray, t_end: np.ndarray, dmax: np.ndarray, dmin: np.ndarray
               ) -> None:
        """Account completed rounds (arrays per round, any order)."""
        c = self.config
        if len(key) == 0:
            return
        d_all = self._dense(key)
        mx_all = dmax.astype(np.float64)
        mn_all = dmin.astype(np.float64)
        horizon = int(c.baseline_seconds * 1e9)
        # only classes still learning T_base need the per-class bookkeeping
        learning = (self.n[d_all] < c.baseline_rounds) & ~self.frozen[d_all]
        if learning.any():
            d, te = d_all[learning], t_end[learning]
            mx, mn = mx_all[learning], mn_all[learning]
            order, _ = _sorted_groups({"d": d, "t": te}, ("d", "t"))
            d, te, mx, mn = d[order], te[order], mx[order], mn[order]
            starts = _group_starts(d)
            sizes = np.diff(np.append(starts, len(d)))
            ud = d[starts]
            new = self.n[ud] == 0
            self.first_t[ud[new]] = te[starts[new]]
            within = np.arange(len(d)) - np.repeat(starts, sizes)
            in_time = te <= self.first_t[d] + horizon
            slot = (self.n[d] + within).astype(np.int64)
            take = (slot < c.baseline_rounds) & in_time
            self.b_t[d[take], slot[take]] = te[take]
            self.b_max[d[take], slot[take]] = mx[take]
            self.b_range[d[take], slot[take]] = mx[take] - mn[take]
            self.n += np.bincount(d[take], minlength=len(self.n))
            # a class whose rounds run past its first two minutes is frozen (Eq. 1)
            self.frozen[np.unique(d[~in_time])] = True
        te, mx, mn, d = t_end, mx_all, mn_all, d_all
        w = te // int(c.ccld_window_s * 1e9)
        self.windows.add({"bin": w, "key": d, "n": np.ones(len(d)), "range": mx - mn,
                          "tmax": mx, "tmin": mn})

    def base(self, key: int, until: int | None = None) -> tuple[float | None, float]:
        """``(T_base, healthy range)`` of a class from its baseline rounds that ended
        before ``until`` (all when None); the configured initial value until ``m`` rounds
        are in (None when there is none and no round is)."""
        d = self.keys.get(key)
        init = self.config.t_base_init_ns
        if d is None or self.n[d] == 0:
            return (float(init) if init else None), 0.0
        k = int(self.n[d])
        sel = slice(0, k)
        t, mx, rg = self.b_t[d, sel], self.b_max[d, sel], self.b_range[d, sel]
        if until is not None:
            ok = t < until
            t, mx, rg = t[ok], mx[ok], rg[ok]
        if len(t) == 0 or (len(t) < self.config.baseline_rounds and init
                           and not self.frozen[d]):
            return (float(init) if init else None), 0.0
        return float(mx.mean()), float(rg.mean())

    def close(self, now_ns: int) -> list[dict[str, Any]]:
        """Close the detection windows that ended before ``now_ns``; return new alarms."""
        c = self.config
        w_ns = int(c.ccld_window_s * 1e9)
        last = now_ns // w_ns - 1
        if last <= self.closed or len(self.windows) == 0:
            return []
        rows = self.windows.query(self.closed + 1, last + 1, ("bin", "key"))
        self.windows.prune(last + 1)
        self.closed = last
        inv = self.keys.key_of()
        out = []
        for b, d, tmax, tmin in zip(rows["bin"].tolist(), rows["key"].tolist(),
                                    rows["tmax"].tolist(), rows["tmin"].tolist(), strict=True):
            t_base, skew = self.base(int(inv[d]), until=now_ns)
            if not t_base:
                continue
            r_val, p_val = ccld_ratios(t_base, np.array([tmax]), np.array([tmin]), skew)
            if r_val is None:
                continue
            hist = self.hist.setdefault(d, [])
            if len(hist) >= c.theta_windows:
                h = np.array(hist)
                med = float(np.median(h))
                theta = max(c.theta_min, med + c.theta_k * 1.4826
                            * float(np.median(np.abs(h - med))))
            else:
                theta = c.theta_default
            if r_val > theta:
                self.run[d] = self.run.get(d, 0) + 1
                if self.run[d] == c.ccld_repeat:
                    out.append({"key": int(inv[d]), "window": int(b), "R": r_val, "P": p_val,
                                "theta": round(theta, 4), "t_ns": int((b + 1) * w_ns)})
            else:
                self.run[d] = 0
                hist.append(r_val)
                del hist[:-256]
        self.alarms.extend(out)
        return out

    def snapshot(self) -> dict[str, Any]:
        return {"keys": self.keys.pairs(), "n": self.n.tolist(),
                "b_t": self.b_t.tolist(), "b_max": self.b_max.tolist(),
                "b_range": self.b_range.tolist(),
                "first_t": self.first_t.tolist(), "frozen": self.frozen.tolist(),
                "windows": self.windows.snapshot(), "closed": self.closed,
                "hist": [[k, v] for k, v in self.hist.items()],
                "run": [[k, v] for k, v in self.run.items()], "alarms": self.alarms}

    def restore(self, state: dict[str, Any]) -> None:
        self.keys = _KeyIndex([(int(k), int(v)) for k, v in state["keys"]])
        self.n = np.array(state["n"], dtype=np.float64)
        m = self.config.baseline_rounds
        self.b_t = np.array(state["b_t"], dtype=np.int64).reshape(-1, m)
        self.b_max = np.array(state["b_max"], dtype=np.float64).reshape(-1, m)
        self.b_range = np.array(state["b_range"], dtype=np.float64).reshape(-1, m)
        self.first_t = np.array(state["first_t"], dtype=np.int64)
        self.frozen = np.array(state["frozen"], dtype=bool)
        self.windows.restore(state["windows"])
        self.closed = int(state["closed"])
        self.hist = {int(k): [float(x) for x in v] for k, v in state["hist"]}
        self.run = {int(k): int(v) for k, v in state["run"]}
        self.alarms = list(state["alarms"])


# ---------------------------------------------------------------------------------------------
# per-rank compute, RDMA queue pairs, GPU samples


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

    def __init__(self) -> None:
        self.last_end = np.zeros(0, dtype=np.int64)
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

    def update(self, rank: np.ndarray, t: np.ndarray, is_enter: np.ndarray,
               p2p: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Rows of one batch -> (rank, enter time, gap ns, pass) of the enters with a known
        end before them. ``p2p``: per row the point-to-point kind (see ``ctx``; 0 for a
        collective)."""
        if len(rank) == 0:
            z = np.zeros(0, dtype=np.int64)
            return z, z, z, z
        self._grow(int(rank.max()) + 1)
        # by rank, then time, ends before enters at equal times
        order = _rank_time_order(rank, t, is_enter)
        r, tt, en = rank[order], t[order], is_enter[order]
        kind = p2p[order] if p2p is not None else np.zeros(len(r), dtype=np.int64)
        n = len(r)
        pos = np.where(~en, np.arange(n), -1)
        last = np.maximum.accumulate(pos)
        same = (last >= 0) & (r[np.maximum(last, 0)] == r)
        prev = np.where(same, tt[np.maximum(last, 0)], self.last_end[r])
        sel = en & (prev != NULL_TIME)
        gap = np.maximum(tt[sel] - prev[sel], 0)
        passes = self._passes(r[en], kind[en])[sel[en]]
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

    def snapshot(self) -> dict[str, Any]:
        return {"last_end": self.last_end.tolist(), "ctx": self.ctx.tolist()}

    def restore(self, state: dict[str, Any]) -> None:
        self.last_end = np.array(state["last_end"], dtype=np.int64)
        self.ctx = np.array(state.get("ctx", []), dtype=np.int64).reshape(-1, 6)
        if len(self.ctx) < len(self.last_end):
            self.ctx = np.concatenate([self.ctx, np.zeros((len(self.last_end)
                                                           - len(self.ctx), 6), np.int64)])


class LinkTracker:
    """RDMA work-request telemetry (``link`` rows, MEGATRACE §III-B): per queue pair the
    work requests completed, the bytes and the in-flight count (``posted - completed``)
    between consecutive samples. A link is judged by the mean time a work request spends in
    flight, ``W = sum(in_flight x dt) / completed`` (Little's law over the sampled window):
    it grows when bandwidth falls *while* work is queued, and stays flat on an idle queue
    (VCCL's rule: bandwidth alone misfires on idle queues)."""

    def __init__(self, meta: JobMeta) -> None:
        self.meta = meta
        self.index: dict[str, int] = {}
        self.node_names: list[str] = []
        self.node_ids: dict[str, int] = {}
        self.qp_node = np.zeros(0, dtype=np.int64)
        self.qp_peer = np.zeros(0, dtype=np.int64)
        self.qp_rank = np.zeros(0, dtype=np.int64)
        self.last = np.zeros((0, 4), dtype=np.int64)  # t, posted, completed, bytes

    def _node(self, name: str) -> int:
        i = self.node_ids.get(name)
        if i is None:
            i = self.node_ids[name] = len(self.node_names)
            self.node_names.append(name)
        return i

    def update(self, link: pa.Table) -> dict[str, np.ndarray] | None:
        """Rows of one batch -> bin columns (``bin`` left to the caller: the sample time)."""
        if link.num_rows == 0:
            return None
        rank_col = pc.fill_null(link.column("rank"), -1)
        peer = pc.fill_null(link.column("peer_node"), "")
        key = pc.binary_join_element_wise(link.column("node"), link.column("device"), peer,
                                          pc.cast(rank_col, pa.string()), "\x1f")
        enc = pc.dictionary_encode(key).combine_chunks()
        words = enc.dictionary.to_pylist()
        codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        ids = np.empty(len(words), dtype=np.int64)
        fresh = []
        for j, w in enumerate(words):
            q = self.index.get(w)
            if q is None:
                q = self.index[w] = len(self.index)
                node, _, peer_node, rnk = w.split("\x1f")
                fresh.append((self._node(node), self._node(peer_node) if peer_node else -1,
                              int(rnk)))
            ids[j] = q
        if fresh:
            arr = np.array(fresh, dtype=np.int64).reshape(-1, 3)
            self.qp_node = np.concatenate([self.qp_node, arr[:, 0]])
            self.qp_peer = np.concatenate([self.qp_peer, arr[:, 1]])
            self.qp_rank = np.concatenate([self.qp_rank, arr[:, 2]])
            self.last = np.concatenate([self.last, np.full((len(arr), 4), NULL_TIME,
                                                           dtype=np.int64)])
        qp = ids[codes]
        t = link.column("t").to_numpy()
        vals = np.stack([t, link.column("posted").to_numpy().astype(np.int64),
                         link.column("completed").to_numpy().astype(np.int64),
                         link.column("bytes").to_numpy().astype(np.int64)], axis=1)
        order = np.lexsort((t, qp))
        qp, vals = qp[order], vals[order]
        starts = _group_starts(qp)
        prev = np.empty_like(vals)
        prev[1:] = vals[:-1]
        prev[starts] = self.last[qp[starts]]
        ends = np.append(starts[1:] - 1, len(qp) - 1)
        self.last[qp[ends]] = vals[ends]
        ok = (prev[:, 0] != NULL_TIME) & (vals[:, 0] > prev[:, 0])
        if not ok.any():
            return None
        dt = (vals[ok, 0] - prev[ok, 0]).astype(np.float64)
        inflight = 0.5 * ((vals[ok, 1] - vals[ok, 2]) + (prev[ok, 1] - prev[ok, 2]))
        return {"t": vals[ok, 0], "qp": qp[ok], "dc": (vals[ok, 2] - prev[ok, 2]).astype(
            np.float64), "lt": np.maximum(inflight, 0.0) * dt,
            "db": (vals[ok, 3] - prev[ok, 3]).astype(np.float64), "dt": dt}

    def snapshot(self) -> dict[str, Any]:
        return {"index": [[k, v] for k, v in self.index.items()],
                "node_names": list(self.node_names), "qp_node": self.qp_node.tolist(),
                "qp_peer": self.qp_peer.tolist(), "qp_rank": self.qp_rank.tolist(),
                "last": self.last.tolist()}

    def restore(self, state: dict[str, Any]) -> None:
        self.index = {str(k): int(v) for k, v in state["index"]}
        self.node_names = [str(x) for x in state["node_names"]]
        self.node_ids = {n: i for i, n in enumerate(self.node_names)}
        self.qp_node = np.array(state["qp_node"], dtype=np.int64)
        self.qp_peer = np.array(state["qp_peer"], dtype=np.int64)
        self.qp_rank = np.array(state["qp_rank"], dtype=np.int64)
        self.last = np.array(state["last"], dtype=np.int64).reshape(-1, 4)


#: NVML clocks-event reasons that mean the GPU slowed itself down: SW power cap, HW
#: slowdown, SW / HW thermal slowdown, HW power brake.
THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


class _WaitGraph:
    """Excess waits (window rate minus baseline rate): per (waiter, communicator) and per
    (communicator, waited-on member). Following a waiter's largest excess to the most
    waited-on member of that communicator, repeatedly, ends at a rank that does not wait:
    the first late rank (MEGATRACE's "trace back along the pipeline")."""

    def __init__(self, registry: CommRegistry, o_rank: np.ndarray, o_cidx: np.ndarray,
                 o_v: np.ndarray, i_cidx: np.ndarray, i_rank: np.ndarray, i_v: np.ndarray
                 ) -> None:
        self.registry = registry
        self.out: dict[tuple[int, int], float] = {}
        self.out_total: dict[int, float] = {}
        self.best_comm: dict[int, tuple[int, float]] = {}
        for r, ci, v in zip(o_rank.tolist(), o_cidx.tolist(), o_v.tolist(), strict=True):
            if v <= 0:
                continue
            self.out[(r, ci)] = v
            self.out_total[r] = self.out_total.get(r, 0.0) + v
            if v > self.best_comm.get(r, (-1, 0.0))[1]:
                self.best_comm[r] = (ci, v)
        self.in_by: dict[int, dict[int, float]] = {}
        self.top: dict[int, tuple[int, float]] = {}  # cidx -> (most waited-on member, v)
        self.ranked: dict[int, list[tuple[float, int]]] = {}  # cidx -> [(v, member)] desc
        for ci, r, v in zip(i_cidx.tolist(), i_rank.tolist(), i_v.tolist(), strict=True):
            if v <= 0:
                continue
            self.in_by.setdefault(r, {})[ci] = v
            self.ranked.setdefault(ci, []).append((v, r))
            if v > self.top.get(ci, (-1, 0.0))[1]:
                self.top[ci] = (r, v)
        for lst in self.ranked.values():
            lst.sort(reverse=True)
        self.votes: dict[int, float] = {}

    def _next(self, rank: int, seen: set[int]) -> int:
        """Whom ``rank`` waits on: in its communicators by decreasing excess wait, the most
        waited-on other member not yet visited (-1: none)."""
        comms = sorted(((v, ci) for (r, ci), v in self.out.items() if r == rank),
                       reverse=True)
        for _, ci in comms:
            for _, m in self.ranked.get(ci, []):
                if m != rank and m not in seen:
                    return m
        return -1

    def roots(self, threshold: float, asym: float, keep_top: bool = True) -> list[int]:
        """Sinks reached from every significant waiter (weighted by its excess wait) whose
        peers wait on them more than they wait on their peers by ``asym``; the most voted
        sink always when ``keep_top``."""
        votes: dict[int, float] = {}
        for start, total in self.out_total.items():
            if total < threshold:
                continue
            r, seen = start, {start}
            while self.out_total.get(r, 0.0) >= threshold:
                nxt = self._next(r, seen)
                if nxt < 0:
                    break
                seen.add(nxt)
                r = nxt
            votes[r] = votes.get(r, 0.0) + total
        self.votes = votes
        sinks = [r for r in votes if self.out_total.get(r, 0.0) < threshold]
        if not sinks:
            return []
        best = max(sinks, key=votes.__getitem__)
        everyone = set(self.out_total) | set(self.in_by)
        return sorted(r for r in sinks if (keep_top and r == best)
                      or self.peer_wait(r, everyone, set()) >= asym)

    def peer_wait(self, rank: int, members: set[int], skip: set[int]) -> float:
        """How much more peers in ``members`` wait on ``rank`` than it waits on them: per
        communicator where it is the most waited-on member (but not in ``skip``, the
        communicators of slow groups), the mean excess wait of those peers minus its own,
        summed."""
        total = 0.0
        for ci in self.in_by.get(rank, {}):
            if ci in skip or self.top.get(ci, (-1, 0.0))[0] != rank:
                continue
            peers = [self.out.get((m, ci), 0.0) for m in self.registry.ranks(ci)
                     if m != rank and m in members]
            if peers:
                total += max(0.0, float(np.mean(peers)) - self.out.get((rank, ci), 0.0))
        return total

    def top_comm(self, rank: int) -> int:
        """The communicator in which ``rank`` is waited on the most (-1: none)."""
        by = self.in_by.get(rank)
        return max(by, key=by.__getitem__) if by else -1

    def fallback_root(self) -> list[int]:
        if self.votes:
            return [max(self.votes, key=self.votes.__getitem__)]
        totals = {r: sum(v.values()) for r, v in self.in_by.items()}
        return [max(totals, key=totals.__getitem__)] if totals else []


# ---------------------------------------------------------------------------------------------
# the detector


@dataclass
class SlowdownConfig:
    """Settings of :class:`SlowdownDetector`."""

    # the verification's sign test at 1% (the series alone uses 0.1%): a level becomes an
    # anomaly only once a root persists over its slow iterations beyond chance
    # (_persistent), which rejects the bursts of pauses and jitter such a test lets through;
    # values count as slower from 4% on (a 5% slow-down must be found: at a 5% threshold
    # only about half of its iterations would count)
    change: ChangeConfig = field(default_factory=lambda: ChangeConfig(alpha=0.01,
                                                                      threshold=0.04))
    # CCL-D §4.2.1
    baseline_rounds: int = 100  # T_base: mean T_max of the first m rounds ...
    baseline_seconds: float = 120.0  # ... m = min(100, rounds in the first two minutes)
    t_base_init_ns: float | None = None  # configured initial T_base (None: learn it)
    ccld_window_s: float = 60.0  # detection window
    ccld_repeat: int = 2  # consecutive slow windows before an alarm
    theta_default: float = 3.0  # CCL-D's practical threshold until the distribution is known
    theta_min: float = 1.0
    theta_k: float = 6.0  # robust deviations above the median of the class's own windows
    theta_windows: int = 5  # windows needed to set theta from the distribution
    alpha: float = 0.4  # CCL-D: P < alpha is communication
    beta: float = 0.6  # CCL-D: P > beta is computation
    # Greyhound §4.3 cross-group comparison and link localization
    transfer_threshold: float = 0.10  # a group's transfer time vs its own baseline
    group_threshold: float = 0.10  # ... and vs the median of its comparable cluster
    noise_z: float = 3.0  # ... and by this many of its own noise (robust sigmas)
    link_threshold: float = 0.30  # a queue pair's in-flight time per work request grew by
    link_min_wrs: int = 64  # MEGATRACE's window: work requests needed in each window
    # localization
    baseline_iterations: int = 8  # the window before the onset used as baseline
    history_iterations: int = 64  # statistics kept (iterations)
    compute_share: float = 0.3  # a rank computes slowly: its extra compute per iteration is
    #                             at least this share of the time lost per iteration ...
    compute_top: float = 0.5  # ... and at least this share of the largest such excess
    max_roots: int = 8  # more ranks than this computing slower is no rank-level fault
    waited_share: float = 0.05  # a compute root is waited on more: >= share x lost time
    explained_share: float = 0.8  # slow groups next to compute roots whose own extra compute
    #                               is this share of the lost time are a side effect
    wait_share: float = 0.3  # wait graph: excess wait >= share x lost time
    comm_share: float = 0.15  # a slow group matters: extra transfer >= share x lost time
    root_asym: float = 0.8  # wait graph: peers wait on a root more than it waits on them
    mixed_share: float = 0.6  # a root on a slow link also computes slowly (wait graph)
    localize_retries: int = 12  # iterations to wait for a persistent root before dropping
    min_window_iterations: float = 1.0  # the anomaly window before a localization counts
    consistency: float = 0.6  # share of the slow iterations whose own root must agree
    severe_iterations: float = 2.0  # a first slow iteration this many reference iterations
    #                                 long is judged by its two halves (_persistent_within)
    persist_alpha: float = 0.2  # a persistent root's stretch arises by chance (any rank of
    #                             the job, each iteration naming its roots at random) at most
    #                             this often
    refine_iterations: int = 8  # an open anomaly's root may be refined this long
    bin_shift: int = 22  # initial bin width 2^22 ns (4.2 ms); coarsened to ~1/8 iteration
    #                      (an iteration's own window must span several bins: its edges
    #                      are whole bins, and the compute of a 60 ms iteration seen through
    #                      3-4 bins of 17 ms depends on where the edges fall)
    max_pending_age_s: float = 600.0  # incomplete rounds older than this are dropped


@dataclass
class _Window:
    """An anomaly window and its reference window (bins ``[lo, hi)`` and ``[b_lo, b_hi)``),
    their lengths (ns), the iteration times in each, and the fraction of wall time the
    slow-down costs (``lost = 1 - ref_iter / iter``)."""

    lo: int
    hi: int
    b_lo: int
    b_hi: int
    win_ns: float
    base_ns: float
    iter_ns: float
    ref_iter_ns: float

    @property
    def lost(self) -> float:
        return max(1.0 - self.ref_iter_ns / max(self.iter_ns, 1.0), 1e-3)

    @property
    def iterations(self) -> float:
        return max(self.win_ns / max(self.iter_ns, 1.0), 1e-3)

    @property
    def ref_iterations(self) -> float:
        return max(self.base_ns / max(self.ref_iter_ns, 1.0), 1e-3)


def _first_above(bins: np.ndarray, values: np.ndarray, b_lo: int, b_hi: int, lo: int,
                 hi: int) -> int | None:
    """The first bin in ``[lo, hi)`` whose value exceeds every bin of ``[b_lo, b_hi)``."""
    base = values[(bins >= b_lo) & (bins < b_hi)]
    limit = float(base.max()) if len(base) else 0.0
    sel = (bins >= lo) & (bins < hi) & (values > limit)
    return int(bins[sel].min()) if sel.any() else None


@dataclass
class _Open:
    """A slow level of the change tracker and the anomaly it may become (internal).
    ``state``: ``pending`` (not yet localized with confidence), ``open`` (reported)."""

    anomaly: dict[str, Any]
    onset_pos: int
    ref_lo_ns: int  # reference window: [ref_lo_ns, start of the onset iteration)
    ref_iter_ns: float  # iteration time of the level below
    healthy_ns: float  # the job's healthy iteration time
    state: str = "pending"
    tries: int = 0
    signature: list[Any] = field(default_factory=list)
    seg_before: int = 0  # the change tracker's healthy segment start before this onset
    per_iter: list[Any] = field(default_factory=list)  # per slow iteration: its signature
    first: int = 0  # the first slow iteration (from the onset) of the persistent root
    # a slow link found with compute roots that are none of its ends' groups: a second,
    # independent fault over the same level, reported as its own anomaly (the communication
    # one; ``anomaly`` is then the compute one)
    extra: list[dict[str, Any]] = field(default_factory=list)


class SlowdownDetector:
    """Slow-downs of a job and their root cause (module docstring). Detector protocol:
    ``update(batch)`` / ``on_tick(now_ns)`` return anomaly reports, once when an anomaly
    opens and once when it closes (same ``id``); ``last_rounds`` holds the ``rounds`` rows
    of the latest batch; ``snapshot()`` / ``restore()`` carry the whole state as JSON.

    Every decision is taken when a job iteration completes, on the data before that
    iteration's end (whole time bins): the diagnosis does not depend on how the records
    were cut into batches, and ``detected_ns`` is the trace time of the evidence."""

    def __init__(self, meta: JobMeta, config: SlowdownConfig | None = None,
                 tracker: Any | None = None) -> None:
        from failslow.detectors.iterations import IterationTracker

        self.meta = meta
        self.config = config or SlowdownConfig()
        self._own_tracker = tracker is None
        self.tracker = tracker if tracker is not None else IterationTracker(meta)
        self.registry = CommRegistry(meta)
        self.joiner = RoundJoiner(self.registry, int(self.config.max_pending_age_s * 1e9))
        self.gaps = GapTracker()
        self.links = LinkTracker(meta)
        self.ccld = CCLDMonitor(self.config)
        self.shift = self.config.bin_shift
        self.out_w = BinTable(("rank", "cidx"), ("w",))
        self.in_w = BinTable(("cidx", "waitee"), ("w", "n"))
        self.grp = BinTable(("cidx", "group", "cls"), ("n", "xfer", "dmax", "dmin"),
                            arg="range", carried=("rdmax", "rdmin"))
        self.comp = BinTable(("rank",), ("d",))
        self.passes = BinTable(("rank", "pass"), ("d",))  # forward / backward compute
        self.qp = BinTable(("qp",), ("dc", "lt", "db"))
        self.gpu = BinTable(("rank",), ("n", "sm", "thr"))
        # framework spans, when a source has them: compute time per rank and pass
        self.spans = BinTable(("rank", "op"), ("d", "n"))
        self.classes = _KeyIndex()  # bytes << 4 | op -> class index
        self.group_ids = _KeyIndex([(-1, 0)])  # point-to-point pair -> small id
        self.change = ChangeTracker(self.config.change)
        self.iters: list[list[int]] = []  # pushed job iterations: [idx, t_start, duration]
        self.iter_offset = 0  # position of iters[0] in the change tracker's stream
        self.base_iter_ns = 0.0
        self.first_iter_t = 0
        self.horizon = 0  # end of the latest job iteration: decisions use data before it
        self.max_t = 0
        self.next_id = 0
        self.levels: list[_Open] = []  # aligned with the change tracker's slow levels
        self.evidence: dict[str, Any] = {}  # the latest localization's evidence (debugging)
        # per-group transfer noise of the latest reference window (see _transfer_noise)
        self._noise: tuple[Any, ...] = (None,)
        self._no_rounds = results.empty("rounds")
        self.last_rounds: pa.Table = self._no_rounds
        self.last_iterations: pa.Table = results.empty("iterations")

    # ------------------------------------------------------------------ protocol

    def update(self, batch: EventBatch, iterations: pa.Table | None = None) -> list[Anomaly]:
        coll = batch.get("coll")
        self.last_rounds = self._no_rounds
        if coll is not None and coll.num_rows:
            self.max_t = max(self.max_t, int(coll_columns(coll)["t"].max()))
            rounds = self.joiner.update(coll)
            if len(rounds):
                self._account(rounds)
                self.last_rounds = rounds_table(self.meta.job, rounds)
            self._account_gaps(coll)
        for kind, fn in (("span", self._account_spans), ("link", self._account_links),
                         ("gpu", self._account_gpu)):
            table = batch.get(kind)
            if table is not None and table.num_rows:
                fn(table)
        if self._own_tracker:
            iterations = self.tracker.update(batch)
            self.last_iterations = iterations
        reports: list[Anomaly] = []
        if iterations is not None and iterations.num_rows:
            job = iterations.filter(pc.equal(iterations.column("rank"), -1))
            job = job.sort_by("iteration")
            for idx, t0, d in zip(job.column("iteration").to_pylist(),
                                  job.column("t_start").to_pylist(),
                                  job.column("duration_ns").to_pylist(), strict=True):
                reports.extend(self._push_iteration(int(idx), int(t0), int(d)))
        return reports

    def on_tick(self, now_ns: int) -> list[Anomaly]:
        return []

    # ------------------------------------------------------------------ accounting

    def _account(self, r: Rounds) -> None:
        """Sum a batch of rounds into the bins and the CCL-D baselines."""
        cls = self._classes(r.op, r.nbytes)
        binr = r.t_end >> self.shift
        rng = (r.dmax - r.dmin).astype(np.float64)
        self.grp.add({"bin": binr, "cidx": r.cidx, "group": r.group, "cls": cls,
                      "n": np.ones(len(r)), "xfer": r.transfer, "dmax": r.dmax,
                      "dmin": r.dmin, "range": rng, "rdmax": r.dmax, "rdmin": r.dmin})
        wait = r.m_wait > 0
        waitee = r.last_rank[r.m_round]
        mbin = binr[r.m_round]
        mcidx = r.cidx[r.m_round]
        self.out_w.add({"bin": mbin[wait], "rank": r.m_rank[wait], "cidx": mcidx[wait],
                        "w": r.m_wait[wait]})
        self.in_w.add({"bin": mbin[wait], "cidx": mcidx[wait], "waitee": waitee[wait],
                       "w": r.m_wait[wait], "n": np.ones(int(wait.sum()))})
        self.ccld.update(self._ccld_key(r.cidx, r.group, cls), r.t_end, r.dmax, r.dmin)

    def _ccld_key(self, cidx: np.ndarray, group: np.ndarray, cls: np.ndarray) -> np.ndarray:
        """One int64 per round class: communicator, point-to-point pair (0 for a
        collective) and (op, bytes) class."""
        gid = self.group_ids.lookup(np.asarray(group, dtype=np.int64))
        return ((np.asarray(cidx, dtype=np.int64) << 40) | (gid << 20)
                | np.asarray(cls, dtype=np.int64))

    def _account_gaps(self, coll: pa.Table) -> None:
        c = coll_columns(coll)
        op, peer, cr = c["op"], c["peer"], c["comm_rank"]
        kind = np.zeros(len(op), dtype=np.int64)
        p = np.flatnonzero((op == SEND) | (op == RECV))
        if len(p):
            recv, pp, cc = op[p] == RECV, peer[p], cr[p]
            # 1 recv from the previous stage, 2 from the next, 3 send to the next, 4 to the
            # previous (0: a peer equal to oneself)
            kind[p] = np.where(recv, np.where(pp < cc, 1, np.where(pp > cc, 2, 0)),
                               np.where(pp > cc, 3, np.where(pp < cc, 4, 0)))
        r, te, gap, passes = self.gaps.update(c["rank"], c["t"], c["is_enter"], kind)
        if len(r):
            d = gap.astype(np.float64)
            self.comp.add({"bin": te >> self.shift, "rank": r, "d": d})
            known = passes > 0
            if known.any():
                self.passes.add({"bin": te[known] >> (self.shift + PASS_BIN_SHIFT),
                                 "rank": r[known], "pass": passes[known], "d": d[known]})

    def _account_links(self, link: pa.Table) -> None:
        cols = self.links.update(link)
        if cols is not None:
            t = cols.pop("t")
            cols.pop("dt")
            cols["bin"] = t >> self.shift
            self.qp.add(cols)

    def _account_gpu(self, gpu: pa.Table) -> None:
        rank = pc.fill_null(gpu.column("rank"), -1).to_numpy().astype(np.int64)
        keep = rank >= 0
        if not keep.any():
            return
        reasons = gpu.column("throttle_reasons").to_numpy().astype(np.uint64)
        thr = (reasons & np.uint64(THROTTLE_MASK)) != 0
        self.gpu.add({"bin": gpu.column("t").to_numpy()[keep] >> self.shift,
                      "rank": rank[keep], "n": np.ones(int(keep.sum())),
                      "sm": gpu.column("sm_clock_mhz").to_numpy()[keep].astype(np.float64),
                      "thr": thr[keep].astype(np.float64)})

    def _account_spans(self, span: pa.Table) -> None:
        """Forward and backward compute time per rank and bin (MEGATRACE's stages)."""
        op = pc.index_in(span.column("op"), value_set=pa.array(SPAN_PASSES))
        code = pc.fill_null(op, -1).to_numpy(zero_copy_only=False).astype(np.int64)
        keep = code >= 0
        if not keep.any():
            return
        t0 = span.column("t_start").to_numpy()[keep]
        t1 = span.column("t_end").to_numpy()[keep]
        self.spans.add({"bin": t1 >> self.shift,
                        "rank": span.column("rank").to_numpy()[keep].astype(np.int64),
                        "op": code[keep], "d": (t1 - t0).astype(np.float64),
                        "n": np.ones(int(keep.sum()))})

    def _classes(self, op: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        return self.classes.lookup((nbytes.astype(np.int64) << 4) | op.astype(np.int64))

    def _kinds_of(self, cidx: np.ndarray) -> np.ndarray:
        uniq, inv = np.unique(cidx, return_inverse=True)
        names = np.array([self.registry.kind(int(i)) for i in uniq.tolist()])
        return names[inv.reshape(-1)]

    @property
    def _tables(self) -> tuple[BinTable, ...]:
        return (self.out_w, self.in_w, self.grp, self.comp, self.passes, self.qp, self.gpu,
                self.spans)

    # ------------------------------------------------------------------ iterations

    def _push_iteration(self, idx: int, t0: int, dur: int) -> list[Anomaly]:
        if self.iters and idx <= self.iters[-1][0]:
            return []
        self.iters.append([idx, t0, dur])
        self.horizon = max(self.horizon, t0 + dur)
        if self.first_iter_t == 0:
            self.first_iter_t = t0 + dur  # skip the first iteration (warm-up)
        self.change.allow_further = all(op.state == "open" for op in self.levels)
        changes = self.change.push(float(dur))
        if not math.isnan(self.change.baseline) and self.change.state == "normal":
            self.base_iter_ns = self.change.baseline
        elif not self.base_iter_ns and len(self.iters) >= 3:
            self.base_iter_ns = float(np.median([d for _, _, d in self.iters[-5:]]))
        self._resize_bins()
        self.ccld.close(self.horizon)
        out: list[Anomaly] = []
        for ch in changes:
            if ch.kind == "onset":
                self._onset(ch)
            else:
                out.extend(self._relief(ch))
        for op in list(self.levels):
            if op.state == "pending":
                out.extend(self._try_confirm(op))
        top = self.levels[-1] if self.levels else None
        if top is not None and top.state == "open" and \
                len(top.per_iter) <= top.first + self.config.refine_iterations:
            out.extend(self._refine(top))
        self._trim()
        return out

    def _pos(self, pos: int) -> int:
        return min(max(pos - self.iter_offset, 0), len(self.iters) - 1)

    def _iter_at(self, pos: int) -> list[int]:
        return self.iters[self._pos(pos)]

    def _resize_bins(self) -> None:
        if self.base_iter_ns <= 0:
            return
        want = max(self.config.bin_shift, int(math.log2(max(self.base_iter_ns / 8, 1.0))))
        if want > self.shift:
            for table in self._tables:
                table.rebin(want - self.shift)
            self.shift = want

    def _trim(self) -> None:
        c = self.config
        keep = c.history_iterations
        if len(self.iters) > 4 * keep:
            drop = len(self.iters) - 2 * keep
            if self.levels:
                drop = min(drop, self.levels[0].onset_pos - self.iter_offset
                           - c.baseline_iterations - 2)
            if drop > 0:
                self.iters = self.iters[drop:]
                self.iter_offset += drop
        if self.base_iter_ns > 0:
            horizon = self.horizon - int(keep * self.base_iter_ns)
            if self.levels:
                horizon = min(horizon, self.levels[0].ref_lo_ns)
            for table in self._tables:
                extra = PASS_BIN_SHIFT if table is self.passes else 0
                table.prune(horizon >> (self.shift + extra))

    # ------------------------------------------------------------------ anomalies

    def _onset(self, ch: Change) -> None:
        c = self.config
        idx, t0, _ = self._iter_at(ch.index)
        if ch.depth <= 1 or not self.levels:
            ref_lo = int(t0 - c.baseline_iterations * ch.baseline)
            ref_lo = max(ref_lo, self.first_iter_t)
            seg = self._iter_at(self.change.seg_start)[1]
            ref_lo = max(ref_lo, seg) if seg < t0 else ref_lo
            healthy = ch.baseline
        else:
            lower = self.levels[-1]
            lo_pos = max(lower.onset_pos + 1, self.change.levels[-2].seg
                         if len(self.change.levels) >= 2 else lower.onset_pos + 1)
            ref_lo = int(self._iter_at(lo_pos)[1])
            healthy = lower.healthy_ns
        ref_lo = min(ref_lo, int(t0) - (1 << self.shift))
        self.levels.append(_Open(
            anomaly={"kind": "slow", "cause": "compute", "ranks": [], "start_ns": int(t0),
                     "detected_ns": None, "end_ns": None,
                     "slowdown": round(ch.level / healthy, 4) if healthy > 0 else None,
                     "onset_iteration": int(idx)},
            onset_pos=ch.index, ref_lo_ns=ref_lo, ref_iter_ns=ch.baseline,
            healthy_ns=healthy, seg_before=self.change.seg_start))

    def _window(self, op: _Open, lo_pos: int, hi_ns: int) -> _Window:
        """Bins of the window from iteration ``lo_pos`` up to ``hi_ns`` and of ``op``'s
        reference window, with their iteration times."""
        s = self.shift
        t_lo = self._iter_at(lo_pos)[1]
        lo, hi = t_lo >> s, max(hi_ns >> s, (t_lo >> s) + 1)
        b_hi = self._iter_at(op.onset_pos)[1] >> s
        b_lo = min(op.ref_lo_ns >> s, b_hi - 1)
        a, b = self._pos(lo_pos), len(self.iters)
        durs = [d for _, t, d in self.iters[a:b] if t + d <= hi_ns] or [self.iters[a][2]]
        return _Window(lo, hi, b_lo, b_hi, float(max((hi << s) - (lo << s), 1)),
                       float(max((b_hi - b_lo) << s, 1)), float(np.median(durs)),
                       op.ref_iter_ns)

    def _try_confirm(self, op: _Open) -> list[Anomaly]:
        """Open the anomaly of a pending level once its root persists (:meth:`_persistent`):
        a fail-slow is a persistent slow component, while pauses and bursts of jitter hit
        random ranks; after ``localize_retries`` more iterations without a persistent root
        the level is dropped."""
        c = self.config
        op.tries += 1
        t_onset = self._iter_at(op.onset_pos)[1]
        if self.horizon - t_onset < c.min_window_iterations * op.ref_iter_ns:
            return []
        found = self._persistent(op)
        if found is None:
            if op.tries > c.localize_retries:
                self._drop(op)
            return []
        first, comm_ok, nodes, roots = found
        win = self._window(op, op.onset_pos + first, self.horizon)
        loc = self.localize(win, op, roots=roots, comm=comm_ok)
        if comm_ok and loc["cause"] == "compute":
            loc = self.localize(win, op, roots=roots, comm=True, force_comm=True)
        loc["signature"] = [comm_ok, nodes, roots]
        if not loc["confident"]:
            return []
        if (loc["cause"] == "compute" and self.evidence.get("compute_source") == "waits"
                and loc.get("P") is not None and loc["P"] < c.alpha):
            # CCL-D §4.2.2: the root's rounds lost time in transfer, not in its late
            # arrival; without gap evidence of its own compute this is no compute slow-down
            return []
        if loc["cause"] == "communication" and loc.get("P") is not None and loc["P"] >= c.alpha:
            # the mirror case: the slow group's rounds did not lose their time mostly to the
            # transfer (CCL-D: only P < alpha is communication; P > beta is a late arrival,
            # and in between the evidence is split): no slow link
            return []
        extra: list[dict[str, Any]] = []
        if loc["cause"] == "mixed" and loc["independent"]:
            # two faults at once (a straggler and a slow link it does not use): one anomaly
            # per root cause; the link's is kept only if its rounds lost time to transfer
            link = self.localize(win, op, roots=[], comm=True, force_comm=True)
            loc = self.localize(win, op, roots=roots, comm=False)
            loc["signature"] = [comm_ok, nodes, roots]
            if link["cause"] == "communication" and (link.get("P") is None
                                                     or link["P"] <= c.beta):
                extra.append({k: v for k, v in link.items() if k not in _INTERNAL})
        depth = self.levels.index(op)
        if depth > 0 and self._same(self.levels[depth - 1], loc):
            # the open anomaly grew worse: one fault, one anomaly
            lower = self.levels[depth - 1]
            lower.anomaly["slowdown"] = max(float(lower.anomaly["slowdown"] or 0.0),
                                            float(op.anomaly["slowdown"] or 0.0))
            self.levels.remove(op)
            self.change.merge_top()
            return []
        op.signature = loc["signature"]
        op.first = first
        op.anomaly.update({k: v for k, v in loc.items()
                           if k not in _INTERNAL})
        if first:
            # the root appeared some iterations after the level's onset: the anomaly is
            # the stretch from there on
            a = self._pos(op.onset_pos + first)
            op.anomaly["onset_iteration"] = int(self.iters[a][0])
            durs = [d for _, t0, d in self.iters[a:] if t0 + d <= self.horizon]
            if durs and op.healthy_ns > 0:
                op.anomaly["slowdown"] = round(float(np.median(durs)) / op.healthy_ns, 4)
        out = []
        for j, loc_j in enumerate([{}, *extra]):
            if j:
                keep = {k: op.anomaly[k] for k in ("kind", "onset_iteration", "slowdown",
                                                   "end_ns")}
                op.extra.append({**keep, **loc_j})
            a_j = op.extra[-1] if j else op.anomaly
            a_j["start_ns"] = min(int(a_j["start_ns"]), self.horizon - 1)
            a_j["detected_ns"] = int(self.horizon)
            a_j["id"] = f"slow-{self.next_id}"
            self.next_id += 1
            out.append(self._anomaly(a_j))
        op.state = "open"
        return out

    def _persistent(self, op: _Open, max_start: int | None = None
                    ) -> tuple[int, bool, list[str], list[int]] | None:
        """The slow iterations since the onset, each localized on its own against the same
        reference (cached), and what persists among them: a compute root (or a slow link)
        found in at least two of them and in ``consistency`` of the iterations from its
        first appearance on (that first one may be only partly slow). Returns (index of the
        first persistent iteration relative to the onset, communication persists?, its node
        pair, persistent compute roots), or None."""
        c = self.config
        a = self._pos(op.onset_pos) + len(op.per_iter)
        while a < len(self.iters):
            _, t0, d = self.iters[a]
            if t0 + d > self.horizon:
                break
            one = self.localize(self._window(op, self.iter_offset + a, t0 + d), op,
                                light=True)
            # the signature, and the slow groups behind its communication evidence
            op.per_iter.append([*one["signature"], one["groups"]] if one["confident"]
                               else None)
            a += 1
        k = len(op.per_iter)

        # the chance that a given rank is among an iteration's compute roots by accident:
        # the share of the ranks that iteration named (noise names many ranks at once)
        world = max(self.meta.world_size, 1)
        chance = [min(len(sig[2]) / world, 1.0) if sig else 0.0 for sig in op.per_iter]

        def stretch(member: list[bool | None], by_chance: bool = False) -> int | None:
            """Earliest start of a persistent trailing stretch (None: none); iterations
            whose ``member`` is None say nothing and are left out (a stretch starts at
            the first of them before its first hit). With ``by_chance``, the stretch must
            also be unlikely to arise by accident for any rank
            (:func:`_persistence_chance`)."""
            known = [i for i in range(k) if member[i] is not None]
            for j, s0 in enumerate(known):
                if max_start is not None and s0 > max_start:
                    break
                if not member[s0]:
                    continue
                rest = known[j:]
                hits = sum(1 for i in rest if member[i])
                n = len(rest)
                # a root that appears only well after the onset needs one more iteration
                need = 2 if s0 <= 1 else 3
                if hits >= need and hits - 1 >= c.consistency * max(n - 1, 1) and (
                        not by_chance or world * _persistence_chance(
                            [chance[i] for i in rest], hits) <= c.persist_alpha):
                    # uninformative iterations just before it belong to the stretch
                    return known[j - 1] + 1 if j else 0
            return None

        starts: list[int] = []
        roots: list[tuple[int, int]] = []  # (start, rank)
        cands = sorted({r for sig in op.per_iter if sig for r in sig[2]})
        for r in cands:
            st = stretch([bool(sig and r in sig[2]) for sig in op.per_iter], by_chance=True)
            if st is not None:
                roots.append((st, r))
                starts.append(st)
        comm_nodes: list[str] = []
        comm_start = None
        pairs = sorted({tuple(sig[1]) for sig in op.per_iter if sig and sig[0]})
        for pair in pairs:
            hit = [bool(sig and sig[0] and (tuple(sig[1]) == pair or not pair))
                   for sig in op.per_iter]
            st = stretch(self._informative(op, hit))
            if st is not None and (comm_start is None or st < comm_start):
                comm_start, comm_nodes = st, list(pair)
        if comm_start is not None:
            starts.append(comm_start)
        if not starts:
            if k == 1 and max_start is None:
                return self._persistent_within(op)
            return None
        first = min(starts)
        return first, comm_start is not None, comm_nodes, [r for _, r in sorted(roots)]

    def _informative(self, op: _Open, hit: list[bool]) -> list[bool | None]:
        """``hit`` with None for the slow iterations that say nothing about the slow
        groups of the hits: their window holds no round of any of them. A group that runs
        once per iteration (a DP ring's gradient sync) and delays the iteration's end ends
        its round next to the boundary between two windows of whole time bins, so some
        windows hold two of its rounds and others none; a window without its round is no
        evidence that it stopped being slow."""
        keys = {(int(cg[0]), int(cg[1])) for sig, h in zip(op.per_iter, hit, strict=True)
                if h and sig is not None and len(sig) > 3 for cg in sig[3]}
        if not keys:
            return list(hit)
        a = self._pos(op.onset_pos)
        out: list[bool | None] = []
        for i, h in enumerate(hit):
            if h or a + i >= len(self.iters):
                out.append(h)
                continue
            _, t0, d = self.iters[a + i]
            win = self._window(op, op.onset_pos + i, t0 + d)
            w = self.grp.query(win.lo, win.hi, ("cidx", "group", "cls"))
            held = any(bool(np.any((w["cidx"] == cx) & (w["group"] == g))) for cx, g in keys)
            out.append(False if held else None)
        return out

    def _persistent_within(self, op: _Open) -> tuple[int, bool, list[str], list[int]] | None:
        """A severe slow-down persists *within* its first slow iteration: when that
        iteration lasted at least ``severe_iterations`` reference iterations, its two halves
        are localized on their own and must name the same root (or the same slow link). A
        pause fills one place of the iteration, a slow component all of it; waiting for a
        second slow iteration would cost several healthy iterations' time."""
        c = self.config
        sig = op.per_iter[0]
        a = self._pos(op.onset_pos)
        _, t0, d = self.iters[a]
        if not sig or d < c.severe_iterations * op.ref_iter_ns:
            return None
        full = self._window(op, op.onset_pos, t0 + d)
        s = self.shift
        mid = (t0 + d // 2) >> s
        halves = []
        for lo, hi in ((full.lo, mid), (mid, full.hi)):
            if hi - lo < 2:
                return None
            win = dataclasses.replace(full, lo=lo, hi=hi, win_ns=float((hi - lo) << s))
            one = self.localize(win, op, light=True)
            if not one["confident"]:
                return None
            halves.append(one["signature"])
        if sig[2]:
            top = sig[2][0]
            if all(h[2] and h[2][0] == top for h in halves):
                return 0, False, [], [top]
            return None
        if sig[0] and all(h[0] and h[1] == sig[1] for h in halves):
            return 0, True, list(sig[1]), []
        return None

    def _refine(self, op: _Open) -> list[Anomaly]:
        """An open anomaly (the top level) whose later iterations add persistent evidence
        (a second slow rank, the compute side of a mixed slow-down) is updated and reported
        again with the same id (its lifecycle: open, updated, resolved)."""
        # only what was there from the onset on: a fault that starts later is its own
        found = self._persistent(op, max_start=op.first + 1)
        if found is None or not op.signature:
            return []
        first, comm_ok, nodes, roots = found
        old_comm, old_nodes, old_roots = op.signature
        comm_ok = comm_ok or bool(old_comm)
        nodes = list(old_nodes) if old_comm and old_nodes else nodes
        roots = sorted(set(roots) | set(old_roots))
        if comm_ok == bool(old_comm) and roots == sorted(old_roots):
            return []
        win = self._window(op, op.onset_pos + first, self.horizon)
        if op.extra:  # the slow link is reported apart: refine the compute anomaly
            loc = self.localize(win, op, roots=roots, comm=False)
        else:
            loc = self.localize(win, op, roots=roots, comm=comm_ok, force_comm=comm_ok)
        if loc["cause"] == op.anomaly["cause"] and loc["ranks"] == op.anomaly["ranks"]:
            op.signature = [comm_ok, nodes, roots]
            return []
        op.signature = [comm_ok, nodes, roots]
        keep = {k: op.anomaly[k] for k in ("id", "start_ns", "detected_ns")}
        op.anomaly.update({k: v for k, v in loc.items()
                           if k not in _INTERNAL})
        op.anomaly.update(keep)
        return [self._anomaly(op.anomaly)]

    def _drop(self, op: _Open) -> None:
        i = self.levels.index(op)
        for _ in range(len(self.levels) - i):
            self.levels.pop()
            self.change.reject()

    def _same(self, a: _Open, loc: dict[str, Any]) -> bool:
        return bool(a.signature) and _agree(a.signature, loc["signature"])

    def _relief(self, ch: Change) -> list[Anomaly]:
        out: list[Anomaly] = []
        _, t_end, _ = self._iter_at(ch.index)
        for _ in range(min(ch.closed, len(self.levels))):
            op = self.levels.pop()
            if op.state != "open":
                if not self.levels:
                    # never confirmed: its values stay in the healthy segment (as a reject)
                    self.change.seg_start = op.seg_before
                # the stretch was judged (no persistent root) and is over: a new onset must
                # be new evidence, not the same transient burst proposed again
                self.change.min_start = max(self.change.min_start, int(ch.index))
                continue
            a, b = self._pos(op.onset_pos), self._pos(ch.index)
            durs = [d for _, _, d in self.iters[a:max(b, a + 1)]]
            if durs and op.healthy_ns > 0:
                op.anomaly["slowdown"] = round(float(np.median(durs)) / op.healthy_ns, 4)
            if op.anomaly.get("cause") != "communication" and op.anomaly.get("ranks") and \
                    "gpu" not in op.anomaly:
                # GPU samples are sparse: look at the whole anomaly once it is over
                gpu = self._gpu_evidence(list(op.anomaly["ranks"]),
                                         self._window(op, op.onset_pos + op.first, int(t_end)))
                if gpu:
                    op.anomaly["gpu"] = gpu
            op.anomaly["end_ns"] = max(int(t_end), int(op.anomaly["start_ns"]) + 1)
            out.append(self._anomaly(op.anomaly))
            for other in op.extra:
                other["slowdown"] = op.anomaly["slowdown"]
                other["end_ns"] = max(int(t_end), int(other["start_ns"]) + 1)
                out.append(self._anomaly(other))
        return out

    @staticmethod
    def _anomaly(d: dict[str, Any]) -> Anomaly:
        return Anomaly.from_dict(dict(d))

    # ------------------------------------------------------------------ localization

    def localize(self, win: _Window, op: _Open | None = None, light: bool = False,
                 roots: list[int] | None = None, comm: bool = True,
                 force_comm: bool = False) -> dict[str, Any]:
        """Root cause of the slow-down in ``win`` against its reference window:
        communication (slow groups, degraded links), computation (ranks whose own compute
        grew, else the sinks of the wait-for graph), or both (module docstring)."""
        c = self.config
        slow = self._slow_groups(win, force_comm) if comm else []
        graph = self._wait_graph(win)
        comp = roots if roots is not None else self._compute_roots(win, graph)
        comm_evidence = bool(slow)
        members: set[int] = set()
        for g in slow:
            members.update(g["ranks"])
        if comp is not None:
            roots = comp
        else:
            roots = graph.roots(c.wait_share * win.lost, c.root_asym * win.lost,
                                keep_top=not comm_evidence)
            # with a slow link, a rank found by the wait graph is a compute root only when
            # its peers on slow groups too still wait on it
            roots = [r for r in roots if r not in members
                     or graph.peer_wait(r, members, {g["cidx"] for g in slow})
                     >= c.mixed_share * win.lost]
        if comm_evidence and roots and self._explained_by(win, list(roots), slow):
            slow, comm_evidence = [], False
        members = {r for g in slow for r in g["ranks"]}
        self.evidence = {"window": win, "slow_groups": slow, "compute": comp,
                         "graph": graph, "roots": roots,
                         "compute_source": "gaps" if comp is not None else "waits"}
        out: dict[str, Any] = {"confident": bool(comm_evidence or roots)}
        if comm_evidence and roots:
            cause = "mixed"
        elif comm_evidence:
            cause = "communication"
        else:
            cause = "compute"
            if not roots:
                roots = graph.fallback_root()
        out["cause"] = cause
        link = None
        nodes: list[str] = []
        rp_cidx = -1
        if comm_evidence:
            link, nodes, rp_cidx = self._link(slow)
        out["link"] = link
        ranks = (sorted(link) if link else []) if cause == "communication" else sorted(roots)
        out["ranks"] = [int(r) for r in ranks]
        sig_ranks = [int(r) for r in roots] if cause != "communication" else []
        # the link's identity: its node pair when it joins two nodes, else (all ranks on one
        # host, or node names unknown) its two ranks
        ident = sorted(nodes) if len(set(nodes)) == 2 else [str(r) for r in sorted(link or [])]
        out["signature"] = [cause != "compute", ident, sig_ranks]
        out["groups"] = [[int(g["cidx"]), int(g["group"])] for g in slow]
        # mixed (CCL-D S3) is one rank whose own transfers are slow too; compute roots
        # outside every slow group are a fault of their own next to the slow link
        out["independent"] = cause == "mixed" and not members.intersection(roots)
        if light:
            return out
        if cause in ("communication", "mixed") and rp_cidx >= 0:
            kind = self.registry.kind(rp_cidx)
            out["comm"], out["comm_kind"] = self.registry.ids[rp_cidx], kind
            out["stage"] = KIND_STAGE.get(kind, "other")
        else:
            rp_cidx = graph.top_comm(ranks[0]) if ranks else -1
            if rp_cidx >= 0:
                out["comm"] = self.registry.ids[rp_cidx]
                out["comm_kind"] = self.registry.kind(rp_cidx)
            else:
                out["comm"] = out["comm_kind"] = None
            out["stage"] = self._compute_stage(ranks, win)
        rp_win = win
        if op is not None:
            out["start_ns"] = self._refine_start(op, win, slow, ranks if cause !=
                                                 "communication" else [])
            # R and P over the rounds from the anomaly's start on: rounds of the onset
            # iteration that ended before it are healthy and would dilute both
            rp_win = dataclasses.replace(win, lo=min(max(win.lo, out["start_ns"] >> self.shift),
                                                     win.hi - 1))
        r_val, p_val = self._rp(rp_cidx, rp_win, link if cause != "compute" else ranks[:1]) \
            if rp_cidx >= 0 else (None, None)
        out["R"], out["P"] = r_val, p_val
        if cause != "communication" and ranks:
            gpu = self._gpu_evidence(ranks, win)
            if gpu:
                out["gpu"] = gpu
        return out

    def _excess(self, table: BinTable, value: str, by: tuple[str, ...], win: _Window
                ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Per key of ``by``: rate of ``value`` in the window minus the baseline rate. The
        window leaves out each key's largest bin when it spans several iterations: a
        pause (GC) fills one bin, a straggler all of them."""
        w = table.query(win.lo, win.hi, ("bin", *by))
        by_key = _aggregate({**{k: w[k] for k in by}, value: w[value], "m": w[value]}, by,
                            (value,), "m", ())
        drop = by_key["m"] if win.iterations >= 2.5 else 0.0
        b = table.query(win.b_lo, win.b_hi, by)
        both = {k: np.concatenate([by_key[k], b[k]]) for k in by}
        both["v"] = np.concatenate([(by_key[value] - drop) / win.win_ns,
                                    -b[value] / win.base_ns])
        agg = _aggregate(both, by, ("v",), None, ())
        return {k: agg[k] for k in by}, agg["v"]

    def _compute_excess(self, win: _Window) -> tuple[np.ndarray, np.ndarray] | None:
        """Per rank, how much its own compute per iteration (the gaps between its
        operations) grew, as a share of the time lost per iteration; None without gap data.
        Each rank's largest time bin is left out of both windows: a pause (GC) fills one
        bin, a slow rank all of them."""
        w = self.comp.query(win.lo, win.hi, ("bin", "rank"))
        if len(w["rank"]) == 0:
            return None
        b = self.comp.query(win.b_lo, win.b_hi, ("bin", "rank"))
        bin_ns = float(1 << self.shift)
        rw, tw = _trimmed(w["rank"], w["d"])
        rb, tb = _trimmed(b["rank"], b["d"])
        rate_w = tw / max(win.win_ns - bin_ns, bin_ns)
        rate_b = _lookup(rw, rb, tb) / max(win.base_ns - bin_ns, bin_ns)
        has_b = _lookup(rw, rb, np.ones(len(rb))) > 0
        lost = max(win.iter_ns - win.ref_iter_ns, 1.0)
        excess = np.where(has_b, (rate_w * win.iter_ns - rate_b * win.ref_iter_ns) / lost,
                          0.0)
        return rw, excess

    def _compute_roots(self, win: _Window, graph: _WaitGraph | None = None
                       ) -> list[int] | None:
        """Ranks whose own compute per iteration grew (:meth:`_compute_excess`) by at least
        ``compute_share`` of the time lost per iteration and by at least ``compute_top`` of
        the largest such growth, strongest first; ``[]`` when no rank did; None when the
        gaps say nothing (no gap data, or so many ranks qualify that waiting shows in the
        gaps: hosts that block outside the library calls). With the wait-for ``graph``, a
        root must also be waited on more than before by its peers in some round: a host
        that blocks outside the library (an implicit barrier, a device synchronization) has
        longer gaps without making anyone wait (CCL-D: the slow rank is the one that enters
        last)."""
        c = self.config
        got = self._compute_excess(win)
        if got is None:
            return None
        rw, excess = got
        if graph is not None and graph.in_by:
            waited = np.array([sum(graph.in_by.get(int(r), {}).values()) for r in rw])
            excess = np.where(waited > c.waited_share * win.lost, excess, 0.0)
        top = float(excess.max())
        hit = (excess >= c.compute_share) & (excess >= c.compute_top * top)
        n = int(hit.sum())
        if n == 0:
            return []
        if n > c.max_roots:
            return None
        order = np.argsort(-excess[hit], kind="stable")
        return [int(r) for r in rw[hit][order]]

    def _explained_by(self, win: _Window, roots: list[int], slow: list[dict[str, Any]]
                      ) -> bool:
        """Are the slow groups a side effect of the compute roots? When the roots' own
        extra compute accounts for the time lost and every slow group has an end among
        the roots or the ranks that share a communicator with them (their transfers end
        late because the roots' neighbours wait for them: batched point-to-point calls,
        hosts that complete calls late), the slow-down is computation, not also a link."""
        if not roots or not slow:
            return False
        got = self._compute_excess(win)
        if got is None:
            return False
        rw, excess = got
        share = float(excess[np.isin(rw, roots)].sum())
        if share < self.config.explained_share:
            return False
        near = set(roots)
        for i in range(len(self.registry.ids)):
            ranks = self.registry.ranks(i)
            if near.intersection(ranks) and set(roots) & set(ranks):
                near.update(ranks)
        return all(set(g["ranks"]) & near for g in slow)

    def _slow_groups(self, win: _Window, force: bool = False) -> list[dict[str, Any]]:
        """Greyhound §4.3 cross-group comparison on transfer times: groups slower than their
        own baseline by more than 10%, and than the median of their comparable cluster by
        more than 10% -- or the whole cluster is slower (a link every group crosses)."""
        c = self.config
        by = ("cidx", "group", "cls")
        w = self.grp.query(win.lo, win.hi, by)
        base = self.grp.query(win.b_lo, win.b_hi, by)
        if len(w["cidx"]) == 0:
            return []
        key = lambda d: (d["cidx"] << 40) ^ (d["group"] * 1_000_003) ^ d["cls"]  # noqa: E731
        wk, bk = key(w), key(base)
        w_mean = w["xfer"] / np.maximum(w["n"], 1)
        b_n = _lookup(wk, bk, base["n"])
        b_mean = _lookup(wk, bk, base["xfer"]) / np.maximum(b_n, 1)
        kinds = self._kinds_of(w["cidx"])
        cluster = np.char.add(np.char.add(kinds.astype(str), "/"),
                              np.char.add(w["cls"].astype(str),
                                          np.where(w["group"] >= 0, "/p2p", "")))
        own = np.where(b_n > 0, w_mean / np.maximum(b_mean, 1.0), 0.0)
        _, cinv = np.unique(cluster, return_inverse=True)
        cinv = cinv.reshape(-1)
        med = np.empty(len(w_mean))
        med_own = np.empty(len(w_mean))
        csize = np.bincount(cinv)[cinv]
        order = np.argsort(cinv, kind="stable")
        starts = _group_starts(cinv[order])
        for j, st in enumerate(starts.tolist()):
            end = starts[j + 1] if j + 1 < len(starts) else len(order)
            sel = order[st:end]
            med[sel] = np.median(w_mean[sel])
            med_own[sel] = np.median(own[sel])
        cross = w_mean / np.maximum(med, 1.0)
        impact = (w_mean - b_mean) * w["n"] / win.win_ns
        # a group is slower than its own baseline by more than 10% and by more than its
        # own noise (the spread of its transfer times over the reference window)
        limit = 1 + np.maximum(c.transfer_threshold, self._transfer_noise(win, wk, w["n"]))
        everyone = med_own > 1 + c.transfer_threshold
        ok = ((b_n > 0) & (own > limit)
              & ((cross > 1 + c.group_threshold) | (csize < 3) | everyone))
        # a group matters when its extra transfer time is a share of the lost time; a
        # cluster slowed as a whole matters by its summed impact
        csum = np.bincount(cinv, weights=np.where(ok, impact, 0.0))[cinv]
        matters = (impact > c.comm_share * win.lost) | (everyone & (csum > c.comm_share
                                                                     * win.lost))
        if not (ok & matters).any() and force:
            # the slow link persisted iteration by iteration: keep its strongest groups
            matters = impact >= 0.5 * float(np.max(np.where(ok, impact, 0.0)))
        ok &= matters
        out = []
        for j in np.flatnonzero(ok)[np.argsort(-impact[ok])].tolist():
            cidx, group = int(w["cidx"][j]), int(w["group"][j])
            ranks = ([group >> 32, group & 0xFFFFFFFF] if group >= 0
                     else self.registry.ranks(cidx))
            out.append({"cidx": cidx, "group": group, "kind": str(kinds[j]),
                        "ranks": [int(x) for x in ranks], "ratio": float(own[j]),
                        "cross": float(cross[j]), "impact": float(impact[j])})
        return out

    def _transfer_noise(self, win: _Window, keys: np.ndarray, n_win: np.ndarray
                        ) -> np.ndarray:
        """Per group (``keys`` as in :meth:`_slow_groups`, ``n_win`` its rounds in the
        window): ``noise_z`` times the relative noise of its mean transfer time over
        ``n_win`` rounds, from the robust spread of its per-bin means in the reference
        window (Greyhound §4.2's jitter, per group: a fabric whose transfers jitter by 15%
        makes single slow iterations of a ring, and those are no slow link) -- at least
        the spread pooled over its comparable cluster (Greyhound §4.3: groups of one kind,
        op and bytes share one fabric): a short reference holds a few bins of a group, and
        their spread can be far below the fabric's. 0 where neither is known."""
        c = self.config
        by = ("cidx", "group", "cls")
        b = self.grp.query(win.b_lo, win.b_hi, ("bin", *by))
        if len(b["bin"]) == 0:
            return np.zeros(len(keys))
        if self._noise[0] is not b:  # the reference's sums changed (or another window)
            self._noise = (b, *self._group_noise(b))
        _, uk, sigma, per_bin = self._noise
        sig = _lookup(keys, uk, sigma)
        rounds = _lookup(keys, uk, per_bin)
        return c.noise_z * sig * np.sqrt(np.maximum(rounds, 1.0) / np.maximum(n_win, 1.0))

    def _group_noise(self, b: dict[str, np.ndarray]
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per group of the per-bin rows ``b``: its key, the robust relative spread of its
        per-bin mean transfer times (0 with fewer than 3 bins; at least the spread of the
        relative deviations pooled over its comparable cluster, with 6 bins or more) and
        its rounds per bin."""
        k = (b["cidx"] << 40) ^ (b["group"] * 1_000_003) ^ b["cls"]
        m = b["xfer"] / np.maximum(b["n"], 1)
        order = np.lexsort((m, k))
        k, m, nb = k[order], m[order], b["n"][order]
        # the comparable cluster of each row: kind, class, point-to-point or not
        _, kind = np.unique(self._kinds_of(b["cidx"][order]), return_inverse=True)
        cl = (kind.reshape(-1).astype(np.int64) << 32) | (b["cls"][order] << 1) | (
            b["group"][order] >= 0)
        starts = _group_starts(k)
        cnt = np.diff(np.append(starts, len(k)))
        med = 0.5 * (m[starts + (cnt - 1) // 2] + m[starts + cnt // 2])
        dev = np.abs(m - np.repeat(med, cnt))
        o2 = np.lexsort((dev, np.repeat(np.arange(len(starts)), cnt)))
        dev = dev[o2]
        mad = 0.5 * (dev[starts + (cnt - 1) // 2] + dev[starts + cnt // 2])
        per_bin = np.add.reduceat(nb, starts) / cnt  # rounds per bin
        sigma = np.where(cnt >= 3, 1.4826 * mad / np.maximum(med, 1.0), 0.0)
        # pooled: the median relative deviation of every bin of the cluster's groups
        rel = np.abs(m / np.maximum(np.repeat(med, cnt), 1.0) - 1.0)
        o3 = np.lexsort((rel, cl))
        rel, cls_sorted = rel[o3], cl[o3]
        c_starts = _group_starts(cls_sorted)
        c_cnt = np.diff(np.append(c_starts, len(rel)))
        c_med = 0.5 * (rel[c_starts + (c_cnt - 1) // 2] + rel[c_starts + c_cnt // 2])
        pooled = np.where(c_cnt >= 6, 1.4826 * c_med, 0.0)
        sigma = np.maximum(sigma, _lookup(cl[starts], cls_sorted[c_starts], pooled))
        return k[starts], sigma, per_bin

    def _link_occupancy(self, win: _Window, pairs: list[tuple[str, str]]
                        ) -> dict[tuple[str, str], float]:
        """Per candidate node pair: how much fuller its queue pairs ran in the window than
        in the reference window (time-averaged in-flight work requests, :class:`LinkTracker`;
        both directions together). On a ring whose rounds are slow, the hop over the slow
        link keeps its queue full while the other hops wait for data, so its occupancy grows
        the most. Pairs with fewer than ``link_min_wrs`` completed work requests in either
        window are left out."""
        c = self.config
        if len(self.qp) == 0 or not pairs:
            return {}
        w = self.qp.query(win.lo, win.hi, ("qp",))
        b = self.qp.query(win.b_lo, win.b_hi, ("qp",))
        if len(w["qp"]) == 0 or len(b["qp"]) == 0:
            return {}
        names = self.links.node_names
        want = {(min(p), max(p)) for p in pairs}
        acc: dict[tuple[str, str], list[float]] = {}
        for tab, off in ((w, 0), (b, 2)):
            node = self.links.qp_node[tab["qp"]]
            peer = self.links.qp_peer[tab["qp"]]
            for j in np.flatnonzero(peer >= 0).tolist():
                a, b_ = str(names[node[j]]), str(names[peer[j]])
                pair = (min(a, b_), max(a, b_))
                if pair not in want:
                    continue
                cur = acc.setdefault(pair, [0.0, 0.0, 0.0, 0.0])
                cur[off] += float(tab["lt"][j])
                cur[off + 1] += float(tab["dc"][j])
        out = {}
        for pair, (lt_w, dc_w, lt_b, dc_b) in acc.items():
            if dc_w < c.link_min_wrs or dc_b < c.link_min_wrs:
                continue
            occ_w, occ_b = lt_w / win.win_ns, lt_b / win.base_ns
            out[pair] = (occ_w + 0.05) / (occ_b + 0.05)
        return out

    def _link(self, slow: list[dict[str, Any]]) -> tuple[list[int] | None, list[str], int]:
        """The slow link (Greyhound §4.3, ring-neighbour analysis): among the node pairs
        crossed by the slow groups' edges (point-to-point pairs, ring neighbours of
        collectives), those with the largest total impact; ties (every hop of a slow ring
        crosses a node pair) are broken by the queue pairs' occupancy when ``link`` rows
        exist (:meth:`_link_occupancy`), else by the lowest pair. Reported as two ranks at
        its ends: an edge of a slow group when one crosses it, a pipeline pair if pipeline
        traffic crosses it (lower stage first), else a ring edge (DP, then TP, then CP),
        lowest rank first; with its communicator."""
        node = self.meta.node_of
        score: dict[tuple[str, str], float] = {}
        for g in slow:
            seen: set[tuple[str, str]] = set()
            for a, b in self._edges(g):
                na, nb = sorted((node(a), node(b)))
                if na != nb and (na, nb) not in seen:
                    seen.add((na, nb))
                    score[(na, nb)] = score.get((na, nb), 0.0) + g["impact"]
        if not score:  # every slow edge stays inside a node (NVLink, PCIe)
            for g in slow:
                for a, b in self._edges(g):
                    if node(a) == node(b):
                        score[(node(a), node(b))] = score.get((node(a), node(b)), 0.0) \
                            + g["impact"]
        if not score:
            return None, [], int(slow[0]["cidx"]) if slow else -1
        best = max(score.values())
        tied: list[tuple[str, str]] = sorted(k for k, v in score.items() if v >= best * 0.999)
        occ = self._link_occupancy(self.evidence["window"], tied) if len(tied) > 1 else {}
        self.evidence["occupancy"] = occ

        def preference(k: tuple[str, str]) -> tuple[float, tuple[str, str]]:
            return -occ.get(k, 0.0), k

        chosen: tuple[str, str] = min(tied, key=preference)
        nodes = list(chosen)
        pair, cidx = self._link_pair(nodes[0], nodes[1], slow)
        if cidx < 0 and slow:
            cidx = int(slow[0]["cidx"])
        return pair, list(nodes), cidx

    def _edges(self, g: dict[str, Any]) -> list[tuple[int, int]]:
        if g["group"] >= 0:
            return [(g["ranks"][0], g["ranks"][1])]
        ring = g["ranks"]
        return [(ring[i], ring[(i + 1) % len(ring)]) for i in range(len(ring))
                ] if len(ring) > 1 else []

    def _link_pair(self, na: str, nb: str, slow: list[dict[str, Any]]
                   ) -> tuple[list[int] | None, int]:
        """Two ranks at the ends of the link between nodes ``na`` and ``nb`` (see
        :meth:`_link`) and the communicator of that pair."""
        node = self.meta.node_of
        ends = {na, nb}
        # the impact of the strongest slow group using each edge: edges of the groups that
        # lost the most (within half of the strongest) come first, then the convention
        strength: dict[frozenset[int], float] = {}
        for g in slow:
            for e in self._edges(g):
                key = frozenset(e)
                strength[key] = max(strength.get(key, 0.0), float(g["impact"]))
        top = max(strength.values(), default=0.0)
        strong = {k for k, v in strength.items() if v >= 0.5 * top}
        # with ``link`` rows: how much the queue pairs of an edge's ends towards each other's
        # node filled (the hop over the slow link keeps its sender's queue full)
        growth = self._qp_growth(self.evidence["window"]) if "window" in self.evidence else {}
        limit = 1 + self.config.link_threshold
        cands: list[tuple[int, int, int, int, list[int]]] = []
        order = {"pp": 0, "dp": 1, "tp": 2, "cp": 3}
        for i in range(len(self.registry.ids)):
            kind = self.registry.kind(i)
            ranks = self.registry.ranks(i)
            if len(ranks) < 2:
                continue
            if kind == "pp" or self.registry.p2p_only[i]:
                edges = [(ranks[j], ranks[j + 1]) for j in range(len(ranks) - 1)]
                rank_kind = 0
            else:
                edges = [(ranks[j], ranks[(j + 1) % len(ranks)]) for j in range(len(ranks))]
                rank_kind = order.get(kind, 4)
            for a, b in edges:
                if {node(a), node(b)} != ends:
                    continue
                pair = [a, b] if rank_kind else sorted((a, b))
                cands.append((int(frozenset((a, b)) not in strong), rank_kind, pair[0], i, pair))
        # the queue growth of an edge: its ends' queue pairs towards each other's node
        queue = {}
        for c in cands:
            a, b = c[4]
            got = [growth[k] for k in ((a, node(b)), (b, node(a))) if k in growth]
            if got:
                queue[(a, b)] = max(got)
        grown = {e for e, v in queue.items() if v > limit}
        # when the queues of one edge over the node pair filled and those of every other
        # did not, the slow hop is that edge (a rank pair's fault: its NIC, its cable);
        # when several filled, the link is slow as a whole and the convention names it
        by_queue = len(grown) == 1 and len(queue) > 1
        best: tuple[Any, ...] | None = None
        for c in cands:
            e = (c[4][0], c[4][1])
            q = -1.0 if by_queue and e in grown else 0.0
            # an edge of a strongly slow group first (rank-level evidence), then the one
            # whose queue pairs alone filled, then the convention
            cand = (c[0], q, c[1], c[2], c[3], c[4])
            if best is None or cand[:4] < best[:4]:
                best = cand
        if best is None:
            for g in slow:
                for a, b in self._edges(g):
                    if {node(a), node(b)} == ends:
                        return [int(a), int(b)], int(g["cidx"])
            return None, -1
        return [int(x) for x in best[5]], best[4]

    def _qp_growth(self, win: _Window) -> dict[tuple[int, str], float]:
        """Per queue pair's owner rank and remote node (``link`` rows with a rank): the
        growth of its time-averaged in-flight work requests from the reference window to
        ``win`` (as :meth:`_link_occupancy`, one direction). Queue pairs with fewer than
        ``link_min_wrs`` completed work requests in either window are left out."""
        c = self.config
        if len(self.qp) == 0:
            return {}
        w = self.qp.query(win.lo, win.hi, ("qp",))
        b = self.qp.query(win.b_lo, win.b_hi, ("qp",))
        if len(w["qp"]) == 0 or len(b["qp"]) == 0:
            return {}
        q = w["qp"]
        dc_b = _lookup(q, b["qp"], b["dc"])
        lt_b = _lookup(q, b["qp"], b["lt"])
        ok = ((self.links.qp_rank[q] >= 0) & (self.links.qp_peer[q] >= 0)
              & (w["dc"] >= c.link_min_wrs) & (dc_b >= c.link_min_wrs))
        ratio = (w["lt"] / win.win_ns + 0.05) / (lt_b / win.base_ns + 0.05)
        names = self.links.node_names
        out: dict[tuple[int, str], float] = {}
        for j in np.flatnonzero(ok).tolist():
            key = (int(self.links.qp_rank[q[j]]), str(names[self.links.qp_peer[q[j]]]))
            out[key] = max(out.get(key, 0.0), float(ratio[j]))
        return out

    def _wait_graph(self, win: _Window) -> _WaitGraph:
        ok, ov = self._excess(self.out_w, "w", ("rank", "cidx"), win)
        ik, iv = self._excess(self.in_w, "w", ("cidx", "waitee"), win)
        return _WaitGraph(self.registry, ok["rank"], ok["cidx"], ov, ik["cidx"], ik["waitee"],
                          iv)

    def _compute_stage(self, ranks: list[int], win: _Window) -> str | None:
        """``forward`` or ``backward`` when only that pass of the root ranks' compute grew
        (by more than 10%, the other by less than 5%), from framework spans when the trace
        has them, else from the gaps placed in the pipeline schedule (:class:`GapTracker`);
        None when both grew or neither is known."""
        if not ranks:
            return None
        if len(self.spans):
            w = self.spans.query(win.lo, win.hi, ("rank", "op"))
            b = self.spans.query(win.b_lo, win.b_hi, ("rank", "op"))
            ratio = {}
            for code in (0, 1):
                sw = np.isin(w["rank"], ranks) & (w["op"] == code)
                sb = np.isin(b["rank"], ranks) & (b["op"] == code)
                if w["n"][sw].sum() == 0 or b["n"][sb].sum() == 0:
                    return None
                ratio[code] = ((w["d"][sw].sum() / w["n"][sw].sum())
                               / (b["d"][sb].sum() / b["n"][sb].sum()))
            return _stage_of(ratio[0], ratio[1])
        if len(self.passes) == 0:
            return None
        k = PASS_BIN_SHIFT
        lo, hi = win.lo >> k, max(win.hi >> k, (win.lo >> k) + 1)
        b_lo, b_hi = win.b_lo >> k, max(win.b_hi >> k, (win.b_lo >> k) + 1)
        if b_hi > lo:
            b_hi = lo
        if b_hi <= b_lo:
            return None
        w = self.passes.query(lo, hi, ("rank", "pass"))
        b = self.passes.query(b_lo, b_hi, ("rank", "pass"))
        sums = {}
        for code in (PASS_FWD, PASS_BWD):
            sw = np.isin(w["rank"], ranks) & (w["pass"] == code)
            sb = np.isin(b["rank"], ranks) & (b["pass"] == code)
            if not sw.any() or not sb.any():
                return None
            sums[code] = (float(w["d"][sw].sum()), float(b["d"][sb].sum()))
        # the passes measured over the same windows: how much more one grew than the other
        (fw, fb), (bw, bb) = sums[PASS_FWD], sums[PASS_BWD]
        if min(fw, fb, bw, bb) <= 0:
            return None
        r = (fw / bw) / (fb / bb)
        if r > 1.10:
            return "forward"
        if r < 1 / 1.10:
            return "backward"
        return None

    def _gpu_evidence(self, ranks: list[int], win: _Window) -> dict[str, Any] | None:
        """Greyhound's thermal case: the root ranks' GPUs throttled (NVML clocks-event
        reasons) or lost SM clock in the window, compared with the reference window."""
        if len(self.gpu) == 0:
            return None
        w = self.gpu.query(win.lo, win.hi, ("rank",))
        b = self.gpu.query(win.b_lo, win.b_hi, ("rank",))
        out = []
        for r in ranks:
            sw, sb = w["rank"] == r, b["rank"] == r
            if not sw.any():
                continue
            n = float(w["n"][sw].sum())
            clock = float(w["sm"][sw].sum()) / n
            throttled = float(w["thr"][sw].sum()) / n
            base_clock = float(b["sm"][sb].sum() / b["n"][sb].sum()) if sb.any() else None
            drop = base_clock is not None and clock < 0.9 * base_clock
            if throttled >= 0.5 or drop:
                out.append({"rank": int(r), "sm_clock_mhz": round(clock, 1),
                            "baseline_sm_clock_mhz": None if base_clock is None
                            else round(base_clock, 1), "throttled": round(throttled, 3)})
        return {"throttling": out} if out else None

    def _rp(self, cidx: int, win: _Window, ranks: list[int] | None = None
            ) -> tuple[float | None, float | None]:
        """CCL-D's R and P (§4.2, Eqs. 3-4) of one communicator over the anomaly window,
        for its round class (op, bytes; for point-to-point, the pair, preferring pairs that
        involve ``ranks``: the slow link's ends or the root) that lost the most time.

        The window's rounds are summarized by their mean ``T_max`` and ``T_min`` rather than
        by the single round with the largest range (Eq. 2, which :class:`CCLDMonitor` uses
        to *detect*): over a window of many rounds that one round is an outlier by
        construction (a pause, a pipeline's first receive) and would say "late arrival"
        whatever the cause. With ``T_base`` and the healthy range from the class's first
        rounds (Eq. 1, :meth:`CCLDMonitor.base`), ``R = (T_max - T_base) / T_base`` and ``P =
        (T_max - T_min - range_base) / (T_max - T_base)``: the share of the extra time that
        is late arrival (computation) rather than transfer (communication); near 1 for a
        compute straggler, near 0 for a slow link."""
        w = self.grp.query(win.lo, win.hi, ("cidx", "group", "cls"))
        rows = np.flatnonzero(w["cidx"] == cidx)
        onset_ns = win.b_hi << self.shift
        if ranks and len(rows):
            g = w["group"][rows]
            mine = (g >= 0) & (np.isin(g >> 32, ranks) | np.isin(g & 0xFFFFFFFF, ranks))
            if len(ranks) >= 2:
                mine = (g >= 0) & np.isin(g >> 32, ranks) & np.isin(g & 0xFFFFFFFF, ranks)
            if mine.any():
                rows = rows[mine]
        best: tuple[float, float | None, float | None] | None = None
        for j in rows.tolist():
            key = int(self._ccld_key(np.array([cidx]), np.array([w["group"][j]]),
                                     np.array([w["cls"][j]]))[0])
            # T_base from the class's baseline rounds before the anomaly: in a job that
            # has not yet completed its m baseline rounds when the anomaly begins, the slow
            # rounds would otherwise enter the baseline they are compared with
            t_base, skew = self.ccld.base(key, until=onset_ns)
            n = float(w["n"][j])
            if not t_base or n <= 0:
                continue
            t_max, t_min = float(w["dmax"][j]) / n, float(w["dmin"][j]) / n
            late = max(t_max - t_min - skew, 0.0)
            slower = max(t_min - (t_base - skew), 0.0)
            r_val = round((t_max - t_base) / t_base, 4)
            p_val = round(late / (late + slower), 4) if late + slower > 0 else None
            lost = (t_max - t_base) * n
            if best is None or lost > best[0]:
                best = (lost, r_val, p_val)
        return (best[1], best[2]) if best is not None else (None, None)

    def _refine_start(self, op: _Open, win: _Window, slow: list[dict[str, Any]],
                      roots: list[int]) -> int:
        """The onset within the time bins: the first bin, from one iteration before the
        onset iteration, where the root's compute (or, without gap data, the wait it
        receives) or the slow group's mean transfer time exceeds every bin of the reference
        window."""
        s = self.shift
        start_ns = int(op.anomaly["start_ns"])
        first = (start_ns - int(op.ref_iter_ns)) >> s
        found: list[int] = []
        if roots:
            d = self.comp.data
            sel = np.isin(d["rank"], roots)
            vals = d["d"][sel]
            if not sel.any():
                d = self.in_w.data
                sel = np.isin(d["waitee"], roots)
                vals = d["w"][sel]
            ub, inv = np.unique(d["bin"][sel], return_inverse=True)
            total = np.bincount(inv.reshape(-1), vals, minlength=len(ub))
            b = _first_above(ub, total, win.b_lo, min(win.b_hi, first), first, win.hi)
            if b is not None:
                found.append(b)
        if slow:
            g = slow[0]
            d = self.grp.data
            sel = (d["cidx"] == g["cidx"]) & (d["group"] == g["group"])
            bins, xfer, n = d["bin"][sel], d["xfer"][sel], d["n"][sel]
            if len(bins):
                ub, inv = np.unique(bins, return_inverse=True)
                inv = inv.reshape(-1)
                mean = np.bincount(inv, xfer) / np.maximum(np.bincount(inv, n), 1)
                b = _first_above(ub, mean, win.b_lo, min(win.b_hi, first), first, win.hi)
                if b is not None:
                    found.append(b)
        if not found:
            return start_ns
        return int(min(min(found) << s, self.horizon - 1))

    # ------------------------------------------------------------------ state

    def snapshot(self) -> dict[str, Any]:
        return {
            "registry": self.registry.snapshot(), "joiner": self.joiner.snapshot(),
            "gaps": self.gaps.snapshot(), "links": self.links.snapshot(),
            "ccld": self.ccld.snapshot(), "shift": self.shift,
            "tables": {name: getattr(self, name).snapshot() for name in _TABLES},
            "classes": [[k & 0xF, k >> 4, i] for k, i in self.classes.pairs()],
            "group_ids": self.group_ids.pairs(),
            "change": self.change.snapshot(), "iters": [list(x) for x in self.iters],
            "iter_offset": self.iter_offset, "base_iter_ns": self.base_iter_ns,
            "first_iter_t": self.first_iter_t, "horizon": self.horizon, "max_t": self.max_t,
            "next_id": self.next_id, "levels": [asdict(op) for op in self.levels],
            "tracker": self.tracker.snapshot() if self._own_tracker else None,
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.registry.restore(state["registry"])
        self.joiner.restore(state["joiner"])
        self.gaps.restore(state["gaps"])
        self.links.restore(state["links"])
        self.ccld.restore(state["ccld"])
        self.shift = int(state["shift"])
        for name in _TABLES:
            getattr(self, name).restore(state["tables"][name])
        self.classes = _KeyIndex([((int(b) << 4) | int(o), int(i))
                                  for o, b, i in state["classes"]])
        self.group_ids = _KeyIndex([(int(g), int(i)) for g, i in state["group_ids"]])
        self.change.restore(state["change"])
        self.iters = [[int(a), int(b), int(c)] for a, b, c in state["iters"]]
        self.iter_offset = int(state["iter_offset"])
        self.base_iter_ns = float(state["base_iter_ns"])
        self.first_iter_t = int(state["first_iter_t"])
        self.horizon = int(state["horizon"])
        self.max_t = int(state["max_t"])
        self.next_id = int(state["next_id"])
        self.levels = [_Open(**op) for op in state["levels"]]
        if self._own_tracker and state.get("tracker") is not None:
            self.tracker.restore(state["tracker"])


_TABLES = ("out_w", "in_w", "grp", "comp", "passes", "qp", "gpu", "spans")
#: localization outputs that are no anomaly fields
_INTERNAL = ("confident", "signature", "evidence", "groups", "independent")


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


def _stage_of(fwd: float, bwd: float) -> str | None:
    """The pass whose compute grew alone: by more than 10%, the other by less than 5%."""
    if fwd > 1.10 and bwd < 1.05:
        return "forward"
    if bwd > 1.10 and fwd < 1.05:
        return "backward"
    return None


def _trimmed(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per key (sorted unique keys): the sum of its values without the largest one."""
    if len(keys) == 0:
        return keys, np.zeros(0)
    order = np.lexsort((values, keys))
    k, v = keys[order], values[order].astype(np.float64)
    starts = _group_starts(k)
    sums = np.add.reduceat(v, starts)
    last = np.append(starts[1:], len(k)) - 1
    return k[starts], sums - v[last]


def _persistence_chance(probs: Sequence[float], hits: int) -> float:
    """Probability that one given rank is among the named roots of at least ``hits`` of
    the iterations by accident, when iteration ``i`` names each rank with probability
    ``probs[i]`` (Poisson-binomial upper tail). A fail-slow keeps naming the same one or
    two ranks; noise (pauses, longer sequences of a whole replica) names many ranks at
    once, so two iterations that share one of their many roots are no evidence."""
    dist = np.zeros(len(probs) + 1)
    dist[0] = 1.0
    for p in probs:
        dist[1:] = dist[1:] * (1.0 - p) + dist[:-1] * p
        dist[0] *= 1.0 - p
    return float(dist[hits:].sum())


def _agree(a: list[Any], b: list[Any]) -> bool:
    """Two localization signatures ``[communication?, link nodes, compute roots]`` name the
    same fault: the same kind of evidence and a common link or a common root rank."""
    if bool(a[0]) != bool(b[0]):
        return False
    if a[0] and a[1] and b[1] and sorted(a[1]) != sorted(b[1]):
        return False
    if a[2] and b[2]:
        # the strongest root of the part is a root of the whole
        return b[2][0] in a[2]
    return bool(a[0]) or not (a[2] or b[2])
