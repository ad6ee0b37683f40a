"""Hang detection, classification and localisation (CCL-D §2.2, §4.2; MEGATRACE §III-C).

Detection (CCL-D §4.2.1, MEGATRACE Algorithm 1 line 3): an operation with an ``enter`` and no
``end`` that has been in flight longer than ``n x T_expected`` is stuck. ``T_expected`` is
learned per (communicator, operation) from completed history (a high quantile of the last
``history`` end-enter durations), clamped to ``[floor_ns, ceiling_ns]``; CCL-D's 5-minute
cutoff is the ceiling and the threshold of operations never seen completing. Tiny allreduces
(<= ``barrier_bytes``, CCL-D's barrier filter) never trigger. A rank that emits nothing for
``n x`` its longest usual gap while a peer waits for it is a hang too (MEGATRACE's heartbeat
timeout); nobody waiting (a pause with nothing in flight) is not. Detection runs on
``on_tick`` as time passes, and on ``update`` at the latest record time.

Classification (CCL-D §4.2.2, Figure 7) over the Trace ID ``(comm, seq)`` of the stuck round
(for send/recv: the k-th operation between a sender and a receiver, events.md):

* H1 ``not_entered``: a member's seq counter on the communicator is behind the round (for
  send/recv: the peer has not posted the matching k-th operation). That member is the root.
* H2 ``inconsistent``: everyone entered but with different operations or byte counts (the
  deviating minority is the root; a tie goes against the signature rarer in history), or
  some members completed the round while the others hang (CCL-D: "the non-hang ranks are
  the root cause").
* H3 ``hardware``: everyone entered consistently and nothing completes. The rank with the
  fewest send/recv steps (``progress`` rows, compared within the round) is the root; a queue
  pair whose posted work requests accumulate without completions (MEGATRACE §III-B2, §III-C
  step 2) names the link, and the report waits a few link samples for that evidence. A member
  that holds in flight rounds its peers completed *and passed* stopped completing work (its
  device: a GPU error), which is H3 with that member as root, not H2.

Cascades: the wait graph goes rank -> its head operations (the earliest in flight: a rank runs
its calls in order, later ones are queued behind) -> the members missing from those rounds.
It is followed from every stuck operation to a root: an idle rank (H1), a round every member
entered (H2/H3), or a hang already reported (the operation is a victim: no new report). One
anomaly is reported per root, with MEGATRACE's *halt point* (the first operation the root
failed to call or complete) and the training stage (§III-C step 3), with the 1F1B pass and
micro-batch for pipeline send/recv.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from failslow import events
from failslow.detectors.base import EventBatch
from failslow.diagnosis import Anomaly
from failslow.events import JobMeta

SEND, RECV = events.OP["send"], events.OP["recv"]
ALLREDUCE = events.OP["allreduce"]
N_OPS = len(events.COLL_OPS)
NO_TIME = int(np.iinfo(np.int64).min)

# Bit layout of the single int64 keys of the sorted tables.
_RANK_BITS = 32          # (comm index, global rank) and (comm index, comm rank)
_PAIR_PEER_BITS = 20     # point-to-point counters: comm index | rank | peer | direction
_PAIR_RANK_BITS = 24
_PAIR_COMM_BITS = 63 - 1 - _PAIR_PEER_BITS - _PAIR_RANK_BITS


@dataclass
class HangConfig:
    """Thresholds of the hang detector.

    ``n_expected``: MEGATRACE's ``n`` (Algorithm 1, ``t > n x T_expected``, e.g. 2).
    ``floor_ns``: the smallest threshold; collectives of microseconds do not alarm after a
    millisecond of host jitter. ``ceiling_ns``: CCL-D's hang threshold (§6.1: 5 minutes, "97 %
    of cases exceeding this limit cannot recover"); the threshold never exceeds it, and an
    operation type with no history waits this long. ``quantile`` of the last ``history``
    durations of a (communicator, operation) is ``T_expected`` once ``min_history`` of them
    were seen. ``barrier_bytes``: CCL-D's barrier filter (allreduce of at most 4 bytes).
    Silence (a rank emits nothing while a peer waits on it): threshold ``silence_n`` times the
    rank's longest gap between its own records, at least ``silence_floor_ns``, learned after
    ``silence_min_gaps`` gaps. ``link_stall_ns``: how long a queue pair's completions must
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
    min_history: int = 4
    barrier_bytes: int = 4
    silence: bool = True
    silence_n: float = 2.0
    silence_floor_ns: int = 1_000_000_000
    silence_min_gaps: int = 50
    link_stall_ns: int = 500_000_000
    p2p_batch_ns: int = 1_000_000
    link_wait_ns: int = 5_000_000_000
    max_listed_victims: int = 64
    max_orphans: int = 100_000
    max_signatures: int = 10_000


