"""Slow-down detection and root-cause localization (CCL-D §4.2, Greyhound §4.2-4.3).

Pipeline per batch of ``coll`` rows:

1. :class:`RoundJoiner` joins ``enter``/``end`` rows into *rounds*: a collective round is
   one ``(comm, seq)`` on every member (CCL-D's Trace ID); a point-to-point round is the
   k-th ``send`` from a to b matched with the k-th ``recv`` on b from a. Only incomplete
   rounds are kept as state; completed ones become :data:`failslow.results` ``rounds`` rows.
2. Every member's *wait* in a round is its duration (``end - enter``, one host clock) minus
   the round's shortest duration: it waited for the member with the shortest duration, the
   last to enter (CCL-D: "the rank with minimal communication time is the root cause").
   Waits, transfer times (``end - t_start``) and CCL-D's ``T_max``/``T_min`` are summed into
   time bins (:class:`BinTable`), so state stays small and a restart loses nothing.
3. Onset and relief come from the job's iteration times (Greyhound §4.2) through
   :class:`failslow.detectors.changepoints.ChangeTracker`.
4. At onset the window since the onset is compared with the baseline window before it:
   * communication (Greyhound §4.3 cross-group comparison): a group (communicator, or the
     pair of a point-to-point channel) whose transfer time grew by more than 10% over its
     own baseline and exceeds the median of its *comparable cluster* (same kind, op and
     bytes) by more than 10%; the link is the pair of ranks common to the slow groups;
   * compute: the wait-for graph of excess waits is followed from every rank that waits
     more than before to the rank it waits on, through TP collectives, PP send/recv and DP
     sync, until a rank that itself does not wait: the first late rank;
   * CCL-D's ``R = (T_max - T_base)/T_base`` and ``P = (T_max - T_min)/(T_max - T_base)``
     (§4.2.1-4.2.2) are reported for the communicator that shows the anomaly; P > 0.6 points
     at computation, P < 0.4 at communication, between at both.
"""

from __future__ import annotations

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
from failslow.detectors.changepoints import ChangeConfig, ChangeTracker
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
        for c in meta.comms:
            i = self._add(c.comm, len(c.ranks))
            self.members[i] = dict(enumerate(c.ranks))
            self.kinds[i] = c.kind

    def _add(self, comm: int, size: int) -> int:
        i = len(self.ids)
        self._index[comm] = i
        self.ids.append(comm)
        self.kinds.append("")
        self.members.append({})
        self.sizes.append(size)
        self.p2p_only.append(True)
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
        uniq, inv = np.unique(comm, return_inverse=True)
        idx = np.empty(len(uniq), dtype=np.int64)
        for j, c in enumerate(uniq.tolist()):
            i = self._index.get(c)
            if i is None:
                first = int(np.argmax(inv == j))
                i = self._add(c, int(size[first]))
            idx[j] = i
        rows_idx = idx[inv]
        learning = np.array([not self.kinds[i] for i in idx])
        if learning.any():
            sel = learning[inv]
            key = np.unique(np.stack([rows_idx[sel], cr[sel], rank[sel],
                                      (op[sel] < SEND).astype(np.int64)], axis=1), axis=0)
            for i, c, r, coll in key.tolist():
                self.members[i][c] = r
                if coll:
                    self.p2p_only[i] = False
            for i in np.unique(idx[learning]).tolist():
                if len(self.members[i]) >= self.sizes[i]:
                    self.kinds[i] = infer_comm_kind(self.ranks(i), self.meta, self.p2p_only[i])
        return rows_idx

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


# ---------------------------------------------------------------------------------------------
# joining enter/end rows into rounds

_POP = ("rank", "comm", "cidx", "cr", "size", "seq", "op", "nbytes", "peer", "te", "tx",
        "ts", "k")


def _empty_pending() -> dict[str, np.ndarray]:
    return {name: np.zeros(0, dtype=np.uint64 if name == "comm" else np.int64)
            for name in _POP}


