"""The anomaly lifecycle of the slow-down detector (CCL-D §4.2, Greyhound §4.2-4.3): each
slow level of the change tracker becomes an anomaly once its root *persists* over its slow
iterations beyond chance (a fail-slow is a persistent slow component; pauses and bursts of
jitter hit random ranks), is refined while young, merged into the level below when it is
the same fault grown worse, dropped when no root persists, and closed by a relief."""

from __future__ import annotations

from typing import Any

import numpy as np

from failslow.detectors.changepoints import Change, ChangeTracker
from failslow.detectors.slowdown.accounting import BinnedStats
from failslow.detectors.slowdown.compute import compute_stage, gpu_evidence, hidden_roots
from failslow.detectors.slowdown.config import SlowdownConfig
from failslow.detectors.slowdown.levels import SlowLevel, Window, agree
from failslow.detectors.slowdown.localizer import INTERNAL_FIELDS, Localizer
from failslow.detectors.slowdown.persistence import Persistence
from failslow.detectors.slowdown.timeline import IterationTimeline
from failslow.diagnosis import Anomaly
from failslow.events import JobMeta


class AnomalyLifecycle:
    """The slow levels (``levels``, aligned with the change tracker's) and the anomalies
    they become: reported once when an anomaly opens (and again when refined) and once when
    it closes, with the same ``id``."""

    def __init__(self, meta: JobMeta, config: SlowdownConfig, change: ChangeTracker,
                 timeline: IterationTimeline, stats: BinnedStats, localizer: Localizer
                 ) -> None:
        self.meta = meta
        self.config = config
        self.change = change
        self.timeline = timeline
        self.stats = stats
        self.localizer = localizer
        self.levels: list[SlowLevel] = []
        self.next_id = 0
        self.persistence = Persistence(meta, config, timeline, stats, localizer, self._below)
        change.corroborate = self.corroborate

    def step(self, changes: list[Change]) -> list[Anomaly]:
        """After a job iteration: open levels at onsets, close them at reliefs, confirm the
        pending ones whose root persists and refine a young open top level."""
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
        return out

    def _window(self, op: SlowLevel, lo_pos: int, hi_ns: int) -> Window:
        return self.timeline.window(op, lo_pos, hi_ns, self.stats.shift)

    def _healthy_ref_lo(self, t0: int, iter_ns: float) -> int:
        """Start of the reference window of a first slow level starting at ``t0``: the
        ``baseline_iterations`` before it, within the healthy segment."""
        ref_lo = int(t0 - self.config.baseline_iterations * iter_ns)
        ref_lo = max(ref_lo, self.timeline.first_t)
        seg = self.timeline.at(self.change.seg_start)[1]
        return max(ref_lo, seg) if seg < t0 else ref_lo

    def corroborate(self, hi: int, i: int) -> float:
        """The change tracker's rank-level evidence on a tentative first onset at stream
        position ``hi`` (``ChangeTracker.corroborate``): each of the iterations ``hi..i``,
        localized on its own against the healthy reference before ``hi``, names one same
        compute root, or one same slow link (or set of candidate hops), or both (a mixed
        slow-down). Returns the chance that this happens by accident, the smaller of
        :meth:`Persistence.by_chance` for the root and :meth:`_link_by_chance` for the link (1.0
        when the iterations agree on neither). A fail-slow is a persistent slow component
        (CCL-D §4.2, Greyhound §4.2): on a job whose iteration times jitter with pauses,
        or whose reference is too short for two values to be significant, its rank or
        link stands out in every slow iteration before the iteration times alone are
        significant."""
        c = self.config
        base = self.change.baseline
        if self.levels or not base > 0:
            return 1.0
        t0 = int(self.timeline.at(hi)[1])
        ref_lo = min(self._healthy_ref_lo(t0, base), t0 - (1 << self.stats.shift))
        probe = SlowLevel(anomaly={}, onset_pos=hi, ref_lo_ns=ref_lo, ref_iter_ns=base,
                          healthy_ns=base)
        named: list[int] = []
        common: set[int] | None = None
        links: list[tuple[str, ...]] = []
        for pos in range(hi, i + 1):
            _, s0, d = self.timeline.at(pos)
            one = self.localizer.localize(self._window(probe, pos, s0 + d), probe, light=True)
            comm, ident, roots = one["signature"] if one["confident"] else (False, [], [])
            if len(roots) > c.max_roots:
                return 1.0
            common = set(roots) if common is None else common & set(roots)
            links.append(tuple(ident) if comm else ())
            named.append(len(roots))
            if not common and not (links[0] and links[-1] == links[0]):
                return 1.0  # they agree on neither: no need to localize the rest
        chance = 1.0
        if common:
            chance = self.persistence.by_chance(named, len(named))
        if links[0] and len(set(links)) == 1:
            chance = min(chance, self._link_by_chance(len(links)))
        return min(chance, 1.0)

    def _link_by_chance(self, hits: int) -> float:
        """The chance that ``hits`` localizations, each naming one slow link, name the
        same one by accident: each could name any of the job's L node pairs a ring joins
        (L, the number of nodes), so L^(1 - hits); 1.0 on a single node."""
        nodes = len(set(self.meta.nodes.values()))
        return float(nodes) ** (1 - hits) if nodes >= 2 else 1.0

    def _onset(self, ch: Change) -> None:
        idx, t0, _ = self.timeline.at(ch.index)
        if ch.depth <= 1 or not self.levels:
            ref_lo = self._healthy_ref_lo(t0, ch.baseline)
            healthy = ch.baseline
        else:
            lower = self.levels[-1]
            lo_pos = max(lower.onset_pos + 1, self.change.levels[-2].seg
                         if len(self.change.levels) >= 2 else lower.onset_pos + 1)
            ref_lo = int(self.timeline.at(lo_pos)[1])
            healthy = lower.healthy_ns
        ref_lo = min(ref_lo, int(t0) - (1 << self.stats.shift))
        self.levels.append(SlowLevel(
            anomaly={"kind": "slow", "cause": "compute", "ranks": [], "start_ns": int(t0),
                     "detected_ns": None, "end_ns": None,
                     "slowdown": round(ch.level / healthy, 4) if healthy > 0 else None,
                     "onset_iteration": int(idx)},
            onset_pos=ch.index, ref_lo_ns=ref_lo, ref_iter_ns=ch.baseline,
            healthy_ns=healthy, seg_before=self.change.seg_start))

    def _try_confirm(self, op: SlowLevel) -> list[Anomaly]:
        """Open the anomaly of a pending level once its root persists (:meth:`Persistence.find`):
        a fail-slow is a persistent slow component, while pauses and bursts of jitter hit
        random ranks; after ``localize_retries`` more iterations without a persistent root
        the level is dropped."""
        c = self.config
        op.tries += 1
        t_onset = self.timeline.at(op.onset_pos)[1]
        if self.timeline.horizon - t_onset < c.min_window_iterations * op.ref_iter_ns:
            return []
        found = self.persistence.find(op)
        if found is not None and self.persistence.decaying(op):
            return []  # a pause and its spill-over, so far: one more iteration decides
        if found is None:
            if op.tries > c.localize_retries:
                self._drop(op)
            return []
        first, comm_ok, nodes, roots = found
        # the root may appear some iterations after the level's onset: the anomaly is the
        # stretch from there on (its start is refined from there)
        a = self.timeline.pos(op.onset_pos + first)
        op.anomaly["onset_iteration"] = int(self.timeline.iters[a][0])
        op.anomaly["start_ns"] = int(self.timeline.iters[a][1])
        win = self._window(op, op.onset_pos + first, self.timeline.horizon)
        # a slow link's end may compute slowly too although no iteration alone showed it
        # (a once-per-iteration sync in every other iteration's window): the whole window
        skip = self._below(op)
        loc = self.localizer.localize(win, op, roots=roots, comm=comm_ok, link_root=True,
                                      skip=skip)
        if comm_ok and loc["cause"] == "compute":
            loc = self.localizer.localize(win, op, roots=roots, comm=True, force_comm=True,
                                          link_root=True, skip=skip)
        # the anomaly's identity is what it names: a link only when its cause names one (a
        # group slow in some iterations alone, not in the whole window, names none)
        names_link = comm_ok and loc["cause"] != "compute"
        loc["signature"] = [names_link, nodes if names_link else [], roots]
        if not loc["confident"]:
            return []
        if (loc["cause"] == "compute" and self.localizer.evidence.get("compute_source") == "waits"
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
            link = self.localizer.localize(win, op, roots=[], comm=True, force_comm=True)
            loc = self.localizer.localize(win, op, roots=roots, comm=False)
            loc["signature"] = [comm_ok, nodes, roots]
            if link["cause"] == "communication" and (link.get("P") is None
                                                     or link["P"] <= c.beta):
                extra.append({k: v for k, v in link.items() if k not in INTERNAL_FIELDS})
        depth = self.levels.index(op)
        if depth > 0 and self._same(self.levels[depth - 1], loc) and \
                not self._far_worse(op, self.levels[depth - 1]):
            # the open anomaly grew worse: one fault, one anomaly, reported again (same id)
            lower = self.levels[depth - 1]
            before = float(lower.anomaly["slowdown"] or 0.0)
            lower.anomaly["slowdown"] = max(before, float(op.anomaly["slowdown"] or 0.0))
            self.levels.remove(op)
            self.change.merge_top()
            grew = lower.state == "open" and lower.anomaly["slowdown"] > before
            return [_anomaly(lower.anomaly)] if grew else []
        op.signature = loc["signature"]
        op.first = first
        op.anomaly.update({k: v for k, v in loc.items()
                           if k not in INTERNAL_FIELDS})
        if first:  # ``a``: the stretch's first iteration (above)
            durs = [d for _, t0, d in self.timeline.iters[a:] if t0 + d <= self.timeline.horizon]
            if durs and op.healthy_ns > 0:
                op.anomaly["slowdown"] = round(float(np.median(durs)) / op.healthy_ns, 4)
        out = []
        for j, loc_j in enumerate([{}, *extra]):
            if j:
                keep = {k: op.anomaly[k] for k in ("kind", "onset_iteration", "slowdown",
                                                   "end_ns")}
                op.extra.append({**keep, **loc_j})
            a_j = op.extra[-1] if j else op.anomaly
            a_j["start_ns"] = min(int(a_j["start_ns"]), self.timeline.horizon - 1)
            a_j["detected_ns"] = int(self.timeline.horizon)
            a_j["id"] = f"slow-{self.next_id}"
            self.next_id += 1
            out.append(_anomaly(a_j))
        op.state = "open"
        op.note_report()
        return out

    def _below(self, op: SlowLevel) -> frozenset[int]:
        """The root ranks of the open anomalies below ``op``: a further slow level's
        reference already holds their slowness."""
        below = self.levels[:self.levels.index(op)] if op in self.levels else []
        return frozenset(int(r) for lv in below if lv.state == "open"
                         for r in lv.anomaly.get("ranks") or [])

    def _refine(self, op: SlowLevel) -> list[Anomaly]:
        """An open anomaly (the top level) whose later iterations add persistent evidence
        (a second slow rank, the compute side of a mixed slow-down) is updated and reported
        again with the same id (its lifecycle: open, updated, resolved)."""
        # only what was there from the onset on: a fault that starts later is its own
        found = self.persistence.find(op, max_start=op.first + 1)
        if not op.signature:
            return []
        old_comm, old_nodes, old_roots = op.signature
        first, comm_ok, nodes, roots = found or (op.first, bool(old_comm), list(old_nodes),
                                                 list(old_roots))
        kept = list(old_roots)
        if found is not None and (comm_ok or roots):
            # a root that no longer persists, that none of the latest ``root_gone``
            # iterations names while something else persists, was a transient that met the
            # onset (a burst on its node): it goes
            latest = op.per_iter[-self.config.root_gone:]
            kept = [r for r in old_roots if r in roots or len(latest) < self.config.root_gone
                    or any(sig is None or r in sig[2] for sig in latest)]
        comm_ok = comm_ok or bool(old_comm)
        nodes = list(old_nodes) if old_comm and old_nodes else nodes
        roots = sorted(set(roots) | set(kept))
        if op.anomaly.get("cause") == "compute" and not comm_ok:
            # stragglers that the first one hides show only over several iterations
            whole = self._window(op, op.onset_pos + op.first, self.timeline.horizon)
            roots = sorted(set(roots) | set(hidden_roots(
                self.stats, self.config, whole, roots + sorted(self._below(op)))))
        if comm_ok == bool(old_comm) and roots == sorted(old_roots):
            return self._restage(op) if len(op.per_iter) == \
                op.first + self.config.refine_iterations else []
        win = self._window(op, op.onset_pos + first, self.timeline.horizon)
        if op.extra:  # the slow link is reported apart: refine the compute anomaly
            loc = self.localizer.localize(win, op, roots=roots, comm=False)
        else:
            loc = self.localizer.localize(win, op, roots=roots, comm=comm_ok, force_comm=comm_ok)
            if loc["cause"] == "mixed" and loc["independent"]:
                # a root off the open anomaly's link is a second fault, not its compute
                # side (``_try_confirm`` keeps such a root apart from the link too)
                return []
        if loc["cause"] == op.anomaly["cause"] and loc["ranks"] == op.anomaly["ranks"]:
            op.signature = [comm_ok, nodes, roots]
            return []
        op.signature = [comm_ok, nodes, roots]
        keep = {k: op.anomaly[k] for k in ("id", "start_ns", "detected_ns")}
        if set(old_roots) - set(kept):
            # the first report named a root the evidence no longer holds: what this one
            # names is known from now on, and the first report is kept beside it
            keep["revised"] = {k: op.anomaly.get(k) for k in ("cause", "ranks", "link",
                                                              "detected_ns")}
            keep["detected_ns"] = int(self.timeline.horizon)
        op.anomaly.update({k: v for k, v in loc.items()
                           if k not in INTERNAL_FIELDS})
        op.anomaly.update(keep)
        if "revised" in keep:  # back to what an earlier report named?
            op.anomaly["detected_ns"] = op.known_since(op.anomaly["detected_ns"])
        op.note_report()
        return [_anomaly(op.anomaly)]

    def _restage(self, op: SlowLevel) -> list[Anomaly]:
        """A compute anomaly's pass (MEGATRACE §III-C), judged again over the
        ``refine_iterations`` iterations since its root appeared and reported again when
        it changed: a pass told from the first two slow iterations rests on a few pass
        bins."""
        a = op.anomaly
        if a.get("cause") != "compute" or not a.get("ranks"):
            return []
        win = self._window(op, op.onset_pos + op.first, self.timeline.horizon)
        stage = compute_stage(self.stats, [int(r) for r in a["ranks"]], win)
        if stage == a.get("stage"):
            return []
        a["stage"] = stage
        return [_anomaly(a)]

    def _drop(self, op: SlowLevel) -> None:
        i = self.levels.index(op)
        for _ in range(len(self.levels) - i):
            self.levels.pop()
            self.change.reject()

    def _far_worse(self, op: SlowLevel, lower: SlowLevel) -> bool:
        """``op``'s iterations are ``worse_factor`` times as slow as the open ``lower``'s: a new
        event on the same root or link (a degraded link that then fails hard; or noise
        that happened to name it before the fault), reported with its own onset."""
        a, b = op.anomaly.get("slowdown"), lower.anomaly.get("slowdown")
        return bool(a and b and float(a) >= self.config.worse_factor * float(b))

    def _same(self, a: SlowLevel, loc: dict[str, Any]) -> bool:
        """``loc`` names the fault of level ``a``: their signatures agree and, when both
        name a link, it is the same link (two links between the same two nodes, as on
        rail-optimized NICs, are two faults)."""
        mine, theirs = a.anomaly.get("link"), loc.get("link")
        if mine and theirs and sorted(mine) != sorted(theirs):
            return False
        return bool(a.signature) and agree(a.signature, loc["signature"])

    def _relief(self, ch: Change) -> list[Anomaly]:
        out: list[Anomaly] = []
        _, t_end, _ = self.timeline.at(ch.index)
        for _ in range(min(ch.closed, len(self.levels))):
            op = self.levels.pop()
            if op.state != "open":
                if not self.levels:
                    # never confirmed: its values stay in the healthy segment (as a reject)
                    self.change.keep_segment(op.seg_before)
                # the stretch was judged (no persistent root) and is over: a new onset must
                # be new evidence, not the same transient burst proposed again
                self.change.min_start = max(self.change.min_start, int(ch.index))
                continue
            a, b = self.timeline.pos(op.onset_pos), self.timeline.pos(ch.index)
            durs = [d for _, _, d in self.timeline.iters[a:max(b, a + 1)]]
            if durs and op.healthy_ns > 0:
                op.anomaly["slowdown"] = round(float(np.median(durs)) / op.healthy_ns, 4)
            if op.anomaly.get("cause") != "communication" and op.anomaly.get("ranks") and \
                    "gpu" not in op.anomaly:
                # GPU samples are sparse: look at the whole anomaly once it is over
                gpu = gpu_evidence(self.stats, list(op.anomaly["ranks"]),
                                         self._window(op, op.onset_pos + op.first, int(t_end)))
                if gpu:
                    op.anomaly["gpu"] = gpu
            op.anomaly["end_ns"] = max(int(t_end), int(op.anomaly["start_ns"]) + 1)
            out.append(_anomaly(op.anomaly))
            for other in op.extra:
                other["slowdown"] = op.anomaly["slowdown"]
                other["end_ns"] = max(int(t_end), int(other["start_ns"]) + 1)
                out.append(_anomaly(other))
        return out


def _anomaly(d: dict[str, Any]) -> Anomaly:
    return Anomaly.from_dict(dict(d))
