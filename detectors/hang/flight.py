"""The in-flight table of the hang detector: operations entered and not yet ended, per
(communicator, rank) seq counters and point-to-point pair counters, and the matching of
``coll`` ends with their enters, vectorised per batch (CCL-D §4.1: the Trace ID ``(comm,
seq)`` of a round; events.md: the k-th send/recv of a pair). An operation in flight longer
than its threshold is stuck (CCL-D §4.2.1); the counters tell which members never entered
its round (H1)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from failslow.detectors.hang.comms import CommTable
from failslow.detectors.hang.config import NO_TIME, RECV, SEND, HangConfig
from failslow.detectors.hang.tables import (
    _OP_CR_BITS,
    _OP_SEQ_BITS,
    _cr_key,
    _lookup,
    _match_ops,
    _pair_key,
    _Sorted,
)
from failslow.detectors.iterations import stable_argsort

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


@dataclass
class Ingested:
    """What one batch of ``coll`` rows did besides the table: operations entered (for the
    ring of recent operations), end records (comm, op, bytes; for the signature book),
    completed operations (comm, op, bytes, duration, hang; for the duration history) and the
    latest end of the operations of each reported hang."""

    latest: int = NO_TIME
    entered: dict[str, np.ndarray] | None = None
    ended: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    completed: tuple[np.ndarray, ...] | None = None
    hang_ends: dict[int, int] = field(default_factory=dict)


class FlightTable:
    """In-flight operations (columns ``_INFLIGHT``; ``hang``: the index of the hang they
    belong to, -1: none), end rows still waiting for their enter (``orphans``), per (comm,
    rank) counters (``cr``) and per (comm, rank, peer, direction) send/recv counts
    (``pairs``). ``version`` changes whenever the in-flight operations do."""

    def __init__(self, config: HangConfig, comms: CommTable) -> None:
        self.config = config
        self.comms = comms
        self.cr = _Sorted(_CR_SPEC)
        self.pairs = _Sorted({"count": (np.int64, 0)})
        self.fl: dict[str, np.ndarray] = {n: np.zeros(0, d) for n, d in _INFLIGHT.items()}
        self.orphans: dict[str, np.ndarray] = {n: np.zeros(0, np.int64)
                                               for n in ("comm", "rank", "seq", "t")}
        self.version = 0

    def ingest(self, rank: np.ndarray, ci: np.ndarray, crank: np.ndarray, seq: np.ndarray,
               op_a: np.ndarray, nbytes: np.ndarray, peer: np.ndarray, t: np.ndarray,
               enter: np.ndarray, latest: int) -> Ingested:
        """One batch of ``coll`` rows (``ci``: communicator indices; ``latest``: the newest
        record time of the job, this batch included)."""
        n_enter = int(np.count_nonzero(enter))
        # (comm, rank) rows of every record at once (enters first set theirs, then ends)
        cr_idx = self.cr.ensure(_cr_key(ci, rank))
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
        fl, orph = self.fl, self.orphans
        out = Ingested(latest)
        old_hit = old_orph = None
        if len(fl["t"]) and (n_enter < len(rank) or len(orph["t"])):
            hits = _match_ops(fl["comm"], fl["rank"], fl["seq"],
                              np.concatenate([ci, orph["comm"]]),
                              np.concatenate([rank, orph["rank"]]),
                              np.concatenate([seq, orph["seq"]]))
            old_hit, old_orph = hits[:len(rank)], hits[len(rank):]
        new = None
        if e_sel is not None:
            new = self._enters(rank[e_sel], ci[e_sel], crank[e_sel], seq[e_sel],
                               op_a[e_sel], nbytes[e_sel], peer[e_sel], t[e_sel],
                               cr_idx[e_sel], None if old_hit is None else old_hit[e_sel] >= 0)
            out.entered = new
        if n_enter < len(rank):
            sel: Any = slice(None) if ends is None else ends
            self._ends(rank[sel], ci[sel], seq[sel], op_a[sel], nbytes[sel], t[sel],
                       cr_idx[sel], out, new, None if old_hit is None or old_orph is None
                       else np.concatenate([old_orph, old_hit[sel]]))
        elif len(self.orphans["t"]):
            self._ends(*(np.zeros(0, np.int64),) * 7, out, new, old_orph)
        elif new is not None:
            self.fl = {n: np.concatenate([self.fl[n], new[n]]) for n in _INFLIGHT}
        return out

    def _enters(self, rank: np.ndarray, ci: np.ndarray, crank: np.ndarray,
                seq: np.ndarray, op: np.ndarray, nbytes: np.ndarray, peer: np.ndarray,
                t: np.ndarray, idx: np.ndarray, dup: np.ndarray | None = None
                ) -> dict[str, np.ndarray]:
        """Entered operations (``idx``: their (comm, rank) rows): membership, seq counters,
        point-to-point indices; returns the new in-flight rows (duplicates of operations
        already in flight dropped), which :meth:`_ends` appends after matching this
        batch's ends with them. ``dup``: which are already in flight (None: computed)."""
        # membership: (comm, comm rank) -> global rank; (comm, rank) state
        self.comms.add_members(ci, crank, rank)
        cols = self.cr.cols
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
            self.comms.mark_p2p(ci_p)
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
            prow = self.pairs.ensure(np.asarray(uniq, dtype=np.int64))
            count = self.pairs.cols["count"]
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
        if len(self.fl["t"]):
            if dup is None:
                dup = _match_ops(self.fl["comm"], self.fl["rank"], self.fl["seq"],
                                 ci, rank, seq) >= 0
            if dup.any():
                new = {n: a[~dup] for n, a in new.items()}
        self.version += 1
        return new

    def _ends(self, rank: np.ndarray, ci: np.ndarray, seq: np.ndarray, op: np.ndarray,
              nbytes: np.ndarray, t: np.ndarray, idx: np.ndarray,
              out: Ingested, new: dict[str, np.ndarray] | None = None,
             old_hit: np.ndarray | None = None) -> None:
        """Ended operations (``idx``: their (comm, rank) rows) and earlier orphan ends,
        matched with the operations in flight and ``new`` (this batch's entered operations,
        in flight after the earlier ones): completed ones leave, their durations are
        learned; ``new`` operations still open join the in-flight table. ``old_hit``: the
        match of the orphans, then the ends, among the earlier operations (None: computed).
        What completed goes to ``out``."""
        if len(rank):
            cols = self.cr.cols
            # per (comm, rank): the end of the highest seq (the last such row on a tie)
            top = np.full(len(self.cr), NO_TIME, dtype=np.int64)
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
            out.ended = (ci, op, nbytes)
        # match ends (and earlier orphans) with in-flight operations: those in flight before
        # this batch first, then this batch's entered ones
        o = self.orphans
        e_comm = np.concatenate([o["comm"], ci])
        e_rank = np.concatenate([o["rank"], rank])
        e_seq = np.concatenate([o["seq"], seq])
        e_t = np.concatenate([o["t"], t])
        parts = [self.fl] if new is None else [self.fl, new]
        matched = np.zeros(len(e_t), dtype=bool)
        dones, end_ts = [], []
        for part in parts:
            n = len(part["t"])
            done = np.zeros(n, dtype=bool)
            end_t = np.full(n, NO_TIME, dtype=np.int64)
            if n and len(e_t):
                free = np.flatnonzero(~matched)
                if part is self.fl and old_hit is not None:
                    hit = old_hit
                elif part is new and not len(o["t"]) and len(self.cr) < 1 << _OP_CR_BITS \
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
                crow = self.cr.find(_cr_key(part["comm"][open_], part["rank"][open_]))
                done_seq = np.where(crow >= 0, self.cr.cols["done_seq"][np.maximum(crow, 0)],
                                    -1)
                lost[open_[part["seq"][open_] < done_seq]] = True
                done |= lost
                end_t[lost] = out.latest
            losts.append(lost)
        if any(d.any() for d in dones):
            oks = [d & ~lost for d, lost in zip(dones, losts, strict=True)]

            def cat(name: str) -> np.ndarray:
                return np.concatenate([p[name][ok] for p, ok in zip(parts, oks, strict=True)])

            dur = np.concatenate([(e - p["t"])[ok] for p, e, ok in
                                  zip(parts, end_ts, oks, strict=True)])
            out.completed = (cat("comm"), cat("op"), cat("bytes"), dur, cat("hang"))
            fl, done, end_t = self.fl, dones[0], end_ts[0]
            in_hang = done & (fl["hang"] >= 0)
            if in_hang.any():
                for h in np.unique(fl["hang"][in_hang]).tolist():
                    sel_h = done & (fl["hang"] == h)
                    out.hang_ends[h] = int(end_t[sel_h].max())
            self.version += 1
        if new is not None:
            self.fl = {n: np.concatenate([p[n][~d] for p, d in zip(parts, dones, strict=True)])
                        for n in _INFLIGHT}
        elif dones[0].any():
            self.fl = {n: a[~dones[0]] for n, a in self.fl.items()}
        # unmatched ends wait for their enter (records of a kind may come in any order)
        keep = ~matched & (e_t >= out.latest - self.config.ceiling_ns)
        keep_idx = np.flatnonzero(keep)[-self.config.max_orphans:]
        self.orphans = {"comm": e_comm[keep_idx], "rank": e_rank[keep_idx],
                        "seq": e_seq[keep_idx], "t": e_t[keep_idx]}

    def note_steps(self, ci: np.ndarray, rank: np.ndarray, seq: np.ndarray, t: np.ndarray,
                   steps: np.ndarray) -> None:
        """Send/recv steps (``progress`` rows) of in-flight operations, and when they last
        changed: the member with the fewest steps is the root of a hardware hang (H3)."""
        fl = self.fl
        hit = _match_ops(fl["comm"], fl["rank"], fl["seq"], ci, rank, seq)
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

    def last_seq(self, ci: int, ranks: np.ndarray) -> np.ndarray:
        row = self.cr.find(_cr_key(ci, ranks))
        return np.where(row >= 0, self.cr.cols["last_seq"][np.maximum(row, 0)], -1)

    def pair_count(self, ci: int, rank: int, peer_crank: int, recv: bool) -> int:
        key = _pair_key(np.array([ci]), np.array([rank]), np.array([peer_crank]),
                        np.array([recv]))
        row = self.pairs.find(key)
        return int(self.pairs.cols["count"][row[0]]) if row[0] >= 0 else 0

    def round_keys(self) -> list[tuple[Any, ...]]:
        """Trace ID of every in-flight operation: ("c", comm, seq) for a collective round,
        ("p", comm, sender, receiver, k) for the k-th send/recv of a pair (events.md)."""
        fl = self.fl
        ci, op, rank = fl["comm"], fl["op"], fl["rank"]
        p2p = (op == SEND) | (op == RECV)
        keys: list[tuple[Any, ...]] = list(zip(["c"] * len(ci), ci.tolist(), fl["seq"].tolist(),
                                              strict=True))
        if p2p.any():
            idx = np.flatnonzero(p2p)
            other = self.comms.global_ranks(ci[idx], fl["peer"][idx])
            send = op[idx] == SEND
            sender = np.where(send, rank[idx], other)
            receiver = np.where(send, other, rank[idx])
            for j, c, a, b, k in zip(idx.tolist(), ci[idx].tolist(), sender.tolist(),
                                     receiver.tolist(), fl["pidx"][idx].tolist(), strict=True):
                keys[j] = ("p", c, a, b, k)
        return keys

    def missing(self, rnd: tuple[Any, ...], ops: list[int]) -> list[int]:
        """Members that have not entered the round (CCL-D: seq counter behind)."""
        if rnd[0] == "c":
            ci, seq = rnd[1], rnd[2]
            members = self.comms.members(ci)
            members = members[members >= 0]
            return members[self.last_seq(ci, members) < seq].tolist()
        _, ci, sender, receiver, k = rnd
        fl = self.fl
        present = {int(fl["rank"][i]) for i in ops}
        members = self.comms.members(ci).tolist()
        out = []
        for r, other, recv in ((sender, receiver, False), (receiver, sender, True)):
            if r in present or r < 0 or other not in members:
                continue
            if self.pair_count(ci, r, members.index(other), recv) <= k:
                out.append(r)
        return out

    def load(self, cr: dict[str, Any], pairs: dict[str, Any], inflight: dict[str, Any],
             orphans: dict[str, Any]) -> None:
        self.cr.load(cr)
        self.pairs.load(pairs)
        self.fl = {n: np.asarray(inflight[n], dtype=d) for n, d in _INFLIGHT.items()}
        self.orphans = {n: np.asarray(a, dtype=np.int64) for n, a in orphans.items()}
