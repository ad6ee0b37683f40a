"""Whether a slow level's root persists (CCL-D §4.2, Greyhound §4.3): the slow iterations
since the level's onset, each localized on its own against the same reference, and what
persists among them beyond chance (:meth:`Persistence.find`); a severe first iteration
judged by its two halves (:meth:`Persistence.within`); a weak slow-down judged by the two
halves of its stretch (:meth:`Persistence.halves`). A fail-slow is a persistent slow
component; pauses and bursts of jitter hit random ranks."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from failslow.detectors.slowdown.accounting import BinnedStats
from failslow.detectors.slowdown.config import SlowdownConfig
from failslow.detectors.slowdown.levels import SlowLevel, Window, persistence_chance
from failslow.detectors.slowdown.localizer import Localizer
from failslow.detectors.slowdown.timeline import IterationTimeline
from failslow.events import JobMeta


class Persistence:
    """The persistence judgments of :class:`~failslow.detectors.slowdown.anomalies.AnomalyLifecycle`
    over its timeline, accounting and localizer; ``below(level)``: the root ranks of the
    open anomalies below ``level`` (its reference already holds their slowness)."""

    def __init__(self, meta: JobMeta, config: SlowdownConfig, timeline: IterationTimeline,
                 stats: BinnedStats, localizer: Localizer,
                 below: Callable[[SlowLevel], frozenset[int]]) -> None:
        self.meta = meta
        self.config = config
        self.timeline = timeline
        self.stats = stats
        self.localizer = localizer
        self.below = below

    def window(self, op: SlowLevel, lo_pos: int, hi_ns: int) -> Window:
        return self.timeline.window(op, lo_pos, hi_ns, self.stats.shift)

    def decaying(self, op: SlowLevel) -> bool:
        """Only two slow iterations so far, the second's excess over the level below under
        half the first's: the shape of one long pause whose delay spills into the next
        iteration's window (the same rank then tops both), not of a fail-slow, whose excess
        holds or grows (a fault starting mid-iteration makes the first one smaller)."""
        a = self.timeline.pos(op.onset_pos)
        done = [d for _, t0, d in self.timeline.iters[a:a + 3]
                if t0 + d <= self.timeline.horizon]
        if len(done) != 2 or op.ref_iter_ns <= 0:
            return False
        first, second = (d - op.ref_iter_ns for d in done)
        return first > 0 and second < 0.5 * first

    def find(self, op: SlowLevel, max_start: int | None = None
                    ) -> tuple[int, bool, list[str], list[int]] | None:
        """The slow iterations since the onset, each localized on its own against the same
        reference (cached), and what persists among them: a compute root (or a slow link)
        found in at least two of them and in ``consistency`` of the iterations from its
        first appearance on (that first one may be only partly slow); an iteration no
        slower than the level below is a miss for every rank and link. Returns (index of the
        first persistent iteration relative to the onset, communication persists?, its node
        pair, persistent compute roots), or None."""
        c = self.config
        a = self.timeline.pos(op.onset_pos) + len(op.per_iter)
        while a < len(self.timeline.iters):
            _, t0, d = self.timeline.iters[a]
            if t0 + d > self.timeline.horizon:
                break
            one = self.localizer.localize(self.window(op, self.timeline.offset + a, t0 + d), op,
                                          light=True, skip=self.below(op))
            # the signature, and the slow groups behind its communication evidence
            op.per_iter.append([*one["signature"], one["groups"]] if one["confident"]
                               else None)
            a += 1
        k = len(op.per_iter)
        a0 = self.timeline.pos(op.onset_pos)
        durs = np.array([d for _, _, d in self.timeline.iters[a0:a0 + k]], dtype=float)

        # how many compute roots each iteration named (noise names many ranks at once)
        named = [len(sig[2]) if sig else 0 for sig in op.per_iter]

        def at_level(i: int, s0: int) -> bool:
            """Iteration ``i`` is slow at the level of the stretch from ``s0`` on: its
            excess over the healthy time is at least ``level_share`` of the stretch's
            median excess (not a mild noisy iteration before a far stronger fault)."""
            level = float(np.median(durs[s0:])) - op.healthy_ns
            return bool(durs[i] - op.healthy_ns >= c.level_share * level)

        def stretch(member: list[bool | None], by_chance: bool = False, slack: int = 0
                    ) -> int | None:
            """Earliest start of a persistent trailing stretch (None: none); iterations
            whose ``member`` is None say nothing and are left out (a stretch starts at
            the first of them before its first hit that is at its level). With
            ``by_chance``, the stretch must also be unlikely to arise by accident for any
            rank (:func:`persistence_chance`). ``slack``: it may start this many
            iterations after ``max_start``."""
            known = [i for i in range(k) if member[i] is not None]
            for j, s0 in enumerate(known):
                if max_start is not None and s0 > max_start + slack:
                    break
                # its first hit is at its level, or only partly slow (the next one is)
                if not member[s0] or not (at_level(s0, s0) or (
                        s0 + 1 < k and at_level(s0 + 1, s0))):
                    continue
                rest = known[j:]
                hits = sum(1 for i in rest if member[i])
                n = len(rest)
                # a root that appears only after iterations that named something else needs
                # one more; those that said nothing (no round of a slow group in their
                # window) and the onset one (its round may be the last healthy one) do not
                # count
                need = 3 if any(0 < i < s0 for i in known) else 2
                if hits >= need and hits - 1 >= c.consistency * max(n - 1, 1) and (
                        not by_chance
                        or self.by_chance([named[i] for i in rest], hits) <= c.persist_alpha):
                    # uninformative iterations just before it belong to the stretch, from
                    # the first one at its level
                    start = known[j - 1] + 1 if j else 0
                    while start < s0 and not at_level(start, s0):
                        start += 1
                    return start
            return None

        # an iteration no slower than the level below is no hit for any rank or link (its
        # slowest ranks are the job's usual ones): a slow-down that went away does not
        # persist in it
        slow = durs > op.ref_iter_ns
        # ... unless the two together are slow: a pause just before a rank's first call
        # held the boundary late (the last rank to cross starts the job's iteration), the
        # iteration before holds it and this one is short: it says nothing
        excess = durs - op.ref_iter_ns
        catch_up = np.concatenate(([False], ~slow[1:] & (excess[:-1] > -excess[1:])))

        def evidence(member: list[bool] | list[bool | None]) -> list[bool | None]:
            return [None if m is None or catch_up[i] else bool(m and slow[i])
                    for i, m in enumerate(member)]

        starts: list[int] = []
        roots: list[tuple[int, int]] = []  # (start, rank)
        cands = sorted({r for sig in op.per_iter if sig for r in sig[2]})
        # the two sides of a mixed fault (a rank and its own link) may show an iteration
        # apart: an end of the open anomaly's slow link may start one iteration later
        ends = set(op.anomaly.get("link") or []) if op.state == "open" else set()
        for r in cands:
            st = stretch(evidence([bool(sig and r in sig[2]) for sig in op.per_iter]),
                         by_chance=True, slack=int(r in ends))
            if st is not None:
                roots.append((st, r))
                starts.append(st)
        comm_nodes: list[str] = []
        comm_start = None
        pairs = sorted({tuple(sig[1]) for sig in op.per_iter if sig and sig[0]})
        for pair in pairs:
            hit = [bool(sig and sig[0] and (tuple(sig[1]) == pair or not pair))
                   for sig in op.per_iter]
            # ... and a once-per-iteration round in the onset window may be the last
            # healthy one
            st = stretch(evidence(self.informative(op, hit)), slack=1)
            if st is not None and (comm_start is None or st < comm_start):
                comm_start, comm_nodes = st, list(pair)
        if comm_start is not None:
            starts.append(comm_start)
        if not starts:
            if k == 1 and max_start is None:
                return self.within(op)
            if max_start is None:
                return self.halves(op)
            return None
        first = min(starts)
        return first, comm_start is not None, comm_nodes, [r for _, r in sorted(roots)]

    def informative(self, op: SlowLevel, hit: list[bool]) -> list[bool | None]:
        """``hit`` with None for the slow iterations that say nothing about the slow
        groups of the hits: their window holds no round of any of them. A group that runs
        once per iteration (a DP ring's gradient sync) and delays the iteration's end ends
        its round next to the boundary between two windows of whole time bins, so some
        windows hold two of its rounds and others none; a window without its round is no
        evidence that it stopped being slow."""
        # (communicator, pair, operation class): a group's other operations (a small
        # all-reduce beside the gradient sync) say nothing about its slow one
        keys = {(int(cg[0]), int(cg[1]), int(cg[2]) if len(cg) > 2 else -1)
                for sig, h in zip(op.per_iter, hit, strict=True)
                if h and sig is not None and len(sig) > 3 for cg in sig[3]}
        if not keys:
            return list(hit)
        a = self.timeline.pos(op.onset_pos)
        out: list[bool | None] = []
        for i, h in enumerate(hit):
            if h or a + i >= len(self.timeline.iters):
                out.append(h)
                continue
            _, t0, d = self.timeline.iters[a + i]
            win = self.window(op, op.onset_pos + i, t0 + d)
            w = self.stats.grp.query(win.lo, win.hi, ("cidx", "group", "cls"))
            held = any(bool(np.any((w["cidx"] == cx) & (w["group"] == g)
                                   & ((w["cls"] == k) | (k < 0)))) for cx, g, k in keys)
            out.append(False if held else None)
        return out

    def within(self, op: SlowLevel) -> tuple[int, bool, list[str], list[int]] | None:
        """A severe slow-down persists *within* its first slow iteration: when that
        iteration lasted at least ``severe_iterations`` reference iterations, its two halves
        are localized on their own and must name the same root (or the same slow link). A
        pause fills one place of the iteration, a slow component all of it; waiting for a
        second slow iteration would cost several healthy iterations' time."""
        c = self.config
        sig = op.per_iter[0]
        a = self.timeline.pos(op.onset_pos)
        _, t0, d = self.timeline.iters[a]
        if not sig or d < c.severe_iterations * op.ref_iter_ns:
            return None
        wins = self._halve(op, 0, 1, by_time=True)
        if any(w.hi - w.lo < 2 for w in wins):
            return None
        halves = []
        for win in wins:
            one = self.localizer.localize(win, op, light=True)
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

    def halves(self, op: SlowLevel) -> tuple[int, bool, list[str], list[int]] | None:
        """A weak slow-down whose one-iteration windows are too short to name its root
        every time (CCL-D §4.2 takes the whole anomaly window): once ``halves_iterations``
        slow iterations passed without a persistent root, the two halves of the stretch
        since the onset are localized on their own and must each name the same compute root
        first (and at most one other rank, kept when both name it), or the same slow link.
        A pause or a burst of noise fills one place of the stretch, or names several
        ranks; a pause that opened the level is left out of the halves. An odd number of
        iterations is halved in time, so the middle one counts in both halves: only when
        every iteration of the stretch was slow (a burst of a few iterations and the short
        one after it, or a pause spilling into the next, are not) and each half names one
        root alone."""
        c = self.config
        k = len(op.per_iter)
        a = self.timeline.pos(op.onset_pos)
        excess = [d - op.ref_iter_ns for _, _, d in self.timeline.iters[a:a + k]]
        # a pause that opened the level (its first iteration ``pause_factor`` times as far
        # above the reference as the others' median) is no part of the stretch
        s = int(k > 1 and excess[0] > c.pause_factor * max(float(np.median(excess[1:])), 0.0))
        n = k - s
        odd = bool(n % 2)
        if n < c.halves_iterations or (odd and min(excess[s:]) <= 0):
            return None
        sigs = []
        for win in self._halve(op, s, k, odd):
            one = self.localizer.localize(win, op, light=True, skip=self.below(op))
            if not one["confident"]:
                return None
            sigs.append(one["signature"])
        (comm1, ident1, roots1), (comm2, ident2, roots2) = sigs
        common = [r for r in roots1 if r in roots2]
        top_shared = bool(common) and (roots1[0] in common or roots2[0] in common)
        if top_shared and max(len(roots1), len(roots2)) <= (1 if odd else 2) and (
                roots1[0] == roots2[0]
                or self.by_chance([len(roots1), len(roots2)], 2) <= c.persist_alpha):
            # the same strongest root in both halves, with the other ranks both name (a
            # second slow rank); one named by one half only is noise there (a pause). The
            # strongest root of one half may be the other's second (a pause in that half
            # outweighed it) if two halves naming one same rank is unlikely by accident.
            return s, False, [], common
        if comm1 and comm2 and ident1 and ident1 == ident2 and not roots1 and not roots2:
            return s, True, list(ident1), []
        return None

    def _halve(self, op: SlowLevel, s: int, k: int, by_time: bool) -> list[Window]:
        """The windows of the two halves of the stretch of iterations ``s..k-1`` since
        ``op``'s onset: of whole iterations, or (``by_time``) cut at its middle in time."""
        a = self.timeline.pos(op.onset_pos)
        if by_time:
            t_lo = self.timeline.iters[a + s][1]
            _, t0, d = self.timeline.iters[a + k - 1]
            full = self.window(op, op.onset_pos + s, t0 + d)
            sh = self.stats.shift
            mid = ((t_lo + t0 + d) // 2) >> sh
            return [dataclasses.replace(full, lo=lo, hi=hi, win_ns=float((hi - lo) << sh))
                    for lo, hi in ((full.lo, mid), (mid, full.hi))]
        m = s + (k - s) // 2
        out = []
        for lo, hi in ((s, m), (m, k)):
            _, t0, d = self.timeline.iters[a + hi - 1]
            out.append(self.window(op, op.onset_pos + lo, t0 + d))
        return out

    def by_chance(self, named: list[int], hits: int) -> float:
        """The chance that some rank is among the roots of at least ``hits`` of the
        localizations that named ``named`` ranks each, by accident: a given rank is among
        a localization's roots with the share of the world it named
        (:func:`persistence_chance`, times the world size)."""
        world = max(self.meta.world_size, 1)
        return world * persistence_chance([min(n / world, 1.0) for n in named], hits)
