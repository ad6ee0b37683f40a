"""One job's detectors together: what the stream processor and the offline analyzer run.

:class:`JobAnalyzer` feeds every batch to the :class:`~failslow.detectors.iterations.
IterationTracker` (Greyhound §4.2 iteration times), the :class:`~failslow.detectors.slowdown.
SlowdownDetector` (change points on those iteration times, CCL-D / Greyhound localization) and
the :class:`~failslow.detectors.hang.HangDetector` (CCL-D hang taxonomy), and returns their
reports and derived rows. The :class:`~failslow.mitigation.planner.MitigationPlanner`
(Greyhound §5.1, Algorithm 1) follows the slow anomalies and the job's iteration times where
they are produced and returns its mitigation advice with them (``Output.advice``).
``snapshot()`` / ``restore()`` carry the whole state as JSON values and numpy arrays (the
planner's open anomalies and accumulated impact included), so a restarted processor resumes
without relearning baselines, without re-reporting and without advising twice.
"""

from __future__ import annotations

import base64
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar, cast

import numpy as np
import pyarrow as pa

from failslow import results
from failslow.detectors.base import Detector, EventBatch
from failslow.detectors.hang import HangConfig, HangDetector
from failslow.detectors.iterations import IterationTracker
from failslow.detectors.linkrate import LinkRateDetector
from failslow.detectors.slowdown import SlowdownDetector
from failslow.diagnosis import Anomaly, Diagnosis
from failslow.engine import registry
from failslow.engine.dedup import CollDeduplicator
from failslow.engine.imports import IMPORTERS
from failslow.engine.probes import (
    ProbeRequest,
    ProbeRequester,
    apply_probe_rows,
    carry_probe_evidence,
    rows_of,
)
from failslow.engine.registry import JobConfig
from failslow.events import JobMeta
from failslow.mitigation.planner import Advice, AnomalyPlans, MitigationPlanner
from failslow.settings import get_settings

__all__ = ["JobAnalyzer", "JobConfig", "Output", "Reports", "only"]

#: 2: detector states by registry name (1: fixed keys; still restored)
STATE_VERSION = 2
#: version-1 state keys of the detectors
_V1_KEYS = {"iterations": "tracker", "slowdown": "slowdown", "hang": "hang",
            "linkrate": "linkrate"}

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class Output:
    """What one ``update`` or ``on_tick`` produced: anomaly reports (an anomaly is reported
    when it opens and again when it closes, same id) and the new ``rounds`` and
    ``iterations`` rows (:data:`failslow.results.SCHEMAS`)."""

    anomalies: list[Anomaly] = field(default_factory=list)
    rounds: pa.Table = field(default_factory=lambda: results.empty("rounds"))
    iterations: pa.Table = field(default_factory=lambda: results.empty("iterations"))
    #: mitigation advice decided on these iterations and reports (Greyhound §5.1)
    advice: list[Advice] = field(default_factory=list)
    #: probes of the open anomalies' suspects to ask the node agents for (issue 17; only
    #: for jobs with probes enabled)
    probe_requests: list[ProbeRequest] = field(default_factory=list)
    #: the evidence rows of a reducing stage (``JobConfig.evidence_shard``), for export
    evidence: pa.Table | None = None