# ---------------------------------------------------------------------------------------------
# small vectorised tables


def _match2(a1: np.ndarray, a2: np.ndarray, b1: np.ndarray, b2: np.ndarray) -> np.ndarray:
    """For each key (b1, b2), the index of the equal key in the unique keys (a1, a2), or -1."""
    na, nb = len(a1), len(b1)
    out = np.full(nb, -1, dtype=np.int64)
    if na == 0 or nb == 0:
        return out
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


class _Sorted:
    """Columns keyed by a sorted unique int64 key; vectorised find and insert."""

    def __init__(self, spec: dict[str, tuple[Any, int]]) -> None:
        self.spec = spec
        self.keys = np.zeros(0, dtype=np.int64)
        self.cols: dict[str, np.ndarray] = {n: np.zeros(0, dtype=d) for n, (d, _) in spec.items()}

    def __len__(self) -> int:
        return len(self.keys)

    def find(self, q: np.ndarray) -> np.ndarray:
        if len(self.keys) == 0:
            return np.full(len(q), -1, dtype=np.int64)
        idx = np.searchsorted(self.keys, q)
        safe = np.minimum(idx, len(self.keys) - 1)
        return np.where((idx < len(self.keys)) & (self.keys[safe] == q), safe, -1)

    def ensure(self, q: np.ndarray) -> np.ndarray:
        """Insert the missing keys of ``q`` (default column values); return their indices."""
        idx = self.find(q)
        if (idx < 0).any():
            new = np.unique(q[idx < 0])
            keys = np.concatenate([self.keys, new])
            order = np.argsort(keys, kind="stable")
            self.keys = keys[order]
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
        for name, (dtype, _) in self.spec.items():
            self.cols[name] = np.asarray(state[name], dtype=dtype)


_INFLIGHT: dict[str, Any] = {
    "rank": np.int64, "comm": np.int64, "seq": np.int64, "op": np.int64, "bytes": np.int64,
    "peer": np.int64, "crank": np.int64, "t": np.int64, "pidx": np.int64, "steps": np.int64,
    "steps_t": np.int64, "hang": np.int64,
}
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


