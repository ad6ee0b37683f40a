"""The link-rate detector: degraded links reported even when the job absorbs them (package
docstring). Windows are one baseline iteration long and close on data time, so the reports
do not depend on how the records were cut into batches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from failslow.detectors.base import EventBatch
from failslow.detectors.linkrate.config import LinkRateConfig
from failslow.detectors.linkrate.jobcost import job_cost, job_slowed
from failslow.detectors.linkrate.queues import QueueTracker, QueueWindows
from failslow.detectors.linkrate.samples import SampleExtractor
from failslow.diagnosis import Anomaly
from failslow.events import NULL_TIME, JobMeta

ID_PREFIX = "linkrate-"
#: the job iterations kept (the latest ones; the window length and cost read them)
ITER_HISTORY = 4096
STAGE = {"pp": "pp_p2p", "dp": "dp_sync", "tp": "tp_collective"}
_KIND_ORDER = {"pp": 0, "dp": 1, "tp": 2, "cp": 3}
_SAMPLE_KEYS = ("lid", "t", "rate", "ts", "rnd")
_QUEUE_KEYS = ("qp", "t", "lt", "dt", "dc")


def _cat(a: dict[str, np.ndarray], b: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    if b is None:
        return a
    return {k: np.concatenate([a[k], b[k]]) for k in a}


def _empty(keys: tuple[str, ...], bool_key: str = "") -> dict[str, np.ndarray]:
    return {k: np.zeros(0, dtype=bool if k == bool_key else
                        (np.int64 if k in ("lid", "t", "qp", "rnd") else np.float64)) for k in keys}


class LinkRateDetector:
    """Per-link transfer rates against the link's own baseline and its peers' (detector
    protocol). ``update`` also reads the job's iteration rows (``iterations`` in the batch:
    the window length and the job cost) and, through ``known``, the anomalies the other
    detectors reported so far (no duplicate of a link they name)."""

    name: ClassVar[str] = "linkrate"
    kinds: ClassVar[frozenset[str]] = frozenset({"coll", "link", "iterations"})
    produces: ClassVar[tuple[str, ...]] = ()
    #: it reads the anomalies the detectors before it reported (``known``): it runs after them
    reads_reports: ClassVar[bool] = True

    def __init__(self, meta: JobMeta, config: LinkRateConfig | None = None,
                 known: Callable[[], list[Anomaly]] | None = None) -> None:
        self.meta = meta
        self.known = known or list
        #: onsets (ns) of the job slow-downs the slow-down detector has seen and not yet
        #: reported (set by the engine's registry when both detectors run)
        self.localizing: Callable[[], list[int]] = list
        self.config = c = config or LinkRateConfig()
        self.k_open = c.open_count()
        self.k_strong = c.strong_count()
        self.samples = SampleExtractor(meta, c.min_bytes, int(c.max_pending_s * 1e9))
        self.queues = QueueTracker()
        self.width = 0
        self.origin = 0
        self.next_w = 0
        self.max_t = NULL_TIME
        self.pending = _empty(_SAMPLE_KEYS, "ts")
        self.qpending = _empty(_QUEUE_KEYS)
        self.iters = np.zeros((0, 2), dtype=np.int64)  # job iterations: t_start, duration
        self.lk: dict[str, np.ndarray] = {}
        self._grow_links(0)
        self.qwin = QueueWindows(c.baseline_windows, c.persist_windows)
        self.open: dict[str, dict[str, Any]] = {}  # key -> {"anomaly": dict, "links": [...]}
        self.deferred: dict[str, int] = {}  # key -> window its links first persisted
        self.next_id = 0
        #: the batch ``prepare`` took the samples of (until ``update`` of that batch)
        self._prepared: EventBatch | None = None

    # ------------------------------------------------------------------ protocol

    def prepare(self, batch: EventBatch) -> None:
        """The samples of the batch's ``coll`` and ``link`` records: the part of ``update``
        that reads no other detector's tables or reports, so the engine runs it beside
        them (:func:`failslow.engine.analyzer.waves`). ``update`` does it when it was not
        done for the same batch."""
        self._prepared = batch
        coll = batch.get("coll")
        if coll is not None and coll.num_rows:
            self.max_t = max(self.max_t, int(pc.max(coll.column("t")).as_py()))
            self.pending = _cat(self.pending, self.samples.update(coll))
        link = batch.get("link")
        if link is not None and link.num_rows:
            self.qpending = _cat(self.qpending, self.queues.update(link))

    def update(self, batch: EventBatch) -> list[Anomaly]:
        if self._prepared is not batch:
            self.prepare(batch)
        self._prepared = None
        iterations = batch.get("iterations")
        if iterations is not None and iterations.num_rows:
            job = iterations.filter(pc.equal(iterations.column("rank"), -1))
            if job.num_rows:
                rows = np.stack([job.column("t_start").to_numpy().astype(np.int64),
                                 job.column("duration_ns").to_numpy().astype(np.int64)], axis=1)
                it = np.concatenate([self.iters, rows])
                self.iters = it[np.argsort(it[:, 0], kind="stable")][-ITER_HISTORY:]
        if not self.width:
            self._fix_width()
            if not self.width:
                return []
        self._grow_links(len(self.samples.links))
        self.qwin.grow(len(self.queues.index))
        out: list[Anomaly] = []
        while self.origin + (self.next_w + 2) * self.width <= self.max_t:
            out += self._close_window(self.next_w, self.known())
            self.next_w += 1
        keep = self.pending["t"] >= self.origin + self.next_w * self.width
        self.pending = {k: v[keep] for k, v in self.pending.items()}
        keep = self.qpending["t"] >= self.origin + self.next_w * self.width
        self.qpending = {k: v[keep] for k, v in self.qpending.items()}
        return out

    def on_tick(self, now_ns: int) -> list[Anomaly]:
        return []  # windows close on data time (batch-independent)

    def outputs(self) -> dict[str, pa.Table]:
        return {}

    # ------------------------------------------------------------------ windows

    def _fix_width(self) -> None:
        c = self.config
        if len(self.iters) >= 3:
            d = self.iters[1:6, 1] if len(self.iters) >= 4 else self.iters[:, 1]
            self.width = max(int(np.median(d) * c.window_iterations), 1_000_000)
            self.origin = int(self.iters[0, 0])
        elif len(self.pending["t"]) and (self.max_t - int(self.pending["t"].min())
                                         > c.staging_s * 1e9):
            self.width = int(c.fallback_window_s * 1e9)
            self.origin = int(self.pending["t"].min())
        if self.width:
            lo = min(int(self.pending["t"].min()) if len(self.pending["t"]) else self.max_t,
                     self.max_t)
            self.next_w = (lo - self.origin) // self.width

    def _grow_links(self, n: int) -> None:
        have = len(self.lk.get("base", ()))
        if n <= have and self.lk:
            return
        m = n - have
        nb = self.config.baseline_windows
        fresh = {"buf": np.full((m, nb), np.nan), "nb": np.zeros(m, np.int64),
                 "base": np.full(m, np.nan), "hist": np.zeros(m, np.int64),
                 "strong": np.zeros(m, np.int64),
                 "judged": np.zeros(m, np.int64), "healthy": np.zeros(m, np.int64),
                 "bad_first": np.full(m, NULL_TIME, np.int64),
                 "bad_last": np.full(m, NULL_TIME, np.int64), "bad_sum": np.zeros(m),
                 "bad_n": np.zeros(m, np.int64), "peer": np.full(m, np.nan),
                 "qgrowth": np.full(m, np.nan)}
        self.lk = fresh if not self.lk else {k: np.concatenate([self.lk[k], v])
                                             for k, v in fresh.items()}

    def _close_window(self, w: int, others: list[Anomaly]) -> list[Anomaly]:
        c, lk = self.config, self.lk
        lo, hi = self.origin + w * self.width, self.origin + (w + 1) * self.width
        self.qwin.account(w, self.qpending, lo, hi)
        p = self.pending
        sel = (p["t"] >= lo) & (p["t"] < hi)
        ring_here = np.unique(p["rnd"][sel & (p["rnd"] >= 0)])
        if len(ring_here):
            # a ring round is judged whole in the window of its first member's end: its
            # members end within the ranks' clock skew of each other, across the window's
            # edge at times, and a member alone in a window would take its own rate,
            # waiting for late peers included, as the round's. Windows are an iteration
            # long, so the edge cuts the same round of iteration after iteration (held-out
            # seed 17 link-dp-1: a healthy hop 1.57x and 2.88x slower, reported). The
            # later members are claimed: not judged again in the next window.
            late = ~sel & (p["t"] >= hi) & np.isin(p["rnd"], ring_here)
            if late.any():
                sel |= late
                p["t"][late] = lo
        if not sel.any():
            return self._decide(w, hi, others)
        lid, rate, ts, rnd = p["lid"][sel], p["rate"][sel], p["ts"][sel], p["rnd"][sel]
        ring = np.flatnonzero(rnd >= 0)
        if len(ring):
            # a member of a ring round timed from its enter row waited for late peers: the
            # round's best rate (its last member to enter, or a member's own transfer from
            # t_start) is the transfer's, which every member shares
            _, inv = np.unique(rnd[ring], return_inverse=True)
            best = np.zeros(int(inv.max()) + 1)
            np.maximum.at(best, inv.reshape(-1), rate[ring])
            rate = rate.copy()
            rate[ring] = np.where(ts[ring], rate[ring], best[inv.reshape(-1)])
        # the members that only timed their round (no link of their own) are done
        link = lid >= 0
        lid, rate, ts = lid[link], rate[link], ts[link]
        if not len(lid):
            return self._decide(w, hi, others)
        # per link: the median of its t_start samples, else its fastest enter-timed one
        order = np.lexsort((rate, ~ts, lid))
        lid, rate, ts = lid[order], rate[order], ts[order]
        starts = np.flatnonzero(np.r_[True, lid[1:] != lid[:-1]])
        cnt = np.diff(np.r_[starts, len(lid)])
        n_ts = np.add.reduceat(ts.astype(np.int64), starts)
        mid_lo = starts + (np.maximum(n_ts, 1) - 1) // 2
        mid_hi = starts + np.maximum(n_ts, 1) // 2
        med = 0.5 * (rate[mid_lo] + rate[mid_hi])
        r = np.where(n_ts > 0, med, rate[starts + cnt - 1])
        links = lid[starts]
        # peers: the median rate of the links of the same class in this window
        cls = self.samples.links.cls[links]
        o2 = np.lexsort((r, cls))
        cs = cls[o2]
        cst = np.flatnonzero(np.r_[True, cs[1:] != cs[:-1]])
        ccnt = np.diff(np.r_[cst, len(cs)])
        cmed = 0.5 * (r[o2][cst + (ccnt - 1) // 2] + r[o2][cst + ccnt // 2])
        ci = np.searchsorted(cs[cst], cls)
        peer = np.where(ccnt[ci] >= c.min_peers, cmed[ci] / r, np.nan)
        base = lk["base"][links]
        own = base / r
        slow = (own >= c.factor) & (np.isnan(peer) | (peer >= c.factor))
        strong = slow & (own >= c.strong_factor) & (np.isnan(peer) | (peer >= c.strong_factor))
        healthy = ~slow & ~(own >= c.relief_factor)
        judged = ~np.isnan(base)
        jl = links[judged]
        mask = (1 << c.persist_windows) - 1
        lk["hist"][jl] = ((lk["hist"][jl] << 1) | slow[judged]) & mask
        lk["strong"][jl] = ((lk["strong"][jl] << 1) | strong[judged]) & mask
        lk["judged"][jl] += 1
        lk["healthy"][jl] = np.where(healthy[judged], lk["healthy"][jl] + 1, 0)
        lk["peer"][jl] = peer[judged]
        bad = jl[slow[judged]]
        lk["bad_first"][bad] = np.where(lk["bad_first"][bad] == NULL_TIME, lo,
                                        lk["bad_first"][bad])
        lk["bad_last"][bad] = hi
        lk["bad_sum"][bad] += own[judged][slow[judged]]
        lk["bad_n"][bad] += 1
        # the baseline: a link's first windows not slower than its peers
        learn = ~judged & ~(peer >= c.factor)
        ll = links[learn]
        lk["buf"][ll, lk["nb"][ll]] = r[learn]
        lk["nb"][ll] += 1
        done = ll[lk["nb"][ll] >= c.baseline_windows]
        lk["base"][done] = np.median(lk["buf"][done], axis=1)
        return self._decide(w, hi, others)

    def _queue_growth(self, lid: int, w: int) -> tuple[float, bool] | None:
        """VCCL's queue condition for a link: over its degraded windows among the last
        ``persist_windows`` (not the healthy ones before its onset), the time-averaged
        in-flight work requests of its ends' queue pairs towards each other's node against
        their baseline -- (largest growth, whether one grew); None when no such queue pair
        was sampled (coll timing decides alone)."""
        if not self.queues.seen or not len(self.qwin):
            return None
        first = int(self.lk["bad_first"][lid])
        onset = (first - self.origin) // self.width if first != NULL_TIME else w
        _, a, b, _, _ = self.samples.links.rows[lid]
        node = self.meta.node_of
        return self.qwin.growth([self.queues.qp_of(a, node(b)), self.queues.qp_of(b, node(a))],
                                w, onset, self.config.queue_factor, self.config.queue_abs)

    # ------------------------------------------------------------------ anomalies

    def _decide(self, w: int, now: int, others: list[Anomaly]) -> list[Anomaly]:
        c, lk = self.config, self.lk
        out: list[Anomaly] = []
        pop = np.zeros(len(lk["hist"]), dtype=np.int64)
        h = lk["hist"].copy()
        while h.any():
            pop += h & 1
            h >>= 1
        taken = {lid for rec in self.open.values() for lid in rec["links"]}
        persistent = [x for x in np.flatnonzero(pop >= self.k_open).tolist() if x not in taken]
        # a strong run persists sooner, unless the job slowed down with it (that is the
        # slow-down detector's to name first); the links of one ring share their onset
        run = (1 << self.k_strong) - 1
        fast = np.flatnonzero(((lk["strong"] & run) == run) & (pop < self.k_open))
        onsets = self.localizing() if len(fast) else []
        ahead: dict[int, bool] = {}
        for lid in fast.tolist():
            start = int(lk["bad_first"][lid])
            if start not in ahead:
                ahead[start] = self._slowdown_ahead(start, onsets)
            if lid not in taken and not ahead[start]:
                persistent.append(lid)
        units = self._units(sorted(persistent), w)
        for key, unit in units.items():
            if key in self.open:
                continue
            grown = self._grow_open_ring(unit)
            if grown is not None:
                out.append(grown)
                continue
            if self._covered(unit, others) is not None:
                self.deferred.pop(key, None)
                continue
            slow_ratio, cost = self._cost(unit["start_ns"], None)
            # a job slow-down is the slow-down detector's to name first; a ring whose hops'
            # queue pairs are sampled waits a little for one of them to fill
            wait = (c.defer_windows if self._slowdown_ahead(unit["start_ns"], self.localizing())
                    else c.persist_windows if unit["wait_queue"] else 0)
            if wait:
                first = self.deferred.setdefault(key, w)
                if w - first < wait:
                    continue
            self.deferred.pop(key, None)
            a = self._anomaly(unit, now, slow_ratio, cost)
            self.open[key] = {"anomaly": a.to_dict(),
                              "links": sorted(unit["links"] + unit["starved"])}
            out.append(a)
        for key in list(self.deferred):
            if key not in units:
                self.deferred.pop(key)
        for key, rec in list(self.open.items()):
            links = np.array(rec["links"], dtype=np.int64)
            a = Anomaly.from_dict(dict(rec["anomaly"]))
            by = self._covered({"nodes": a.extra.get("nodes"), "comm": a.comm,
                                "start_ns": a.start_ns, "node_pairs": a.extra.get(
                                    "candidate_nodes", []),
                                "how": a.extra.get("localized_by")}, others)
            if by is None and not (lk["healthy"][links] >= c.close_windows).all():
                continue
            end = int(lk["bad_last"][links].max())
            if by is not None:
                a.extra["superseded_by"] = by
                end = max(end, now)
            slow_ratio, cost = self._cost(int(a.start_ns or 0), end)
            self._fill_cost(a, slow_ratio, cost)
            a.end_ns = end
            for x in ("bad_first", "bad_last"):
                lk[x][links] = NULL_TIME
            lk["bad_sum"][links] = 0.0
            lk["bad_n"][links] = 0
            lk["hist"][links] = 0
            lk["strong"][links] = 0
            del self.open[key]
            out.append(a)
        # a link healthy again forgets its bad streak
        idle = (lk["healthy"] >= c.close_windows) & (lk["hist"] == 0)
        if taken:
            idle[list(taken & set(np.flatnonzero(idle).tolist()))] = False
        lk["bad_first"][idle] = NULL_TIME
        lk["bad_sum"][idle] = 0.0
        lk["bad_n"][idle] = 0
        return out

    def _units(self, persistent: list[int], w: int) -> dict[str, dict[str, Any]]:
        """Persistent links -> the anomalies they make: a point-to-point pair is pinned; the
        degraded hops of one ring are pinned when the queue condition kept one, or when
        they all cross one pair of two nodes (then named by convention); else (hops inside
        one node are distinct NVLink / PCIe paths) the ring is reported with no link.
        Pinned links over one node pair are one anomaly."""
        rows = self.samples.links.rows
        comms = self.samples.comms
        node = self.meta.node_of
        by_comm: dict[int, list[int]] = {}
        for lid in persistent:
            by_comm.setdefault(rows[lid][0], []).append(lid)
        units: dict[str, dict[str, Any]] = {}
        for ci, lids in by_comm.items():
            p2p = rows[lids[0]][3] == -1
            queue = {x: self._queue_growth(x, w) for x in lids}
            for x, g in queue.items():
                self.lk["qgrowth"][x] = np.nan if g is None else g[0]
            # VCCL's queue condition: where a link's queue pairs are sampled, its queue must
            # have grown too, unless coll timing alone shows a drop of
            # ``factor_without_queue_growth`` (every hop of a slow ring is slower in coll
            # timing; the queues single out the slow one)
            mean_drop = self.lk["bad_sum"] / np.maximum(self.lk["bad_n"], 1)
            lids = [x for x in lids if (g := queue[x]) is None or g[1]
                    or mean_drop[x] >= self.config.factor_without_queue_growth]
            if not lids:
                continue
            queued = any(g is not None for g in queue.values())
            grown = [x for x in lids if (queue[x] or (0.0, False))[1]]
            starved: list[int] = []
            if not p2p and grown:
                # the hops whose queues filled; the others were starved by them
                starved = [x for x in lids if x not in grown]
                lids = grown
            pairs = {tuple(sorted((node(rows[x][1]), node(rows[x][2])))) for x in lids}
            if p2p:
                groups = [([x], "rank_pair") for x in lids]
            elif len({frozenset((rows[x][1], rows[x][2])) for x in lids}) == 1:
                # one pair of ranks (both directions of a two-member ring are one link)
                groups = [(lids, "queue" if grown else "ring_hop")]
            elif len(pairs) == 1 and len(next(iter(pairs))) == 2 and \
                    len(set(next(iter(pairs)))) == 2:
                groups = [(lids, "node_pair")]
            else:
                groups = []
                key = f"comm:{comms.ids[ci]}"
                ends = sorted({int(rows[x][i]) for x in lids for i in (1, 2)})
                units[key] = self._unit(lids, None, "unpinned", ends)
                units[key]["candidate_nodes"] = sorted([list(p) for p in pairs])
                units[key]["wait_queue"] = queued
                units[key]["reason"] = (
                    "every hop of the ring inside one node is slower in coll timing (the "
                    "slowest NVLink / PCIe hop sets the round's time for all members)"
                    if pairs and all(len(set(p)) == 1 for p in pairs) else
                    "every hop of the ring over another node is slower in coll timing (the "
                    "slowest hop sets the round's time for all members) and no link rows "
                    "single one out" if not queued else
                    "the queues of several hops over different node pairs grew" if grown else
                    "no queue pair of the ring's hops grew in the link rows")
            for lids_g, how in groups:
                na, nb = sorted((node(rows[lids_g[0]][1]), node(rows[lids_g[0]][2])))
                key = f"link:{na}|{nb}"
                prev = units.get(key)
                allg = lids_g + (prev["links"] if prev else [])
                best = min(allg, key=lambda x: (_KIND_ORDER.get(comms.kind(rows[x][0]), 4),
                                                rows[x][1], rows[x][2]))
                a, b = rows[best][1], rows[best][2]
                units[key] = self._unit(allg, [a, b], how if not prev else "node_pair",
                                        sorted((a, b)))
                units[key]["starved"] = starved + (prev["starved"] if prev else [])
        return units

    def _unit(self, lids: list[int], link: list[int] | None, how: str,
              ranks: list[int]) -> dict[str, Any]:
        lk, rows = self.lk, self.samples.links.rows
        rep = lids[0] if link is None else next(
            x for x in lids if [rows[x][1], rows[x][2]] == link)
        firsts = [int(v) for v in lk["bad_first"][lids] if v != NULL_TIME]
        node = self.meta.node_of
        return {"links": sorted(lids), "link": link, "how": how, "ranks": ranks, "rep": rep,
                "comm_idx": rows[rep][0], "start_ns": min(firsts) if firsts else None,
                "nodes": (sorted((node(link[0]), node(link[1]))) if link else None),
                "comm": self.samples.comms.ids[rows[rep][0]], "candidate_nodes": [],
                "starved": [], "wait_queue": False}

    def _covered(self, unit: dict[str, Any], others: list[Anomaly]) -> str | None:
        """The id of another detector's slow communication anomaly naming this unit's link
        (the same node pair), or, for a ring reported without a link, its communicator or
        one of its node pairs, and overlapping it in time; else None. An anomaly that
        names no link but this unit's communicator covers it too: the slow-down detector
        already reports that ring's slowness with its candidate hops (a mixed slow-down's
        late rank also makes another hop of its ring look slow); and so does a compute
        anomaly naming a member of a ring no queue pinned (:meth:`_ring_members`)."""
        node = self.meta.node_of
        start = unit.get("start_ns") or 0
        members = self._ring_members(unit)
        for o in others:
            if o.id.startswith(ID_PREFIX) or o.kind != "slow":
                continue
            if o.end_ns is not None and o.end_ns < start:
                continue
            if o.cause == "compute" and members is not None and \
                    not members.isdisjoint(o.ranks):
                return o.id
            if o.cause not in ("communication", "mixed"):
                continue
            pair = sorted((node(o.link[0]), node(o.link[1]))) if o.link else None
            if unit.get("nodes") and pair == unit["nodes"]:
                return o.id
            if unit.get("nodes") and o.link is None and o.comm == unit.get("comm"):
                return o.id
            if not unit.get("nodes") and (o.comm == unit.get("comm") or (
                    pair is not None and pair in unit.get("node_pairs", unit.get(
                        "candidate_nodes", [])))):
                return o.id
        return None

    def _grow_open_ring(self, unit: dict[str, Any]) -> Anomaly | None:
        """A ring's hops that turn persistent after the ring was reported without a link
        are the same fault (the slowest hop slows them all; which hop crosses the count
        first is chance), not a second one pinned by its timing: they join that report,
        which is reported again with its hops and ranks grown (same id). None when the
        unit's communicator has no such open report, or when a queue pinned the unit."""
        if unit["how"] == "queue":
            return None
        rec = next((r for r in self.open.values() if r["anomaly"]["link"] is None
                    and r["anomaly"]["comm"] == unit["comm"]), None)
        if rec is None:
            return None
        rows, node = self.samples.links.rows, self.meta.node_of
        rec["links"] = sorted(set(rec["links"]) | set(unit["links"] + unit["starved"]))
        a = rec["anomaly"]
        hops = sorted({(int(x), int(y)) for x, y in a["links"]}
                      | {(int(rows[x][1]), int(rows[x][2])) for x in unit["links"]})
        a["links"] = a["link_candidates"] = [list(h) for h in hops]
        a["ranks"] = sorted({r for h in hops for r in h})
        a["candidate_nodes"] = [list(p) for p in sorted(
            {tuple(sorted((node(x), node(y)))) for x, y in hops})]
        return Anomaly.from_dict(dict(a))

    def _ring_members(self, unit: dict[str, Any]) -> set[int] | None:
        """The members of a ring unit that no grown queue pinned (a slow GPU slows its own
        ring's transfers: every hop of it is slower in coll timing, CCL-D §4.2), else None.
        A compute anomaly of another detector naming one of them covers the unit; a slow
        link next to that rank is the slow-down detector's mixed cause."""
        ci = self.samples.comms.index.get(int(unit.get("comm") or 0))
        if ci is None or self.samples.comms.p2p[ci] or unit.get("how") == "queue":
            return None
        return {int(r) for r in self.samples.comms.members[ci].tolist() if r >= 0}

    def _cost(self, start: int, end: int | None) -> tuple[float | None, float | None]:
        """The job's slow-down since ``start`` (to a window after ``end``) and the
        fraction of job time lost (:func:`.jobcost.job_cost`)."""
        return job_cost(self.iters, start, end + self.width if end is not None else None,
                        self.config.cost_reference_iterations)

    def _slowdown_ahead(self, start: int | None, onsets: list[int]) -> bool:
        """Whether the job slow-down since the link degraded (at ``start``) is the
        slow-down detector's to name: that detector is localizing one that began then or
        later (``onsets``, within a window), or the job slowed down as its change tracker
        confirms (:func:`.jobcost.job_slowed`). A smaller one is the link's to report."""
        if start is None:
            return False
        return any(t >= start - self.width for t in onsets) or job_slowed(
            self.iters, start, self.config)

    def _fill_cost(self, a: Anomaly, ratio: float | None, cost: float | None) -> None:
        a.slowdown = ratio
        severe = cost is not None and cost >= self.config.info_cost
        a.extra.update({"severity": "warning" if severe else "info", "cost_fraction": cost,
                        "absorbed": not severe})

    def _anomaly(self, unit: dict[str, Any], now: int, ratio: float | None,
                 cost: float | None) -> Anomaly:
        lk, rep = self.lk, unit["rep"]
        kind = self.samples.comms.kind(unit["comm_idx"])
        n = max(int(lk["bad_n"][rep]), 1)
        q = lk["qgrowth"][rep]
        peer = lk["peer"][rep]
        extra: dict[str, Any] = {
            "detector": "linkrate", "link_slowdown": round(float(lk["bad_sum"][rep]) / n, 3),
            "peer_slowdown": None if np.isnan(peer) else round(float(peer), 3),
            "queue_growth": None if np.isnan(q) else round(float(q), 3),
            "localized_by": unit["how"], "nodes": unit["nodes"],
            # the hops (one per op class is one link)
            "links": sorted({(self.samples.links.rows[x][1], self.samples.links.rows[x][2])
                             for x in unit["links"]})}
        extra["links"] = [list(p) for p in extra["links"]]
        if unit["link"] is None:
            extra["candidate_nodes"] = unit["candidate_nodes"]
            # as the slow-down detector names them: the hops one of which is slow
            extra["link_candidates"] = extra["links"]
            extra["why_no_link"] = unit.get("reason")
        a = Anomaly(id=f"{ID_PREFIX}{self.next_id}", kind="slow", cause="communication",
                    ranks=list(unit["ranks"]), link=unit["link"], comm=unit["comm"],
                    comm_kind=kind, stage=STAGE.get(kind, "other"),
                    start_ns=unit["start_ns"], detected_ns=now, extra=extra)
        self.next_id += 1
        self._fill_cost(a, ratio, cost)
        return a

    # ------------------------------------------------------------------ state

    def snapshot(self) -> dict[str, Any]:
        return {"samples": self.samples.snapshot(), "queues": self.queues.snapshot(),
                "width": self.width, "origin": self.origin, "next_w": self.next_w,
                "max_t": self.max_t,
                "pending": {k: v.copy() for k, v in self.pending.items()},
                "qpending": {k: v.copy() for k, v in self.qpending.items()},
                "iters": self.iters.copy(),
                "links": {k: v.copy() for k, v in self.lk.items()},
                "q": self.qwin.snapshot(),
                "open": self.open, "deferred": self.deferred, "next_id": self.next_id}

    def restore(self, state: dict[str, Any]) -> None:
        self.samples.restore(state["samples"])
        self.queues.restore(state["queues"])
        self.width, self.origin = int(state["width"]), int(state["origin"])
        self.next_w, self.max_t = int(state["next_w"]), int(state["max_t"])
        ref_s, ref_q = _empty(_SAMPLE_KEYS, "ts"), _empty(_QUEUE_KEYS)
        self.pending = {k: np.array(v, dtype=ref_s[k].dtype) for k, v in state["pending"].items()}
        self.qpending = {k: np.array(v, dtype=ref_q[k].dtype)
                         for k, v in state["qpending"].items()}
        self.iters = np.array(state["iters"], dtype=np.int64).reshape(-1, 2)
        nb = self.config.baseline_windows
        lk: dict[str, np.ndarray] = {}
        for k, v in state["links"].items():
            if k in ("buf",):
                lk[k] = np.array(v, dtype=np.float64).reshape(-1, nb)
            elif k in ("base", "bad_sum", "peer", "qgrowth"):
                lk[k] = np.array(v, dtype=np.float64)
            else:
                lk[k] = np.array(v, dtype=np.int64)
        lk.setdefault("strong", np.zeros(len(lk["hist"]), np.int64))  # older snapshots
        self.lk = lk
        self.qwin.restore(state["q"])
        self.open = {str(k): dict(v) for k, v in state["open"].items()}
        self.deferred = {str(k): int(v) for k, v in state["deferred"].items()}
        self.next_id = int(state["next_id"])
