"""Per-link transfer-rate samples from ``coll`` end rows (events.md).

A *link* is a point-to-point pair (both directions together; inside a node too: its own
NVLink / PCIe path), or a ring hop ``member i -> member i+1`` (communicator-rank order,
cyclic) of an all-reduce, all-gather or reduce-scatter whose traffic crosses nodes (or, for
a DP or PP group that lies within one node, the path between two of its members; tensor
parallelism within a node is left out). Each end row gives one sample,
``bytes / transfer time``: ``end - t_start`` when ``t_start`` is known (the device's own
transfer, free of waiting and of cross-node clock offsets); otherwise ``end - enter`` on the
same rank's clock, which includes the wait for late peers -- the member that entered last
waited only for the transfer, so a ring round takes its members' fastest such sample (its
members whose hop stays in a node included: they give no link sample, ``lid`` -1, but the
late one is often among them), and a window keeps a link's fastest one. A ring
member's row is its outgoing hop's sample: in a ring the slowest hop sets every member's
time, so coll timing alone degrades every hop of that ring (:mod:`.detector` localizes).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from failslow import events
from failslow.detectors.iterations import coll_columns, comm_codes
from failslow.detectors.slowdown.comms import CommRegistry, infer_comm_kind
from failslow.events import NULL_TIME, JobMeta

#: op classes: point-to-point, ring collectives; other ops give no link samples
P2P_OPS = ("send", "recv")
RING_OPS = ("allreduce", "allgather", "reducescatter")
_OPS = events.COLL_OPS
_P2P = np.array([op in P2P_OPS for op in _OPS] + [False])
_RING = np.array([op in RING_OPS for op in _OPS] + [False])
_SEQ_BITS = 33


class CommTable:
    """Communicators by small index: id, members (comm rank -> global rank, -1 unknown),
    kind (``meta.comms``, else inferred from members and degrees), point-to-point only."""

    def __init__(self, meta: JobMeta) -> None:
        self.meta = meta
        self.index: dict[int, int] = {}
        self.ids: list[int] = []
        self.members: list[np.ndarray] = []
        self.p2p: list[bool] = []
        self._kinds: dict[int, str] = {}
        #: bumped whenever a communicator, a member or an op class is learned
        self.version = 0
        self._arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._arrays_version = -1
        self._meta_kinds = {c.comm: c.kind for c in meta.comms}
        #: the job's slow-down detector's communicator registry, when it runs beside this
        #: one (set by the engine): the kinds it learned for the whole job are used here,
        #: so both detectors label a group alike (None: inferred here, group by group)
        self.learned: CommRegistry | None = None
        for c in meta.comms:
            i = self._add(c.comm, len(c.ranks))
            self.members[i][:] = c.ranks

    def _add(self, comm: int, size: int) -> int:
        i = self.index.get(comm)
        if i is None:
            i = self.index[comm] = len(self.ids)
            self.ids.append(comm)
            self.members.append(np.full(max(size, 1), -1, dtype=np.int64))
            self.p2p.append(True)
            self.version += 1
        return i

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every communicator's members in one flat array, with their offsets and sizes
        (rebuilt only when something was learned)."""
        if self._arrays is None or self._arrays_version != self.version:
            sizes = np.array([len(m) for m in self.members], dtype=np.int64)
            offs = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
            flat = (np.concatenate(self.members) if self.members
                    else np.zeros(0, dtype=np.int64))
            self._arrays, self._arrays_version = (flat, offs, sizes), self.version
        return self._arrays

    def learn(self, codes: tuple[np.ndarray, np.ndarray, np.ndarray], crank: np.ndarray,
              csize: np.ndarray, rank: np.ndarray, p2p: np.ndarray) -> np.ndarray:
        """Index of every row's communicator (``codes``: as :func:`~failslow.detectors.
        iterations.columns.comm_codes` gives them); members and op classes learned from the
        rows."""
        uniq, first, inv = codes
        known_ids = np.array(self.ids, dtype=np.uint64)
        order = np.argsort(known_ids)
        pos = np.minimum(np.searchsorted(known_ids[order], uniq), max(len(order) - 1, 0))
        hit = (known_ids[order][pos] == uniq) if len(order) else np.zeros(len(uniq), bool)
        idx = np.where(hit, order[pos] if len(order) else 0, -1).astype(np.int64)
        for j in np.flatnonzero(~hit).tolist():  # once per communicator ever
            idx[j] = self._add(int(uniq[j]), int(csize[first[j]]))
        cidx = idx[inv.reshape(-1)]
        flat, offs, sizes = self.arrays()
        inside = (crank >= 0) & (crank < sizes[cidx])
        slot = offs[cidx[inside]] + crank[inside]
        new = flat[slot] < 0
        if new.any():
            key = np.unique(np.stack([cidx[inside][new], crank[inside][new],
                                      rank[inside][new]], axis=1), axis=0)
            for ci, cr, r in key.tolist():  # once per (communicator, member) ever
                self.members[ci][cr] = r
                self._kinds.pop(ci, None)
            self.version += 1
        still = np.array(self.p2p, dtype=bool)
        for ci in np.unique(cidx[~p2p & still[cidx]]).tolist():  # once per communicator
            self.p2p[ci] = False
            self._kinds.pop(ci, None)
            self.version += 1
        return cidx

    @property
    def kinds_version(self) -> int:
        """Changes whenever the learned kinds this table reads changed."""
        return self.learned.kinds_version if self.learned is not None else 0

    def kind(self, i: int) -> str:
        if self.learned is not None and self.ids[i] not in self._meta_kinds:
            k = self.learned.kind_of(self.ids[i])
            if k is not None:
                return k
        k = self._kinds.get(i)
        if k is None:
            k = self._meta_kinds.get(self.ids[i])
            if k is None:
                m = self.members[i]
                k = (infer_comm_kind([int(x) for x in m], self.meta, self.p2p[i])
                     if (m >= 0).all() else ("pp" if self.p2p[i] else "other"))
            self._kinds[i] = k
        return k

    def snapshot(self) -> dict[str, Any]:
        return {"ids": [str(c) for c in self.ids], "members": [m.tolist() for m in self.members],
                "p2p": list(self.p2p)}

    def restore(self, state: dict[str, Any]) -> None:
        self.ids = [int(c) for c in state["ids"]]
        self.index = {c: i for i, c in enumerate(self.ids)}
        self.members = [np.array(m, dtype=np.int64) for m in state["members"]]
        self.p2p = [bool(x) for x in state["p2p"]]
        self._kinds = {}
        self.version += 1