def _group_starts(*keys: np.ndarray) -> np.ndarray:
    """Start offsets of runs of equal keys in arrays already sorted by them."""
    n = len(keys[0])
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    change = np.zeros(n, dtype=bool)
    change[0] = True
    for k in keys:
        change[1:] |= k[1:] != k[:-1]
    return np.flatnonzero(change)


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
        rank = coll.column("rank").to_numpy().astype(np.int64)
        comm = coll.column("comm").to_numpy().astype(np.uint64)
        cr = coll.column("comm_rank").to_numpy().astype(np.int64)
        size = coll.column("comm_size").to_numpy().astype(np.int64)
        seq = coll.column("seq").to_numpy().astype(np.int64)
        op = pc.index_in(coll.column("op"), value_set=pa.array(events.COLL_OPS))
        opc = op.to_numpy(zero_copy_only=False).astype(np.int64)
        nbytes = coll.column("bytes").to_numpy().astype(np.uint64).view(np.int64)
        peer = coll.column("peer").to_numpy().astype(np.int64)
        is_enter = pc.equal(coll.column("phase"), "enter").to_numpy(zero_copy_only=False)
        t = coll.column("t").to_numpy()
        ts_col = pc.fill_null(coll.column("t_start"), NULL_TIME).to_numpy()
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
        allr = {c: np.concatenate([self.pending[c], new[c]]) for c in _POP}
        order = np.lexsort((allr["seq"], allr["rank"], allr["cidx"]))
        allr = {c: v[order] for c, v in allr.items()}
        starts = _group_starts(allr["cidx"], allr["rank"], allr["seq"])
        out = {c: allr[c][starts] for c in _POP}
        for c in ("te", "tx", "ts", "k"):
            out[c] = np.maximum.reduceat(allr[c], starts) if len(starts) else allr[c][:0]
        return out

    def _complete(self, ops: dict[str, np.ndarray], now: int) -> Rounds:
        valid = (ops["te"] != NULL_TIME) & (ops["tx"] != NULL_TIME)
        is_p2p = (ops["op"] == SEND) | (ops["op"] == RECV)
        done = np.zeros(len(valid), dtype=bool)
        parts: list[Rounds] = []
        # collectives: all comm_size members have entered and ended
        c = np.flatnonzero(~is_p2p)
        if len(c):
            order = c[np.lexsort((ops["rank"][c], ops["seq"][c], ops["cidx"][c]))]
            starts = _group_starts(ops["cidx"][order], ops["seq"][order])
            nvalid = np.add.reduceat(valid[order].astype(np.int64), starts)
            nrows = np.diff(np.append(starts, len(order)))
            ok = (nvalid == ops["size"][order][starts]) & (nrows == nvalid)
            sel_rows = np.repeat(ok, nrows)
            rows = order[sel_rows]
            done[rows] = True
            if len(rows):
                gid = np.repeat(np.arange(ok.sum()), nrows[ok])
                parts.append(self._rounds(ops, rows, gid, p2p=False))
        # point-to-point: the k-th send a->b with the k-th recv on b from a
        p = np.flatnonzero(is_p2p & (ops["k"] >= 0))
        if len(p):
            src = np.where(ops["op"][p] == SEND, ops["cr"][p], ops["peer"][p])
            dst = np.where(ops["op"][p] == SEND, ops["peer"][p], ops["cr"][p])
            order = np.lexsort((ops["op"][p], ops["k"][p], dst, src, ops["cidx"][p]))
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
                gid = np.repeat(np.arange(ok.sum()), nrows[ok])
                parts.append(self._rounds(ops, rows, gid, p2p=True))
        keep = ~done
        if self.max_age_ns and now:
            last = np.maximum(ops["te"], ops["tx"])
            keep &= last >= now - self.max_age_ns
        self.pending = {c: v[keep] for c, v in ops.items()}
        return _concat_rounds(parts)

    @staticmethod
    def _rounds(ops: dict[str, np.ndarray], rows: np.ndarray, gid: np.ndarray,
                p2p: bool) -> Rounds:
        """Round statistics; ``rows`` grouped contiguously by ``gid``. For p2p the send
        sorts before the recv (op code order)."""
        te, tx, ts = ops["te"][rows], ops["tx"][rows], ops["ts"][rows]
        rank = ops["rank"][rows]
        dur = tx - te
        starts = _group_starts(gid)
        counts = np.diff(np.append(starts, len(gid)))
        dmax = np.maximum.reduceat(dur, starts)
        dmin = np.minimum.reduceat(dur, starts)
        # the member with the shortest duration entered last (clock-robust)
        by_dur = np.lexsort((rank, dur, gid))
        last_rank = rank[by_dur[starts]]
        has_ts = ts != NULL_TIME
        xfer = np.where(has_ts, tx - ts, 0).astype(np.float64)
        n_ts = np.add.reduceat(has_ts.astype(np.int64), starts)
        sum_ts = np.add.reduceat(xfer, starts)
        transfer = np.where(n_ts > 0, sum_ts / np.maximum(n_ts, 1), dmin.astype(np.float64))
        first = rows[starts]
        if p2p:
            # the send sorts first (op code order): its seq, bytes and rank name the round
            group = (rank[starts] << 32) | rank[starts + 1]
            op = np.full(len(starts), SEND, dtype=np.int64)
        else:
            group = np.full(len(starts), -1, dtype=np.int64)
            op = ops["op"][first]
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
        pa.array([job] * n, pa.string()),
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
# time-binned statistics