class JobAnalyzer:
    """All detectors of one job over its record batches (see the module docstring).

    Reports follow an anomaly's lifecycle: opened (``end_ns`` null), possibly updated when
    later iterations refine its root cause (same ``id``, still open: a second slow rank,
    the compute side of a mixed slow-down), resolved (``end_ns`` set). ``diagnosis()`` holds
    the latest report of each."""

    def __init__(self, meta: JobMeta, config: JobConfig | None = None) -> None:
        self.meta = meta
        self.config = config or JobConfig()
        self._anomalies: dict[str, Anomaly] = {}  # latest report per id, first-seen order
        #: the enabled detectors by registry name, in the order they run
        self.detectors: dict[str, Detector] = registry.build(
            meta, self.config, lambda: list(self._anomalies.values()))
        #: detectors that raised, with the error (skipped from then on; see ``_guard``)
        self.failed: dict[str, str] = {}
        #: the detectors in waves that may run side by side (:func:`waves`)
        self._waves = waves(self.detectors)
        #: repeated ``coll`` rows (at-least-once delivery) never reach the detectors
        self.dedup = CollDeduplicator()
        #: ranks that sent at least one ``coll`` row (see ``_unknown_roots``)
        self.observed = np.zeros(max(meta.world_size, 1), dtype=bool)
        #: who is asked to confirm a suspect (off unless the job is in ``probe_jobs``)
        self.requester = ProbeRequester(meta, self.config.probe_jobs,
                                        self.config.probe_deadline_s)
        #: derived tables of other stages (``JobConfig.imported``), each row taken once
        self.imports = {name: IMPORTERS[name]() for name in sorted(self.config.imported)}
        self.planner: MitigationPlanner | None = None
        # the planner follows slow anomalies and iteration times: it runs where the
        # slow-down detector does (a processor may run only some detectors, issue 13)
        if self.config.planner is not None and "slowdown" in self.detectors:
            self.planner = MitigationPlanner(
                meta.job, self.config.planner,
                AnomalyPlans(meta, max(1, self.config.planner_multiple_of)))

    @property
    def tracks_iterations(self) -> bool:
        """This engine runs the iteration tracker: its diagnosis has the iterations summary
        (an engine may run only some detectors: ``failslow process --detectors``)."""
        return "iterations" in self.detectors

    # the registered detectors by role (None: not enabled)
    @property
    def tracker(self) -> IterationTracker:
        return cast(IterationTracker, self.detectors["iterations"])

    @property
    def slowdown(self) -> SlowdownDetector:
        return cast(SlowdownDetector, self.detectors["slowdown"])

    @property
    def hang(self) -> HangDetector:
        return cast(HangDetector, self.detectors["hang"])

    @property
    def linkrate(self) -> LinkRateDetector | None:
        return cast(LinkRateDetector | None, self.detectors.get("linkrate"))

    def update(self, batch: EventBatch) -> Output:
        """Every enabled detector on ``batch``, in registry order: the tables one derives
        (``produces``) join the batch of the ones after it, and the anomalies one reports are
        known to the ones after it."""
        coll = batch.get("coll")
        if coll is not None:
            batch = {**batch, "coll": self.dedup.update(coll)}
            self._observe(batch["coll"])
        batch = dict(batch)
        for name, importer in self.imports.items():
            imported = batch.get(name)
            if imported is not None:
                batch[name] = importer.take(imported)
        derived: dict[str, pa.Table] = {}
        found: list[Anomaly] = []
        parallel = coll is not None and coll.num_rows >= PARALLEL_MIN_ROWS
        for wave in self._waves:
            # the tasks of one wave read nothing the others derive or report: side by side
            # on the engine's threads, their reports taken in registry order
            calls: list[Callable[[], list[Anomaly]]] = [
                partial(self._guard, name, partial(self._task, name, step, batch),
                        list[Anomaly]()) for name, step in wave]
            for (name, step), reports in zip(wave, _run_all(calls, parallel), strict=True):
                self._record(reports)
                found += reports
                if name in self.failed or step != "update":
                    continue
                for table_name, table in self.detectors[name].outputs().items():
                    batch[table_name] = derived[table_name] = table
        # active validation (issue 17): probe rows answering open anomalies are evidence;
        # a skipped one may be asked again
        found += apply_probe_rows(self._anomalies, batch.get("probe"))
        self.requester.answered(rows_of(batch.get("probe")))
        iterations = derived.get("iterations", results.empty("iterations"))
        rounds = derived.get("rounds", results.empty("rounds"))
        # the planner follows the job's iterations wherever they come from (derived here,
        # or imported from the stage that tracks them: ``JobConfig.imported``)
        followed = batch.get("iterations") if "iterations" in self.config.imported else None
        advice = self._advise(iterations if followed is None else followed, found)
        return Output(found, rounds, iterations, advice, self.requester.requests(found),
                      derived.get("evidence"))

    def _task(self, name: str, step: str, batch: EventBatch) -> list[Anomaly]:
        det = self.detectors[name]
        if step == "prepare":
            det.prepare(batch)  # type: ignore[attr-defined]
            return []
        return det.update(batch)

    def on_tick(self, now_ns: int) -> Output:
        found: list[Anomaly] = []
        for name, det in self.detectors.items():
            reports = self._guard(name, partial(det.on_tick, now_ns), list[Anomaly]())
            self._record(reports)
            found += reports
        return Output(found, advice=self._advise(None, found),
                      probe_requests=self.requester.requests(found))

    def end_post_mortem(self, last_event_ns: int) -> Output:
        """The trace is a snapshot taken after the job stopped (Flight Recorder dumps): no
        operation in flight at its end will complete. One last tick past the hang ceiling
        reports what is stuck; those reports say they were detected at ``last_event_ns``,
        the last thing observed, not at the synthetic tick time."""
        hang = self.config.hang or HangConfig()
        out = self.on_tick(last_event_ns + hang.ceiling_ns + 1_000_000_000)
        for a in out.anomalies:
            if a.detected_ns is not None and a.detected_ns > last_event_ns:
                a.detected_ns = last_event_ns
                a.extra["detected_post_mortem"] = True
        return out

    def _guard(self, part: str, call: Callable[[], T], fallback: T) -> T:
        """``call()`` unless ``part`` failed before; a part that raises is logged with its
        traceback, counted in :attr:`failed` and skipped from then on, so one failing
        detector never stops the others (the diagnosis lists it as incomplete). The
        detectors that read a failed one's derived tables stop with it."""
        if part in self.failed or self._upstream_failed(part):
            return fallback
        try:
            return call()
        except Exception as e:  # noqa: BLE001 - isolate one detector's failure
            log.warning("job %s: the %s detector failed and is skipped from now on: %s: %s",
                        self.meta.job, part, type(e).__name__, e, exc_info=True)
            self.failed[part] = f"{type(e).__name__}: {e}"
            return fallback

    def _upstream_failed(self, part: str) -> bool:
        det = self.detectors.get(part)
        if det is None:
            return False
        return any(set(other.produces) & det.kinds
                   for name, other in self.detectors.items() if name in self.failed)

    def _advise(self, iterations: pa.Table | None, found: list[Anomaly]) -> list[Advice]:
        """The planner's decisions on new iteration rows and reports (none without either)."""
        if self.planner is None or (not found and (iterations is None
                                                   or not iterations.num_rows)):
            return []
        planner = self.planner
        return self._guard("planner", lambda: planner.update(
            results.empty("iterations") if iterations is None else iterations, found), [])

    def _observe(self, coll: pa.Table) -> None:
        if not coll.num_rows:
            return
        ranks = coll.column("rank").to_numpy()  # no sort: a mark per row is O(n)
        top = int(ranks.max())
        if top >= len(self.observed):
            grown = np.zeros(top + 1, dtype=bool)
            grown[:len(self.observed)] = self.observed
            self.observed = grown
        self.observed[ranks[ranks >= 0]] = True

    def _unknown_roots(self, found: list[Anomaly]) -> None:
        """Missing data is not evidence: a rank that never sent a row (no Flight Recorder
        dump, a dead collector) is never a root cause. It moves from ``ranks`` to
        ``extra["unknown_ranks"]``; an anomaly that pointed only at such ranks keeps no root
        rank and says so."""
        for a in found:
            # a rank NCCL RAS names as the root is evidenced by RAS (hang detector)
            named = set(a.extra.get("ras_roots") or ())
            unknown = [r for r in a.ranks if r not in named and (
                r < 0 or r >= len(self.observed) or not self.observed[r])]
            if not unknown:
                continue
            a.ranks = [r for r in a.ranks if r not in unknown]
            a.extra["unknown_ranks"] = sorted(set(unknown) | set(a.extra.get("unknown_ranks", [])))
            a.extra["note"] = ("the rank(s) in unknown_ranks sent no data: they may be the cause "
                               "or their collector may have failed; not named as root cause")

    def _record(self, found: list[Anomaly]) -> None:
        self._unknown_roots(found)
        for a in found:
            carry_probe_evidence(self._anomalies.get(a.id), a)
            self._anomalies[a.id] = a

    def diagnosis(self) -> Diagnosis:
        """The diagnosis so far (diagnosis.md): iterations summary and every anomaly in its
        latest state, and the detectors that failed (``incomplete``); no what-if analysis
        here."""
        summary = None if "iterations" in self.failed or not self.tracks_iterations \
            else self.tracker.summary()
        return Diagnosis(job=self.meta.job, iterations=summary,
                         anomalies=[Anomaly.from_dict(a.to_dict())
                                    for a in self._anomalies.values()],
                         whatif=None,
                         incomplete=[{"part": p, "reason": r} for p, r in self.failed.items()])

    def snapshot(self) -> dict[str, Any]:
        return {"version": STATE_VERSION,
                "detectors": {name: det.snapshot() for name, det in self.detectors.items()},
                "anomalies": [a.to_dict() for a in self._anomalies.values()],
                "planner": None if self.planner is None else self.planner.snapshot(),
                "imports": {name: imp.snapshot() for name, imp in self.imports.items()},
                "failed": dict(self.failed), "duplicates_dropped": self.dedup.dropped,
                "probes_asked": sorted(self.requester.asked),
                "probes_tries": dict(sorted(self.requester.tries.items())),
                "observed": {"n": len(self.observed), "bits": base64.b64encode(
                    np.packbits(self.observed).tobytes()).decode()}}

    def restore(self, state: dict[str, Any]) -> None:
        version = state.get("version")
        if version == 1:
            detectors = {name: state.get(key) for name, key in _V1_KEYS.items()}
        elif version == STATE_VERSION:
            detectors = state["detectors"]
        else:
            raise ValueError(f"unsupported analyzer state version {version!r}")
        for name, det in self.detectors.items():
            saved = detectors.get(name)
            if saved is not None:
                det.restore(saved)
        self._anomalies = {}
        for a in (Anomaly.from_dict(d) for d in state["anomalies"]):
            self._anomalies[a.id] = a
        if self.planner is not None and state.get("planner") is not None:
            self.planner.restore(state["planner"])
        saved_imports = state.get("imports") or {}
        if "last" in saved_imports:  # (before 2026-11-30's evidence: iterations only)
            saved_imports = {"iterations": saved_imports}
        for name, importer in self.imports.items():
            if saved_imports.get(name) is not None:
                importer.restore(saved_imports[name])
        self.failed = dict(state.get("failed", {}))
        self.requester.asked = set(state.get("probes_asked", ()))
        self.requester.tries = {str(k): int(v)
                                for k, v in (state.get("probes_tries") or {}).items()}
        self.dedup.dropped = int(state.get("duplicates_dropped", 0))
        seen = state.get("observed")
        if seen is not None:
            bits = np.frombuffer(base64.b64decode(seen["bits"]), dtype=np.uint8)
            self.observed = np.unpackbits(bits)[:int(seen["n"])].astype(bool)


