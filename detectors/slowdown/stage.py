"""The evidence reducer as a detector of its own (issue 13 item 3; docs/scaling.md, "Built:
evidence reducers in their own processes"): a consumer group that runs it for shard ``i``
of ``n`` (``failslow process --detectors evidence --shard i/n --export evidence``) joins
the rounds and measures the gaps of its shard's ranks, as the slow-down detector's
reducers do in one process (:mod:`.shards`), and exports what they add up to as rows
(:mod:`.evidence_rows`). The job's slow-down detector, in a group that imports them
(``--import evidence``), sums the rows of every shard instead of reducing the ``coll``
rows itself. The stage also writes the ``rounds`` it joins.

Rows are summed per key and bin before they leave, in bins as coarse as the job's
detector is sure to have by the time it reads them: it coarsens its bins to ~1/8 of its
baseline iteration time (:func:`.accounting.shift_for`, never finer later), and that
baseline is a median of job iteration times it was given, so it is at least the shortest
of them. The stage takes the shortest job iteration among those the detector has surely
read before this batch: at least 3 (it knows its baseline after 3), derived at least
:data:`SHIFT_LAG_WINDOWS` windows before it (a job's batch merges at most
``MAX_MERGED_WINDOWS`` windows; every stage of a job analyses it in windows of one length,
as the exports' ``t_emit`` already needs). Finer bins than the detector's are exact
(it sums them into its own); before that the rows go at ``bin_shift``.

A job whose meta lists no communicators cannot be split (the routing needs them): the
stage exports nothing for it, and the importing slow-down detector reduces its rows
itself."""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from failslow import results
from failslow.detectors.base import EventBatch
from failslow.detectors.iterations import coll_columns
from failslow.detectors.slowdown.accounting import shift_for
from failslow.detectors.slowdown.bins import _aggregate, _KeyIndex
from failslow.detectors.slowdown.ccld import CCLDMonitor, pack_class
from failslow.detectors.slowdown.config import SlowdownConfig
from failslow.detectors.slowdown.evidence_rows import SCHEMA, evidence_table
from failslow.detectors.slowdown.reducer import Evidence, EvidenceReducer
from failslow.detectors.slowdown.rounds import rounds_table
from failslow.detectors.slowdown.shards import ShardRouter
from failslow.diagnosis import Anomaly
from failslow.events import JobMeta
from failslow.replay import DEFAULT_WINDOW_NS, MAX_MERGED_WINDOWS

log = logging.getLogger(__name__)

#: Columns of held CCL-D window rows that are floats (the others are int64).
_HELD_FLOATS = frozenset({"n", "range"})
#: A job iteration bounds the bins once derived this many windows before a batch.
SHIFT_LAG_WINDOWS = MAX_MERGED_WINDOWS + 2
#: ... and once the detector has read this many (it knows its baseline then).
SHIFT_MIN_ITERATIONS = 3


def splits(meta: JobMeta) -> bool:
    """Whether a job's evidence can be reduced by another stage (its meta lists its
    communicators)."""
    return bool(meta.comms)


