"""The stream processor: messages in, detector results out.

A single-threaded consume loop in the shape of a checkpointing stream processor: poll a
batch of messages, decode and validate each (a bad one goes to the dead-letter topic with its
reason and is counted; the loop goes on), feed every job's records to that job's
:class:`~failslow.detectors.job.JobAnalyzer` (created from the job's ``meta`` message;
records that arrive before it wait in a bounded buffer), let time pass with
``on_tick(now)`` (hangs show up as the absence of events), and at each checkpoint write the
raw events plus the derived ``rounds``, ``iterations`` and anomaly reports to the sink,
publish the reports on ``failslow.anomalies``, and only then commit the input offsets
(at-least-once). A sink that raises :class:`~failslow.stream.sink.SinkBackpressureError`
pauses consumption: the same batch is offered again after the requested delay.

The clock is injectable: wall time in production (``clock="wall"``), per-job event time
(the largest event time seen, ``clock="event"``) for replays, demos and tests, or any
callable returning nanoseconds.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from failslow import events, results
from failslow.detectors.base import EventBatch
from failslow.diagnosis import Anomaly, Diagnosis
from failslow.events import ContractError, JobMeta
from failslow.replay import TIME_COLUMN
from failslow.stream.sink import (
    AnomalyReport,
    Sink,
    SinkBackpressureError,
    SinkBatch,
    anomalies_table,
    concat,
    select_schema,
)
from failslow.stream.transport import (
    ANOMALIES_TOPIC,
    DEADLETTER_TOPIC,
    H_ERROR,
    H_ERROR_CLASS,
    H_SOURCE_OFFSET,
    H_SOURCE_PARTITION,
    H_SOURCE_TOPIC,
    DecodeError,
    Message,
    Transport,
    decode,
    encode_anomaly,
)

log = logging.getLogger(__name__)


class Analyzer(Protocol):
    """What the processor needs of a per-job analyzer (failslow.detectors.job.JobAnalyzer).
    ``update``/``on_tick`` return an object with ``anomalies`` and optionally ``rounds`` and
    ``iterations`` tables, or a plain list of anomalies (the Detector protocol)."""

    def update(self, batch: EventBatch) -> Any: ...

    def on_tick(self, now_ns: int) -> Any: ...

    def diagnosis(self) -> Diagnosis: ...


AnalyzerFactory = Callable[[JobMeta], Analyzer]
Clock = Callable[[], int]


def default_analyzer(meta: JobMeta) -> Analyzer:
    """A :class:`failslow.detectors.job.JobAnalyzer` for ``meta``."""
    from failslow.detectors.job import JobAnalyzer

    analyzer: Analyzer = JobAnalyzer(meta)
    return analyzer


class SinkError(RuntimeError):
    """The sink kept failing; nothing of the current checkpoint was committed."""


@dataclass
class ProcessorStats:
    """Counters of one processor."""

    polls: int = 0
    messages: int = 0  # decoded event messages
    rows: Counter[str] = field(default_factory=Counter)  # decoded rows per kind
    dead_letters: int = 0
    dead_letter_reasons: Counter[str] = field(default_factory=Counter)
    errors: int = 0  # analyzer failures (the batch is skipped for detection, still stored)
    anomaly_reports: int = 0
    checkpoints: int = 0
    sink_writes: int = 0
    rows_written: Counter[str] = field(default_factory=Counter)
    backpressure: int = 0
    sink_failures: int = 0
    jobs: int = 0
    pending_messages: int = 0  # waiting for their job's meta

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        for key in ("rows", "dead_letter_reasons", "rows_written"):
            d[key] = dict(d[key])
        return d


@dataclass
class _Job:
    meta: JobMeta
    analyzer: Analyzer
    watermark: int = events.NULL_TIME  # largest event time seen
    last_tick: int = events.NULL_TIME
    anomalies: dict[str, Anomaly] = field(default_factory=dict)  # latest report per id


class StreamProcessor:
    """Consumes event messages from ``transport`` and writes results to ``sink``.

    Parameters: ``analyzer_factory`` builds the per-job analyzer from its meta (default
    :func:`default_analyzer`);
    ``clock`` is ``"wall"``, ``"event"`` or a callable returning ns; ``tick_interval_ns`` is
    the least clock advance between two ``on_tick`` calls of a job; a checkpoint happens
    after ``checkpoint_messages`` messages or ``checkpoint_interval_s`` seconds, and at the
    end of :meth:`run`; ``store_events`` also writes the raw event tables to the sink;
    ``strict`` re-raises analyzer failures instead of counting them.
    """

    def __init__(self, transport: Transport, sink: Sink | None = None, *,
                 analyzer_factory: AnalyzerFactory | None = None,
                 clock: Clock | str = "wall", tick_interval_ns: int = 0,
                 max_messages: int = 256, poll_timeout: float = 0.5,
                 checkpoint_messages: int = 1000, checkpoint_interval_s: float = 5.0,
                 store_events: bool = True, max_pending_messages: int = 10_000,
                 max_sink_attempts: int = 5, max_backpressure_retries: int = 1000,
                 sleep: Callable[[float], None] = time.sleep, strict: bool = False) -> None:
        if isinstance(clock, str) and clock not in ("wall", "event"):
            raise ValueError("clock must be 'wall', 'event' or a callable")
        self.transport = transport
        self.sink = sink
        self.stats = ProcessorStats()
        self._factory = analyzer_factory or default_analyzer
        self._clock = clock
        self._tick_interval = tick_interval_ns
        self._max_messages = max_messages
        self._poll_timeout = poll_timeout
        self._checkpoint_messages = checkpoint_messages
        self._checkpoint_interval = checkpoint_interval_s
        self._store_events = store_events
        self._max_pending = max_pending_messages
        self._max_sink_attempts = max_sink_attempts
        self._max_backpressure = max_backpressure_retries
        self._sleep = sleep
        self._strict = strict
        self._id = uuid.uuid4().hex[:12]
        self._jobs: dict[str, _Job] = {}
        self._pending: dict[str, list[tuple[str, pa.Table]]] = defaultdict(list)
        self._out: dict[str, list[pa.Table]] = defaultdict(list)
        self._reports: list[AnomalyReport] = []
        # (topic, partition) -> (first, last) uncommitted offsets
        self._ranges: dict[tuple[str, int], tuple[int, int]] = {}
        self._uncommitted = 0
        self._last_checkpoint = time.monotonic()
        self._version = 0
        self._running = False

    # ----------------------------------------------------------------------------- public

    def run(self, until_idle: bool = True, max_polls: int | None = None) -> ProcessorStats:
        """Consume until the transport is idle (``until_idle``), :meth:`stop` is called or
        ``max_polls`` polls were made; then checkpoint."""
        self._running = True
        polls = 0
        try:
            while self._running and (max_polls is None or polls < max_polls):
                n = self.step(timeout=0.0 if until_idle else self._poll_timeout)
                polls += 1
                if n == 0 and until_idle:
                    break
        finally:
            self._running = False
        self.checkpoint()
        return self.stats

    def stop(self) -> None:
        """Ask :meth:`run` to return after the current poll."""
        self._running = False

    def step(self, timeout: float = 0.0) -> int:
        """One poll: process its messages, tick every job, checkpoint when due. Returns the
        number of messages polled."""
        messages = self.transport.poll(self._max_messages, timeout)
        self.stats.polls += 1
        by_job: dict[str, dict[str, list[pa.Table]]] = {}
        for message in messages:
            self._note(message)
            try:
                kind, table = decode(message)
            except DecodeError as e:
                self._dead_letter(message, e.reason_class, str(e))
                continue
            self.stats.messages += 1
            self.stats.rows[kind] += table.num_rows
            if self._store_events and table.num_rows:
                self._out[kind].append(select_schema(table, events.SCHEMAS[kind]))
            if kind == "meta":
                self._on_meta(message, table)
            elif message.key in self._jobs:
                by_job.setdefault(message.key, {}).setdefault(kind, []).append(table)
            elif len(self._pending[message.key]) < self._max_pending:
                self._pending[message.key].append((kind, table))
                self.stats.pending_messages += 1
            else:
                self._dead_letter(message, "no_meta",
                                  f"no meta message for job {message.key!r} after "
                                  f"{self._max_pending} messages")
        for job, kinds in by_job.items():
            self._update(job, {k: _concat(v) for k, v in kinds.items()})
        self._tick_all()
        if self._checkpoint_due():
            self.checkpoint()
        return len(messages)

    def checkpoint(self) -> None:
        """Write everything collected since the last checkpoint, publish the anomaly reports,
        then commit the input offsets."""
        tables = concat(self._out)
        reports = self._reports
        if reports:
            tables["anomalies"] = anomalies_table(reports)
        if not tables and not self._uncommitted:
            return
        batch = SinkBatch(tables, token=self._token())
        if self.sink is not None and tables:
            self._write(batch)
        for r in reports:
            value, headers = encode_anomaly(r.job, r.anomaly, r.version)
            self.transport.produce(ANOMALIES_TOPIC, r.job, value, headers)
        self.transport.commit()
        self.stats.checkpoints += 1
        self._out = defaultdict(list)
        self._reports = []
        self._ranges = {}
        self._uncommitted = 0
        self._last_checkpoint = time.monotonic()

    def jobs(self) -> list[str]:
        return list(self._jobs)

    def meta(self, job: str) -> JobMeta:
        return self._jobs[job].meta

    def analyzer(self, job: str) -> Analyzer:
        return self._jobs[job].analyzer

    def anomalies(self, job: str) -> list[Anomaly]:
        """The latest report of each anomaly of ``job`` seen by this processor."""
        return list(self._jobs[job].anomalies.values())

    def diagnosis(self, job: str) -> Diagnosis:
        return self._jobs[job].analyzer.diagnosis()

    def snapshot(self) -> dict[str, Any]:
        """Detection state of every job (JSON-friendly when the analyzers' snapshots are):
        take it right after :meth:`checkpoint`, so that it matches the committed offsets."""
        jobs = {}
        for job, st in self._jobs.items():
            snap = getattr(st.analyzer, "snapshot", None)
            jobs[job] = {"meta": st.meta.to_row(), "watermark": st.watermark,
                         "last_tick": st.last_tick,
                         "anomalies": [a.to_dict() for a in st.anomalies.values()],
                         "analyzer": snap() if callable(snap) else None}
        return {"version": 1, "report_version": self._version, "jobs": jobs}

    def restore(self, state: dict[str, Any]) -> None:
        """Recreate the jobs of :meth:`snapshot` (analyzers from the factory, then their
        ``restore``), replacing the current ones."""
        if state.get("version") != 1:
            raise ValueError(f"unsupported processor snapshot version {state.get('version')!r}")
        self._jobs = {}
        for job, d in state["jobs"].items():
            meta = events.parse_meta_row(d["meta"], "snapshot")
            analyzer = self._factory(meta)
            restore = getattr(analyzer, "restore", None)
            if d.get("analyzer") is not None and callable(restore):
                restore(d["analyzer"])
            self._jobs[job] = _Job(meta, analyzer, int(d["watermark"]), int(d["last_tick"]),
                                   {a["id"]: Anomaly.from_dict(a) for a in d["anomalies"]})
        self.stats.jobs = len(self._jobs)
        self._version = max(self._version, int(state.get("report_version", 0)))

    def close(self) -> None:
        """Checkpoint and close the sink (the transport belongs to the caller)."""
        self.checkpoint()
        if self.sink is not None:
            self.sink.close()

    # ----------------------------------------------------------------------------- internals

    def _note(self, message: Message) -> None:
        key = (message.topic, message.partition)
        first, _ = self._ranges.get(key, (message.offset, message.offset))
        self._ranges[key] = (first, message.offset)
        self._uncommitted += 1

    def _token(self) -> str:
        """Identifies the input of this checkpoint: the same when the same batch is retried,
        different for any other batch (the processor id keeps runs apart)."""
        if not self._ranges:
            return ""
        ranges = ",".join(f"{t}/{p}:{a}-{b}" for (t, p), (a, b) in sorted(self._ranges.items()))
        return f"{self._id}|{ranges}"

    def _dead_letter(self, message: Message, reason_class: str, reason: str) -> None:
        headers = dict(message.headers)
        headers.update({H_ERROR: reason[:1000], H_ERROR_CLASS: reason_class,
                        H_SOURCE_TOPIC: message.topic, H_SOURCE_OFFSET: str(message.offset),
                        H_SOURCE_PARTITION: str(message.partition)})
        self.transport.produce(DEADLETTER_TOPIC, message.key, message.value, headers)
        self.stats.dead_letters += 1
        self.stats.dead_letter_reasons[reason_class] += 1
        log.warning("dead letter from %s@%d: %s", message.topic, message.offset, reason)

    def _on_meta(self, message: Message, table: pa.Table) -> None:
        for i, row in enumerate(table.to_pylist()):
            try:
                meta = events.parse_meta_row(row, f"{message.topic}@{message.offset}", i)
            except ContractError as e:
                self._dead_letter(message, "contract", str(e))
                return
            if meta.job in self._jobs:
                self._jobs[meta.job].meta = meta  # a newer description; topology kept
                continue
            try:
                analyzer = self._factory(meta)
            except Exception as e:
                if self._strict:
                    raise
                self.stats.errors += 1
                log.exception("cannot create the analyzer of job %s", meta.job)
                self._dead_letter(message, "analyzer", f"cannot create analyzer: {e}")
                return
            self._jobs[meta.job] = _Job(meta, analyzer)
            self.stats.jobs += 1
            pending = self._pending.pop(meta.job, [])
            if pending:
                self.stats.pending_messages -= len(pending)
                kinds: dict[str, list[pa.Table]] = {}
                for kind, t in pending:
                    kinds.setdefault(kind, []).append(t)
                self._update(meta.job, {k: _concat(v) for k, v in kinds.items()})

    def _update(self, job: str, batch: EventBatch) -> None:
        state = self._jobs[job]
        for kind, table in batch.items():
            column = TIME_COLUMN.get(kind)
            if column and table.num_rows:
                top = pc.max(table.column(column)).as_py()
                if top is not None and top > state.watermark:
                    state.watermark = int(top)
        try:
            out = state.analyzer.update(batch)
        except Exception:
            if self._strict:
                raise
            self.stats.errors += 1
            log.exception("analyzer of job %s failed on a batch", job)
            return
        self._collect(job, state, out)

    def _now(self, state: _Job) -> int | None:
        if self._clock == "event":
            return None if state.watermark == events.NULL_TIME else state.watermark
        if self._clock == "wall":
            return time.time_ns()
        assert callable(self._clock)
        return int(self._clock())

    def _tick_all(self) -> None:
        for job, state in self._jobs.items():
            now = self._now(state)
            if now is None or now <= state.last_tick or (
                    state.last_tick != events.NULL_TIME
                    and now - state.last_tick < self._tick_interval):
                continue
            state.last_tick = now
            try:
                out = state.analyzer.on_tick(now)
            except Exception:
                if self._strict:
                    raise
                self.stats.errors += 1
                log.exception("analyzer of job %s failed on tick %d", job, now)
                continue
            self._collect(job, state, out)

    def _collect(self, job: str, state: _Job, out: Any) -> None:
        if out is None:
            return
        found = out if isinstance(out, list) else list(getattr(out, "anomalies", None) or [])
        for name in ("rounds", "iterations"):
            table = None if isinstance(out, list) else getattr(out, name, None)
            if table is not None and table.num_rows:
                self._out[name].append(select_schema(table, results.SCHEMAS[name]))
        now = time.time_ns()
        for anomaly in found:
            self._version = max(self._version + 1, now)
            state.anomalies[anomaly.id] = anomaly
            self._reports.append(AnomalyReport(job, anomaly, self._version, now))
            self.stats.anomaly_reports += 1

    def _checkpoint_due(self) -> bool:
        if self._uncommitted >= self._checkpoint_messages:
            return True
        return bool(self._uncommitted) and (
            time.monotonic() - self._last_checkpoint >= self._checkpoint_interval)

    def _write(self, batch: SinkBatch) -> None:
        assert self.sink is not None
        failures = pressure = 0
        while True:
            try:
                self.sink.write(batch)
            except SinkBackpressureError as e:
                pressure += 1
                self.stats.backpressure += 1
                if pressure > self._max_backpressure:
                    raise SinkError(f"sink still busy after {pressure} retries") from e
                log.info("sink back-pressure: pausing %.3g s", e.retry_after)
                self._sleep(e.retry_after)
                continue
            except Exception as e:
                failures += 1
                self.stats.sink_failures += 1
                if failures >= self._max_sink_attempts:
                    raise SinkError(f"sink failed {failures} times: {e}") from e
                log.warning("sink write failed (%s); retrying", e)
                self._sleep(min(0.1 * 2 ** failures, 5.0))
                continue
            break
        self.stats.sink_writes += 1
        for name, table in batch.tables.items():
            self.stats.rows_written[name] += table.num_rows


def _concat(tables: list[pa.Table]) -> pa.Table:
    if len(tables) == 1:
        return tables[0]
    return pa.concat_tables(tables, promote_options="permissive")