def waves(detectors: dict[str, Detector]) -> list[list[tuple[str, str]]]:
    """The detectors' tasks, in registry order, cut into waves whose members may run side
    by side. A task is ``(name, "update")``, or ``(name, "prepare")`` for a detector that
    reads the others' reports (``reads_reports``) and has a ``prepare(batch)`` step, which
    reads only the batch's records (the link-rate detector's samples): that step runs in
    the wave before its ``update``. An ``update`` starts a new wave when it reads a table
    one of the current wave derives, or when it reads the other detectors' reports (the
    link-rate detector does not repeat a link already named)."""
    out: list[list[tuple[str, str]]] = []
    produced: set[str] = set()
    for name, det in detectors.items():
        reads_reports = bool(getattr(det, "reads_reports", False))
        after = reads_reports or bool(produced & det.kinds)
        if reads_reports and out and callable(getattr(det, "prepare", None)):
            out[-1].append((name, "prepare"))
        if not out or after:
            out.append([])
            produced = set()
        out[-1].append((name, "update"))
        produced |= set(det.produces)
    return out


_POOL: list[ThreadPoolExecutor | None] = [None]
_POOL_LOCK = threading.Lock()


def _forget_pool() -> None:
    """A forked child has none of its parent's threads: it makes a pool of its own."""
    global _POOL_LOCK
    _POOL[0] = None
    _POOL_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def _threads() -> int:
    n = get_settings().processor.engine_threads
    if n > 0:
        return n
    # the cores this process may run on (a processor pinned to one core gets no threads)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(4, cores or 1)


