"""The row-level half of the slow-down detector (issue 13 item 3; docs/scaling.md, "The
shape that meets the floors"): an :class:`EvidenceReducer` joins the rounds of the ``coll``
rows it is given (CCL-D §5.1 Trace ID) and measures its ranks' compute gaps (MEGATRACE
§III-B), and returns the rows the job-level detector sums into its time bins
(:class:`Evidence`). It decides nothing and keeps only the state of incomplete rounds and
of each rank's latest operations.

Several reducers may share one job (:class:`~failslow.detectors.slowdown.shards.
ShardRouter`): every bin key (a waiter and a communicator, a group, a rank) is produced by
exactly one of them, and the sums are of whole nanoseconds, so their evidence adds up to
one reducer's exactly."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from failslow.detectors.iterations import coll_columns
from failslow.detectors.slowdown.bins import _aggregate
from failslow.detectors.slowdown.comms import CommRegistry
from failslow.detectors.slowdown.config import RECV, SEND, SlowdownConfig, pure_dp
from failslow.detectors.slowdown.gaps import PASS_BIN_SHIFT, GapTracker
from failslow.detectors.slowdown.kernel import gap_kernel, round_kernel
from failslow.detectors.slowdown.rounds import RoundJoiner, Rounds, _concat_rounds
from failslow.events import JobMeta

#: The bin tables a reducer adds rows to (the others, from ``link``, ``gpu`` and ``span``
#: rows, are accounted by the job-level detector): their keys besides the bin, the summed
#: columns, the column maximized per key and those its row carries (:class:`.bins.BinTable`).
REDUCED_SPECS: dict[str, tuple[tuple[str, ...], tuple[str, ...], str | None,
                               tuple[str, ...]]] = {
    "grp": (("cidx", "group", "cls"), ("n", "xfer", "dmax", "dmin"), "range",
            ("rdmax", "rdmin")),
    "out_w": (("rank", "cidx"), ("w",), None, ()),
    "in_w": (("cidx", "waitee"), ("w", "n"), None, ()),
    "comp": (("rank",), ("d",), None, ()),
    "passes": (("rank", "pass"), ("d",), None, ()),  # forward / backward compute
}
REDUCED_TABLES = tuple(REDUCED_SPECS)


def class_key(r: Rounds) -> np.ndarray:
    """The raw round class of every round: ``bytes << 4 | op``."""
    return (r.nbytes.astype(np.int64) << 4) | r.op.astype(np.int64)


@dataclass
class Evidence:
    """What reducers add to a job's evidence from one batch.

    ``tables``: rows per bin table (:data:`REDUCED_TABLES`), in the order they were
    produced, with ``bin`` = time >> ``shift`` (``passes``: >> ``shift`` +
    :data:`~.gaps.PASS_BIN_SHIFT`); ``grp`` rows name their round class by its raw key
    (``bytes << 4 | op``, column ``cls``), which the job turns into its own dense ids.
    ``rounds``: the completed rounds (the ``rounds`` output and CCL-D's baselines);
    ``ccld``: rounds that came as rows from another stage (:mod:`.evidence_rows`), only
    the fields of CCL-D's baselines (``cidx``, ``group``, ``cls`` raw, ``t`` = end,
    ``dmax``, ``dmin``); ``ccld_windows``: rounds of classes past their baseline, summed
    per CCL-D detection window by that stage (``bin`` = window, ``n`` rounds, ``dmax`` and
    ``dmin`` of the one with the largest range: :meth:`.ccld.CCLDMonitor.add_windows`)."""

    shift: int
    tables: dict[str, list[dict[str, np.ndarray]]] = field(
        default_factory=lambda: {name: [] for name in REDUCED_TABLES})
    rounds: list[Rounds] = field(default_factory=list)
    ccld: list[dict[str, np.ndarray]] = field(default_factory=list)
    ccld_windows: list[dict[str, np.ndarray]] = field(default_factory=list)
    #: imported rows summed at bins coarser than ``shift`` (should not happen: .stage)
    coarser_rows: int = 0

    def add(self, other: Evidence) -> None:
        """Append another reducer's evidence of the same batch (same ``shift``)."""
        for name, parts in other.tables.items():
            self.tables[name].extend(parts)
        self.rounds.extend(other.rounds)
        self.ccld.extend(other.ccld)
        self.ccld_windows.extend(other.ccld_windows)

    def all_rounds(self) -> Rounds:
        return _concat_rounds([r for r in self.rounds if len(r)])

    def summed(self) -> Evidence:
        """The same evidence with each table's rows summed per key and bin (as its
        :class:`.bins.BinTable` sums them: a sum of sums is the same sum)."""
        out = Evidence(self.shift, rounds=self.rounds, ccld=self.ccld,
                       ccld_windows=self.ccld_windows)
        for name, parts in self.tables.items():
            if parts:
                keys, sums, arg, carried = REDUCED_SPECS[name]
                cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
                out.tables[name] = [_aggregate(cols, ("bin", *keys), sums, arg, carried)]
        return out

    def ccld_rows(self) -> dict[str, np.ndarray]:
        """The fields of CCL-D's baselines of every round, joined here or imported."""
        parts = [{"cidx": r.cidx, "group": r.group, "cls": class_key(r), "t": r.t_end,
                  "dmax": r.dmax, "dmin": r.dmin}
                 for r in self.rounds if len(r)] + self.ccld
        names = ("cidx", "group", "cls", "t", "dmax", "dmin")
        if not parts:
            return {k: np.zeros(0, dtype=np.int64) for k in names}
        return {k: np.concatenate([p[k] for p in parts]) for k in names}