class BinTable:
    """Statistics summed per key and time bin (bin = time >> shift). ``arg`` names a column
    maximized per key whose row also supplies the ``carried`` columns (CCL-D's round with
    the largest range and its T_max, T_min)."""

    def __init__(self, keys: tuple[str, ...], sums: tuple[str, ...], arg: str | None = None,
                 carried: tuple[str, ...] = ()) -> None:
        self.keys, self.sums, self.arg, self.carried = keys, sums, arg, carried
        self.floats = sums + ((arg,) if arg else ()) + carried
        self._data: dict[str, np.ndarray] = {}
        self._chunks: list[dict[str, np.ndarray]] = []
        self._pending_rows = 0
        self.clear()
        self._compacted = 0

    def clear(self) -> None:
        self._data = {k: np.zeros(0, dtype=np.int64) for k in ("bin", *self.keys)}
        self._data.update({f: np.zeros(0) for f in self.floats})
        self._chunks, self._pending_rows = [], 0

    @property
    def data(self) -> dict[str, np.ndarray]:
        """All rows (appended chunks are joined on first use)."""
        if self._chunks:
            self._data = {k: np.concatenate([self._data[k], *(c[k] for c in self._chunks)])
                          for k in self._data}
            self._chunks, self._pending_rows = [], 0
        return self._data

    @data.setter
    def data(self, value: dict[str, np.ndarray]) -> None:
        self._data, self._chunks, self._pending_rows = value, [], 0

    def __len__(self) -> int:
        return len(self._data["bin"]) + self._pending_rows

    def add(self, cols: dict[str, np.ndarray]) -> None:
        if len(cols["bin"]) == 0:
            return
        part = _aggregate(cols, ("bin", *self.keys), self.sums, self.arg, self.carried)
        self._chunks.append({k: part[k] for k in self._data})
        self._pending_rows += len(part["bin"])
        if len(self) > 2 * self._compacted + 4096:
            self.compact()

    def compact(self) -> None:
        self.data = _aggregate(self.data, ("bin", *self.keys), self.sums, self.arg,
                               self.carried)
        self._compacted = len(self)

    def rebin(self, delta: int) -> None:
        if delta > 0:
            self.data["bin"] = self.data["bin"] >> delta
            self.compact()

    def prune(self, min_bin: int) -> None:
        keep = self.data["bin"] >= min_bin
        if not keep.all():
            self.data = {k: v[keep] for k, v in self.data.items()}

    def query(self, lo: int, hi: int, by: tuple[str, ...]) -> dict[str, np.ndarray]:
        """Rows with ``lo <= bin < hi`` summed by the ``by`` keys."""
        sel = (self.data["bin"] >= lo) & (self.data["bin"] < hi)
        return _aggregate({k: v[sel] for k, v in self.data.items()}, by, self.sums, self.arg,
                          self.carried)

    def snapshot(self) -> dict[str, Any]:
        return {k: v.tolist() for k, v in self.data.items()}

    def restore(self, state: dict[str, Any]) -> None:
        self.data = {k: np.array(state[k], dtype=np.float64 if k in self.floats else np.int64)
                     for k in self._data}
        self._compacted = len(self)


def _aggregate(cols: dict[str, np.ndarray], by: tuple[str, ...], sums: tuple[str, ...],
               arg: str | None, carried: tuple[str, ...]) -> dict[str, np.ndarray]:
    n = len(cols[by[0]])
    if n == 0:
        out = {k: cols[k][:0] for k in by}
        out.update({f: np.zeros(0) for f in (*sums, *((arg,) if arg else ()), *carried)})
        return out
    sort_keys = [cols[k] for k in reversed(by)]
    if arg:
        sort_keys.insert(0, -cols[arg])  # the row with the largest arg first in each group
    order = np.lexsort(sort_keys)
    srt = {k: cols[k][order] for k in by}
    starts = _group_starts(*[srt[k] for k in by])
    out = {k: srt[k][starts] for k in by}
    for f in sums:
        out[f] = np.add.reduceat(cols[f][order].astype(np.float64), starts)
    if arg:
        out[arg] = cols[arg][order][starts].astype(np.float64)
        for f in carried:
            out[f] = cols[f][order][starts].astype(np.float64)
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


def ccld_ratios(t_base: float, dmax: np.ndarray, dmin: np.ndarray
                ) -> tuple[float | None, float | None]:
    """CCL-D §4.2: over the rounds of a window (their longest and shortest member
    durations), take the round with the largest range ``T_max(r) - T_min(r)`` (Eq. 2);
    ``R = (T_max - T_base) / T_base`` (Eq. 3) and ``P = (T_max - T_min) / (T_max - T_base)``
    (Eq. 4, clipped to [0, 1]; None when ``T_max <= T_base``). P > beta (0.6) points at
    computation (the last rank to enter), P < alpha (0.4) at communication."""
    if len(dmax) == 0 or t_base <= 0:
        return None, None
    j = int(np.argmax(np.asarray(dmax, dtype=np.float64) - np.asarray(dmin, dtype=np.float64)))
    t_max, t_min = float(dmax[j]), float(dmin[j])
    r_val = (t_max - t_base) / t_base
    p_val = None
    if t_max > t_base:
        p_val = round(min(max((t_max - t_min) / (t_max - t_base), 0.0), 1.0), 4)
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




