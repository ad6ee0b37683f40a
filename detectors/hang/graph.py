"""The wait graph of one detection pass (CCL-D §4.2.2 decision tree, MEGATRACE §III-C partial
graph): rank -> its head operations (the earliest in flight: a rank runs its calls in order,
later ones are queued behind) -> the members missing from those rounds, followed from every
stuck operation to a root: an idle rank (H1), a round every member entered (H2/H3), a wait
cycle, or a hang already reported (the operation is a victim)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from failslow.detectors.hang.config import ALLREDUCE, NO_TIME, RECV, SEND
from failslow.detectors.hang.tables import _cr_key

if TYPE_CHECKING:
    from failslow.detectors.hang.detector import HangDetector


class WaitGraph:
    """One detection pass over the in-flight operations at ``now`` (per-operation
    thresholds ``thr``, per-rank ``horizon``), built lazily from the triggers."""

    def __init__(self, det: HangDetector, now: int, thr: np.ndarray, horizon: np.ndarray
                 ) -> None:
        self.det, self.now, self.thr, self.horizon = det, now, thr, horizon
        fl = det.flight.fl
        self.barrier = (fl["op"] == ALLREDUCE) & (fl["bytes"] <= det.config.barrier_bytes)
        self.round_key = det.flight.round_keys()
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
        self.open_roots = det.hangs.open_roots()

    def missing(self, rnd: tuple[Any, ...]) -> list[int]:
        if rnd not in self.missing_cache:
            self.missing_cache[rnd] = self.det.flight.missing(rnd, self.round_ops.get(rnd, []))
        return self.missing_cache[rnd]

    def round_t(self, rnd: tuple[Any, ...]) -> int:
        return int(self.det.flight.fl["t"][self.round_ops[rnd]].min())

    def complete_t(self, rnd: tuple[Any, ...]) -> tuple[int, int]:
        """When the last in-flight member entered the round (its transfer could start then:
        a member that entered waits with no progress until all have, CCL-D §4.1), and that
        member's operation."""
        ops = self.round_ops[rnd]
        i = ops[int(np.argmax(self.det.flight.fl["t"][ops]))]
        return int(self.det.flight.fl["t"][i]), i

    def waiting_on(self, rank: int) -> list[tuple[Any, ...]]:
        """Rounds in flight, not barriers and not yet part of a hang, whose missing members
        include ``rank``."""
        fl = self.det.flight.fl
        comms = self.det.comms_of(rank)
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
        fl = self.det.flight.fl
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
        det, fl = self.det, self.det.flight.fl
        floor = det.config.idle_floor_ns
        if term[0] == "idle":
            r = term[1]
            last = int(det.ranks.last[r]) if r < len(det.ranks.last) else NO_TIME
            if last == NO_TIME:
                return det.ranks.first_t != NO_TIME and self.now - det.ranks.first_t >= floor
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
