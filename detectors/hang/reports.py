"""Reports of the hang detector: the hangs reported so far (open until their stuck operations
complete, then reported once more with ``end_ns``), and the reports of one detection pass:
one anomaly per root (CCL-D §4.2.2), with MEGATRACE's halt point and training stage (§III-C
step 3) and the victims (the members blocked behind the root)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from failslow import events
from failslow.detectors.hang.classify import Classifier
from failslow.detectors.hang.config import NO_TIME
from failslow.detectors.hang.graph import WaitGraph
from failslow.detectors.hang.halt import Placement
from failslow.diagnosis import Anomaly


@dataclass
class _Hang:
    anomaly: Anomaly
    index: int
    roots: list[int] = field(default_factory=list)        # idle roots (H1)
    round: list[Any] | None = None                         # the all-entered round (H2/H3)
    last_end: int = NO_TIME
    ended: bool = False


class OpenHangs:
    """Every hang reported, by index (the ``hang`` column of the in-flight table)."""

    def __init__(self) -> None:
        self.hangs: list[_Hang] = []

    def new(self, anomaly: Anomaly, roots: list[int], rnd: list[Any] | None) -> int:
        index = len(self.hangs)
        anomaly.id = f"hang-{index}-{anomaly.start_ns}"
        self.hangs.append(_Hang(anomaly, index, roots, rnd))
        return index

    def open_roots(self) -> dict[int, int]:
        """Idle roots (H1) of the hangs still open -> their hang index."""
        return {r: h.index for h in self.hangs if not h.ended for r in h.roots}

    def note_end(self, index: int, end_ns: int) -> None:
        """Operations of hang ``index`` completed, the last at ``end_ns``."""
        h = self.hangs[index]
        h.last_end = max(h.last_end, end_ns)

    def history_mask(self, hang: np.ndarray, dur: np.ndarray) -> np.ndarray:
        """Which completed operations count as duration history: not those that were part of
        a reported hang, except the waits of a not-entered (H1) hang that completed after
        all: its root was busy on the host (a checkpoint written by one rank), which recurs
        and is then normal (CCL-D §4.2.1's long operations), so it is reported once only."""
        ok = (hang < 0) & (dur >= 0)
        in_hang = np.flatnonzero(hang >= 0)
        if len(in_hang):
            pause = {h: self.hangs[h].anomaly.cause == "not_entered"
                     for h in np.unique(hang[in_hang]).tolist()}
            ok[in_hang] = [pause[h] for h in hang[in_hang].tolist()]
            ok &= dur >= 0
        return ok

    def finished(self, in_flight: np.ndarray) -> list[Anomaly]:
        """Open hangs whose stuck operations all completed (none left among the hang
        indices ``in_flight``): report once more with end_ns."""
        out = []
        active = set(np.unique(in_flight).tolist())
        for h in self.hangs:
            if not h.ended and h.index not in active and h.last_end != NO_TIME:
                h.ended = True
                h.anomaly.end_ns = h.last_end
                out.append(Anomaly.from_dict(h.anomaly.to_dict()))
        return out

    def to_state(self) -> list[dict[str, Any]]:
        return [{"anomaly": h.anomaly.to_dict(), "index": h.index, "roots": h.roots,
                 "round": h.round, "last_end": h.last_end, "ended": h.ended}
                for h in self.hangs]

    def load(self, hangs: list[dict[str, Any]]) -> None:
        self.hangs = [_Hang(Anomaly.from_dict(h["anomaly"]), int(h["index"]), list(h["roots"]),
                            h["round"], int(h["last_end"]), bool(h["ended"]))
                      for h in hangs]


class Reporter:
    """The reports of one detection pass over its wait graph."""

    def __init__(self, graph: WaitGraph) -> None:
        self.graph = graph
        self.det = graph.det
        self.placement = Placement(graph)
        self.classifier = Classifier(graph, self.placement)

    def resolve(self, triggers: dict[tuple[Any, ...], None]) -> list[Anomaly]:
        fl = self.det.flight.fl
        out: list[Anomaly] = []
        idle_groups: list[tuple[set[int], set[tuple[Any, ...]]]] = []
        groups: dict[tuple[Any, ...], set[tuple[Any, ...]]] = {}
        to_hang: dict[int, set[tuple[Any, ...]]] = {}
        cycles: dict[tuple[Any, ...], set[tuple[Any, ...]]] = {}
        for rnd in triggers:
            terms = {t for t in self.graph.terminals(rnd) if self.graph.valid(t)}
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
        for r, waits in self.graph.silent_roots.items():
            for rnd in waits:
                self.graph.direct.setdefault(r, set()).add(rnd)
            idle_groups.append(({r}, set(waits)))
        # victims of open hangs: adopt their rounds, no new report
        for h, adopted in to_hang.items():
            self._mark(adopted, h)
        for roots, rounds in _merge(idle_groups):
            out.append(self._report_not_entered(sorted(roots), rounds))
        for grnd, via in groups.items():
            if any(fl["hang"][i] >= 0 for i in self.graph.round_ops[grnd]):
                continue
            report = self._report_group(grnd, via)
            if report is not None:
                out.append(report)
        for ranks, via in cycles.items():
            out.append(self._report_cycle(list(ranks), via))
        return [Anomaly.from_dict(a.to_dict()) for a in out]

    def _mark(self, rounds: set[tuple[Any, ...]], h: int) -> None:
        fl = self.det.flight.fl
        for rnd in rounds:
            for i in self.graph.round_ops.get(rnd, []):
                if fl["hang"][i] < 0:
                    fl["hang"][i] = h

    def _victims(self, rounds: set[tuple[Any, ...]], roots: list[int]) -> dict[str, Any]:
        fl, ops = self.det.flight.fl, self.graph.round_ops
        ranks = sorted({int(fl["rank"][i]) for rnd in rounds for i in ops.get(rnd, [])}
                       - set(roots))
        cap = self.det.config.max_listed_victims
        return {"victims": ranks[:cap], "victims_count": len(ranks)}

    def _anomaly(self, cause: str, ranks: list[int], rnd: tuple[Any, ...], start: int,
                 link: list[int] | None, extra: dict[str, Any]) -> Anomaly:
        det = self.det
        ci = rnd[1]
        op = int(det.flight.fl["op"][self.graph.round_ops[rnd][0]])
        place = self.placement
        where = place.pipeline_pass(rnd, ranks) if rnd[0] == "p" else place.position(rnd)
        return Anomaly(id="", kind="hang", cause=cause, ranks=ranks, link=link,
                       comm=det.comms.u64[ci], comm_kind=det.comm_kind(ci),
                       stage=det.comms.stage(ci, op), start_ns=start, detected_ns=self.graph.now,
                       extra={"halt_point": self.placement.halt_point(rnd), **where, **extra,
                              "blocked_rounds": self._blocked_rounds(ranks)})

    def _blocked_rounds(self, roots: list[int]) -> list[dict[str, Any]]:
        """The rounds in flight that wait for a root rank to enter them, earliest first: the
        wave front the other ranks are stopped at (what PyTorch's Flight Recorder analysis
        reports as a collective with missing ranks), where the halt point is the root's own
        stuck operation (MEGATRACE §III-C). The first such round of each communicator."""
        det, graph = self.det, self.graph
        fl = det.flight.fl
        found = []
        for rnd, ops in graph.round_ops.items():
            if graph.barrier[ops].all():
                continue
            missing = [r for r in graph.missing(rnd) if r in roots]
            if not missing:
                continue
            first = ops[int(np.argmin(fl["t"][ops]))]
            row: dict[str, Any] = {
                "comm": det.comms.u64[rnd[1]], "comm_kind": det.comm_kind(rnd[1]),
                "op": events.COLL_OPS[int(fl["op"][first])], "t_enter": int(fl["t"][first]),
                "missing": sorted(missing),
                "entered": sorted({int(fl["rank"][i]) for i in ops})}
            if rnd[0] == "c":
                row["seq"] = rnd[2]
            found.append(row)
        found.sort(key=lambda r: r["t_enter"])
        per_comm: dict[int, dict[str, Any]] = {}
        for row in found:  # one per communicator: where its members stopped
            per_comm.setdefault(row["comm"], row)
        return list(per_comm.values())[:det.config.max_listed_victims]

    def _report_not_entered(self, roots: list[int], rounds: set[tuple[Any, ...]]) -> Anomaly:
        """H1: the members that never entered the round are the root (CCL-D §4.2.2)."""
        direct = set().union(*(self.graph.direct.get(r, set()) for r in roots)) or rounds
        reached = [rnd for rnd in direct if self.placement.reached(rnd, roots)] or list(direct)
        first = min(self.graph.round_t(rnd) for rnd in reached)
        window = self.det.config.p2p_batch_ns
        near = [rnd for rnd in reached if self.graph.round_t(rnd) <= first + window]
        halt = min(near, key=lambda rnd: (self.placement.batch_order(rnd, roots),
                                          self.graph.round_t(rnd)))
        allr = rounds | direct
        a = self._anomaly("not_entered", roots, halt, self.graph.round_t(halt), None,
                          self._victims(allr, roots))
        h = self.det.hangs.new(a, roots, None)
        self._mark(allr, h)
        return a

    def _report_cycle(self, ranks: list[int], rounds: set[tuple[Any, ...]]) -> Anomaly:
        halt = min(rounds, key=self.graph.round_t)
        a = self._anomaly("inconsistent", ranks, halt, self.graph.round_t(halt), None,
                          {"wait_cycle": True, **self._victims(rounds, ranks)})
        h = self.det.hangs.new(a, [], list(halt))
        self._mark(rounds, h)
        return a

    def _report_group(self, grnd: tuple[Any, ...], rounds: set[tuple[Any, ...]]
                      ) -> Anomaly | None:
        """All members entered the round: H2 (inconsistent) or H3 (hardware). A hardware
        hang waits a little for work-request evidence of a broken link (MEGATRACE §III-C
        step 2, validation) when queue-pair samples of the members' nodes are flowing."""
        det = self.det
        ops = self.graph.round_ops[grnd]
        cause, roots, link, extra = self.classifier.classify(grnd, ops)
        if (cause == "hardware" and link is None and grnd[0] == "c"
                and self.classifier.link_pending(grnd[1], ops, roots)):
            return None
        a = self._anomaly(cause, roots, grnd, self.graph.complete_t(grnd)[0], link,
                          {**extra, **self._victims(rounds | {grnd}, roots)})
        h = det.hangs.new(a, [], list(grnd))
        self._mark(rounds | {grnd}, h)
        return a


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