@dataclass
class _Window:
    """An anomaly window and its baseline window, in bins, with their lengths (ns) and the
    fraction of wall time the slow-down costs (``lost = 1 - baseline / slow``)."""

    lo: int
    hi: int
    b_lo: int
    b_hi: int
    win_ns: float
    base_ns: float
    lost: float


def _first_above(bins: np.ndarray, values: np.ndarray, b_lo: int, b_hi: int, lo: int,
                 hi: int) -> int | None:
    """The first bin in ``[lo, hi)`` whose value exceeds every bin of ``[b_lo, b_hi)``."""
    base = values[(bins >= b_lo) & (bins < b_hi)]
    limit = float(base.max()) if len(base) else 0.0
    sel = (bins >= lo) & (bins < hi) & (values > limit)
    return int(bins[sel].min()) if sel.any() else None


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

    change: ChangeConfig = field(default_factory=ChangeConfig)
    baseline_rounds: int = 100  # CCL-D T_base: mean T_max of the first m rounds ...
    baseline_seconds: float = 120.0  # ... m = min(100, rounds in the first two minutes)
    transfer_threshold: float = 0.10  # a group's transfer time vs its own baseline
    group_threshold: float = 0.10  # Greyhound §4.3: exceeds the cluster median by 10%
    alpha: float = 0.4  # CCL-D: P < alpha is communication
    beta: float = 0.6  # CCL-D: P > beta is computation
    baseline_iterations: int = 8  # the window before the onset used as baseline
    history_iterations: int = 48  # statistics kept (iterations)
    wait_share: float = 0.3  # a rank waits significantly: excess wait >= share x lost time
    comm_share: float = 0.15  # a slow group matters: extra transfer >= share x lost time
    root_asym: float = 0.8  # a sink is a root when its peers wait on it more than it
    #                         waits on them by >= root_asym x lost time (or it is the top)
    mixed_share: float = 0.6  # a root on a slow link also computes slowly: peers on slow
    #                           links too wait on it >= share x lost time
    localize_retries: int = 3  # iterations to wait for a confident localization ...
    min_window_iterations: float = 1.5  # ... over a window at least this long
    bin_shift: int = 24  # initial bin width 2^24 ns (17 ms); coarsened to ~1/8 iteration
    max_pending_age_s: float = 600.0  # incomplete rounds older than this are dropped


@dataclass
class _Open:
    """An anomaly being tracked (internal)."""

    anomaly: dict[str, Any]
    onset_pos: int
    baseline_ns: float
    reported: bool = False
    tries: int = 0


