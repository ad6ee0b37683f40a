"""The slow-down detector (CCL-D §4.2, Greyhound §4.2-4.3, MEGATRACE §III; the package
docstring describes the algorithm): per batch it joins rounds and accounts the evidence
into time bins; at the end of every job iteration it feeds the iteration time to the
change tracker and lets the anomaly lifecycle decide, on the data before that end."""

from __future__ import annotations

import logging
import math
from dataclasses import asdict
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from failslow import results
from failslow.detectors.base import EventBatch
from failslow.detectors.changepoints import ChangeTracker
from failslow.detectors.iterations import IterationTracker, coll_columns
from failslow.detectors.slowdown.accounting import TABLE_NAMES, BinnedStats
from failslow.detectors.slowdown.anomalies import AnomalyLifecycle
from failslow.detectors.slowdown.bins import _KeyIndex
from failslow.detectors.slowdown.comms import CommRegistry
from failslow.detectors.slowdown.config import SlowdownConfig
from failslow.detectors.slowdown.evidence_rows import evidence_of
from failslow.detectors.slowdown.levels import SlowLevel, Window
from failslow.detectors.slowdown.localizer import Localizer
from failslow.detectors.slowdown.reducer import Evidence, EvidenceReducer
from failslow.detectors.slowdown.rounds import rounds_table
from failslow.detectors.slowdown.shards import ShardRouter
from failslow.detectors.slowdown.stage import splits
from failslow.detectors.slowdown.timeline import IterationTimeline
from failslow.diagnosis import Anomaly
from failslow.events import JobMeta

log = logging.getLogger(__name__)