def _row_hash(rows: np.ndarray) -> np.ndarray:
    """A 64-bit hash of every row of an int64 matrix (splitmix64 steps over the columns)."""
    h = np.full(len(rows), 0x9E3779B97F4A7C15, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for col in rows.T.astype(np.uint64):
            h ^= col + np.uint64(0x9E3779B97F4A7C15) + (h << np.uint64(6)) + (h >> np.uint64(2))
            h ^= h >> np.uint64(30)
            h *= np.uint64(0xBF58476D1CE4E5B9)
            h ^= h >> np.uint64(27)
            h *= np.uint64(0x94D049BB133111EB)
            h ^= h >> np.uint64(31)
    return h.view(np.int64)


class LinkRegistry:
    """Links by id: communicator index, the two ends (p2p: lower comm rank first; ring:
    the hop's sender first), op class and bytes (a link id per traffic class, so rates
    compare like with like) and the peer class (kind, op, bytes, communicator size, and
    whether the link joins two nodes: a hop between nodes is compared with the others that
    are, not with NVLink hops several times faster, which would make it look degraded from
    its first window and keep it from ever learning its own baseline)."""

    def __init__(self, nodes: Mapping[int, str] | None = None) -> None:
        self.nodes = dict(nodes or {})
        self.index: dict[tuple[int, int, int, int, int], int] = {}
        self.rows: list[tuple[int, int, int, int, int]] = []  # cidx, a, b, op, bytes
        self.cls_index: dict[tuple[str, int, int, int, int], int] = {}
        self.cls = np.zeros(0, dtype=np.int64)
        self._kinds_version = 0  # of the communicator kinds the classes were made with
        self._rows = np.zeros((0, 5), dtype=np.int64)
        self._hash_sorted = np.zeros(0, dtype=np.int64)
        self._id_sorted = np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.rows)

    def ids(self, keys: np.ndarray, comms: CommTable) -> np.ndarray:
        """Link id of every row of ``keys`` (columns cidx, a, b, op, bytes): one binary
        search per row on a 64-bit hash of the row; Python runs once per new link."""
        if comms.kinds_version != self._kinds_version:
            self._reclass(comms)
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        h = _row_hash(keys)
        out, hit = self._find(h)
        if not hit.all():
            fresh = []
            for row in np.unique(keys[~hit], axis=0).tolist():  # once per link, ever
                k = (int(row[0]), int(row[1]), int(row[2]), int(row[3]), int(row[4]))
                if k not in self.index:
                    self.index[k] = len(self.rows)
                    self.rows.append(k)
                    fresh.append(self._class(k, comms))
            if fresh:
                self.cls = np.concatenate([self.cls, np.array(fresh, dtype=np.int64)])
            self._reindex()
            out, hit = self._find(h)
        if not (self._rows[out] == keys).all():  # a hash collision: exact, the slow way
            return np.array([self.index[(r[0], r[1], r[2], r[3], r[4])]
                             for r in keys.tolist()], dtype=np.int64)
        return out

    def _class(self, k: tuple[int, int, int, int, int], comms: CommTable) -> int:
        """The peer class of link ``k`` (class docstring)."""
        ck = (comms.kind(k[0]), k[3], k[4], len(comms.members[k[0]]), self._crosses(k[1], k[2]))
        return self.cls_index.setdefault(ck, len(self.cls_index))

    def _reclass(self, comms: CommTable) -> None:
        """Peer classes again after communicator kinds changed (a kind learned before the
        job's other groups showed its rank order was corrected): classes hold no state of
        their own, each window compares a link with its class's links in that window."""
        self.cls_index = {}
        self.cls = np.array([self._class(k, comms) for k in self.rows], dtype=np.int64)
        self._kinds_version = comms.kinds_version

    def _crosses(self, a: int, b: int) -> int:
        """1 when both ends' nodes are known and differ."""
        na, nb = self.nodes.get(a), self.nodes.get(b)
        return int(na is not None and nb is not None and na != nb)

    def _reindex(self) -> None:
        self._rows = np.array(self.rows, dtype=np.int64).reshape(-1, 5)
        h = _row_hash(self._rows)
        order = np.argsort(h, kind="stable")
        self._hash_sorted, self._id_sorted = h[order], order.astype(np.int64)

    def _find(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if len(self._hash_sorted) == 0:
            return np.zeros(len(h), dtype=np.int64), np.zeros(len(h), dtype=bool)
        pos = np.minimum(np.searchsorted(self._hash_sorted, h), len(self._hash_sorted) - 1)
        return self._id_sorted[pos], self._hash_sorted[pos] == h

    def snapshot(self) -> dict[str, Any]:
        return {"rows": [list(r) for r in self.rows],
                "cls": [[*k, v] for k, v in self.cls_index.items()], "link_cls": self.cls.tolist()}

    def restore(self, state: dict[str, Any]) -> None:
        self.rows = [(int(a), int(b), int(c), int(d), int(e)) for a, b, c, d, e in state["rows"]]
        self.index = {r: i for i, r in enumerate(self.rows)}
        # snapshots before the node crossing was part of the class: 0 (as then)
        self.cls_index = {(str(c[0]), int(c[1]), int(c[2]), int(c[3]),
                           int(c[4]) if len(c) > 5 else 0): int(c[-1])
                          for c in state["cls"]}
        self.cls = np.array(state["link_cls"], dtype=np.int64)
        self._reindex()


class SampleExtractor:
    """``coll`` batches -> link samples (link id, end time, rate in bytes/ns, whether from
    ``t_start``). Keeps the enter times of operations still in flight, to time end rows
    without ``t_start``."""

    def __init__(self, meta: JobMeta, min_bytes: int, max_pending_ns: int) -> None:
        self.meta = meta
        self.comms = CommTable(meta)
        self.links = LinkRegistry(meta.nodes)
        self.min_bytes = min_bytes
        self.max_pending_ns = max_pending_ns
        self.pend_key = np.zeros(0, dtype=np.int64)
        self.pend_t = np.zeros(0, dtype=np.int64)
        self._members_cache: tuple[np.ndarray, ...] | None = None
        self._members_version = -1
        nodes = sorted(set(meta.nodes.values()))
        self.node_ids = {n: i for i, n in enumerate(nodes)}
        self.node_of_rank = np.array(
            [self.node_ids.get(meta.nodes.get(r, ""), -1) for r in range(meta.world_size)],
            dtype=np.int64)

    def node(self, ranks: np.ndarray) -> np.ndarray:
        """Node index per global rank (rank // 8 in its own namespace when unknown)."""
        ok = (ranks >= 0) & (ranks < len(self.node_of_rank))
        known = np.where(ok, self.node_of_rank[np.clip(ranks, 0, max(len(self.node_of_rank)
                                                                         - 1, 0))], -1)
        return np.where(known >= 0, known, -1 - ranks // 8)

    def update(self, coll: pa.Table) -> dict[str, np.ndarray]:
        empty = {"lid": np.zeros(0, np.int64), "t": np.zeros(0, np.int64),
                 "rate": np.zeros(0), "ts": np.zeros(0, bool), "rnd": np.zeros(0, np.int64)}
        if coll.num_rows == 0:
            return empty
        cols = coll_columns(coll)  # decoded once for all the detectors of the job
        op = cols["op"]  # -1 when unknown: the last entry of _P2P and _RING (False)
        rank, crank, csize = cols["rank"], cols["comm_rank"], cols["comm_size"]
        seq, nbytes, peer = cols["seq"], cols["bytes"], cols["peer"]
        enter, t, t_start = cols["is_enter"], cols["t"], cols["t_start"]
        p2p = _P2P[op]
        cidx = self.comms.learn(comm_codes(coll), crank, csize, rank, p2p)
        world = max(self.meta.world_size, int(rank.max()) + 1, 1)
        horizon = int(t.max()) - self.max_pending_ns
        flat, offs, sizes, one_node, spans_nodes, never = self._member_arrays()
        skip = never[cidx] & ~p2p
        if skip.any():
            # collectives of a tensor- or context-parallel group within one node give no
            # sample: left out before their enter and end rows are joined (most rows)
            rest = np.flatnonzero(~skip)
            op, rank, crank, csize, seq, nbytes, peer, enter, t, t_start, p2p, cidx = (
                a[rest] for a in (op, rank, crank, csize, seq, nbytes, peer, enter, t,
                                  t_start, p2p, cidx))
        key = ((cidx * world + rank) << _SEQ_BITS) | (seq & ((1 << _SEQ_BITS) - 1))
        round_key = (cidx << _SEQ_BITS) | (seq & ((1 << _SEQ_BITS) - 1))
        # enter times: this batch's and the pending ones; an end row consumes its enter
        pk = np.concatenate([self.pend_key, key[enter]])
        pt = np.concatenate([self.pend_t, t[enter]])
        order = np.argsort(pk, kind="stable")
        pk, pt = pk[order], pt[order]
        end = ~enter
        pos = np.searchsorted(pk, key[end])
        hit = pos < len(pk)
        hit[hit] = pk[pos[hit]] == key[end][hit]
        t_enter = np.full(int(end.sum()), NULL_TIME, dtype=np.int64)
        t_enter[hit] = pt[pos[hit]]
        keep = np.ones(len(pk), dtype=bool)
        keep[pos[hit]] = False
        keep &= pt >= horizon
        self.pend_key, self.pend_t = pk[keep], pt[keep]
        # samples of the end rows
        e = np.flatnonzero(end)
        te, ts = t[e], t_start[e]
        has_ts = (ts != NULL_TIME) & (te > ts)
        dur = np.where(has_ts, te - ts, np.where((t_enter != NULL_TIME) & (te > t_enter),
                                                  te - t_enter, 0))
        ci, cr, sz = cidx[e], crank[e], csize[e]
        is_p2p, is_ring = p2p[e], _RING[op[e]]
        other_cr = np.where(is_p2p, peer[e], (cr + 1) % np.maximum(sz, 1))
        ok = (other_cr >= 0) & (other_cr < sizes[ci])
        other = np.full(len(e), -1, dtype=np.int64)
        other[ok] = flat[offs[ci[ok]] + other_cr[ok]]
        inside = one_node[ci]  # rows of a DP / PP group within one node
        me = rank[e]
        lo_first = np.where(is_p2p, cr < other_cr, True)
        a = np.where(lo_first, me, other)
        b = np.where(lo_first, other, me)
        timed = (dur > 0) & (nbytes[e] >= self.min_bytes)
        good = (timed & (is_p2p | is_ring) & (other >= 0) & (other != me)
                & ((self.node(me) != self.node(other)) | inside | is_p2p)
                & ((sz > 1) | is_p2p))
        # a ring member whose hop stays in its node is no link sample, but it times the
        # round all the same (lid -1): the member that entered last, the one a GC pause
        # held, is often one of them, and only it waited for no one
        timer = timed & is_ring & (sz > 1) & ~good & spans_nodes[ci]
        if not (good | timer).any():
            return empty
        g = np.flatnonzero(good)
        opcls = np.where(is_p2p[g], -1, op[e][g])
        keys = np.stack([ci[g], a[g], b[g], opcls, nbytes[e][g]], axis=1)
        lid = self.links.ids(keys, self.comms) if len(g) else np.zeros(0, np.int64)
        h = np.flatnonzero(timer)
        lid = np.concatenate([lid, np.full(len(h), -1, dtype=np.int64)])
        g = np.concatenate([g, h])
        # ring rounds: members joined by (comm, seq), so that a member timed from its enter
        # row takes the round's best rate (see the detector)
        rnd = np.where(is_ring[g], round_key[e][g], -1)
        return {"lid": lid, "t": te[g], "rate": nbytes[e][g] / dur[g].astype(np.float64),
                "ts": has_ts[g], "rnd": rnd}

    def _member_arrays(self) -> tuple[np.ndarray, ...]:
        """Every communicator's members in one flat array (with offsets and sizes), whether
        it is a DP / PP group that lies within one node, whether its known members span
        nodes (its in-node ring members time its rounds), and whether its collectives never
        give a sample (a TP / CP group whose members are all known and on one node: every
        ring hop stays in the node); rebuilt only when the communicators or their members
        change."""
        comms = self.comms
        if self._members_cache is None or comms.version != self._members_version:
            flat, offs, sizes = comms.arrays()
            one_node = np.zeros(len(sizes), dtype=bool)
            spans_nodes = np.zeros(len(sizes), dtype=bool)
            never = np.zeros(len(sizes), dtype=bool)
            for c, m in enumerate(comms.members):  # once per communicator change, not batch
                known = m[m >= 0]
                nodes = len(np.unique(self.node(known)))
                within = len(known) > 1 and nodes == 1
                spans_nodes[c] = nodes > 1
                parallel = comms.kind(c) in ("tp", "cp")
                one_node[c] = within and not parallel
                never[c] = within and parallel and len(known) == len(m)
            self._members_cache = (flat, offs, sizes, one_node, spans_nodes, never)
            self._members_version = comms.version
        return self._members_cache

    def snapshot(self) -> dict[str, Any]:
        return {"comms": self.comms.snapshot(), "links": self.links.snapshot(),
                "pend_key": self.pend_key.copy(), "pend_t": self.pend_t.copy()}

    def restore(self, state: dict[str, Any]) -> None:
        self.comms.restore(state["comms"])
        self.links.restore(state["links"])
        self.pend_key = np.array(state["pend_key"], dtype=np.int64)
        self.pend_t = np.array(state["pend_t"], dtype=np.int64)
