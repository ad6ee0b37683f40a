"""The jobs of a stream processor (:class:`Jobs`): each job's analyzers, the records held
until every kind the detectors read has arrived up to a time, their analysis in event-time
windows with a tick at each window's end (as ``failslow analyze`` replays a trace), the
job's clock, and the results collected into its partition's output."""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from failslow import events, results
from failslow.detectors.base import EventBatch
from failslow.diagnosis import Anomaly
from failslow.engine.imports import SCHEMAS
from failslow.events import JobMeta
from failslow.replay import TIME_COLUMN, Coalescer, cut
from failslow.stream.config import (
    Analyzer,
    AnalyzerFactory,
    ProcessorConfig,
    WhatIf,
    WhatIfFactory,
)
from failslow.stream.exports import EXPORT_MESSAGE_ROWS, T_EMIT, message_rows, with_emit_time
from failslow.stream.partitions import Partition
from failslow.stream.sink import AnomalyReport, diagnoses_table, select_schema
from failslow.stream.stats import ProcessorStats
from failslow.stream.transport import encode, one_batch_stream
from failslow.stream.windows import concat_tables, last_step, split_at, time_span

log = logging.getLogger(__name__)

#: The stream's pace (event time per wall time) is a decaying average with this half-life,
#: known once this much wall time was seen.
PACE_HALF_LIFE_NS = 10_000_000_000
MIN_PACE_WALL_NS = 2_000_000_000


@dataclass
class JobState:
    meta: JobMeta
    analyzer: Analyzer
    partition: int = 0
    watermark: int = events.NULL_TIME  # largest event time seen
    advanced: int = 0  # monotonic ns when the watermark last advanced
    last_tick: int = events.NULL_TIME
    seen: int = 0  # monotonic ns when the job's last message was processed
    pace_event: float = 0.0  # decayed sums of event time and wall time the watermark
    pace_wall: float = 0.0  # advanced by: the stream's pace (event s per wall s)
    version: int = 0  # the last report's version
    diag_version: int = 0
    anomalies: dict[str, Anomaly] = field(default_factory=dict)  # latest report per id
    whatif: WhatIf | None = None
    dirty: bool = False  # the diagnosis summary changed since the last checkpoint
    # input held until every record kind of the job reached its time (see Jobs.horizon)
    held: dict[str, list[pa.Table]] = field(default_factory=dict)
    held_rows: int = 0
    kind_wm: dict[str, int] = field(default_factory=dict)  # kind -> event time complete
    # a kind several shards export: kind -> shard -> its watermark (kind_wm: the least,
    # once every shard was heard from)
    source_wm: dict[str, dict[int, int]] = field(default_factory=dict)
    kind_seen: dict[str, int] = field(default_factory=dict)  # kind -> monotonic ns
    first_data: int = 0  # monotonic ns of the first data message (0: none yet)
    # the job's window grid starts here (its first event time less one; None: no event yet)
    origin: int | None = None
    # sparse windows merged before analysis, as offline (failslow.replay.Coalescer)
    merger: Coalescer = field(default_factory=Coalescer)
    # a replayed post-mortem trace ends at this event time (None: not announced)
    post_mortem: int | None = None
    ended: bool = False  # its post-mortem end was analysed: no more ticks
    export_wm: int = events.NULL_TIME  # the last watermark of its exported tables
    missing_imports: set[str] = field(default_factory=set)  # imported kinds told missing


