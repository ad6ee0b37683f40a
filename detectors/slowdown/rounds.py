"""Joining ``enter``/``end`` rows into rounds (CCL-D §5.1 Trace ID): a collective round is
one ``(comm, seq)`` on every member; a point-to-point round is the k-th ``send`` from a to b
matched with the k-th ``recv`` on b from a. Every member's wait is its duration minus the
round's shortest (CCL-D: the member with the shortest duration entered last)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from failslow import events, results
from failslow.detectors.iterations import (
    _group_starts,
    _pack,
    _sorted_groups,
    coll_columns,
    comm_codes,
)
from failslow.detectors.slowdown.comms import CommRegistry
from failslow.detectors.slowdown.config import RECV, SEND
from failslow.detectors.slowdown.kernel import RoundKernel, RoundWorkspace
from failslow.events import NULL_TIME

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

    def __init__(self, registry: CommRegistry, max_age_ns: int = 600_000_000_000,
                 kernel: RoundKernel | None = None) -> None:
        self.registry = registry
        self.max_age_ns = max_age_ns
        #: the C form of the merge and the completion (None: the numpy form below), and
        #: its buffers
        self.kernel = kernel
        self.workspace = RoundWorkspace()
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
        cidx = self.registry.observe(comm_codes(coll), cr, size, rank, opc)
        null = np.full(n, NULL_TIME, dtype=np.int64)
        new = {
            "rank": rank, "comm": comm, "cidx": cidx, "cr": cr, "size": size, "seq": seq,
            "op": opc, "nbytes": nbytes, "peer": peer,
            "te": np.where(is_enter, t, null), "tx": np.where(is_enter, null, t),
            "ts": np.where(is_enter, null, ts_col), "k": np.full(n, -1, dtype=np.int64),
        }
        self._assign_k(new, is_enter)
        now = int(t.max()) if n else 0
        if self.kernel is not None:
            return self._join_in_c(self.kernel, new, now)
        ops = self._merge(new)
        return self._complete(ops, now)

    def _join_in_c(self, kernel: RoundKernel, new: dict[str, np.ndarray], now: int
                   ) -> Rounds:
        """:meth:`_merge` and :meth:`_complete` in one pass of the C kernel."""
        p, n = len(self.pending["rank"]), len(new["rank"])
        rows = kernel.rows(self.workspace, p + n)
        for i, c in enumerate(_POP):
            rows[i, :p] = self.pending[c].view(np.int64)
            rows[i, p:] = new[c].view(np.int64)
        pend, rnd, transfer, m_round, m_rank, m_wait = kernel(self.workspace, p + n, now,
                                                              self.max_age_ns)
        self.pending = {c: pend[i] for i, c in enumerate(_POP)}
        self.pending["comm"] = self.pending["comm"].view(np.uint64)
        return Rounds(cidx=rnd[0], comm=rnd[1].view(np.uint64), seq=rnd[2], op=rnd[3],
                      nbytes=rnd[4], members=rnd[5], t_first=rnd[6], t_last=rnd[7],
                      t_end=rnd[8], last_rank=rnd[9], dmax=rnd[10], dmin=rnd[11],
                      transfer=transfer, group=rnd[12], m_round=m_round, m_rank=m_rank,
                      m_wait=m_wait)

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
        return {"pending": {c: (v.view(np.int64) if c == "comm" else v).copy()
                            for c, v in self.pending.items()},
                "p2p_keys": self.p2p_keys.copy(), "p2p_counts": self.p2p_counts.copy()}

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
