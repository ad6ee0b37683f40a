"""The evidence a job's batches add up to (CCL-D §4.2, Greyhound §4.3, MEGATRACE §III):
waits, transfer times and CCL-D's ``T_max``/``T_min`` of every round, each rank's compute
(the gaps between its operations, placed in the pipeline schedule), RDMA queue-pair
occupancy, GPU clocks and framework spans, summed into time bins (:class:`BinnedStats`);
and the CCL-D baselines per round class."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from failslow.detectors.slowdown.bins import BinTable, _KeyIndex
from failslow.detectors.slowdown.ccld import CCLDMonitor, pack_class
from failslow.detectors.slowdown.comms import CommRegistry
from failslow.detectors.slowdown.config import SPAN_PASSES, SlowdownConfig, pure_dp
from failslow.detectors.slowdown.gaps import PASS_BIN_SHIFT
from failslow.detectors.slowdown.links import LinkTracker
from failslow.detectors.slowdown.reducer import REDUCED_SPECS, REDUCED_TABLES, Evidence
from failslow.events import JobMeta

#: NVML clocks-event reasons that mean the GPU slowed itself down: SW power cap, HW
#: slowdown, SW / HW thermal slowdown, HW power brake.
THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80

#: The bin tables of :class:`BinnedStats`, by attribute name (snapshot order).
TABLE_NAMES = ("out_w", "in_w", "grp", "comp", "passes", "qp", "gpu", "spans")


def shift_for(config: SlowdownConfig, base_iter_ns: float) -> int:
    """The bin shift for an iteration time of ``base_iter_ns``: bins of ~1/8 of it, never
    finer than ``config.bin_shift`` (it grows with ``base_iter_ns``)."""
    return max(config.bin_shift, int(math.log2(max(base_iter_ns / 8, 1.0))))


def _reduced_table(name: str) -> BinTable:
    keys, sums, arg, carried = REDUCED_SPECS[name]
    return BinTable(keys, sums, arg=arg, carried=carried)


class BinnedStats:
    """Per-batch accounting of one job into time bins (bin = time >> ``shift``; the bins
    are coarsened to ~1/8 iteration once the iteration time is known):

    * ``out_w`` / ``in_w``: waits per (waiter, communicator) and per (communicator,
      waited-on member); ``grp``: rounds, transfer time and ``T_max``/``T_min`` per group
      (communicator, point-to-point pair, (op, bytes) class); ``ccld``: CCL-D's baselines;
    * ``comp`` / ``passes``: each rank's compute, and per forward / backward pass;
      ``spans``: framework spans when a source has them;
    * ``qp``: RDMA queue pairs (:class:`LinkTracker`); ``gpu``: SM clock and throttling.

    The rounds and the gaps (``grp``, ``out_w``, ``in_w``, ``comp``, ``passes``) come from
    the :class:`~.reducer.EvidenceReducer` s (:meth:`absorb`); the rest is accounted here.
    """

    def __init__(self, meta: JobMeta, config: SlowdownConfig, registry: CommRegistry
                 ) -> None:
        self.meta = meta
        self.config = config
        self.registry = registry
        self.links = LinkTracker(meta)
        self.ccld = CCLDMonitor(config)
        self.shift = config.bin_shift
        # the tables the evidence reducers fill
        self.out_w = _reduced_table("out_w")
        self.in_w = _reduced_table("in_w")
        self.grp = _reduced_table("grp")
        self.comp = _reduced_table("comp")
        self.passes = _reduced_table("passes")  # forward / backward compute
        self.qp = BinTable(("qp",), ("dc", "lt", "db"))
        self.gpu = BinTable(("rank",), ("n", "sm", "thr"))
        # framework spans, when a source has them: compute time per rank and pass
        self.spans = BinTable(("rank", "op"), ("d", "n"))
        #: CCL-D window rows of classes whose baseline was learned by a reducing stage
        #: but not here (this stage started later than it): see ``CCLDMonitor.add_windows``
        self.unlearned_windows = 0
        self.classes = _KeyIndex()  # bytes << 4 | op -> class index
        self.group_ids = _KeyIndex([(-1, 0)])  # point-to-point pair -> small id

    @property
    def pure_dp(self) -> bool:
        """No tensor, pipeline or context parallelism (:func:`.config.pure_dp`)."""
        return pure_dp(self.meta)

    @property
    def tables(self) -> tuple[BinTable, ...]:
        return tuple(getattr(self, name) for name in TABLE_NAMES)

    def absorb(self, ev: Evidence) -> None:
        """Sum reducers' evidence of one batch (:mod:`.reducer`) into the bins and the
        CCL-D baselines. The round classes get this job's dense ids in one lookup per batch
        (new ones in key order), so ids do not depend on how many reducers there are; bins
        finer than the tables' are coarsened (a sum of sums is exact)."""
        delta = self.shift - ev.shift
        tables = dict(ev.tables)
        grp = tables["grp"]
        if grp:
            dense = self.classes.lookup(np.concatenate([p["cls"] for p in grp]))
            ends = np.cumsum([len(p["cls"]) for p in grp])
            tables["grp"] = [{**p, "cls": c} for p, c in
                             zip(grp, np.split(dense, ends[:-1]), strict=True)]
        for name in REDUCED_TABLES:
            table = getattr(self, name)
            for cols in tables[name]:
                if delta:
                    cols = {**cols, "bin": cols["bin"] >> delta}
                table.add(cols)
        r = ev.ccld_rows()
        if len(r["t"]):
            cls = self.classes.lookup(r["cls"])
            self.ccld.update(self.ccld_key(r["cidx"], r["group"], cls), r["t"], r["dmax"],
                             r["dmin"])
        for w in ev.ccld_windows:  # a reducing stage's rounds past their class's baseline
            cls = self.classes.lookup(w["cls"])
            self.unlearned_windows += self.ccld.add_windows(
                self.ccld_key(w["cidx"], w["group"], cls), w["bin"], w["n"], w["dmax"],
                w["dmin"])

    def ccld_key(self, cidx: np.ndarray, group: np.ndarray, cls: np.ndarray) -> np.ndarray:
        """One int64 per round class: communicator, point-to-point pair (0 for a
        collective) and (op, bytes) class."""
        return pack_class(cidx, self.group_ids.lookup(np.asarray(group, dtype=np.int64)), cls)

    def account_links(self, link: pa.Table) -> None:
        cols = self.links.update(link)
        if cols is not None:
            t = cols.pop("t")
            cols.pop("dt")
            cols["bin"] = t >> self.shift
            self.qp.add(cols)

    def account_gpu(self, gpu: pa.Table) -> None:
        rank = pc.fill_null(gpu.column("rank"), -1).to_numpy().astype(np.int64)
        keep = rank >= 0
        if not keep.any():
            return
        reasons = gpu.column("throttle_reasons").to_numpy().astype(np.uint64)
        thr = (reasons & np.uint64(THROTTLE_MASK)) != 0
        self.gpu.add({"bin": gpu.column("t").to_numpy()[keep] >> self.shift,
                      "rank": rank[keep], "n": np.ones(int(keep.sum())),
                      "sm": gpu.column("sm_clock_mhz").to_numpy()[keep].astype(np.float64),
                      "thr": thr[keep].astype(np.float64)})

    def account_spans(self, span: pa.Table) -> None:
        """Forward and backward compute time per rank and bin (MEGATRACE's stages)."""
        op = pc.index_in(span.column("op"), value_set=pa.array(SPAN_PASSES))
        code = pc.fill_null(op, -1).to_numpy(zero_copy_only=False).astype(np.int64)
        keep = code >= 0
        if not keep.any():
            return
        t0 = span.column("t_start").to_numpy()[keep]
        t1 = span.column("t_end").to_numpy()[keep]
        self.spans.add({"bin": t1 >> self.shift,
                        "rank": span.column("rank").to_numpy()[keep].astype(np.int64),
                        "op": code[keep], "d": (t1 - t0).astype(np.float64),
                        "n": np.ones(int(keep.sum()))})

    def kinds_of(self, cidx: np.ndarray) -> np.ndarray:
        uniq, inv = np.unique(cidx, return_inverse=True)
        names = np.array([self.registry.kind(int(i)) for i in uniq.tolist()])
        return names[inv.reshape(-1)]

    def resize(self, base_iter_ns: float) -> None:
        """Coarsen the bins to ~1/8 of the iteration time ``base_iter_ns``."""
        if base_iter_ns <= 0:
            return
        want = shift_for(self.config, base_iter_ns)
        if want > self.shift:
            for table in self.tables:
                table.rebin(want - self.shift)
            self.shift = want

    def prune(self, horizon_ns: int) -> None:
        """Drop the bins before ``horizon_ns``."""
        for table in self.tables:
            extra = PASS_BIN_SHIFT if table is self.passes else 0
            table.prune(horizon_ns >> (self.shift + extra))