class Jobs:
    """The jobs of the processor by id. ``parts`` and ``idle_since`` (partition -> monotonic
    ns since it was read to its end) are the processor's: results go to the job's partition,
    and a partition read to its end lets silence count (the ``"wall"`` clock, alignment)."""

    def __init__(self, config: ProcessorConfig, stats: ProcessorStats,
                 analyzer_factory: AnalyzerFactory, whatif_factory: WhatIfFactory | None,
                 parts: dict[int, Partition], idle_since: dict[int, int], align: bool) -> None:
        self.config = config
        self.stats = stats
        self.analyzer_factory = analyzer_factory
        self.whatif_factory = whatif_factory
        self.states: dict[str, JobState] = {}
        self._parts = parts
        self._idle_since = idle_since
        self._align = align
        self._window_ns = max(1, int(config.window_ns))
        self._align_idle_ns = int(config.align_idle_s * 1e9)
        self._grace_ns = int(config.silence_grace_s * 1e9)
        self._kinds = frozenset(config.analyzer_kinds)
        #: the kinds the horizon waits for (not the sparse ones: events.SPARSE_KINDS)
        self._aligned = self._kinds - events.SPARSE_KINDS
        self._batch_rows = 0  # rows added since the last run_batches
        #: retired jobs: their meta and partition (:meth:`retire_idle`)
        self.retired: dict[str, tuple[JobMeta, int]] = {}

    def _merger(self) -> Coalescer:
        return Coalescer(self._window_ns, self.config.min_batch_rows)

    def __contains__(self, job: str) -> bool:
        return job in self.states

    def create(self, meta: JobMeta, partition: int) -> JobState:
        """A new job from its meta (the factories' errors propagate)."""
        analyzer = self.analyzer_factory(meta)
        whatif = self.whatif_factory(meta) if self.whatif_factory else None
        st = self.states[meta.job] = JobState(meta, analyzer, partition, whatif=whatif,
                                              seen=time.monotonic_ns(),
                                              merger=self._merger())
        self.stats.jobs = len(self.states)
        return st

    def retire_idle(self) -> list[str]:
        """Retire the jobs without a message for ``retire_after_s``: their merged windows
        are analysed and collected, then their state is let go (a job that ended, or a hung
        one already reported, holds no memory for ever); their meta is kept, so records
        that come later start the job afresh (:meth:`revive`)."""
        limit = self.config.retire_after_s
        if limit is None:
            return []
        now = time.monotonic_ns()
        gone = [job for job, st in self.states.items()
                if now - st.seen > limit * 1e9 and not st.held_rows]
        for job in gone:
            st = self.states[job]
            self.flush(job, st)
            self.retired[job] = (st.meta, st.partition)
            del self.states[job]
            log.info("job %s: no message for %.0f s, its detector state is let go", job,
                     limit)
        self.stats.jobs = len(self.states)
        self.stats.jobs_retired += len(gone)
        return gone

    def revive(self, job: str) -> bool:
        """Start a retired job afresh (its records came back); False: not retired."""
        retired = self.retired.pop(job, None)
        if retired is None:
            return False
        self.create(*retired)
        log.info("job %s: records again after it was retired; detection starts afresh", job)
        return True

    def drop_partition(self, number: int) -> None:
        for job in [j for j, st in self.states.items() if st.partition == number]:
            del self.states[job]
        for job in [j for j, (_, p) in self.retired.items() if p == number]:
            del self.retired[job]
        self.stats.jobs = len(self.states)

    # ----------------------------------------------------------------------------- input

    def add(self, job: str, kind: str, table: pa.Table, watermark: int | None = None,
            post_mortem: bool = False, source: tuple[int, int] | None = None) -> None:
        """Hold ``table`` for the job; ``watermark``: the producer says every row of this
        kind up to that time was published (header ``failslow-watermark``);
        ``post_mortem``: and the trace, a post-mortem snapshot, ends there; ``source``:
        the producer is shard ``i`` of the ``n`` that publish this kind (the kind is
        complete up to the least of their watermarks)."""
        if not self.config.detect:
            return
        st = self.states[job]
        if post_mortem and watermark is not None:
            st.post_mortem = max(st.post_mortem or watermark, watermark)
        st.kind_seen[kind] = time.monotonic_ns()
        if not st.first_data:
            st.first_data = st.kind_seen[kind]
        top = watermark
        column = TIME_COLUMN.get(kind)
        if table.num_rows:
            if column is not None:
                tmax = pc.max(table.column(column)).as_py()
                if tmax is not None:
                    top = max(int(tmax), top if top is not None else int(tmax))
            st.held.setdefault(kind, []).append(table)
            st.held_rows += table.num_rows
            self._batch_rows += table.num_rows
        if top is not None and column is not None and source is not None:
            shard, count = source
            marks = st.source_wm.setdefault(kind, {})
            marks[shard] = max(marks.get(shard, events.NULL_TIME), top)
            top = min(marks.values()) if len(marks) >= count else None
        if top is not None and column is not None:
            st.kind_wm[kind] = max(st.kind_wm.get(kind, events.NULL_TIME), top)
        if self._batch_rows >= self.config.max_batch_rows:
            self.run_batches()

    def horizon(self, st: JobState) -> int | None:
        """The event time up to which every record kind the detectors read has arrived
        (None: release everything; sparse kinds such as ``ras`` rows are not waited for).
        A kind without a message while the job's partition has
        been read to its end for ``align_idle_s`` has nothing more and does not count; a kind
        not seen yet holds everything back until then, counted from the job's first data
        message (its messages may still be on the way: topics are fetched independently)."""
        now = time.monotonic_ns()
        idle_since = self._idle_since.get(st.partition)  # read to its end since then
        horizon: int | None = None
        for kind in self._aligned:
            if idle_since is not None:
                quiet = max(st.kind_seen.get(kind, st.first_data or now), idle_since)
                if now - quiet >= self._align_idle_ns:
                    if kind in self.config.imports and kind not in st.kind_seen \
                            and kind not in st.missing_imports:
                        # the stage that exports it may not run: say so once
                        st.missing_imports.add(kind)
                        log.warning("job %s: no %s rows from the stage that exports them "
                                    "(failslow.derived.%s) after %.0f s: is it running?",
                                    st.meta.job, kind, kind, self._align_idle_ns / 1e9)
                    continue  # nothing more of this kind
            wm = st.kind_wm.get(kind, events.NULL_TIME)
            horizon = wm if horizon is None else min(horizon, wm)
        return horizon

    def run_batches(self, force: bool = False) -> None:
        """Analyse the held input of every job up to its horizon (all of it: ``force``)."""
        self._batch_rows = 0
        for job, st in list(self.states.items()):
            if not st.held_rows:
                continue
            horizon = None if force or not self._align \
                or st.held_rows > self.config.max_held_rows else self.horizon(st)
            released: dict[str, pa.Table] = {}
            for kind, parts in list(st.held.items()):
                table = concat_tables(parts)
                column = TIME_COLUMN.get(kind)
                if horizon is None or column is None:
                    out, keep = table, None
                else:
                    out, keep = split_at(table, column, horizon)
                if out.num_rows:
                    released[kind] = out
                if keep is not None and keep.num_rows:
                    st.held[kind] = [keep]
                else:
                    del st.held[kind]
            st.held_rows = sum(t.num_rows for parts in st.held.values() for t in parts)
            if released:
                self._update(job, released, horizon)
            if st.post_mortem is not None and not st.held_rows and not st.ended:
                self._end_post_mortem(job, st)

    # ----------------------------------------------------------------------------- analysis

    def _update(self, job: str, batch: EventBatch, horizon: int | None = None) -> None:
        """Feed ``batch`` (complete up to ``horizon``) to the job's analyzers in the windows of
        the job's grid (:func:`failslow.replay.cut`, as ``failslow analyze`` replays a
        trace), sparse ones merged by the job's :class:`~failslow.replay.Coalescer`, with a
        tick at each analysed batch's end: the results do not depend on how the input was
        polled, and they are those of the offline analysis."""
        state = self.states[job]
        span = time_span(batch)
        if span is not None:
            if state.origin is None:
                state.origin = span[0] - 1
            t0 = time.perf_counter()
            windows = cut(batch, self._window_ns, state.origin, horizon)
            self.stats.seconds["window"] += time.perf_counter() - t0
            for now, window in windows:
                merged = state.merger.push(now, window)
                if merged is not None:
                    self._analyse(job, state, *merged)
        rest = {k: t for k, t in batch.items() if k not in TIME_COLUMN}
        if rest:
            self._update_window(job, state, rest)
        if state.whatif is not None:
            self._whatif(job, state, batch)

    def _analyse(self, job: str, state: JobState, now: int, batch: EventBatch) -> None:
        self._update_window(job, state, batch)
        self.tick(job, state, now, windowed=True)

    def _end_post_mortem(self, job: str, state: JobState) -> None:
        """The trace was a post-mortem snapshot and all of it was analysed: one last tick
        past the hang ceiling, as ``failslow analyze`` gives such a trace
        (:meth:`~failslow.engine.analyzer.JobAnalyzer.end_post_mortem`); the job's time
        stops there."""
        assert state.post_mortem is not None
        self.flush(job, state)
        end = getattr(state.analyzer, "end_post_mortem", None)
        state.ended = True
        if callable(end):
            self._collect(job, state, end(max(state.post_mortem, state.watermark)))

    def flush(self, job: str, state: JobState) -> None:
        """Analyse the job's merged windows now (the input is drained, or time went on)."""
        merged = state.merger.flush()
        if merged is not None:
            self._analyse(job, state, *merged)

    def _update_window(self, job: str, state: JobState, batch: EventBatch) -> None:
        advanced = False
        previous = state.watermark
        for kind, table in batch.items():
            column = TIME_COLUMN.get(kind)
            if column and table.num_rows:
                top = pc.max(table.column(column)).as_py()
                if top is not None and top > state.watermark:
                    state.watermark = int(top)
                    advanced = True
        if advanced:
            now = time.monotonic_ns()
            if state.advanced and previous != events.NULL_TIME:
                wall = now - state.advanced
                decay = 0.5 ** (wall / PACE_HALF_LIFE_NS)
                state.pace_event = state.pace_event * decay + (state.watermark - previous)
                state.pace_wall = state.pace_wall * decay + wall
            state.advanced = now
        analyzed = {k: t for k, t in batch.items() if k in self._kinds}
        t0 = time.perf_counter()
        try:
            out = state.analyzer.update(analyzed) if analyzed else None
        except Exception:
            if self.config.strict:
                raise
            self.stats.errors += 1
            log.exception("analyzer of job %s failed on a batch", job)
            out = None
        finally:
            self.stats.seconds["analyze"] += time.perf_counter() - t0
        self._collect(job, state, out)

    def _whatif(self, job: str, state: JobState, batch: EventBatch) -> None:
        assert state.whatif is not None
        t1 = time.perf_counter()
        try:
            result = state.whatif.update(batch)
        except Exception:  # noqa: BLE001 - optional analysis
            if self.config.strict:
                raise
            self.stats.errors += 1
            log.exception("what-if analysis of job %s failed", job)
            result = None
        self.stats.seconds["whatif"] += time.perf_counter() - t1
        if result is not None:
            step = last_step(result, state.watermark)
            self._parts[state.partition].whatif.append(
                (job, step, state.watermark, result, time.time_ns()))
            self.stats.whatif_results += 1
            state.dirty = True

    # ----------------------------------------------------------------------------- time

    def now(self, state: JobState) -> int | None:
        """The job's time by the configured clock (None: none yet)."""
        clock = self.config.clock
        if clock == "event":
            return None if state.watermark == events.NULL_TIME else state.watermark
        if clock == "system":
            return time.time_ns()
        if clock == "wall":
            if state.watermark == events.NULL_TIME:
                return None
            idle = self._idle_since.get(state.partition)
            if idle is None:  # input may be waiting: event time only
                return state.watermark
            since = max(state.seen, state.advanced, idle)
            silence = time.monotonic_ns() - since - self._grace_ns
            if silence <= 0 or state.pace_wall < MIN_PACE_WALL_NS:
                return state.watermark
            pace = state.pace_event / state.pace_wall
            return state.watermark + int(silence / max(1.0, pace))
        assert callable(clock)
        return int(clock())

    def tick_all(self, drained: bool = False) -> None:
        """Tick every job at its clock's time. Windows held for merging are analysed first
        when the job's time went past its data (silence) or the input is ``drained``;
        otherwise the tick waits for them (a tick must not run ahead of held data)."""
        for job, state in list(self.states.items()):
            if drained:
                self.flush(job, state)
            now = self.now(state)
            if now is None:
                continue
            if state.merger.pending:
                if now < max(state.watermark, state.merger.now):
                    continue  # held windows are newer than the job's time: wait for them
                self.flush(job, state)
            self.tick(job, state, now)

    def tick(self, job: str, state: JobState, now: int, windowed: bool = False) -> None:
        """``on_tick(now)`` unless the job's time did not move on (enough). ``windowed``:
        the end of an event-time window (only with the event and wall clocks)."""
        if state.ended or (windowed and self.config.clock not in ("event", "wall")):
            return
        if now <= state.last_tick or (state.last_tick != events.NULL_TIME
                                      and now - state.last_tick < self.config.tick_interval_ns):
            return
        state.last_tick = now
        t0 = time.perf_counter()
        try:
            out = state.analyzer.on_tick(now)
        except Exception:
            if self.config.strict:
                raise
            self.stats.errors += 1
            log.exception("analyzer of job %s failed on tick %d", job, now)
            return
        finally:
            self.stats.seconds["tick"] += time.perf_counter() - t0
        self._collect(job, state, out)

    # ----------------------------------------------------------------------------- output

    def _collect(self, job: str, state: JobState, out: Any) -> None:
        if out is None:
            return
        part = self._parts[state.partition]
        found = out if isinstance(out, list) else list(getattr(out, "anomalies", None) or [])
        for name in ("rounds", "iterations"):
            table = None if isinstance(out, list) else getattr(out, name, None)
            if table is not None and table.num_rows:
                part.out[name].append(select_schema(table, results.SCHEMAS[name]))
                part.rows += table.num_rows
                state.dirty = True
                if name in self.config.exports:
                    part.exported.append((job, name, with_emit_time(name, table,
                                                                    state.watermark)))
        evidence = None if isinstance(out, list) else getattr(out, "evidence", None)
        if evidence is not None and evidence.num_rows and "evidence" in self.config.exports:
            part.exported.append((job, "evidence", with_emit_time("evidence", evidence,
                                                                  state.watermark)))
        now = time.time_ns()
        for anomaly in found:
            base = state.watermark if state.watermark != events.NULL_TIME else 0
            state.version = max(state.version + 1, base)
            state.anomalies[anomaly.id] = anomaly
            part.reports.append(AnomalyReport(job, anomaly, state.version, now))
            self.stats.anomaly_reports += 1
            state.dirty = True
        advice = None if isinstance(out, list) else getattr(out, "advice", None)
        if advice:
            part.advice.extend(advice)
            self.stats.advice += len(advice)
        asks = None if isinstance(out, list) else getattr(out, "probe_requests", None)
        if asks:
            part.probe_requests.extend(asks)

    def export_messages(self, part: Partition) -> None:
        """The messages of ``part``'s exported tables for its next checkpoint: per job and
        table, the rows derived since the last one and a watermark below the job's event
        time (a later row may be derived at that very time), also without rows, so that
        the importing stage moves on (:mod:`failslow.stream.exports`)."""
        if not self.config.exports:
            return
        rows: dict[tuple[str, str], list[pa.Table]] = {}
        for job, name, table in part.exported:
            rows.setdefault((job, name), []).append(table)
        part.exported = []
        jobs = {job for job, _ in rows} | {job for job, st in self.states.items()
                                           if st.partition == part.number}
        for job in sorted(jobs):
            st = self.states.get(job)
            tops = [int(pc.max(t.column(T_EMIT)).as_py()) for (j, _), ts in rows.items()
                    if j == job for t in ts]
            wm = events.NULL_TIME
            if st is not None and st.watermark != events.NULL_TIME:
                wm = st.watermark - 1
            if tops:
                wm = max(wm, max(tops) - 1)
            last = st.export_wm if st is not None else events.NULL_TIME
            if wm <= last and not tops:
                continue
            wm = max(wm, last)
            for name in sorted(self.config.exports):
                parts = rows.get((job, name))
                table = concat_tables(parts) if parts else with_emit_time(
                    name, SCHEMAS[name].empty_table(), 0)
                # messages of bounded rows and bytes: only the last one moves
                # the watermark on (the importer must not go past rows still to come)
                n = min(EXPORT_MESSAGE_ROWS, message_rows(table))
                starts = range(0, max(table.num_rows, 1), n)
                for i in starts:
                    part.exports.append((job, name, table.slice(i, n),
                                         wm if i == starts[-1] else last))
            if st is not None:
                st.export_wm = wm

    def diagnosis_rows(self, parts: list[Partition]) -> None:
        """A ``diagnoses`` row for every job of ``parts`` whose summary changed."""
        numbers = {p.number for p in parts}
        rows = []
        for job, state in self.states.items():
            if not state.dirty or state.partition not in numbers:
                continue
            state.dirty = False
            if not getattr(state.analyzer, "tracks_iterations", True):
                # the summary comes from the consumer group that tracks the iterations
                continue
            try:
                summary = state.analyzer.diagnosis().iterations
            except Exception:  # noqa: BLE001 - the summary is optional
                log.exception("diagnosis of job %s failed", job)
                continue
            base = state.watermark if state.watermark != events.NULL_TIME else 0
            state.diag_version = max(state.diag_version + 1, base)
            rows.append((state.partition, job, state.diag_version, summary,
                         len(state.anomalies)))
        for number, job, version, summary, count in rows:
            self._parts[number].out["diagnoses"].append(
                diagnoses_table([(job, version, summary, count, time.time_ns())]))

    # ----------------------------------------------------------------------------- state

    def state_of(self, st: JobState) -> dict[str, Any]:
        """The job's detection state, JSON-friendly when its analyzers' snapshots are."""
        snap = getattr(st.analyzer, "snapshot", None)
        whatif_snap = getattr(st.whatif, "snapshot", None) if st.whatif is not None else None
        held = _encoded(st.held)
        merger = st.merger
        return {"meta": st.meta.to_row(), "partition": st.partition,
                "watermark": st.watermark, "last_tick": st.last_tick,
                "held": held, "kind_wm": dict(st.kind_wm), "origin": st.origin,
                "source_wm": {k: [[s, w] for s, w in sorted(m.items())]
                              for k, m in st.source_wm.items()},
                "post_mortem": st.post_mortem, "ended": st.ended,
                "merged": {"tables": _encoded(merger.pending), "first": merger.first,
                           "now": merger.now},
                "version": st.version, "diag_version": st.diag_version,
                "anomalies": [a.to_dict() for a in st.anomalies.values()],
                "analyzer": snap() if callable(snap) else None,
                "whatif": whatif_snap() if callable(whatif_snap) else None}

    def restore(self, job: str, d: Mapping[str, Any], partition: int | None = None
                ) -> JobState:
        """Recreate the job of :meth:`state_of` (analyzers from the factories, then their
        ``restore``); returns it."""
        meta = events.parse_meta_row(d["meta"], "snapshot")
        analyzer = self.analyzer_factory(meta)
        restore = getattr(analyzer, "restore", None)
        if d.get("analyzer") is not None and callable(restore):
            restore(d["analyzer"])
        whatif = self.whatif_factory(meta) if self.whatif_factory else None
        w_restore = getattr(whatif, "restore", None)
        if whatif is not None and d.get("whatif") is not None and callable(w_restore):
            try:
                w_restore(d["whatif"])
            except Exception:  # noqa: BLE001 - start the what-if analysis afresh
                log.exception("cannot restore the what-if state of job %s", job)
        number = int(d.get("partition", 0)) if partition is None else partition
        now = time.monotonic_ns()
        st = self.states[job] = JobState(
            meta, analyzer, number, watermark=int(d["watermark"]), advanced=now,
            last_tick=int(d["last_tick"]), seen=now, version=int(d.get("version", 0)),
            diag_version=int(d.get("diag_version", 0)),
            anomalies={a["id"]: Anomaly.from_dict(a) for a in d["anomalies"]}, whatif=whatif,
            kind_wm={str(k): int(v) for k, v in d.get("kind_wm", {}).items()},
            kind_seen={str(k): now for k in d.get("kind_wm", {})},
            origin=None if d.get("origin") is None else int(d["origin"]),
            post_mortem=None if d.get("post_mortem") is None else int(d["post_mortem"]),
            ended=bool(d.get("ended", False)),
            source_wm={str(k): {int(s): int(w) for s, w in m}
                       for k, m in (d.get("source_wm") or {}).items()},
            merger=self._merger())
        st.held = _decoded(d.get("held", {}))
        st.held_rows = sum(t.num_rows for parts in st.held.values() for t in parts)
        merged = d.get("merged")
        if merged:
            st.merger.pending = _decoded(merged["tables"])
            st.merger.rows = sum(t.num_rows for parts in st.merger.pending.values()
                                 for t in parts)
            st.merger.first, st.merger.now = int(merged["first"]), int(merged["now"])
        self.stats.jobs = len(self.states)
        return st


def _encoded(tables: Mapping[str, list[pa.Table]]) -> dict[str, str]:
    """Held tables by kind as base64 Arrow IPC (zstd), for a JSON snapshot."""
    return {k: base64.b64encode(_ipc(k, concat_tables(parts))).decode()
            for k, parts in tables.items() if parts}


def _ipc(kind: str, table: pa.Table) -> bytes:
    """An event table as its messages carry it; an imported derived table as it is."""
    return encode(kind, table, "zstd") if kind in events.KINDS \
        else one_batch_stream(table, "zstd")


def _decoded(encoded: Mapping[str, str]) -> dict[str, list[pa.Table]]:
    out: dict[str, list[pa.Table]] = {}
    for kind, text in encoded.items():
        table = ipc.open_stream(pa.BufferReader(base64.b64decode(text))).read_all()
        if table.num_rows:
            out[kind] = [table]
    return out