class SlowdownDetector:
    """Slow-downs of a job and their root cause (module docstring). Detector protocol:
    ``update(batch)`` / ``on_tick(now_ns)`` return anomaly reports, once when an anomaly
    opens and once when it closes (same ``id``); ``last_rounds`` holds the ``rounds`` rows
    of the latest batch; ``snapshot()`` / ``restore()`` carry the whole state as JSON."""

    def __init__(self, meta: JobMeta, config: SlowdownConfig | None = None,
                 tracker: Any | None = None) -> None:
        from failslow.detectors.iterations import IterationTracker

        self.meta = meta
        self.config = config or SlowdownConfig()
        self._own_tracker = tracker is None
        self.tracker = tracker if tracker is not None else IterationTracker(meta)
        self.registry = CommRegistry(meta)
        self.joiner = RoundJoiner(self.registry, int(self.config.max_pending_age_s * 1e9))
        self.shift = self.config.bin_shift
        self.out_w = BinTable(("rank", "cidx"), ("w",))
        self.in_w = BinTable(("cidx", "waitee"), ("w", "n"))
        self.grp = BinTable(("cidx", "group", "cls"), ("n", "xfer", "dmax", "dmin"),
                            arg="range", carried=("rdmax", "rdmin"))
        # framework spans, when a source has them: compute time per rank and pass
        self.spans = BinTable(("rank", "op"), ("d", "n"))
        self.classes: dict[tuple[int, int], int] = {}  # (op, bytes) -> class index
        self.tbase: dict[str, list[float]] = {}  # "kind/cls" -> [n, sum T_max, first t]
        self.change = ChangeTracker(self.config.change)
        self.iters: list[list[int]] = []  # pushed job iterations: [idx, t_start, duration]
        self.iter_offset = 0  # position of iters[0] in the change tracker's stream
        self.base_iter_ns = 0.0
        self.first_iter_t = 0
        self.max_t = 0
        self.next_id = 0
        self.open: _Open | None = None
        self.evidence: dict[str, Any] = {}  # the latest localization's evidence (debugging)
        self.last_rounds: pa.Table = results.empty("rounds")
        self.last_iterations: pa.Table = results.empty("iterations")

    # ------------------------------------------------------------------ protocol

    def update(self, batch: EventBatch, iterations: pa.Table | None = None) -> list[Anomaly]:
        coll = batch.get("coll")
        self.last_rounds = results.empty("rounds")
        if coll is not None and coll.num_rows:
            self.max_t = max(self.max_t, int(pc.max(coll.column("t")).as_py()))
            rounds = self.joiner.update(coll)
            if len(rounds):
                self._account(rounds)
                self.last_rounds = rounds_table(self.meta.job, rounds)
        span = batch.get("span")
        if span is not None and span.num_rows:
            self._account_spans(span)
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
        self._tbase(r, cls)

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

    def _compute_stage(self, ranks: list[int], win: _Window) -> str | None:
        """``forward`` or ``backward`` when only that pass of the root ranks' compute grew
        (by more than 10%, the other by less than 5%); None without spans or when both
        did."""
        if not ranks or len(self.spans) == 0:
            return None
        w = self.spans.query(win.lo, win.hi, ("rank", "op"))
        b = self.spans.query(win.b_lo, win.b_hi, ("rank", "op"))
        ratio = {}
        for code, name in enumerate(SPAN_PASSES):
            sw = np.isin(w["rank"], ranks) & (w["op"] == code)
            sb = np.isin(b["rank"], ranks) & (b["op"] == code)
            if w["n"][sw].sum() == 0 or b["n"][sb].sum() == 0:
                return None
            ratio[name] = ((w["d"][sw].sum() / w["n"][sw].sum())
                           / (b["d"][sb].sum() / b["n"][sb].sum()))
        fwd, bwd = ratio["forward-compute"], ratio["backward-compute"]
        if fwd > 1.10 and bwd < 1.05:
            return "forward"
        if bwd > 1.10 and fwd < 1.05:
            return "backward"
        return None

    def _classes(self, op: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        key = np.stack([op, nbytes], axis=1)
        uniq, inv = np.unique(key, axis=0, return_inverse=True)
        idx = np.empty(len(uniq), dtype=np.int64)
        for j, (o, b) in enumerate(uniq.tolist()):
            idx[j] = self.classes.setdefault((int(o), int(b)), len(self.classes))
        return idx[inv.reshape(-1)]

    def _tbase(self, r: Rounds, cls: np.ndarray) -> None:
        """CCL-D Eq. (1): T_base = mean T_max of the first m rounds of a class, m = min(100,
        rounds in the first two minutes); classes are (communicator kind, op, bytes)."""
        c = self.config
        kinds = self._kinds_of(r.cidx)
        keys = np.char.add(np.char.add(kinds.astype(str), "/"), cls.astype(str))
        for key in np.unique(keys).tolist():
            st = self.tbase.get(key)
            sel = np.flatnonzero(keys == key)
            t_end = r.t_end[sel]
            if st is None:
                st = self.tbase[key] = [0.0, 0.0, float(t_end.min())]
            room = c.baseline_rounds - int(st[0])
            if room <= 0:
                continue
            order = np.argsort(t_end, kind="stable")[:room]
            order = order[t_end[order] <= st[2] + c.baseline_seconds * 1e9]
            st[0] += len(order)
            st[1] += float(r.dmax[sel][order].sum())
            if len(order) == 0:
                st[0] = float(c.baseline_rounds)  # past the first two minutes: frozen

    def _kinds_of(self, cidx: np.ndarray) -> np.ndarray:
        uniq, inv = np.unique(cidx, return_inverse=True)
        names = np.array([self.registry.kind(int(i)) for i in uniq.tolist()])
        return names[inv]

    def t_base(self, kind: str, cls: int) -> float | None:
        st = self.tbase.get(f"{kind}/{cls}")
        return st[1] / st[0] if st and st[0] > 0 else None

    # ------------------------------------------------------------------ iterations

    def _push_iteration(self, idx: int, t0: int, dur: int) -> list[Anomaly]:
        if self.iters and idx <= self.iters[-1][0]:
            return []
        self.iters.append([idx, t0, dur])
        if self.first_iter_t == 0:
            self.first_iter_t = t0 + dur  # skip the first iteration (warm-up)
        changes = self.change.push(float(dur))
        if not math.isnan(self.change.baseline) and self.change.state == "normal":
            self.base_iter_ns = self.change.baseline
        elif not self.base_iter_ns and len(self.iters) >= 3:
            self.base_iter_ns = float(np.median([d for _, _, d in self.iters[-5:]]))
        self._resize_bins()
        out: list[Anomaly] = []
        for ch in changes:
            if ch.kind == "onset":
                out.extend(self._onset(ch.index, ch.baseline, ch.level))
            else:
                out.extend(self._relief(ch.index))
        if self.open is not None and not self.open.reported:
            out.extend(self._try_report())
        self._trim()
        return out

    def _iter_at(self, pos: int) -> list[int]:
        i = min(max(pos - self.iter_offset, 0), len(self.iters) - 1)
        return self.iters[i]

    def _resize_bins(self) -> None:
        if self.base_iter_ns <= 0:
            return
        want = max(self.config.bin_shift, int(math.log2(max(self.base_iter_ns / 8, 1.0))))
        if want > self.shift:
            for table in (self.out_w, self.in_w, self.grp, self.spans):
                table.rebin(want - self.shift)
            self.shift = want

    def _trim(self) -> None:
        c = self.config
        keep = c.history_iterations
        if len(self.iters) > 4 * keep:
            drop = len(self.iters) - 2 * keep
            self.iters = self.iters[drop:]
            self.iter_offset += drop
        if self.base_iter_ns > 0:
            horizon = self.max_t - int(keep * self.base_iter_ns)
            if self.open is not None:
                start = int(self.open.anomaly["start_ns"])
                horizon = min(horizon, start - int((c.baseline_iterations + 2)
                                                   * self.base_iter_ns))
            for table in (self.out_w, self.in_w, self.grp, self.spans):
                table.prune(horizon >> self.shift)

    # ------------------------------------------------------------------ anomalies

    def _onset(self, pos: int, baseline: float, level: float) -> list[Anomaly]:
        out: list[Anomaly] = []
        if self.open is not None:  # a new slow-down while one is open: close it first
            out.extend(self._relief(pos))
        idx, t0, _ = self._iter_at(pos)
        aid = f"slow-{self.next_id}"
        self.next_id += 1
        self.open = _Open(anomaly={"id": aid, "kind": "slow", "cause": "compute", "ranks": [],
                                   "start_ns": int(t0), "detected_ns": int(self.max_t),
                                   "end_ns": None, "slowdown": round(level / baseline, 4),
                                   "onset_iteration": int(idx)},
                          onset_pos=pos, baseline_ns=baseline)
        return out

    def _try_report(self) -> list[Anomaly]:
        op = self.open
        assert op is not None
        loc = self.localize(int(op.anomaly["start_ns"]), self.max_t, op.baseline_ns,
                            float(op.anomaly["slowdown"]))
        op.tries += 1
        # the window counts from the refined onset
        short = (self.max_t - int(loc["start_ns"])
                 < self.config.min_window_iterations * op.baseline_ns)
        if (short or not loc["confident"]) and op.tries <= self.config.localize_retries:
            return []
        op.anomaly.update({k: v for k, v in loc.items() if k != "confident"})
        op.anomaly["detected_ns"] = int(self.max_t)
        op.reported = True
        return [self._anomaly(op.anomaly)]

    def _relief(self, pos: int) -> list[Anomaly]:
        op = self.open
        if op is None:
            return []
        out: list[Anomaly] = []
        if not op.reported:
            op.tries = self.config.localize_retries + 1
            out.extend(self._try_report())
        _, t_end, _ = self._iter_at(pos)
        lo, hi = op.onset_pos - self.iter_offset, pos - self.iter_offset
        durs = [d for _, _, d in self.iters[max(lo, 0):max(hi, lo + 1)]]
        if durs:
            op.anomaly["slowdown"] = round(float(np.median(durs)) / op.baseline_ns, 4)
        op.anomaly["end_ns"] = int(t_end)
        out.append(self._anomaly(op.anomaly))
        self.open = None
        return out

    @staticmethod
    def _anomaly(d: dict[str, Any]) -> Anomaly:
        return Anomaly.from_dict(dict(d))

    # ------------------------------------------------------------------ localization

    def localize(self, start_ns: int, end_ns: int, baseline_ns: float,
                 slowdown: float) -> dict[str, Any]:
        """Root cause of a slow-down that began at ``start_ns``: compares the window
        ``[start_ns, end_ns]`` with the baseline window before it (module docstring)."""
        c = self.config
        s = self.shift
        lo, hi = start_ns >> s, (end_ns >> s) + 1
        span = max(1, int(c.baseline_iterations * baseline_ns) >> s)
        b_hi = lo
        b_lo = max(b_hi - span, (self.first_iter_t >> s) + 1 if self.first_iter_t else 0)
        b_lo = min(b_lo, b_hi - 1)
        win = _Window(lo, hi, b_lo, b_hi, float(max(end_ns - (lo << s), 1)),
                      float(max((b_hi - b_lo) << s, 1)),
                      max(1.0 - 1.0 / max(slowdown, 1.0), 1e-3))

        slow = self._slow_groups(win)
        graph = self._wait_graph(win)
        # with a slow link, a rank is a compute root only on its own evidence
        roots = graph.roots(c.wait_share * win.lost, c.root_asym * win.lost, keep_top=not slow)
        self.evidence = {"window": win, "slow_groups": slow, "graph": graph, "roots": roots}
        link, rep, link_ranks = self._link(slow)
        members: set[int] = set(link_ranks)
        for g in slow:
            members.update(g["ranks"])
        # a root on a slow group is explained by it, unless its peers in the same situation
        # (on slow groups too) still wait on it: then it is also slow to compute
        compute = [r for r in roots if r not in members
                   or graph.peer_wait(r, members, {g["cidx"] for g in slow})
                   >= c.mixed_share * win.lost]
        out: dict[str, Any] = {"confident": bool(slow or roots)}
        if slow and compute:
            cause = "mixed"
        elif slow:
            cause = "communication"
        else:
            cause = "compute"
            if not compute:
                compute = graph.fallback_root()
        out["cause"] = cause
        out["link"] = link
        rp_cidx = -1
        if cause in ("communication", "mixed"):
            top = rep if rep is not None else slow[0]
            rp_cidx = int(top["cidx"])
            out["comm"], out["comm_kind"] = self.registry.ids[rp_cidx], top["kind"]
            out["stage"] = KIND_STAGE.get(top["kind"], "other")
            ranks = sorted(compute) if cause == "mixed" else sorted(link_ranks)
        else:
            ranks = sorted(compute)
            if ranks:
                rp_cidx = graph.top_comm(ranks[0])
            if rp_cidx >= 0:
                kind = self.registry.kind(rp_cidx)
                out["comm"], out["comm_kind"] = self.registry.ids[rp_cidx], kind
            else:
                out["comm"] = out["comm_kind"] = None
            out["stage"] = self._compute_stage(ranks, win)
        out["ranks"] = [int(r) for r in ranks]
        r_val, p_val = self._rp(rp_cidx, lo, hi) if rp_cidx >= 0 else (None, None)
        out["R"], out["P"] = r_val, p_val
        out["start_ns"] = self._refine_start(start_ns, baseline_ns, win, slow,
                                             ranks if cause != "communication" else [])
        return out

    def _refine_start(self, start_ns: int, baseline_ns: float, win: _Window,
                      slow: list[dict[str, Any]], roots: list[int]) -> int:
        """The onset within the time bins: the first bin, from one iteration before the
        onset iteration, where the wait received by a root (compute, all communicators) or
        the slow group's mean transfer time (communication) exceeds every bin of the
        baseline window."""
        s = self.shift
        first = (start_ns - int(baseline_ns)) >> s
        found: list[int] = []
        if roots:
            d = self.in_w.data
            sel = np.isin(d["waitee"], roots)
            ub, inv = np.unique(d["bin"][sel], return_inverse=True)
            total = np.bincount(inv, d["w"][sel], minlength=len(ub))
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
                mean = np.bincount(inv, xfer) / np.maximum(np.bincount(inv, n), 1)
                b = _first_above(ub, mean, win.b_lo, min(win.b_hi, first), first, win.hi)
                if b is not None:
                    found.append(b)
        if not found:
            return int(start_ns)
        return int(min(found) << s)

    def _excess(self, table: BinTable, value: str, by: tuple[str, ...], win: _Window
                ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Per key of ``by``: rate of ``value`` in the window minus the baseline rate. The
        window leaves out each key's largest bin: a pause (GC) fills one bin, a straggler
        all of them."""
        w = table.query(win.lo, win.hi, ("bin", *by))
        # per key: the sum over bins, and (as the arg column "m") its largest bin
        by_key = _aggregate({**{k: w[k] for k in by}, value: w[value], "m": w[value]}, by,
                            (value,), "m", ())
        b = table.query(win.b_lo, win.b_hi, by)
        both = {k: np.concatenate([by_key[k], b[k]]) for k in by}
        both["v"] = np.concatenate([(by_key[value] - by_key["m"]) / win.win_ns,
                                    -b[value] / win.base_ns])
        agg = _aggregate(both, by, ("v",), None, ())
        return {k: agg[k] for k in by}, agg["v"]

    def _slow_groups(self, win: _Window) -> list[dict[str, Any]]:
        """Greyhound §4.3 cross-group comparison on transfer times: groups slower than their
        own baseline and than the median of their comparable cluster by more than 10%."""
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
        med = np.empty(len(w_mean))
        csize = np.empty(len(w_mean), dtype=np.int64)
        for cl in np.unique(cluster).tolist():
            sel = cluster == cl
            med[sel] = np.median(w_mean[sel])
            csize[sel] = sel.sum()
        own = np.where(b_n > 0, w_mean / np.maximum(b_mean, 1.0), 0.0)
        cross = w_mean / np.maximum(med, 1.0)
        impact = (w_mean - b_mean) * w["n"] / win.win_ns
        ok = ((b_n > 0) & (own > 1 + c.transfer_threshold)
              & ((cross > 1 + c.group_threshold) | (csize < 3))
              & (impact > c.comm_share * win.lost))
        out = []
        for j in np.flatnonzero(ok)[np.argsort(-impact[ok])].tolist():
            cidx, group = int(w["cidx"][j]), int(w["group"][j])
            ranks = ([group >> 32, group & 0xFFFFFFFF] if group >= 0
                     else self.registry.ranks(cidx))
            out.append({"cidx": cidx, "group": group, "kind": str(kinds[j]),
                        "ranks": [int(x) for x in ranks], "ratio": float(own[j]),
                        "cross": float(cross[j]), "impact": float(impact[j])})
        return out

    def _link(self, slow: list[dict[str, Any]]
              ) -> tuple[list[int] | None, dict[str, Any] | None, list[int]]:
        """The link common to the slow groups (Greyhound §4.3): the pair of nodes crossed by
        the slow groups' edges (point-to-point pairs, ring neighbours of collectives) with
        the largest total impact; reported as its first edge in rank order, a
        point-to-point pair first. Returns the link, the slow group it was taken from and
        the ranks of that link."""
        if not slow:
            return None, None, []
        node = self.meta.node_of
        edges: list[tuple[tuple[str, str], int, int, int]] = []  # (nodes, p2p?, a, gi)
        score: dict[tuple[str, str], float] = {}
        for gi, g in enumerate(slow):
            if g["group"] >= 0:
                pairs = [(g["ranks"][0], g["ranks"][1])]
            else:
                ring = g["ranks"]
                pairs = [(ring[i], ring[(i + 1) % len(ring)]) for i in range(len(ring))
                         ] if len(ring) > 1 else []
            seen: set[tuple[str, str]] = set()
            for a, b in pairs:
                na, nb = sorted((node(a), node(b)))
                nk = (na, nb)
                edges.append((nk, 0 if g["group"] >= 0 else 1, a, gi))
                if nk not in seen:
                    seen.add(nk)
                    score[nk] = score.get(nk, 0.0) + g["impact"]
        cross = {k: v for k, v in score.items() if k[0] != k[1]}
        pool = cross or score
        best = max(pool, key=lambda k: (pool[k], k))
        cands = []
        for nk, kind, a, gi in edges:
            if nk != best:
                continue
            g = slow[gi]
            if g["group"] >= 0:
                pair = sorted(g["ranks"])
            else:
                ring = g["ranks"]
                pair = [a, ring[(ring.index(a) + 1) % len(ring)]]
            cands.append((kind, min(pair) if g["group"] >= 0 else a, pair, gi))
        kind, _, pair, gi = min(cands, key=lambda x: (x[0], x[1]))
        return [int(pair[0]), int(pair[1])], slow[gi], [int(pair[0]), int(pair[1])]

    def _wait_graph(self, win: _Window) -> _WaitGraph:
        ok, ov = self._excess(self.out_w, "w", ("rank", "cidx"), win)
        ik, iv = self._excess(self.in_w, "w", ("cidx", "waitee"), win)
        return _WaitGraph(self.registry, ok["rank"], ok["cidx"], ov, ik["cidx"], ik["waitee"],
                          iv)

    def _rp(self, cidx: int, lo: int, hi: int) -> tuple[float | None, float | None]:
        """CCL-D Eqs. (2)-(4) for one communicator over the window."""
        win = self.grp.query(lo, hi, ("cidx", "cls"))
        sel = np.flatnonzero(win["cidx"] == cidx)
        if len(sel) == 0:
            return None, None
        j = sel[np.argmax(win["range"][sel])]
        base = self.t_base(self.registry.kind(cidx), int(win["cls"][j]))
        if not base:
            return None, None
        return ccld_ratios(base, win["rdmax"][j:j + 1], win["rdmin"][j:j + 1])

    # ------------------------------------------------------------------ state

    def snapshot(self) -> dict[str, Any]:
        return {
            "registry": self.registry.snapshot(), "joiner": self.joiner.snapshot(),
            "shift": self.shift, "out_w": self.out_w.snapshot(), "in_w": self.in_w.snapshot(),
            "grp": self.grp.snapshot(), "spans": self.spans.snapshot(),
            "classes": [[o, b, i] for (o, b), i in self.classes.items()],
            "tbase": {k: list(v) for k, v in self.tbase.items()},
            "change": self.change.snapshot(), "iters": [list(x) for x in self.iters],
            "iter_offset": self.iter_offset, "base_iter_ns": self.base_iter_ns,
            "first_iter_t": self.first_iter_t, "max_t": self.max_t, "next_id": self.next_id,
            "open": None if self.open is None else asdict(self.open),
            "tracker": self.tracker.snapshot() if self._own_tracker else None,
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.registry.restore(state["registry"])
        self.joiner.restore(state["joiner"])
        self.shift = int(state["shift"])
        self.out_w.restore(state["out_w"])
        self.in_w.restore(state["in_w"])
        self.grp.restore(state["grp"])
        self.spans.restore(state["spans"])
        self.classes = {(int(o), int(b)): int(i) for o, b, i in state["classes"]}
        self.tbase = {k: [float(x) for x in v] for k, v in state["tbase"].items()}
        self.change.restore(state["change"])
        self.iters = [[int(a), int(b), int(c)] for a, b, c in state["iters"]]
        self.iter_offset = int(state["iter_offset"])
        self.base_iter_ns = float(state["base_iter_ns"])
        self.first_iter_t = int(state["first_iter_t"])
        self.max_t = int(state["max_t"])
        self.next_id = int(state["next_id"])
        self.open = None if state["open"] is None else _Open(**state["open"])
        if self._own_tracker and state.get("tracker") is not None:
            self.tracker.restore(state["tracker"])
