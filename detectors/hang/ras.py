"""NCCL RAS findings as hang evidence (``ras`` rows, event contract v2, docs/events-v2.md).

The node agent publishes one row per (communicator, global rank, finding) and RAS report
(:mod:`failslow.collectors.ras`): ``missing`` and ``behind`` say a rank did not enter (CCL-D
H1), ``inconsistent`` that it launched other operations at the same count (H2), ``stalled``
that every member launched the same and nothing more (an H3 candidate, or a paused job). A
finding repeats while its condition lasts; it is *current* while seen within
``ras_fresh_ns`` (or three report intervals, the longer).

Two uses (:class:`RasEvidence`):

* beside ``coll`` rows, the reports of the wait graph are annotated (:meth:`annotate`):
  ``extra["ras"]`` lists the findings of the hang's communicators and ranks since it began,
  ``ras_agrees`` says whether RAS names the same root (``ras_roots``: those ranks), and
  ``ras_note`` what RAS says otherwise. The ``coll``-based root is never changed;
* where ``coll`` rows cannot show the hang (nothing in flight among the communicator's
  members, none of their rows for the idle floor before the latest report: a dead
  collector, a job with only RAS and Inspector data, which writes an operation only once it
  completes), current findings raise it (:meth:`raise_hangs`): H1 with the missing and
  behind ranks as root once seen for ``idle_floor_ns``, likewise H2 for ``inconsistent``,
  and ``stalled`` as an H3 candidate without root once it lasted the detector's timeout for
  an operation it knows nothing of (``ceiling_ns``, CCL-D's 5 minutes: RAS tells neither
  the stuck operation nor its size). Such a hang ends when ``coll`` rows of the members come
  again. A rank RAS names is a root because RAS says so (``ras_roots``), even without rows
  of its own; a rank with neither stays unknown (the engine's rule).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from failslow import events
from failslow.detectors.hang.config import NO_TIME
from failslow.diagnosis import Anomaly

if TYPE_CHECKING:
    from failslow.detectors.hang.detector import HangDetector

#: finding -> the hang cause it is evidence for
CAUSE = {"missing": "not_entered", "behind": "not_entered", "inconsistent": "inconsistent",
         "stalled": "hardware"}
_ROOTED = ("missing", "behind", "inconsistent")
_STALLED = -1  # rank of a communicator's ``stalled`` entry (RAS names no rank)


def _op(function: str | None) -> str | None:
    """A RAS collective function name (``AllReduce``) as an event-contract op."""
    if not function:
        return None
    name = function.lower().replace("all2all", "alltoall").replace("allgatherv", "allgather")
    return name if name in events.COLL_OPS else None


class RasEvidence:
    """The RAS findings of one job: per (communicator, rank, finding) when first and last
    seen, in how many reports, and the function and counts of the latest."""

    def __init__(self, fresh_ns: int) -> None:
        self.fresh_ns = fresh_ns
        self.seen: dict[tuple[int, int, str], dict[str, Any]] = {}
        self.last_t = NO_TIME
        self.interval = 0          # usual gap between two reports
        #: communicator -> index of the hang RAS raised on it, and the coll time it saw then
        self.raised: dict[int, list[int]] = {}
        #: hang index -> the RAS annotation last reported with it
        self.noted: dict[int, dict[str, Any]] = {}
        self._key: tuple[int, ...] = ()   # inputs of the last raise_hangs pass

    # ----------------------------------------------------------------------------- ingestion

    def ingest(self, table: pa.Table) -> int:
        """One batch of ``ras`` rows; returns its newest time."""
        t = table.column("t").to_numpy()
        times = np.unique(t)
        prev = np.concatenate([[self.last_t], times]) if self.last_t != NO_TIME else times
        gaps = np.diff(prev)
        gaps = gaps[gaps > 0]
        if len(gaps):  # the agent's query interval, smoothed
            gap = float(np.median(gaps))
            self.interval = int(gap if self.interval == 0 else 0.8 * self.interval + 0.2 * gap)
        self.last_t = max(self.last_t, int(times[-1]))
        stalled = pc.equal(table.column("finding"), "stalled")
        rank = pc.if_else(stalled, pa.scalar(_STALLED, pa.int32()), table.column("rank"))
        keyed = pa.table({"comm": table.column("comm"), "rank": rank,
                          "finding": table.column("finding"), "t": table.column("t"),
                          "size": table.column("comm_size"), "function": table.column("function"),
                          "count": table.column("count"), "expected": table.column("expected")})
        keyed = keyed.sort_by([("t", "ascending")])
        groups = keyed.group_by(["comm", "rank", "finding"], use_threads=False).aggregate([
            ("t", "min"), ("t", "max"), ("t", "count_distinct"), ("size", "max"),
            ("function", "last"), ("count", "last"), ("expected", "last")])
        for g in groups.to_pylist():
            key = (int(g["comm"]), int(g["rank"]), str(g["finding"]))
            f = self.seen.get(key)
            if f is None or int(g["t_min"]) - f["last_t"] > self.fresh():
                f = self.seen[key] = {"first_t": int(g["t_min"]), "reports": 0}
            f.update(last_t=int(g["t_max"]), size=int(g["size_max"]),
                     function=g["function_last"], count=g["count_last"],
                     expected=g["expected_last"])
            f["reports"] += int(g["t_count_distinct"])
        return int(times[-1])

    def fresh(self) -> int:
        """How long a finding stays current after it was last seen."""
        return max(self.fresh_ns, 3 * self.interval)

    def current(self, now: int) -> dict[tuple[int, int, str], dict[str, Any]]:
        limit = self.fresh()
        return {k: f for k, f in self.seen.items() if now - f["last_t"] <= limit}

    def forget(self, now: int) -> None:
        """Drop findings not seen for a long while (bounded state)."""
        limit = 10 * self.fresh()
        self.seen = {k: f for k, f in self.seen.items() if now - f["last_t"] <= limit}

    @staticmethod
    def listed(key: tuple[int, int, str], f: dict[str, Any]) -> dict[str, Any]:
        """One finding as the anomaly lists it."""
        out: dict[str, Any] = {"finding": key[2], "comm": key[0]}
        if key[1] != _STALLED:
            out["rank"] = key[1]
        for name in ("function", "count", "expected"):
            if f.get(name) is not None:
                out[name] = f[name]
        out["first_t"] = f["first_t"]   # stable while it lasts: a change is news
        return out

    # --------------------------------------------------------------------------- annotation

    def annotate(self, det: HangDetector, a: Anomaly) -> dict[str, Any]:
        """The RAS evidence of a hang the ``coll`` rows found (module docstring); empty
        when RAS said nothing about its communicators or ranks since it began."""
        if not self.seen or a.kind != "hang":
            return {}
        comms = {a.comm} | {b.get("comm") for b in a.extra.get("blocked_rounds") or []}
        hp = a.extra.get("halt_point")
        if isinstance(hp, dict):
            comms.add(hp.get("comm"))
        roots = set(a.ranks) | set(a.extra.get("unknown_ranks") or [])
        since = (a.start_ns or 0) - self.fresh()
        rel = sorted((k, f) for k, f in self.seen.items()
                     if f["last_t"] >= since
                     and (k[0] in comms or k[0] not in det.comms.ids or k[1] in roots))
        if not rel:
            return {}
        named = {k[1] for k, _ in rel if k[2] in ("missing", "behind")}
        odd = {k[1] for k, _ in rel if k[2] == "inconsistent"}
        stalled = any(k[2] == "stalled" and k[0] in comms for k, _ in rel)
        if a.cause == "not_entered":
            agree, other = named & roots, (named | odd) - roots
        elif a.cause == "inconsistent":
            agree, other = odd & roots, (named | odd) - roots
        else:
            agree, other = set(), (named | odd) - roots
        cap = det.config.max_listed_victims
        out: dict[str, Any] = {"ras": [self.listed(k, f) for k, f in rel][:cap],
                               "ras_agrees": bool(agree) or (a.cause == "hardware" and stalled
                                                             and not other),
                               "ras_roots": sorted(agree)}
        if other:
            said = sorted({f"{k[1]} {k[2]}" for k, _ in rel if k[1] in other})
            out["ras_note"] = (f"RAS names {', '.join(said)}; the coll rows show "
                               f"{sorted(a.ranks) or 'no known rank'} as the root "
                               f"({a.cause}): the coll-based root is kept")
        return out

    # ------------------------------------------------------------------------ RAS alone

    def raise_hangs(self, det: HangDetector, now: int) -> list[Anomaly]:
        """Hangs RAS alone shows (module docstring), and the end of those it raised before
        once ``coll`` rows of their members come again."""
        out = self._ended(det)
        # what a raise depends on besides time (which only makes findings stale)
        key = (self.last_t, det.flight.version, len(det.hangs.hangs), len(self.raised),
               int(det.ranks.last.max()) if len(det.ranks.last) else NO_TIME)
        if key == self._key:
            return out
        self._key = key
        cur = self.current(now)
        if not cur:
            return out
        cfg = det.config
        by_comm: dict[int, list[tuple[tuple[int, int, str], dict[str, Any]]]] = {}
        for k, f in cur.items():
            by_comm.setdefault(k[0], []).append((k, f))
        open_roots = det.hangs.open_roots()
        busy = set(det.flight.fl["rank"].tolist())
        for comm, found in sorted(by_comm.items()):
            if comm in self.raised:
                continue
            members = self._members(det, comm)
            named = {k[1] for k, _ in found if k[1] != _STALLED}
            # an unknown communicator (its hash in no coll row): every rank is a member
            scope = members | named if members else set()
            if named & set(open_roots) or (busy & scope if scope else busy):
                continue        # the coll rows show it (or will): they lead
            last = max(f["last_t"] for _, f in found)
            coll_t = self._coll_last(det, scope)
            if coll_t != NO_TIME and coll_t >= last - cfg.idle_floor_ns:
                continue        # rows of the members are recent: no hang they would miss
            rooted = [(k, f) for k, f in found if k[2] in ("missing", "behind")] or \
                [(k, f) for k, f in found if k[2] == "inconsistent"]
            lasting = cfg.idle_floor_ns
            if not rooted:
                rooted = [(k, f) for k, f in found if k[2] == "stalled"]
                lasting = cfg.ceiling_ns
            rooted = [(k, f) for k, f in rooted if f["last_t"] - f["first_t"] >= lasting]
            if rooted:
                out.append(self._report(det, comm, rooted, found, now, coll_t))
        return out

    @staticmethod
    def _members(det: HangDetector, comm: int) -> set[int]:
        ci = det.comms.ids.get(comm, -1)
        if ci < 0:
            return set()
        m = det.comms.members(ci)
        return {int(r) for r in m[m >= 0]}

    @staticmethod
    def _coll_last(det: HangDetector, ranks: set[int]) -> int:
        """The newest ``coll`` record of ``ranks`` (of any rank when empty)."""
        last = det.ranks.last
        if not len(last):
            return NO_TIME
        if not ranks:
            return int(last.max())
        idx = np.array([r for r in ranks if 0 <= r < len(last)], dtype=np.int64)
        return int(last[idx].max()) if len(idx) else NO_TIME

    def _report(self, det: HangDetector, comm: int,
                rooted: list[tuple[tuple[int, int, str], dict[str, Any]]],
                found: list[tuple[tuple[int, int, str], dict[str, Any]]], now: int,
                coll_t: int) -> Anomaly:
        finding = rooted[0][0][2]
        cause = CAUSE[finding]
        roots = sorted({k[1] for k, _ in rooted if k[1] != _STALLED})
        size = max(f["size"] for _, f in found)
        ci = det.comms.ids.get(comm, -1)
        f0 = min((f for _, f in rooted), key=lambda f: f["first_t"])
        op = _op(f0.get("function"))
        if ci >= 0:
            kind: str | None = det.comm_kind(ci)
            stage = det.comms.stage(ci, events.OP[op]) if op is not None else None
        else:
            kind = "world" if size == det.meta.world_size else None
            stage = None
        halt: dict[str, Any] = {"comm": comm, "op": op, "source": "ras"}
        if cause == "not_entered":
            halt["missing"] = roots
        if f0.get("count") is not None:
            halt.update(count=f0["count"], expected=f0.get("expected"))
        since = "never" if coll_t == NO_TIME else f"none since {coll_t}"
        extra: dict[str, Any] = {
            "halt_point": halt, "evidence": "ras",
            "ras": [self.listed(k, f) for k, f in sorted(found)][:det.config.max_listed_victims],
            "ras_agrees": True, "ras_roots": roots,
            "note": f"from NCCL RAS alone: coll rows of the communicator's ranks: {since}"}
        if size > len(roots):
            extra["victims_count"] = size - len(roots)
        if cause == "hardware":
            extra["candidate"] = True
            extra["note"] += ("; every member launched the same operations and none since: a "
                              "stalled transfer (H3) or a paused job, RAS names no rank")
        a = Anomaly(id="", kind="hang", cause=cause, ranks=roots, link=None, comm=comm,
                    comm_kind=kind, stage=stage, start_ns=f0["first_t"], detected_ns=now,
                    extra=extra)
        h = det.hangs.new(a, roots if cause == "not_entered" else [], None)
        self.raised[comm] = [h, coll_t]
        self.noted[h] = {}
        return Anomaly.from_dict(a.to_dict())

    def _ended(self, det: HangDetector) -> list[Anomaly]:
        """RAS-raised hangs whose members sent ``coll`` rows again: reported with end_ns."""
        out = []
        for comm, (h, coll_t) in list(self.raised.items()):
            hang = det.hangs.hangs[h]
            if hang.ended:
                del self.raised[comm]
                continue
            basis = max(coll_t, hang.anomaly.detected_ns or NO_TIME)
            if not len(det.ranks.last) or int(det.ranks.last.max()) <= basis:
                continue        # no coll row since: cheap on every tick
            members = self._members(det, comm) | set(hang.anomaly.ranks)
            t = self._coll_last(det, members)
            if t != NO_TIME and t > basis:
                hang.ended = True
                hang.anomaly.end_ns = t
                out.append(Anomaly.from_dict(hang.anomaly.to_dict()))
                del self.raised[comm]
        return out

    # ------------------------------------------------------------------------------ state

    def to_state(self) -> dict[str, Any]:
        return {"seen": [[list(k), f] for k, f in self.seen.items()], "last_t": self.last_t,
                "interval": self.interval,
                "raised": [[c, v] for c, v in self.raised.items()],
                "noted": [[h, v] for h, v in self.noted.items()]}

    def load(self, state: dict[str, Any]) -> None:
        self.seen = {(int(k[0]), int(k[1]), str(k[2])): dict(f) for k, f in state["seen"]}
        self.last_t = int(state["last_t"])
        self.interval = int(state["interval"])
        self.raised = {int(c): [int(x) for x in v] for c, v in state["raised"]}
        self.noted = {int(h): dict(v) for h, v in state["noted"]}
