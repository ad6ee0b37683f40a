"""The wait-for graph of a window (MEGATRACE §III: "trace back along the pipeline"): excess
waits per (waiter, communicator) and per (communicator, waited-on member); following the
largest waits ends at the first late rank."""

from __future__ import annotations

import numpy as np

from failslow.detectors.slowdown.comms import CommRegistry


class WaitGraph:
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