class EvidenceReducer:
    """Rounds and compute gaps of the ``coll`` rows it is given, as bin rows (module
    docstring). ``registry``: the job's communicators (a reducer of its own by default)."""

    def __init__(self, meta: JobMeta, config: SlowdownConfig,
                 registry: CommRegistry | None = None) -> None:
        self.meta = meta
        self.config = config
        self.registry = registry if registry is not None else CommRegistry(meta)
        self.joiner = RoundJoiner(self.registry, int(config.max_pending_age_s * 1e9),
                                  round_kernel())
        self.gaps = GapTracker(meta.microbatches, gap_kernel())

    def update(self, coll: pa.Table, shift: int, gap_rows: pa.Table | None = None
               ) -> Evidence:
        """Join the rounds of ``coll`` and account the gaps of ``gap_rows`` (default: the
        same rows; a sharded reducer joins some rounds of other shards' ranks and measures
        only its own ranks' gaps)."""
        ev = Evidence(shift)
        if coll.num_rows:
            rounds = self.joiner.update(coll)
            if len(rounds):
                self._rounds(rounds, ev)
        gaps = coll if gap_rows is None else gap_rows
        if gaps.num_rows:
            self._gaps(gaps, ev)
        return ev

    def _rounds(self, r: Rounds, ev: Evidence) -> None:
        """Waits, transfer times and ``T_max``/``T_min`` of the rounds (CCL-D §4.2)."""
        binr = r.t_end >> ev.shift
        raw_cls = class_key(r)
        rng = (r.dmax - r.dmin).astype(np.float64)
        t = ev.tables
        t["grp"].append({"bin": binr, "cidx": r.cidx, "group": r.group, "cls": raw_cls,
                         "n": np.ones(len(r)), "xfer": r.transfer, "dmax": r.dmax,
                         "dmin": r.dmin, "range": rng, "rdmax": r.dmax, "rdmin": r.dmin})
        wait = r.m_wait > 0
        waitee = r.last_rank[r.m_round]
        mbin = binr[r.m_round]
        mcidx = r.cidx[r.m_round]
        t["out_w"].append({"bin": mbin[wait], "rank": r.m_rank[wait], "cidx": mcidx[wait],
                           "w": r.m_wait[wait]})
        t["in_w"].append({"bin": mbin[wait], "cidx": mcidx[wait], "waitee": waitee[wait],
                          "w": r.m_wait[wait], "n": np.ones(int(wait.sum()))})
        ev.rounds.append(r)

    def _gaps(self, coll: pa.Table, ev: Evidence) -> None:
        """Each rank's compute between its operations, placed in the schedule (gaps.py)."""
        c = coll_columns(coll)
        op, peer, cr = c["op"], c["peer"], c["comm_rank"]
        kind = np.zeros(len(op), dtype=np.int64)
        p = np.flatnonzero((op == SEND) | (op == RECV))
        if len(p):
            recv, pp, cc = op[p] == RECV, peer[p], cr[p]
            # 1 recv from the previous stage, 2 from the next, 3 send to the next, 4 to the
            # previous (0: a peer equal to oneself)
            kind[p] = np.where(recv, np.where(pp < cc, 1, np.where(pp > cc, 2, 0)),
                               np.where(pp > cc, 3, np.where(pp < cc, 4, 0)))
        # without a pipeline, the tensor-parallel collectives place the passes
        tp = self.registry.tp_rows(c["comm"]) if self.meta.pp == 1 and self.meta.tp > 1 \
            else None
        r, te, gap, passes = self.gaps.update(c["rank"], c["t"], c["is_enter"], kind, tp)
        if not len(r):
            return
        d = gap.astype(np.float64)
        # a pure data-parallel job computes in one gap per iteration that ends on the
        # iteration boundary (the gradient sync's entry), on either side of it by jitter
        # alone: there a gap counts at its middle. Elsewhere gaps are many and short, and
        # count at their end (where the wait graph sees the late arrival)
        at = te - gap // 2 if pure_dp(self.meta) else te
        ev.tables["comp"].append({"bin": at >> ev.shift, "rank": r, "d": d})
        known = passes > 0
        if known.any():
            ev.tables["passes"].append({"bin": te[known] >> (ev.shift + PASS_BIN_SHIFT),
                                        "rank": r[known], "pass": passes[known],
                                        "d": d[known]})

    def snapshot(self) -> dict[str, Any]:
        return {"registry": self.registry.snapshot(), "joiner": self.joiner.snapshot(),
                "gaps": self.gaps.snapshot()}

    def restore(self, state: dict[str, Any]) -> None:
        self.registry.restore(state["registry"])
        self.joiner.restore(state["joiner"])
        self.gaps.restore(state["gaps"])