def _u64_to_i64(a: np.ndarray) -> np.ndarray:
    """Counters and sizes as int64 (saturating; nulls already replaced)."""
    return np.minimum(a.astype(np.uint64), np.uint64(2**63 - 1)).astype(np.int64)


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
        # durations per (comm, op): ring buffers
        self._stat_row = np.full((0, N_OPS), -1, dtype=np.int64)
        self._dur = np.full((0, self.config.history), -1, dtype=np.int64)
        self._dur_pos = np.zeros(0, dtype=np.int64)
        self._dur_n = np.zeros(0, dtype=np.int64)
        self._exp = np.full(0, -1, dtype=np.int64)
        # per rank
        self._rk_last = np.full(0, NO_TIME, dtype=np.int64)
        self._rk_gap = np.zeros(0, dtype=np.int64)
        self._rk_ngap = np.zeros(0, dtype=np.int64)
        # links (queue pairs)
        self._qp_ids: dict[str, int] = {}
        self._qp_info: list[tuple[str, str, str | None, int]] = []
        self._qp = {n: np.zeros(0, np.int64) for n in
                    ("last_t", "posted", "completed", "t_change", "posted_change")}
        self._signatures: dict[tuple[int, int, int], int] = {}
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
        out = self._finished()
        if self._latest != NO_TIME:
            out += self._check(self._latest)
        return out

    def on_tick(self, now_ns: int) -> list[Anomaly]:
        return self._finished() + self._check(int(now_ns))

    def snapshot(self) -> dict[str, Any]:
        return {
            "version": 1, "latest": self._latest,
            "comms": {"u64": self._comm_u64, "kind": self._comm_kind, "size": self._comm_size,
                      "p2p": self._comm_p2p},
            "cr": self._cr.to_state(), "crk": self._crk.to_state(),
            "pairs": self._pairs.to_state(),
            "inflight": {n: a.tolist() for n, a in self._fl.items()},
            "orphans": {n: a.tolist() for n, a in self._orphans.items()},
            "stats": {"row": self._stat_row.tolist(), "dur": self._dur.tolist(),
                      "pos": self._dur_pos.tolist(), "n": self._dur_n.tolist(),
                      "exp": self._exp.tolist()},
            "ranks": {"last": self._rk_last.tolist(), "gap": self._rk_gap.tolist(),
                      "ngap": self._rk_ngap.tolist()},
            "qp": {"keys": list(self._qp_ids), "info": [list(i) for i in self._qp_info],
                   **{n: a.tolist() for n, a in self._qp.items()}},
            "signatures": [[*k, v] for k, v in self._signatures.items()],
            "link_period": self._link_period,
            "hangs": [{"anomaly": h.anomaly.to_dict(), "index": h.index, "roots": h.roots,
                       "round": h.round, "last_end": h.last_end, "ended": h.ended}
                      for h in self._hangs],
        }

    def restore(self, state: dict[str, Any]) -> None:
        if state.get("version") != 1:
            raise ValueError("hang detector: unknown snapshot version")
        self._latest = int(state["latest"])
        comms = state["comms"]
        self._comm_u64 = [int(c) for c in comms["u64"]]
        self._comm_ids = {c: i for i, c in enumerate(self._comm_u64)}
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
        self._stat_row = np.asarray(st["row"], dtype=np.int64).reshape(-1, N_OPS)
        self._dur = np.asarray(st["dur"], dtype=np.int64).reshape(-1, self.config.history)
        self._dur_pos = np.asarray(st["pos"], dtype=np.int64)
        self._dur_n = np.asarray(st["n"], dtype=np.int64)
        self._exp = np.asarray(st["exp"], dtype=np.int64)
        rk = state["ranks"]
        self._rk_last = np.asarray(rk["last"], dtype=np.int64)
        self._rk_gap = np.asarray(rk["gap"], dtype=np.int64)
        self._rk_ngap = np.asarray(rk["ngap"], dtype=np.int64)
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
            grow = np.full((ci + 1 - len(self._stat_row), N_OPS), -1, dtype=np.int64)
            self._stat_row = np.concatenate([self._stat_row, grow])
        return ci

    def _comm_index(self, comm: np.ndarray, sizes: np.ndarray | None = None) -> np.ndarray:
        uniq, first, inv = np.unique(comm, return_index=True, return_inverse=True)
        ids = np.empty(len(uniq), dtype=np.int64)
        for j, c in enumerate(uniq.tolist()):
            if sizes is None:
                ids[j] = self._comm_ids.get(int(c), -1)
            else:
                ids[j] = self._register_comm(int(c), int(sizes[first[j]]))
        return ids[inv.reshape(-1)]

    def _grow_ranks(self, max_rank: int) -> None:
        n = max_rank + 1 - len(self._rk_last)
        if n > 0:
            self._rk_last = np.concatenate([self._rk_last, np.full(n, NO_TIME, np.int64)])
            self._rk_gap = np.concatenate([self._rk_gap, np.zeros(n, np.int64)])
            self._rk_ngap = np.concatenate([self._rk_ngap, np.zeros(n, np.int64)])

    def _ingest_coll(self, table: pa.Table) -> None:
        rank = table.column("rank").to_numpy().astype(np.int64)
        comm_u = table.column("comm").to_numpy()
        csize = table.column("comm_size").to_numpy().astype(np.int64)
        ci = self._comm_index(comm_u, csize)
        crank = table.column("comm_rank").to_numpy().astype(np.int64)
        seq = _u64_to_i64(table.column("seq").to_numpy())
        op = pc.index_in(table.column("op"), value_set=pa.array(events.COLL_OPS))
        op_a = op.to_numpy().astype(np.int64)
        phase = np.asarray(pc.equal(table.column("phase"), "end").to_numpy(), dtype=bool)
        nbytes = _u64_to_i64(table.column("bytes").to_numpy())
        peer = table.column("peer").to_numpy().astype(np.int64)
        t = table.column("t").to_numpy().astype(np.int64)
        self._latest = max(self._latest, int(t.max()))
        self._observe_ranks(rank, t)
        enter = ~phase
        if enter.any():
            self._ingest_enters(rank[enter], ci[enter], crank[enter], seq[enter], op_a[enter],
                                nbytes[enter], peer[enter], t[enter])
        if phase.any():
            self._ingest_ends(rank[phase], ci[phase], seq[phase], op_a[phase], nbytes[phase],
                              t[phase])
        elif len(self._orphans["t"]):
            self._ingest_ends(*(np.zeros(0, np.int64),) * 6)

    def _observe_ranks(self, rank: np.ndarray, t: np.ndarray) -> None:
        """Last record time and longest gap between a rank's own records (silence baseline)."""
        self._grow_ranks(int(rank.max()))
        order = np.lexsort((t, rank))
        r, ts = rank[order], t[order]
        prev = np.empty_like(ts)
        prev[1:] = ts[:-1]
        first = np.ones(len(r), dtype=bool)
        first[1:] = r[1:] != r[:-1]
        prev[first] = self._rk_last[r[first]]
        ok = prev != NO_TIME
        gaps = np.where(ok, ts - prev, 0)
        np.maximum.at(self._rk_gap, r[ok], gaps[ok])
        np.add.at(self._rk_ngap, r[ok], 1)
        last = np.ones(len(r), dtype=bool)
        last[:-1] = r[1:] != r[:-1]
        self._rk_last[r[last]] = np.maximum(self._rk_last[r[last]], ts[last])

    def _ingest_enters(self, rank: np.ndarray, ci: np.ndarray, crank: np.ndarray,
                       seq: np.ndarray, op: np.ndarray, nbytes: np.ndarray, peer: np.ndarray,
                       t: np.ndarray) -> None:
        # membership: (comm, comm rank) -> global rank; (comm, rank) state
        self._mcache.clear()
        k = self._crk.ensure(_cr_key(ci, crank))
        self._crk.cols["rank"][k] = rank
        idx = self._cr.ensure(_cr_key(ci, rank))
        cols = self._cr.cols
        cols["crank"][idx] = crank
        np.maximum.at(cols["last_seq"], idx, seq)
        np.maximum.at(cols["last_t"], idx, t)
        zero = seq == 0
        cols["seq0"][idx[zero]] = True
        # point-to-point: index k of the k-th operation per (comm, rank, peer, direction)
        p2p = (op == SEND) | (op == RECV)
        pidx = np.full(len(rank), -1, dtype=np.int64)
        if p2p.any():
            for c in np.unique(ci[p2p]).tolist():
                self._comm_p2p[c] = True
            pk = _pair_key(ci[p2p], rank[p2p], peer[p2p], op[p2p] == RECV)
            order = np.lexsort((seq[p2p], pk))
            sk = pk[order]
            start = np.ones(len(sk), dtype=bool)
            start[1:] = sk[1:] != sk[:-1]
            head = np.maximum.accumulate(np.where(start, np.arange(len(sk)), 0))
            pos = np.arange(len(sk)) - head
            prow = self._pairs.ensure(sk)
            base = self._pairs.cols["count"][prow]
            sub = np.empty(len(sk), dtype=np.int64)
            sub[order] = base + pos
            pidx[np.flatnonzero(p2p)] = sub
            np.add.at(self._pairs.cols["count"], prow, 1)
        new = {"rank": rank, "comm": ci, "seq": seq, "op": op, "bytes": nbytes, "peer": peer,
               "crank": crank, "t": t, "pidx": pidx,
               "steps": np.full(len(rank), -1, np.int64),
               "steps_t": np.full(len(rank), NO_TIME, np.int64),
               "hang": np.full(len(rank), -1, np.int64)}
        # duplicates of operations already in flight are ignored
        dup = _match2(_cr_key(self._fl["comm"], self._fl["rank"]), self._fl["seq"],
                      _cr_key(ci, rank), seq) >= 0
        if dup.any():
            new = {n: a[~dup] for n, a in new.items()}
        self._fl = {n: np.concatenate([self._fl[n], new[n]]) for n in _INFLIGHT}
        self._fl_version += 1

    def _ingest_ends(self, rank: np.ndarray, ci: np.ndarray, seq: np.ndarray, op: np.ndarray,
                     nbytes: np.ndarray, t: np.ndarray) -> None:
        if len(rank):
            idx = self._cr.ensure(_cr_key(ci, rank))
            cols = self._cr.cols
            order = np.lexsort((seq, idx))
            last = np.ones(len(order), dtype=bool)
            last[:-1] = idx[order][1:] != idx[order][:-1]
            sel = order[last]
            newer = seq[sel] > cols["done_seq"][idx[sel]]
            sel = sel[newer]
            cols["done_seq"][idx[sel]] = seq[sel]
            cols["done_op"][idx[sel]] = op[sel]
            cols["done_bytes"][idx[sel]] = nbytes[sel]
            self._count_signatures(ci, op, nbytes)
        # match ends (and earlier orphans) with in-flight operations
        o = self._orphans
        e_comm = np.concatenate([o["comm"], ci])
        e_rank = np.concatenate([o["rank"], rank])
        e_seq = np.concatenate([o["seq"], seq])
        e_t = np.concatenate([o["t"], t])
        fl = self._fl
        hit = _match2(_cr_key(fl["comm"], fl["rank"]), fl["seq"], _cr_key(e_comm, e_rank), e_seq)
        matched = hit >= 0
        done = np.zeros(len(fl["t"]), dtype=bool)
        end_t = np.full(len(fl["t"]), NO_TIME, dtype=np.int64)
        done[hit[matched]] = True
        np.maximum.at(end_t, hit[matched], e_t[matched])
        # an operation on a communicator whose later collective completed has completed
        # too (one stream per communicator runs in call order): its end row was lost
        crow = self._cr.find(_cr_key(fl["comm"], fl["rank"]))
        done_seq = np.where(crow >= 0, self._cr.cols["done_seq"][np.maximum(crow, 0)], -1)
        coll = (fl["op"] != SEND) & (fl["op"] != RECV)
        lost = coll & (fl["seq"] < done_seq) & ~done
        done |= lost
        end_t[lost] = self._latest
        if done.any():
            self._learn(fl["comm"][done & ~lost], fl["op"][done & ~lost],
                        (end_t - fl["t"])[done & ~lost], fl["hang"][done & ~lost])
            for h in np.unique(fl["hang"][done]).tolist():
                if h >= 0:
                    sel = done & (fl["hang"] == h)
                    self._hangs[h].last_end = max(self._hangs[h].last_end, int(end_t[sel].max()))
            self._fl = {n: a[~done] for n, a in fl.items()}
            self._fl_version += 1
        # unmatched ends wait for their enter (records of a kind may come in any order)
        keep = ~matched & (e_t >= self._latest - self.config.ceiling_ns)
        keep_idx = np.flatnonzero(keep)[-self.config.max_orphans:]
        self._orphans = {"comm": e_comm[keep_idx], "rank": e_rank[keep_idx],
                         "seq": e_seq[keep_idx], "t": e_t[keep_idx]}

    def _count_signatures(self, ci: np.ndarray, op: np.ndarray, nbytes: np.ndarray) -> None:
        """How often each (comm, op, bytes) completed: breaks ties between the two sides of
        an inconsistent round (the usual signature is not the deviating one)."""
        order = np.lexsort((nbytes, op, ci))
        c_s, o_s, b_s = ci[order], op[order], nbytes[order]
        start = np.ones(len(order), dtype=bool)
        start[1:] = (c_s[1:] != c_s[:-1]) | (o_s[1:] != o_s[:-1]) | (b_s[1:] != b_s[:-1])
        heads = np.flatnonzero(start)
        counts = np.diff(np.append(heads, len(order)))
        book = self._signatures
        for c, o, b, n in zip(c_s[heads].tolist(), o_s[heads].tolist(), b_s[heads].tolist(),
                              counts.tolist(), strict=True):
            book[(c, o, b)] = book.get((c, o, b), 0) + n
        if len(book) > 4 * self.config.max_signatures:
            keep = sorted(book.items(), key=lambda kv: -kv[1])[: self.config.max_signatures]
            self._signatures = dict(keep)

    def _learn(self, ci: np.ndarray, op: np.ndarray, dur: np.ndarray, hang: np.ndarray) -> None:
        """Append completed durations to the ring buffer of their (comm, op); operations that
        were part of a reported hang are not history."""
        ok = (hang < 0) & (dur >= 0)
        ci, op, dur = ci[ok], op[ok], dur[ok]
        if not len(ci):
            return
        rows = self._stat_row[ci, op]
        missing = rows < 0
        if missing.any():
            pairs = np.unique(ci[missing] * N_OPS + op[missing])
            start = len(self._dur_n)
            self._stat_row[pairs // N_OPS, pairs % N_OPS] = np.arange(start, start + len(pairs))
            width = self.config.history
            self._dur = np.concatenate([self._dur, np.full((len(pairs), width), -1, np.int64)])
            self._dur_pos = np.concatenate([self._dur_pos, np.zeros(len(pairs), np.int64)])
            self._dur_n = np.concatenate([self._dur_n, np.zeros(len(pairs), np.int64)])
            self._exp = np.concatenate([self._exp, np.full(len(pairs), -1, np.int64)])
            rows = self._stat_row[ci, op]
        order = np.argsort(rows, kind="stable")
        g = rows[order]
        first = np.ones(len(g), dtype=bool)
        first[1:] = g[1:] != g[:-1]
        head = np.maximum.accumulate(np.where(first, np.arange(len(g)), 0))
        pos = np.arange(len(g)) - head
        uniq, counts = np.unique(g, return_counts=True)
        count_of = counts[np.searchsorted(uniq, g)]
        k = self.config.history
        keep = pos >= count_of - k
        slot = (self._dur_pos[g] + pos) % k
        self._dur[g[keep], slot[keep]] = dur[order][keep]
        self._dur_pos[uniq] = (self._dur_pos[uniq] + counts) % k
        self._dur_n[uniq] += counts
        # quantile ("higher" method) of the filled slots, vectorised over the touched rows
        block = self._dur[uniq]
        filled = np.minimum(self._dur_n[uniq], k)
        block = np.sort(np.where(block < 0, np.iinfo(np.int64).max, block), axis=1)
        at = np.ceil(self.config.quantile * (filled - 1)).astype(np.int64)
        self._exp[uniq] = np.take_along_axis(block, at[:, None], axis=1)[:, 0]

    def _ingest_progress(self, table: pa.Table) -> None:
        ci = self._comm_index(table.column("comm").to_numpy())
        known = ci >= 0
        if not known.any() or not len(self._fl["t"]):
            return
        rank = table.column("rank").to_numpy().astype(np.int64)[known]
        seq = _u64_to_i64(table.column("seq").to_numpy())[known]
        t = table.column("t").to_numpy().astype(np.int64)[known]
        steps = (_u64_to_i64(table.column("send_count").to_numpy())
                 + _u64_to_i64(table.column("recv_count").to_numpy()))[known]
        self._latest = max(self._latest, int(t.max()))
        fl = self._fl
        hit = _match2(_cr_key(fl["comm"], fl["rank"]), fl["seq"], _cr_key(ci[known], rank), seq)
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

    def _thresholds(self) -> np.ndarray:
        """Per in-flight operation: clamp(n x T_expected(comm, op), floor, ceiling).

        An operation type never completed on its communicator borrows the expectation of the
        same operation on communicators of the same size (the same parallel dimension); with
        no such history it waits for the ceiling (first calls include connection set-up)."""
        cfg = self.config
        fl = self._fl
        ops = np.maximum(fl["op"], 0)
        rows = self._stat_row[fl["comm"], ops]
        learned = self._dur_n >= cfg.min_history
        exp = np.full(len(rows), np.inf)
        if len(learned):
            safe = np.maximum(rows, 0)
            ok = (rows >= 0) & learned[safe]
            exp[ok] = self._exp[safe[ok]]
            if not ok.all() and learned.any():
                sizes = np.asarray(self._comm_size, dtype=np.int64)
                ci_r, op_r = np.nonzero(self._stat_row >= 0)
                row_r = self._stat_row[ci_r, op_r]
                good = learned[row_r]
                key_r = sizes[ci_r[good]] * N_OPS + op_r[good]
                exp_r = self._exp[row_r[good]]
                order = np.argsort(key_r, kind="stable")
                key_r, exp_r = key_r[order], exp_r[order]
                uniq, first = np.unique(key_r, return_index=True)
                best = np.maximum.reduceat(exp_r, first)
                want = sizes[fl["comm"][~ok]] * N_OPS + ops[~ok]
                pos = np.minimum(np.searchsorted(uniq, want), len(uniq) - 1)
                found = uniq[pos] == want
                borrowed = np.where(found, best[pos].astype(np.float64), np.inf)
                exp[~ok] = borrowed
        thr = np.clip(cfg.n_expected * exp, cfg.floor_ns, cfg.ceiling_ns)
        return np.nan_to_num(thr, posinf=cfg.ceiling_ns).astype(np.int64)

    def _silence_thresholds(self) -> np.ndarray:
        cfg = self.config
        thr = np.clip(cfg.silence_n * self._rk_gap.astype(np.float64), cfg.silence_floor_ns,
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
        thr = self._thresholds()
        age = now - fl["t"]
        barrier = (fl["op"] == ALLREDUCE) & (fl["bytes"] <= cfg.barrier_bytes)
        stuck = (age > thr) & ~barrier & (fl["hang"] < 0)
        silent = self._silent_ranks(now) if cfg.silence else np.zeros(0, np.int64)
        if self._quiet_cache[0] == self._fl_version:
            silent = silent[~np.isin(silent, list(self._quiet_cache[1]))]
        if not stuck.any() and not len(silent):
            return []
        ctx = _Context(self, now, thr)
        triggers = [ctx.round_key[i] for i in np.flatnonzero(stuck).tolist()]
        if len(silent):
            sthr = self._silence_thresholds()
            if self._quiet_cache[0] != self._fl_version:
                self._quiet_cache = (self._fl_version, set())
            for r in silent.tolist():
                if r in self._quiet_cache[1]:
                    continue
                waiting = ctx.waiting_on(r)
                if not waiting:     # nobody waits on it: not worth asking again until the
                    self._quiet_cache[1].add(r)   # operations in flight change
                if waiting:
                    # the silence that counts starts when a peer began waiting (a rank that
                    # resumes after a pause where nobody waited is not silent)
                    ref = max(int(self._rk_last[r]), min(ctx.round_t(w) for w in waiting))
                    if now - ref > int(sthr[r]):
                        ctx.silent_roots[r] = waiting
        return ctx.resolve(dict.fromkeys(triggers))

    def _silent_ranks(self, now: int) -> np.ndarray:
        """Ranks with no operation in flight and no record for longer than their silence
        threshold (only worth following if someone waits on them)."""
        if not len(self._rk_last):
            return np.zeros(0, np.int64)
        busy = np.zeros(len(self._rk_last), dtype=bool)
        busy[self._fl["rank"]] = True
        roots = {r for h in self._hangs if not h.ended for r in h.roots}
        seen = self._rk_last != NO_TIME
        quiet = seen & ~busy & (now - self._rk_last > self._silence_thresholds())
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
        if kind == "tp":
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

    def __init__(self, det: HangDetector, now: int, thr: np.ndarray) -> None:
        self.det, self.now, self.thr = det, now, thr
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
        """Enough evidence for a root: an idle rank silent for at least the floor; an
        all-entered round stuck by its own threshold."""
        det, fl = self.det, self.det._fl
        if term[0] == "idle":
            last = int(det._rk_last[term[1]]) if term[1] < len(det._rk_last) else NO_TIME
            return last == NO_TIME or self.now - last >= det.config.floor_ns
        if term[0] == "group":
            ops = self.round_ops[term[1]]
            return bool(np.any(self.now - fl["t"][ops] > self.thr[ops]))
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

    def _pass(self, rnd: tuple[Any, ...]) -> dict[str, Any]:
        """1F1B position of a pipeline send/recv: activations flow to higher pipeline ranks
        in the forward pass, gradients to lower ones in the backward pass (MEGATRACE
        §III-B1); the k-th such transfer of a pair is micro-batch k mod microbatches."""
        det = self.det
        if rnd[0] != "p" or det.comm_kind(rnd[1]) != "pp":
            return {}
        ci, sender, receiver, k = rnd[1], rnd[2], rnd[3], rnd[4]
        members = det._members(ci).tolist()
        if sender not in members or receiver not in members:
            return {}
        forward = members.index(sender) < members.index(receiver)
        extra: dict[str, Any] = {"pass": "forward" if forward else "backward"}
        m = det.meta
        row = det._cr.find(_cr_key(ci, np.array([sender])))[0]
        from_start = row >= 0 and bool(det._cr.cols["seq0"][row])
        if m.microbatches > 0 and m.schedule in ("1f1b", "gpipe") and from_start:
            extra["microbatch"] = k % m.microbatches
            extra["iteration_index"] = k // m.microbatches
        return extra

    def _anomaly(self, cause: str, ranks: list[int], rnd: tuple[Any, ...], start: int,
                 link: list[int] | None, extra: dict[str, Any]) -> Anomaly:
        det = self.det
        ci = rnd[1]
        op = int(det._fl["op"][self.round_ops[rnd][0]])
        return Anomaly(id="", kind="hang", cause=cause, ranks=ranks, link=link,
                       comm=det._comm_u64[ci], comm_kind=det.comm_kind(ci),
                       stage=det.stage(ci, op), start_ns=start, detected_ns=self.now,
                       extra={"halt_point": self._halt_point(rnd), **self._pass(rnd), **extra})

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
        operation on its own pipeline communicator. Collective rounds are reached by
        definition: the members that entered are the root's lockstep peers."""
        if rnd[0] == "c":
            return True
        det = self.det
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
        a = self._anomaly(cause, roots, grnd, self.round_t(grnd), link,
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
            deviating = self._minority(ci, sig) if grnd[0] == "c" else sorted(sig)
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

    def _minority(self, ci: int, sig: dict[int, tuple[int, int]]) -> list[int]:
        """The deviating ranks: those whose (op, bytes) is not the most common one in the
        round (CCL-D §2.2 H2); on a tie, the side whose signature is rarer in this
        communicator's completed history."""
        book = self.det._signatures
        counts = Counter(sig.values())
        keep = max(counts, key=lambda s: (counts[s], book.get((ci, s[0], s[1]), 0), -s[0], -s[1]))
        return sorted(m for m, s in sig.items() if s != keep)

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
        stuck_at = int(np.min(fl["t"][ops] + self.thr[ops]))
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

__all__ = ["BENCHMARKS", "HangConfig", "HangDetector", "replay_with_ticks"]