#: ``coll`` rows of a batch below which its detectors run one after the other: the GIL
#: makes threads pay only on large batches (a 256-rank job in 100 ms batches, about 7 k
#: rows each, took 2.9 CPU s on threads against 1.7 s on one; the 4096-rank ``large``
#: preset, about 90 k rows a batch, gains wall time on them)
PARALLEL_MIN_ROWS = 20_000


def _run_all(calls: list[Callable[[], T]], parallel: bool = True) -> list[T]:
    """Every call's result, in order: on the engine's shared threads when there are several
    calls and threads and ``parallel``, else here. This thread takes a share of the work:
    the pool has one thread fewer than :func:`_threads`."""
    if len(calls) < 2 or _threads() < 2 or not parallel:
        return [c() for c in calls]
    with _POOL_LOCK:
        pool = _POOL[0]
        if pool is None:
            pool = _POOL[0] = ThreadPoolExecutor(max_workers=_threads() - 1,
                                                 thread_name_prefix="failslow-engine")
    futures = [pool.submit(c) for c in calls[1:]]
    first = calls[0]()  # this thread takes a share of the work too
    return [first, *(f.result() for f in futures)]


class Reports:
    """A job's engine seen as one detector whose ``update`` / ``on_tick`` return the anomaly
    reports (drivers written for the detector protocol, such as the hang benchmarks' lagged
    streams, run the engine through it)."""

    def __init__(self, analyzer: JobAnalyzer) -> None:
        self.analyzer = analyzer

    def update(self, batch: EventBatch) -> list[Anomaly]:
        return self.analyzer.update(batch).anomalies

    def on_tick(self, now_ns: int) -> list[Anomaly]:
        return self.analyzer.on_tick(now_ns).anomalies


def only(meta: JobMeta, names: set[str], **config: Any) -> JobAnalyzer:
    """An engine running only the registered detectors ``names`` (and those whose tables
    they read), without planner unless ``config`` gives one; ``config``: :class:`JobConfig`
    fields."""
    config.setdefault("planner", None)
    return JobAnalyzer(meta, JobConfig(detectors=frozenset(names), **config))