class SlowdownDetector:
    """Slow-downs of a job and their root cause (package docstring). Detector protocol:
    ``update(batch)`` / ``on_tick(now_ns)`` return anomaly reports, once when an anomaly
    opens and once when it closes (same ``id``); ``last_rounds`` holds the ``rounds`` rows
    of the latest batch; ``snapshot()`` / ``restore()`` carry the whole state as JSON.

    Every decision is taken when a job iteration completes, on the data before that
    iteration's end (whole time bins): the diagnosis does not depend on how the records
    were cut into batches, and ``detected_ns`` is the trace time of the evidence.

    Its parts: ``reducers`` (the rounds and compute gaps of the rows, :mod:`.reducer`; one
    per shard of the ranks, ``config.shards``, :mod:`.shards`), ``stats`` (the binned
    evidence), ``timeline`` (the job
    iterations), ``change`` (the change tracker), ``localizer`` and ``lifecycle`` (the
    anomalies).

    It reads the job iterations the :class:`IterationTracker` derives (``iterations`` in the
    batch, registered before it); alone (``own_tracker``, the default) it runs a tracker of
    its own on batches without them. With ``evidence_imported`` it sums the ``evidence``
    rows of the stage that reduces the job's ``coll`` rows (:mod:`.stage`) and reads no
    ``coll`` rows (it writes no ``rounds``: that stage does)."""

    name: ClassVar[str] = "slowdown"
    kinds: ClassVar[frozenset[str]] = frozenset({"coll", "span", "link", "gpu", "iterations",
                                                 "evidence"})
    produces: ClassVar[tuple[str, ...]] = ("rounds",)

    def __init__(self, meta: JobMeta, config: SlowdownConfig | None = None,
                 own_tracker: bool = True, evidence_imported: bool = False) -> None:
        self.meta = meta
        self.config = config or SlowdownConfig()
        self._own_tracker = own_tracker
        #: the evidence comes as rows from the reducing stage (``evidence`` in the batch,
        #: :mod:`.stage`) instead of from reducers here, for a job that stage can split
        self.evidence_imported = evidence_imported and splits(meta)
        self.tracker = IterationTracker(meta) if own_tracker else None
        self.registry = CommRegistry(meta)
        self.router = ShardRouter(meta, self.config.shards)
        # the row-level half; the first reducer's communicators are the job's
        self.reducers = [EvidenceReducer(meta, self.config, self.registry if i == 0 else None)
                         for i in range(self.router.shards)]
        self.stats = BinnedStats(meta, self.config, self.registry)
        self.change = ChangeTracker(self.config.change)
        self.timeline = IterationTimeline()
        self.localizer = Localizer(self.config, self.stats, self.timeline)
        self.lifecycle = AnomalyLifecycle(meta, self.config, self.change, self.timeline,
                                          self.stats, self.localizer)
        self.base_iter_ns = 0.0
        self.max_t = 0
        self._no_rounds = results.empty("rounds")
        self.last_rounds: pa.Table = self._no_rounds
        self.last_iterations: pa.Table = results.empty("iterations")

    @property
    def levels(self) -> list[SlowLevel]:
        """The slow levels, aligned with the change tracker's."""
        return self.lifecycle.levels

    def pending_onsets(self) -> list[int]:
        """The onsets (ns) of the job slow-downs seen but not yet reported (levels still
        being localized): the link-rate detector leaves a link degraded since then to this
        detector."""
        return [int(op.anomaly["start_ns"]) for op in self.lifecycle.levels
                if op.state == "pending"]

    @property
    def evidence(self) -> dict[str, Any]:
        """The latest localization's evidence (debugging)."""
        return self.localizer.evidence

    def localize(self, win: Window, op: SlowLevel | None = None, light: bool = False,
                 roots: list[int] | None = None, comm: bool = True,
                 force_comm: bool = False) -> dict[str, Any]:
        """:meth:`Localizer.localize`."""
        return self.localizer.localize(win, op, light=light, roots=roots, comm=comm,
                                       force_comm=force_comm)

    # ------------------------------------------------------------------ protocol

    def update(self, batch: EventBatch) -> list[Anomaly]:
        iterations = batch.get("iterations")
        coll = batch.get("coll")
        self.last_rounds = self._no_rounds
        stats = self.stats
        if self.evidence_imported:
            rows = batch.get("evidence")
            if rows is not None and rows.num_rows:
                evidence = evidence_of(rows, self.registry, stats.shift)
                if evidence.coarser_rows:
                    log.warning("job %s: %d evidence rows were summed in bins coarser than "
                                "the detector's", self.meta.job, evidence.coarser_rows)
                unlearned = stats.unlearned_windows
                stats.absorb(evidence)
                if stats.unlearned_windows and not unlearned:
                    log.warning("job %s: CCL-D rounds arrive summed per window for round "
                                "classes whose baseline this stage never saw (the evidence "
                                "stages ran before it): those classes get no R and P",
                                self.meta.job)
        elif coll is not None and coll.num_rows:
            self.max_t = max(self.max_t, int(coll_columns(coll)["t"].max()))
            evidence = Evidence(stats.shift)
            for reducer, (rows, own_rows) in zip(self.reducers, self.router.split(coll),
                                                 strict=True):
                evidence.add(reducer.update(rows, stats.shift, own_rows))
            stats.absorb(evidence)
            rounds = evidence.all_rounds()
            if len(rounds):
                self.last_rounds = rounds_table(self.meta.job, rounds)
        for kind, fn in (("span", stats.account_spans), ("link", stats.account_links),
                         ("gpu", stats.account_gpu)):
            table = batch.get(kind)
            if table is not None and table.num_rows:
                fn(table)
        if self.tracker is not None and iterations is None:
            iterations = self.tracker.track(batch)
            self.last_iterations = iterations
        reports: list[Anomaly] = []
        if iterations is not None and iterations.num_rows:
            job = iterations.filter(pc.equal(iterations.column("rank"), -1))
            job = job.sort_by("iteration")
            for idx, t0, d in zip(job.column("iteration").to_pylist(),
                                  job.column("t_start").to_pylist(),
                                  job.column("duration_ns").to_pylist(), strict=True):
                reports.extend(self._push_iteration(int(idx), int(t0), int(d)))
        return reports

    def on_tick(self, now_ns: int) -> list[Anomaly]:
        return []  # decisions are taken when iterations end (class docstring)

    def outputs(self) -> dict[str, pa.Table]:
        return {"rounds": self.last_rounds}

    # ------------------------------------------------------------------ iterations

    def _push_iteration(self, idx: int, t0: int, dur: int) -> list[Anomaly]:
        timeline = self.timeline
        if not timeline.push(idx, t0, dur):
            return []
        self.change.allow_further = all(op.state == "open" for op in self.lifecycle.levels)
        changes = self.change.push(float(dur))
        if not math.isnan(self.change.baseline) and self.change.state == "normal":
            self.base_iter_ns = self.change.baseline
        elif not self.base_iter_ns and len(timeline.iters) >= 3:
            self.base_iter_ns = float(np.median([d for _, _, d in timeline.iters[-5:]]))
        self.stats.resize(self.base_iter_ns)
        self.stats.ccld.close(timeline.horizon)
        out = self.lifecycle.step(changes)
        self._trim()
        return out

    def _trim(self) -> None:
        """Forget the iterations and bins older than ``history_iterations`` (but none an
        open level's reference window needs)."""
        c = self.config
        keep = c.history_iterations
        levels = self.lifecycle.levels
        self.timeline.trim(keep, levels[0].onset_pos - c.baseline_iterations - 2
                           if levels else None)
        if self.base_iter_ns > 0:
            horizon = self.timeline.horizon - int(keep * self.base_iter_ns)
            if levels:
                horizon = min(horizon, levels[0].ref_lo_ns)
            self.stats.prune(horizon)

    # ------------------------------------------------------------------ state

    def snapshot(self) -> dict[str, Any]:
        stats, timeline = self.stats, self.timeline
        return {
            **self.reducers[0].snapshot(),
            "shards": [r.snapshot() for r in self.reducers[1:]],
            "links": stats.links.snapshot(),
            "ccld": stats.ccld.snapshot(), "shift": stats.shift,
            "tables": {name: getattr(stats, name).snapshot() for name in TABLE_NAMES},
            "classes": [[k & 0xF, k >> 4, i] for k, i in stats.classes.pairs()],
            "group_ids": stats.group_ids.pairs(),
            "change": self.change.snapshot(), "iters": [list(x) for x in timeline.iters],
            "iter_offset": timeline.offset, "base_iter_ns": self.base_iter_ns,
            "first_iter_t": timeline.first_t, "horizon": timeline.horizon,
            "max_t": self.max_t, "next_id": self.lifecycle.next_id,
            "levels": [asdict(op) for op in self.lifecycle.levels],
            "tracker": self.tracker.snapshot() if self.tracker is not None else None,
        }

    def restore(self, state: dict[str, Any]) -> None:
        stats, timeline = self.stats, self.timeline
        shards = state.get("shards") or []
        if len(shards) == len(self.reducers) - 1:
            for reducer, part in zip(self.reducers, [state, *shards], strict=True):
                reducer.restore(part)
        else:  # the shard count changed: its rows in flight were routed otherwise
            log.warning("job %s: a snapshot of %d evidence reducers restored into %d; their "
                        "incomplete rounds are dropped", self.meta.job, len(shards) + 1,
                        len(self.reducers))
            self.registry.restore(state["registry"])
        stats.links.restore(state["links"])
        stats.ccld.restore(state["ccld"])
        stats.shift = int(state["shift"])
        for name in TABLE_NAMES:
            getattr(stats, name).restore(state["tables"][name])
        stats.classes = _KeyIndex([((int(b) << 4) | int(o), int(i))
                                   for o, b, i in state["classes"]])
        stats.group_ids = _KeyIndex([(int(g), int(i)) for g, i in state["group_ids"]])
        self.change.restore(state["change"])
        timeline.iters = [[int(a), int(b), int(c)] for a, b, c in state["iters"]]
        timeline.offset = int(state["iter_offset"])
        self.base_iter_ns = float(state["base_iter_ns"])
        timeline.first_t = int(state["first_iter_t"])
        timeline.horizon = int(state["horizon"])
        self.max_t = int(state["max_t"])
        self.lifecycle.next_id = int(state["next_id"])
        self.lifecycle.levels = [SlowLevel(**op) for op in state["levels"]]
        if self.tracker is not None and state.get("tracker") is not None:
            self.tracker.restore(state["tracker"])