class EvidenceStage:
    """Shard ``shard`` of ``shards`` of a job's evidence reducers (module docstring).
    Detector protocol; reports nothing. It sizes its bins by the job iterations the
    tracking stage exports when it imports them too (``--import iterations``); without
    them its rows go at ``bin_shift``."""

    name: ClassVar[str] = "evidence"
    kinds: ClassVar[frozenset[str]] = frozenset({"coll"})
    produces: ClassVar[tuple[str, ...]] = ("evidence",)

    def __init__(self, meta: JobMeta, config: SlowdownConfig, shard: int, shards: int,
                 window_ns: int = DEFAULT_WINDOW_NS) -> None:
        if not 0 <= shard < shards:
            raise ValueError(f"shard {shard} of {shards}: want 0 <= shard < shards")
        self.meta = meta
        self.config = config
        self.shard = shard
        self.lag_ns = SHIFT_LAG_WINDOWS * window_ns
        self.router = ShardRouter(meta, shards)
        self.reducer = EvidenceReducer(meta, config)
        #: the job's CCL-D baselines as far as this shard's round classes go (only their
        #: learning: :meth:`_ccld_summed`), and the dense ids of its classes' parts
        self.ccld = CCLDMonitor(config)
        self.ccld_classes = _KeyIndex()
        self.ccld_groups = _KeyIndex()
        #: rounds past their class's baseline whose window is not over yet
        self.ccld_held: dict[str, np.ndarray] = {}
        #: job iterations not yet old enough to size the bins: (derived at, duration)
        self.recent: list[tuple[int, int]] = []
        self.settled = 0  # iterations old enough, and the shortest of them
        self.shortest = 0
        self._none = pa.Table.from_batches([], schema=SCHEMA)
        self.last: dict[str, pa.Table] = {"evidence": self._none,
                                          "rounds": results.empty("rounds")}

    @property
    def shift(self) -> int:
        """The bin shift of the rows this stage sends now (module docstring)."""
        if self.settled < SHIFT_MIN_ITERATIONS:
            return self.config.bin_shift
        return shift_for(self.config, float(self.shortest))

    def update(self, batch: EventBatch) -> list[Anomaly]:
        self.last = {"evidence": self._none, "rounds": results.empty("rounds")}
        coll = batch.get("coll")
        if splits(self.meta) and coll is not None and coll.num_rows:
            now = int(coll_columns(coll)["t"].max())
            self._settle(now)
            rows, own = self.router.rows_of(coll, self.shard)
            ev = self.reducer.update(rows, self.shift, own).summed()
            self.last["evidence"] = evidence_table(self.meta.job, self._ccld_summed(ev, now),
                                                   self.reducer.registry, self.shard)
            r = ev.all_rounds()
            if len(r):
                self.last["rounds"] = rounds_table(self.meta.job, r)
        self._learn(batch.get("iterations"))
        return []

    def _ccld_summed(self, ev: Evidence, now: int) -> Evidence:
        """``ev`` with the rounds of classes past CCL-D's baseline summed per detection
        window and class, as the job's monitor sums them; only the rounds of classes still
        learning their baseline go one by one. All rounds of a class are joined in one
        shard (:mod:`.shards`), so this shard's copy of the monitor's learning
        (:meth:`~.ccld.CCLDMonitor.learn`, on the same rounds in the same batches) knows
        when the job's does. A window's rows are held until a batch reaches past its end
        (``now``, the batch's latest time): the job's monitor closes a window only once an
        iteration ended past it, in that batch or later, after summing its evidence. A
        round that completes later still goes in the batch it completes in."""
        r = ev.ccld_rows()
        out = Evidence(ev.shift, tables=ev.tables)
        if len(r["t"]):
            key = pack_class(r["cidx"], self.ccld_groups.lookup(r["group"]),
                             self.ccld_classes.lookup(r["cls"]))
            learning = self.ccld.learn(key, r["t"], r["dmax"], r["dmin"])
            out.ccld.append({k: v[learning] for k, v in r.items()})
            if not learning.all():
                done = {k: v[~learning] for k, v in r.items()}
                done["bin"] = done.pop("t") // int(self.config.ccld_window_s * 1e9)
                done["n"] = np.ones(len(done["bin"]))
                done["range"] = (done["dmax"].astype(np.float64)
                                 - done["dmin"].astype(np.float64))
                held = self.ccld_held
                self.ccld_held = done if not held else {
                    k: np.concatenate([held[k], done[k]]) for k in held}
        held = self.ccld_held
        if held:
            ready = held["bin"] < now // int(self.config.ccld_window_s * 1e9)
            if ready.any():
                rows = {k: v[ready] for k, v in held.items()}
                self.ccld_held = {k: v[~ready] for k, v in held.items()} \
                    if not ready.all() else {}
                out.ccld_windows.append(summed_windows(rows))
        return out

    def _learn(self, iterations: pa.Table | None) -> None:
        """Note the batch's imported job iterations (after its rows were summed: the
        detector reads them after this batch's evidence). Rows derived beside it (no
        ``t_emit``) are not the job stage's: they size nothing."""
        if iterations is None or not iterations.num_rows \
                or "t_emit" not in iterations.column_names:
            return
        job = iterations.filter(pc.equal(iterations.column("rank"), -1))
        dur = job.column("duration_ns").to_numpy().astype(np.int64)
        t = job.column("t_emit").to_numpy().astype(np.int64)
        self.recent.extend(zip(t.tolist(), dur.tolist(), strict=True))

    def _settle(self, now: int) -> None:
        """Size the bins by the job iterations derived long enough before ``now``."""
        cut = now - self.lag_ns
        old = [d for t, d in self.recent if t < cut]
        if old:
            self.recent = [x for x in self.recent if x[0] >= cut]
            self.shortest = min(old) if not self.settled else min(self.shortest, *old)
            self.settled += len(old)

    def on_tick(self, now_ns: int) -> list[Anomaly]:
        return []

    def outputs(self) -> dict[str, pa.Table]:
        return dict(self.last)

    def snapshot(self) -> dict[str, Any]:
        return {"shard": self.shard, "shards": self.router.shards,
                "reducer": self.reducer.snapshot(), "recent": [list(x) for x in self.recent],
                "settled": self.settled, "shortest": self.shortest,
                "ccld": self.ccld.snapshot(), "ccld_classes": self.ccld_classes.pairs(),
                "ccld_groups": self.ccld_groups.pairs(),
                "ccld_held": {k: v.copy() for k, v in self.ccld_held.items()}}

    def restore(self, state: dict[str, Any]) -> None:
        self.recent = [(int(t), int(d)) for t, d in state.get("recent", [])]
        self.settled = int(state.get("settled", 0))
        self.shortest = int(state.get("shortest", 0))
        if (int(state["shard"]), int(state["shards"])) == (self.shard, self.router.shards):
            self.reducer.restore(state["reducer"])
            if state.get("ccld") is not None:  # (before 2026-11-30: every round one by one)
                self.ccld.restore(state["ccld"])
                self.ccld_classes = _KeyIndex([(int(k), int(i))
                                               for k, i in state["ccld_classes"]])
                self.ccld_groups = _KeyIndex([(int(k), int(i))
                                              for k, i in state["ccld_groups"]])
                self.ccld_held = {k: np.asarray(v, dtype=np.float64 if k in _HELD_FLOATS
                                                else np.int64)
                                  for k, v in (state.get("ccld_held") or {}).items()}
        else:  # its rounds in flight were routed otherwise; its classes' rounds go one by
            # one until learned again here (exact, only less summed)
            log.warning("job %s: the snapshot of evidence shard %s/%s restored into shard "
                        "%d/%d; its incomplete rounds are dropped", self.meta.job,
                        state["shard"], state["shards"], self.shard, self.router.shards)


def summed_windows(rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Rounds of CCL-D round classes past their baseline, one row per detection window and
    class: their count, and ``T_max``/``T_min`` of the round with the largest range (the
    first on a tie), as the monitor's window table keeps them."""
    summed = _aggregate(rows, ("bin", "cidx", "group", "cls"), ("n",), "range",
                        ("dmax", "dmin"))
    summed.pop("range")
    return summed
