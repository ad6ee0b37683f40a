"""The stream processor: messages in, detector results out (README, Architecture; issue 6).

A single-threaded consume loop in the shape of a checkpointing stream processor:

1. poll a batch of messages; decode and validate each (a bad one goes to the dead-letter
   topic with its reason and is counted; the loop goes on);
2. feed every job's records to that job's :class:`~failslow.detectors.job.JobAnalyzer`
   (created from the job's ``meta`` message; records that arrive before it wait in a bounded
   buffer) and, when a what-if factory is given, to its what-if analyzer. Records go in
   windows of 100 ms of event time with a tick at each window's end, as ``failslow
   analyze`` replays a trace, so both give the same diagnosis. Kafka fetches the topics of
   the record kinds independently, so a job's records are held until every kind it sends
   has arrived up to a time (producers may say so with a ``failslow-watermark`` header, as
   ``failslow replay`` does; a kind silent while its partition is read to the end stops
   counting after ``align_idle_s``), and released in time order;
3. let time pass with ``on_tick(now)``: hangs show up as the absence of events;
4. at each checkpoint: log the cut (the offset range of every topic and partition the
   checkpoint covers) in the state store, write the raw events, the derived ``rounds``,
   ``iterations``, the anomaly reports, the mitigation advice (Greyhound §5.1: the job
   analyzer's planner), what-if results and ``diagnoses`` rows to the sink (one write per
   partition, with a deduplication token derived from its cut), publish the reports on
   ``failslow.anomalies`` and the advice on ``failslow.advice``, and only then commit the
   input offsets (at-least-once);
5. every ``snapshot_interval_s`` (and when a partition is revoked, and at shutdown) save the
   detector state of each partition's jobs with the offsets it corresponds to.

A restarted processor (or the one a partition moves to) restores the partition's snapshot,
seeks to its offsets and re-reads the input, cutting it exactly at the logged cuts: every
re-written batch carries the token of its first write, so the store drops it, and reports
of cuts that were committed are not published again (:mod:`failslow.stream.state`). So a
crash loses nothing, stores nothing twice, does not relearn baselines and does not report
an anomaly again.

A sink (or state store) that raises :class:`~failslow.stream.sink.SinkBackpressureError`
pauses consumption (the consumer keeps polling, paused, to stay in its group); the same
batch is offered again after an exponentially growing delay, without limit by default.

The clock is injectable. ``"wall"`` (production): a job's time is its largest event time,
advanced by the silence since its last message, once the processor has read the job's
partition to its end and a grace period (5 s: producers reconnecting after a broker outage,
a stalled collector) has passed, scaled down by the stream's pace (event
time per wall time, when above 1): a live job's silence counts in full, a backlog or a
replay at 10x does not make a stall of the producer look like a hang, and a stream that
stops does. ``"event"``: the largest event time seen (replays, demos, tests).
``"system"``: the host clock. Or any callable returning nanoseconds.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import time
import uuid
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from failslow import events, results
from failslow.detectors.base import EventBatch
from failslow.diagnosis import Anomaly, Diagnosis
from failslow.events import ContractError, JobMeta
from failslow.mitigation.planner import Advice, advice_table
from failslow.replay import DEFAULT_WINDOW_NS, TIME_COLUMN
from failslow.stream.sink import (
    ADVICE_TOPIC,
    AnomalyReport,
    Sink,
    SinkBackpressureError,
    SinkBatch,
    anomalies_table,
    concat,
    diagnoses_table,
    encode_advice,
    select_schema,
    whatif_table,
)
from failslow.stream.state import Cut, PartitionSnapshot, StateStore
from failslow.stream.transport import (
    ANOMALIES_TOPIC,
    DEADLETTER_TOPIC,
    H_ERROR,
    H_ERROR_CLASS,
    H_SOURCE_OFFSET,
    H_SOURCE_PARTITION,
    H_SOURCE_TOPIC,
    H_WATERMARK,
    DecodeError,
    Message,
    Transport,
    decode,
    encode,
    encode_anomaly,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Record kinds the detectors read (what ``failslow analyze`` feeds them).
ANALYZER_KINDS = ("coll", "progress", "link", "span")
STATE_VERSION = 2
#: ``run(idle_timeout=...)`` waits at least this long for a first partition assignment.
UNASSIGNED_WAIT_S = 60.0
#: The stream's pace (event time per wall time) is a decaying average with this half-life,
#: known once this much wall time was seen.
PACE_HALF_LIFE_NS = 10_000_000_000
MIN_PACE_WALL_NS = 2_000_000_000


class Analyzer(Protocol):
    """What the processor needs of a per-job analyzer (failslow.detectors.job.JobAnalyzer).
    ``update``/``on_tick`` return an object with ``anomalies`` and optionally ``rounds`` and
    ``iterations`` tables, or a plain list of anomalies (the Detector protocol)."""

    def update(self, batch: EventBatch) -> Any: ...

    def on_tick(self, now_ns: int) -> Any: ...

    def diagnosis(self) -> Diagnosis: ...


class WhatIf(Protocol):
    """What the processor needs of a what-if analyzer (failslow.whatif.analysis
    .WhatIfAnalyzer): ``update`` returns the new diagnosis ``whatif`` object when it was
    recomputed, else None."""

    def update(self, batch: EventBatch) -> dict[str, Any] | None: ...


AnalyzerFactory = Callable[[JobMeta], Analyzer]
WhatIfFactory = Callable[[JobMeta], WhatIf | None]
Clock = Callable[[], int]


def default_analyzer(meta: JobMeta) -> Analyzer:
    """A :class:`failslow.detectors.job.JobAnalyzer` for ``meta``; its mitigation planner's
    action costs come from ``$FAILSLOW_PLANNER_COSTS`` (e.g. ``S2=5,S3=60,S4=1800``)."""
    from failslow.detectors.job import JobAnalyzer, JobConfig
    from failslow.mitigation.planner import PlannerConfig

    analyzer: Analyzer = JobAnalyzer(meta, JobConfig(planner=PlannerConfig.from_env()))
    return analyzer


def default_whatif(meta: JobMeta) -> WhatIf | None:
    """A :class:`failslow.whatif.analysis.WhatIfAnalyzer` for ``meta``, or None when that
    module is not installed or refuses the job."""
    try:
        from failslow.whatif.analysis import WhatIfAnalyzer
    except ImportError:
        return None
    try:
        analyzer: WhatIf = WhatIfAnalyzer(meta)
    except Exception as e:  # noqa: BLE001 - what-if is optional; detection goes on
        log.warning("no what-if analysis for job %s: %s", meta.job, e)
        return None
    return analyzer


class SinkError(RuntimeError):
    """The sink kept failing; nothing of the current checkpoint was committed."""


class Stopped(RuntimeError):
    """:meth:`StreamProcessor.stop` was called while the processor waited for its sink."""


@dataclass
class ProcessorStats:
    """Counters of one processor (exported as Prometheus metrics by
    :mod:`failslow.stream.metrics`)."""

    polls: int = 0
    messages: int = 0  # decoded event messages
    rows: Counter[str] = field(default_factory=Counter)  # decoded rows per kind
    dead_letters: int = 0
    dead_letter_reasons: Counter[str] = field(default_factory=Counter)
    errors: int = 0  # analyzer failures (the batch is skipped for detection, still stored)
    anomaly_reports: int = 0
    anomalies_published: int = 0
    advice: int = 0  # mitigation advice made (planner decisions)
    advice_published: int = 0
    whatif_results: int = 0
    checkpoints: int = 0
    sink_writes: int = 0
    rows_written: Counter[str] = field(default_factory=Counter)
    backpressure: int = 0
    sink_failures: int = 0
    paused: int = 0  # 1 while consumption is paused for the sink
    paused_seconds: float = 0.0
    jobs: int = 0
    pending_messages: int = 0  # waiting for their job's meta
    snapshots: int = 0
    snapshot_bytes: int = 0
    restored_jobs: int = 0
    replayed_cuts: int = 0  # logged cuts re-cut after a restart
    deferred_messages: int = 0
    lag: int | None = None  # messages behind the end of the assigned partitions
    rows_per_s: float = 0.0  # decoded rows per second over the last metrics interval
    first_message_ns: int = 0  # wall time of the first message
    last_checkpoint_ns: int = 0  # wall time of the last checkpoint that wrote rows
    cpu_first_message_s: float = 0.0  # CPU time of the process (all threads) at those two
    cpu_last_checkpoint_s: float = 0.0
    # (CPU time, rows decoded) at each checkpoint that wrote rows (the last 1000)
    cpu_samples: list[tuple[float, int]] = field(default_factory=list)
    seconds: defaultdict[str, float] = field(  # time per phase
        default_factory=lambda: defaultdict(float))

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        for key in ("rows", "dead_letter_reasons", "rows_written", "seconds"):
            d[key] = dict(d[key])
        d["seconds"] = {k: round(v, 4) for k, v in d["seconds"].items()}
        return d


@dataclass
class _Job:
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
    # input held until every record kind of the job reached its time (see _horizon)
    held: dict[str, list[pa.Table]] = field(default_factory=dict)
    held_rows: int = 0
    kind_wm: dict[str, int] = field(default_factory=dict)  # kind -> event time complete
    kind_seen: dict[str, int] = field(default_factory=dict)  # kind -> monotonic ns
    first_data: int = 0  # monotonic ns of the first data message (0: none yet)


@dataclass
class _Pending:
    """A message of a job whose meta has not arrived yet."""

    message: Message
    kind: str
    table: pa.Table


@dataclass
class _Part:
    """Everything the processor keeps for one partition number."""

    number: int
    seq: int = 0  # the last logged cut
    snapshot_seq: int = 0  # the cut the last snapshot includes
    positions: dict[str, int] = field(default_factory=dict)  # topic -> next offset
    ranges: dict[str, list[int]] = field(default_factory=dict)  # since the last cut
    messages: int = 0  # since the last cut
    rows: int = 0  # buffered output rows
    out: dict[str, list[pa.Table]] = field(default_factory=lambda: defaultdict(list))
    reports: list[AnomalyReport] = field(default_factory=list)
    advice: list[Advice] = field(default_factory=list)
    whatif: list[tuple[str, int, int, dict[str, Any], int]] = field(default_factory=list)
    cuts: deque[Cut] = field(default_factory=deque)  # logged cuts to re-cut (recovery)
    done: set[int] = field(default_factory=set)  # seqs of logged cuts that were committed
    deferred: list[Message] = field(default_factory=list)  # after the next logged cut
    recovering_since: float = 0.0
    pending: dict[str, list[_Pending]] = field(default_factory=dict)
    pending_bytes: int = 0

    def has_output(self) -> bool:
        return bool(self.reports or self.advice or self.whatif or any(self.out.values()))


class StreamProcessor:
    """Consumes event messages from ``transport`` and writes results to ``sink``.

    Parameters: ``analyzer_factory`` builds the per-job analyzer from its meta (default
    :func:`default_analyzer`); ``whatif_factory`` the per-job what-if analyzer (None: no
    what-if results; :func:`default_whatif` for the real one); ``state`` keeps checkpoints
    (None: offsets are committed to the transport only; a restart then relearns the jobs);
    ``clock`` is ``"wall"``, ``"event"``, ``"system"`` or a callable returning ns;
    ``tick_interval_ns`` is the least clock advance between two ``on_tick`` calls of a job;
    a checkpoint happens after ``checkpoint_messages`` messages, ``checkpoint_rows`` buffered
    rows or ``checkpoint_interval_s`` seconds, and at the end of :meth:`run`;
    a job's records are analysed in windows of ``window_ns`` of event time, in time order
    (as ``failslow analyze`` does), once every record kind the detectors read has arrived up
    to that time (topics are consumed independently; a kind silent for ``align_idle_s`` of
    wall time does not hold the others back; a job holds at most ``max_held_rows``; ``align``
    defaults to whether the transport delivers topics out of publication order), at the
    latest when ``max_batch_rows`` rows were collected; ``store_events`` also
    writes the raw event tables (``meta`` is always written); ``detect=False`` runs no detector
    (a processor that only stores events, in its own consumer group, so that storing and
    detecting use a core each); ``strict`` re-raises analyzer
    failures instead of counting them; ``max_backpressure_retries`` (None: no limit) and
    ``max_backoff_s`` bound the waiting for a busy sink.
    """

    def __init__(self, transport: Transport, sink: Sink | None = None, *,
                 analyzer_factory: AnalyzerFactory | None = None,
                 whatif_factory: WhatIfFactory | None = None,
                 state: StateStore | None = None,
                 clock: Clock | str = "wall", tick_interval_ns: int = 0,
                 max_messages: int = 256, poll_timeout: float = 0.5,
                 checkpoint_messages: int = 1000, checkpoint_interval_s: float = 5.0,
                 checkpoint_rows: int = 4_000_000, max_batch_rows: int = 1_000_000,
                 window_ns: int = DEFAULT_WINDOW_NS, align: bool | None = None,
                 align_idle_s: float = 5.0,
                 max_held_rows: int = 8_000_000,
                 snapshot_interval_s: float = 60.0, store_events: bool = True,
                 detect: bool = True,
                 max_pending_messages: int = 10_000, max_pending_bytes: int = 256 << 20,
                 max_sink_attempts: int = 5, max_backpressure_retries: int | None = 1000,
                 max_backoff_s: float = 10.0, cut_timeout_s: float = 120.0,
                 silence_grace_s: float = 5.0,
                 metrics_interval_s: float = 5.0,
                 analyzer_kinds: Iterable[str] = ANALYZER_KINDS,
                 sleep: Callable[[float], None] | None = None, strict: bool = False) -> None:
        if isinstance(clock, str) and clock not in ("wall", "event", "system"):
            raise ValueError("clock must be 'wall', 'event', 'system' or a callable")
        self.transport = transport
        self.sink = sink
        self.state = state
        self.stats = ProcessorStats()
        self._factory = analyzer_factory or default_analyzer
        self._whatif_factory = whatif_factory
        self._clock = clock
        self._tick_interval = tick_interval_ns
        self._max_messages = max_messages
        self._poll_timeout = poll_timeout
        self._checkpoint_messages = checkpoint_messages
        self._checkpoint_interval = checkpoint_interval_s
        self._checkpoint_rows = checkpoint_rows
        self._max_batch_rows = max_batch_rows
        self._window_ns = max(1, int(window_ns))
        self._align = (not transport.ordered) if align is None else align
        self._align_idle_ns = int(align_idle_s * 1e9)
        self._max_held_rows = max_held_rows
        self._snapshot_interval = snapshot_interval_s
        self._store_events = store_events
        self._detect = detect
        self._max_pending = max_pending_messages
        self._max_pending_bytes = max_pending_bytes
        self._max_sink_attempts = max_sink_attempts
        self._max_backpressure = max_backpressure_retries
        self._max_backoff = max_backoff_s
        self._cut_timeout = cut_timeout_s
        self._grace_ns = int(silence_grace_s * 1e9)
        self._metrics_interval = metrics_interval_s
        self._analyzer_kinds = frozenset(analyzer_kinds)
        self._sleep = sleep
        self._strict = strict
        self._id = uuid.uuid4().hex[:12]
        self._jobs: dict[str, _Job] = {}
        self._parts: dict[int, _Part] = {}
        self._to_load: set[int] = set()
        self._batch_rows = 0  # rows added since the last _run_batches
        self._uncommitted = 0
        self._last_checkpoint = time.monotonic()
        self._last_snapshot = time.monotonic()
        self._snapshot_cost = 0.0
        self._idle_since: dict[int, int] = {}  # partition -> caught up since (monotonic ns)
        self._last_metrics = time.monotonic()
        self._metrics_rows = 0
        self._running = False
        self._stop_requested = False
        self._writing = False
        self._held: list[Message] = []  # polled while paused (should not happen)
        self.last_message = time.monotonic()
        transport.set_listener(self)

    # ----------------------------------------------------------------------------- public

    def run(self, until_idle: bool = True, max_polls: int | None = None,
            idle_timeout: float | None = None) -> ProcessorStats:
        """Consume until the transport is idle (``until_idle``: a poll returned nothing),
        ``idle_timeout`` seconds passed without a message, :meth:`stop` is called or
        ``max_polls`` polls were made; then checkpoint."""
        self._running = True
        self._stop_requested = False
        polls = 0
        started = time.monotonic()
        self.last_message = max(self.last_message, started)
        abandoned = drained = False
        try:
            while self._running and (max_polls is None or polls < max_polls):
                n = self.step(timeout=0.0 if until_idle else self._poll_timeout)
                polls += 1
                if n == 0 and until_idle:
                    drained = True
                    break
                # a consumer that was not given partitions yet (its group waits for a
                # crashed predecessor to time out) waits longer before giving up
                limit = None if idle_timeout is None else (
                    idle_timeout if self._parts else max(idle_timeout, UNASSIGNED_WAIT_S))
                if (limit is not None and n == 0
                        and time.monotonic() - self.last_message >= limit):
                    log.info("no message for %.1f s: stopping", limit)
                    drained = True
                    break
        except Stopped:
            abandoned = True
            log.warning("stopped while waiting for the sink: the uncommitted input will be "
                        "read again")
        finally:
            self._running = False
        if not abandoned:
            if drained:  # everything available was read: analyse all of it
                self._run_batches(force=True)
                self._tick_all()
            self.checkpoint()
        return self.stats

    def stop(self) -> None:
        """Ask :meth:`run` to return after the current poll (or wait for the sink)."""
        self._running = False
        self._stop_requested = True

    def step(self, timeout: float = 0.0) -> int:
        """One poll: process its messages, tick every job, checkpoint when due. Returns the
        number of messages polled (including those of a newly assigned partition, which are
        dropped and fetched again from where its state ends)."""
        t0 = time.perf_counter()
        polled_at = time.monotonic_ns()
        messages = self._held + self.transport.poll(self._max_messages, timeout)
        self._held = []
        self.stats.seconds["poll"] += time.perf_counter() - t0
        self.stats.polls += 1
        self._observe_idle(messages, polled_at)
        polled = len(messages)
        if self._to_load:
            messages = self._load_assigned(messages)
        if messages:
            self.last_message = time.monotonic()
            if not self.stats.first_message_ns:
                self.stats.first_message_ns = time.time_ns()
                self.stats.cpu_first_message_s = time.process_time()
        for message in messages:
            self._admit(message)
        self._run_batches()
        self._check_cut_timeouts()
        self._tick_all()
        if self._checkpoint_due():
            self.checkpoint()
        if self.state is not None and self._snapshot_due():
            self.snapshot_all()
        self._update_metrics()
        return polled

    def _observe_idle(self, messages: list[Message], polled_at: int) -> None:
        """Note which partitions this consumer has read to their end: only for those does
        the absence of new events count, as time passing (the ``"wall"`` clock) and as a
        record kind having nothing more (:meth:`_horizon`)."""
        for number in self._parts:
            try:
                caught_up = self.transport.caught_up(number)
            except Exception:  # noqa: BLE001 - unknown
                caught_up = None
            if caught_up is None:  # unknown: only a poll without its messages says so
                caught_up = not messages
            if caught_up:
                self._idle_since.setdefault(number, polled_at)
            else:
                self._idle_since.pop(number, None)

    def checkpoint(self, partitions: Iterable[int] | None = None) -> None:
        """Write everything collected since the last checkpoint (of ``partitions``, default
        all), publish the anomaly reports, then commit the input offsets."""
        self._run_batches()
        chosen = list(self._parts.values()) if partitions is None else [
            self._parts[p] for p in partitions if p in self._parts]
        # a partition still re-cutting its logged cuts writes at their ends, with their tokens
        chosen = [p for p in chosen if not p.cuts]
        self._diagnosis_rows(chosen)
        work = [p for p in chosen if p.messages or p.has_output()]
        if not work:
            return
        cuts: dict[int, Cut | None] = {}
        for part in work:
            if part.ranges:
                part.seq += 1
                cuts[part.number] = Cut(part.number, part.seq,
                                        {t: (r[0], r[1]) for t, r in part.ranges.items()},
                                        time.time_ns())
            else:
                cuts[part.number] = None
        logged = [c for c in cuts.values() if c is not None]
        if self.state is not None and logged:
            state = self.state
            self._retrying("state", lambda: state.log_cuts(self.transport.group, logged))
        offsets: dict[tuple[str, int], int] = {}
        for part in work:
            cut = cuts[part.number]
            self._flush(part, cut, publish=True)
            if cut is not None:
                offsets.update({(t, part.number): end for t, end in cut.ends().items()})
        self._commit(offsets)
        self.stats.checkpoints += 1
        self._last_checkpoint = time.monotonic()

    def snapshot_all(self, partitions: Iterable[int] | None = None) -> None:
        """Save the state of every job of ``partitions`` (default all) with its offsets;
        checkpoints first so that the state matches the committed input."""
        if self.state is None:
            return
        chosen = list(self._parts) if partitions is None else [p for p in partitions
                                                               if p in self._parts]
        self.checkpoint(chosen)
        started = time.perf_counter()
        snaps = []
        for number in chosen:
            part = self._parts[number]
            if part.cuts or (part.snapshot_seq == part.seq and not part.pending):
                continue  # still re-cutting, or nothing new since the last snapshot
            jobs = {job: self._job_state(st) for job, st in self._jobs.items()
                    if st.partition == number}
            pending = {job: [_pending_state(p) for p in items]
                       for job, items in part.pending.items()}
            snaps.append(PartitionSnapshot(number, part.seq, dict(part.positions),
                                           {"version": STATE_VERSION, "jobs": jobs,
                                            "pending": pending}, time.time_ns()))
        if snaps:
            state = self.state
            self._retrying("state", lambda: state.save_snapshots(self.transport.group, snaps))
            for s in snaps:
                self._parts[s.partition].snapshot_seq = s.seq
            self.stats.snapshots += len(snaps)
        self._snapshot_cost = time.perf_counter() - started
        self.stats.seconds["snapshot"] += self._snapshot_cost
        self._last_snapshot = time.monotonic()

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
        return {"version": STATE_VERSION,
                "jobs": {job: self._job_state(st) for job, st in self._jobs.items()}}

    def restore(self, state: dict[str, Any]) -> None:
        """Recreate the jobs of :meth:`snapshot` (analyzers from the factory, then their
        ``restore``), replacing the current ones."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported processor snapshot version {state.get('version')!r}")
        self._jobs = {}
        for job, d in state["jobs"].items():
            self._restore_job(job, d)
        self.stats.jobs = len(self._jobs)

    def close(self) -> None:
        """Checkpoint, snapshot and close the sink and state store (the transport belongs to
        the caller)."""
        self.checkpoint()
        if self.state is not None:
            self.snapshot_all()
        self.transport.set_listener(None)
        if self.sink is not None:
            self.sink.close()
        if self.state is not None:
            self.state.close()

    # ------------------------------------------------------------------ assignment (listener)

    def on_assigned(self, partitions: set[int]) -> None:
        """Partitions given to this consumer: their state is loaded before their messages
        are processed (in :meth:`step`). The idle time of ``run(idle_timeout=...)`` starts
        again (a restarted consumer may wait for the group to drop its predecessor)."""
        self.last_message = time.monotonic()
        for p in partitions:
            if p not in self._parts:
                self._to_load.add(p)

    def on_revoked(self, partitions: set[int]) -> None:
        """Partitions taken away: checkpoint and snapshot them (unless the sink is down),
        then forget their jobs; the next owner continues from there."""
        mine = [p for p in partitions if p in self._parts]
        self._to_load -= set(partitions)
        if not mine:
            return
        if not self._writing:
            try:
                if self.state is not None:
                    self.snapshot_all(mine)
                else:
                    self.checkpoint(mine)
            except Exception:  # noqa: BLE001 - the next owner re-reads from the last cut
                log.exception("could not checkpoint revoked partitions %s", mine)
        for p in mine:
            self._drop_partition(p)

    def _drop_partition(self, number: int) -> None:
        part = self._parts.pop(number, None)
        self._idle_since.pop(number, None)
        if part is None:
            return
        self._uncommitted = max(0, self._uncommitted - part.messages)
        for job in [j for j, st in self._jobs.items() if st.partition == number]:
            del self._jobs[job]
        self.stats.jobs = len(self._jobs)
        self.stats.pending_messages = sum(len(v) for p in self._parts.values()
                                          for v in p.pending.values())

    def _load_assigned(self, messages: list[Message]) -> list[Message]:
        """Load the state of newly assigned partitions, seek to where it ends, and drop the
        messages of those partitions polled before the seek (they are fetched again)."""
        loading = set(self._to_load)
        self._to_load.clear()
        if self.state is None:  # positions are the transport's own: keep what was polled
            for number in loading:
                self._part(number)
            return messages
        first: dict[tuple[str, int], int] = {}
        kept: list[Message] = []
        for m in messages:
            if m.partition in loading:
                first.setdefault((m.topic, m.partition), m.offset)
            else:
                kept.append(m)
        for number in sorted(loading):
            targets = self._load_partition(number)
            for (topic, p), offset in first.items():
                if p == number and topic not in targets:
                    targets[topic] = offset
            for topic, offset in targets.items():
                try:
                    self.transport.seek(topic, number, offset)
                except NotImplementedError:
                    pass
                except Exception as e:  # noqa: BLE001 - e.g. the partition moved again
                    log.warning("cannot seek %s[%d] to %d: %s", topic, number, offset, e)
        return kept

    def _load_partition(self, number: int) -> dict[str, int]:
        """Create the partition's bookkeeping from its snapshot and logged cuts; returns the
        offsets to seek to, per topic."""
        part = _Part(number)
        self._parts[number] = part
        if self.state is None:
            return {}
        state = self.state
        t0 = time.perf_counter()
        snap, cuts = self._retrying("state", lambda: state.load(self.transport.group, number))
        targets: dict[str, int] = {}
        if snap is not None:
            part.seq = part.snapshot_seq = snap.seq
            part.positions = {t: int(o) for t, o in snap.offsets.items()}
            targets.update(part.positions)
            for job, d in snap.state.get("jobs", {}).items():
                self._restore_job(job, d, number)
                self.stats.restored_jobs += 1
            for job, items in snap.state.get("pending", {}).items():
                for item in items:
                    message = _pending_message(item, number)
                    try:
                        kind, table = decode(message)
                    except DecodeError:
                        continue
                    self._hold_pending(part, job, message, kind, table)
        if cuts:
            for cut in cuts:
                for topic, (lo, _) in cut.ranges.items():
                    targets.setdefault(topic, lo)
            committed: dict[str, int | None] = {}
            for topic in {t for c in cuts for t in c.ranges}:
                try:
                    committed[topic] = self.transport.committed_offset(topic, number)
                except Exception:  # noqa: BLE001 - unknown: publish again (at-least-once)
                    committed[topic] = None
            for cut in cuts:
                if all((committed.get(t) or 0) >= end for t, end in cut.ends().items()):
                    part.done.add(cut.seq)
            part.cuts = deque(cuts)
            part.recovering_since = time.monotonic()
            log.info("partition %d: re-cutting %d logged cut(s) after seq %d", number,
                     len(cuts), part.seq)
        self.stats.seconds["state"] += time.perf_counter() - t0
        return targets

    # ----------------------------------------------------------------------------- messages

    def _part(self, number: int) -> _Part:
        part = self._parts.get(number)
        if part is None:  # a transport without assignment callbacks
            part = self._parts[number] = _Part(number)
        return part

    def _admit(self, message: Message) -> None:
        part = self._part(message.partition)
        if part.cuts:
            cut = part.cuts[0]
            rng = cut.ranges.get(message.topic)
            if rng is None or message.offset > rng[1]:
                part.deferred.append(message)
                self.stats.deferred_messages += 1
                return
        self._process(message, part)
        while part.cuts and self._cut_complete(part, part.cuts[0]):
            self._complete_cut(part)

    def _cut_complete(self, part: _Part, cut: Cut) -> bool:
        return all(part.positions.get(t, -1) > last for t, (_, last) in cut.ranges.items())

    def _complete_cut(self, part: _Part) -> None:
        """The input of the next logged cut is processed: write it again with its token
        (the store drops what it has), publish unless it was committed, commit."""
        self._run_batches()
        cut = part.cuts.popleft()
        self._diagnosis_rows([part])
        self._flush(part, cut, publish=cut.seq not in part.done)
        self._commit({(t, part.number): end for t, end in cut.ends().items()})
        part.seq = max(part.seq, cut.seq)
        self.stats.replayed_cuts += 1
        part.recovering_since = time.monotonic()
        deferred, part.deferred = part.deferred, []
        for message in deferred:
            self._admit(message)

    def _check_cut_timeouts(self) -> None:
        for part in self._parts.values():
            if part.cuts and time.monotonic() - part.recovering_since > self._cut_timeout:
                log.warning("partition %d: logged cut %d never completed (input gone?); "
                            "continuing without re-cutting", part.number, part.cuts[0].seq)
                part.seq = max(part.seq, max(c.seq for c in part.cuts))
                part.cuts.clear()
                deferred, part.deferred = part.deferred, []
                for message in deferred:
                    self._admit(message)

    def _process(self, message: Message, part: _Part) -> None:
        self._note(message, part)
        t0 = time.perf_counter()
        try:
            kind, table = decode(message)
        except DecodeError as e:
            self.stats.seconds["decode"] += time.perf_counter() - t0
            self._dead_letter(message, e.reason_class, str(e))
            return
        self.stats.seconds["decode"] += time.perf_counter() - t0
        job = self._jobs.get(message.key)
        if job is not None:
            job.seen = time.monotonic_ns()
        self.stats.messages += 1
        self.stats.rows[kind] += table.num_rows
        self._metrics_rows += table.num_rows
        if (self._store_events or kind == "meta") and table.num_rows:
            part.out[kind].append(select_schema(table, events.SCHEMAS[kind]))
            part.rows += table.num_rows
        if kind == "meta":
            self._on_meta(message, table, part)
        elif message.key in self._jobs:
            self._add_to_batch(message.key, kind, table, _watermark(message))
        else:
            self._hold_pending(part, message.key, message, kind, table)

    def _hold_pending(self, part: _Part, job: str, message: Message, kind: str,
                      table: pa.Table) -> None:
        count = sum(len(v) for v in part.pending.values())
        if count >= self._max_pending or part.pending_bytes + len(message.value) \
                > self._max_pending_bytes:
            self._dead_letter(message, "no_meta",
                              f"no meta message for job {job!r} after {count} messages")
            return
        part.pending.setdefault(job, []).append(_Pending(message, kind, table))
        part.pending_bytes += len(message.value)
        self.stats.pending_messages += 1

    def _add_to_batch(self, job: str, kind: str, table: pa.Table,
                      watermark: int | None = None) -> None:
        """Hold ``table`` for the job; ``watermark``: the producer says every row of this
        kind up to that time was published (header ``failslow-watermark``)."""
        if not self._detect:
            return
        st = self._jobs[job]
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
        if top is not None and column is not None:
            st.kind_wm[kind] = max(st.kind_wm.get(kind, events.NULL_TIME), top)
        if self._batch_rows >= self._max_batch_rows:
            self._run_batches()

    def _horizon(self, st: _Job) -> int | None:
        """The event time up to which every record kind the detectors read has arrived
        (None: release everything). A kind without a message while the job's partition has
        been read to its end for ``align_idle_s`` has nothing more and does not count; a kind not
        seen yet holds everything back until then, counted from the job's first data message
        (its messages may still be on the way: topics are fetched independently)."""
        now = time.monotonic_ns()
        idle_since = self._idle_since.get(st.partition)  # read to its end since then
        horizon: int | None = None
        for kind in self._analyzer_kinds:
            if idle_since is not None:
                quiet = max(st.kind_seen.get(kind, st.first_data or now), idle_since)
                if now - quiet >= self._align_idle_ns:
                    continue  # nothing more of this kind
            wm = st.kind_wm.get(kind, events.NULL_TIME)
            horizon = wm if horizon is None else min(horizon, wm)
        return horizon

    def _run_batches(self, force: bool = False) -> None:
        """Analyse the held input of every job up to its horizon (all of it: ``force``)."""
        self._batch_rows = 0
        for job, st in list(self._jobs.items()):
            if not st.held_rows:
                continue
            horizon = None if force or not self._align \
                or st.held_rows > self._max_held_rows else self._horizon(st)
            released: dict[str, pa.Table] = {}
            for kind, parts in list(st.held.items()):
                table = _concat(parts)
                column = TIME_COLUMN.get(kind)
                if horizon is None or column is None:
                    out, keep = table, None
                else:
                    out, keep = _split_at(table, column, horizon)
                if out.num_rows:
                    released[kind] = out
                if keep is not None and keep.num_rows:
                    st.held[kind] = [keep]
                else:
                    del st.held[kind]
            st.held_rows = sum(t.num_rows for parts in st.held.values() for t in parts)
            if released:
                self._update(job, released)

    def _note(self, message: Message, part: _Part) -> None:
        rng = part.ranges.get(message.topic)
        if rng is None:
            part.ranges[message.topic] = [message.offset, message.offset]
        else:
            rng[1] = max(rng[1], message.offset)
        part.positions[message.topic] = max(part.positions.get(message.topic, 0),
                                            message.offset + 1)
        part.messages += 1
        self._uncommitted += 1

    def _dead_letter(self, message: Message, reason_class: str, reason: str) -> None:
        headers = dict(message.headers)
        headers.update({H_ERROR: reason[:1000], H_ERROR_CLASS: reason_class,
                        H_SOURCE_TOPIC: message.topic, H_SOURCE_OFFSET: str(message.offset),
                        H_SOURCE_PARTITION: str(message.partition)})
        self.transport.produce(DEADLETTER_TOPIC, message.key, message.value, headers)
        self.stats.dead_letters += 1
        self.stats.dead_letter_reasons[reason_class] += 1
        log.warning("dead letter from %s[%d]@%d: %s", message.topic, message.partition,
                    message.offset, reason)

    def _on_meta(self, message: Message, table: pa.Table, part: _Part) -> None:
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
                whatif = self._whatif_factory(meta) if self._whatif_factory else None
            except Exception as e:
                if self._strict:
                    raise
                self.stats.errors += 1
                log.exception("cannot create the analyzer of job %s", meta.job)
                self._dead_letter(message, "analyzer", f"cannot create analyzer: {e}")
                return
            self._jobs[meta.job] = _Job(meta, analyzer, part.number, whatif=whatif,
                                        seen=time.monotonic_ns())
            self.stats.jobs = len(self._jobs)
            pending = part.pending.pop(meta.job, [])
            if pending:
                self.stats.pending_messages -= len(pending)
                part.pending_bytes -= sum(len(p.message.value) for p in pending)
                for item in pending:
                    self._add_to_batch(meta.job, item.kind, item.table,
                                       _watermark(item.message))

    def _update(self, job: str, batch: EventBatch) -> None:
        """Feed ``batch`` to the job's analyzers in windows of at most ``window_ns`` of event
        time, in time order, with a tick at the end of each window (as ``failslow analyze``
        replays a trace), so the results do not depend on how the input was polled."""
        state = self._jobs[job]
        span = _time_span(batch)
        if span is None or span[1] - span[0] < self._window_ns:
            self._update_window(job, state, batch)
            if span is not None:
                self._tick_job(job, state, span[1], windowed=True)
            if state.whatif is not None:
                self._whatif(job, state, batch)
            return
        t0 = time.perf_counter()
        windows = _windows(batch, self._window_ns)
        self.stats.seconds["window"] += time.perf_counter() - t0
        for end, window in windows:
            self._update_window(job, state, window)
            self._tick_job(job, state, end, windowed=True)
        rest = {k: t for k, t in batch.items() if k not in TIME_COLUMN}
        if rest:
            self._update_window(job, state, rest)
        if state.whatif is not None:
            self._whatif(job, state, batch)

    def _update_window(self, job: str, state: _Job, batch: EventBatch) -> None:
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
        analyzed = {k: t for k, t in batch.items() if k in self._analyzer_kinds}
        t0 = time.perf_counter()
        try:
            out = state.analyzer.update(analyzed) if analyzed else None
        except Exception:
            if self._strict:
                raise
            self.stats.errors += 1
            log.exception("analyzer of job %s failed on a batch", job)
            out = None
        finally:
            self.stats.seconds["analyze"] += time.perf_counter() - t0
        self._collect(job, state, out)

    def _whatif(self, job: str, state: _Job, batch: EventBatch) -> None:
        assert state.whatif is not None
        t1 = time.perf_counter()
        try:
            result = state.whatif.update(batch)
        except Exception:  # noqa: BLE001 - optional analysis
            if self._strict:
                raise
            self.stats.errors += 1
            log.exception("what-if analysis of job %s failed", job)
            result = None
        self.stats.seconds["whatif"] += time.perf_counter() - t1
        if result is not None:
            step = _last_step(result, state.watermark)
            self._parts[state.partition].whatif.append(
                (job, step, state.watermark, result, time.time_ns()))
            self.stats.whatif_results += 1
            state.dirty = True

    def _now(self, state: _Job) -> int | None:
        if self._clock == "event":
            return None if state.watermark == events.NULL_TIME else state.watermark
        if self._clock == "system":
            return time.time_ns()
        if self._clock == "wall":
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
        assert callable(self._clock)
        return int(self._clock())

    def _tick_all(self) -> None:
        for job, state in list(self._jobs.items()):
            now = self._now(state)
            if now is not None:
                self._tick_job(job, state, now)

    def _tick_job(self, job: str, state: _Job, now: int, windowed: bool = False) -> None:
        """``on_tick(now)`` unless the job's time did not move on (enough). ``windowed``:
        the end of an event-time window (only with the event and wall clocks)."""
        if windowed and self._clock not in ("event", "wall"):
            return
        if now <= state.last_tick or (state.last_tick != events.NULL_TIME
                                      and now - state.last_tick < self._tick_interval):
            return
        state.last_tick = now
        t0 = time.perf_counter()
        try:
            out = state.analyzer.on_tick(now)
        except Exception:
            if self._strict:
                raise
            self.stats.errors += 1
            log.exception("analyzer of job %s failed on tick %d", job, now)
            return
        finally:
            self.stats.seconds["tick"] += time.perf_counter() - t0
        self._collect(job, state, out)

    def _collect(self, job: str, state: _Job, out: Any) -> None:
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

    def _diagnosis_rows(self, parts: list[_Part]) -> None:
        numbers = {p.number for p in parts}
        rows = []
        for job, state in self._jobs.items():
            if not state.dirty or state.partition not in numbers:
                continue
            state.dirty = False
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

    # ----------------------------------------------------------------------------- writing

    def _flush(self, part: _Part, cut: Cut | None, publish: bool) -> None:
        """Write the partition's buffered rows (token of ``cut``), publish its reports."""
        tables = concat(part.out)
        reports = part.reports
        if reports:
            tables["anomalies"] = anomalies_table(reports)
        if part.advice:
            tables["advice"] = advice_table(part.advice)
        if part.whatif:
            tables["whatif"] = whatif_table(part.whatif)
        if self.sink is not None and tables:
            batch = SinkBatch(tables, token=self._token(part.number, cut, tables))
            self._write(batch)
        if publish:
            t0 = time.perf_counter()
            for r in reports:
                value, headers = encode_anomaly(r.job, r.anomaly, r.version)
                self.transport.produce(ANOMALIES_TOPIC, r.job, value, headers)
                self.stats.anomalies_published += 1
            for adv in part.advice:
                value, headers = encode_advice(adv)
                self.transport.produce(ADVICE_TOPIC, adv.job, value, headers)
                self.stats.advice_published += 1
            self.stats.seconds["publish"] += time.perf_counter() - t0
        if tables:
            self.stats.last_checkpoint_ns = time.time_ns()
            self.stats.cpu_last_checkpoint_s = time.process_time()
            self.stats.cpu_samples.append((round(self.stats.cpu_last_checkpoint_s, 4),
                                           sum(self.stats.rows.values())))
            del self.stats.cpu_samples[:-1000]
        self._uncommitted = max(0, self._uncommitted - part.messages)
        part.out = defaultdict(list)
        part.reports = []
        part.advice = []
        part.whatif = []
        part.ranges = {}
        part.messages = 0
        part.rows = 0

    def _token(self, number: int, cut: Cut | None, tables: Mapping[str, pa.Table]) -> str:
        """The same for the same input: group, partition and offset ranges of ``cut``; for
        rows made without input (reports of a tick), a digest of the reports."""
        group = self.transport.group
        if cut is not None:
            ranges = ",".join(f"{t}:{lo}-{hi}" for t, (lo, hi) in sorted(cut.ranges.items()))
            return f"{group}/{number}/{cut.seq}|{ranges}"
        digest = hashlib.sha1()
        for name in sorted(tables):
            table = tables[name]
            keys = [c for c in ("job", "id", "version", "step", "computed_ns", "advice_id",
                                "t_ns")
                    if c in table.column_names]
            digest.update(name.encode())
            digest.update(json.dumps(table.select(keys).to_pylist(), default=str).encode())
        return f"{group}/{number}/tick|{digest.hexdigest()}"

    def _commit(self, offsets: dict[tuple[str, int], int]) -> None:
        t0 = time.perf_counter()
        if offsets:
            self.transport.commit(offsets)
        self.stats.seconds["commit"] += time.perf_counter() - t0

    def _write(self, batch: SinkBatch) -> None:
        assert self.sink is not None
        sink = self.sink
        t0 = time.perf_counter()
        self._retrying("sink", lambda: sink.write(batch))
        self.stats.seconds["sink"] += time.perf_counter() - t0
        self.stats.sink_writes += 1
        for name, table in batch.tables.items():
            self.stats.rows_written[name] += table.num_rows

    def _retrying(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()``, retried while it pushes back (consumption paused meanwhile, with a
        growing delay up to ``max_backoff_s``) and up to ``max_sink_attempts`` times when it
        fails otherwise."""
        failures = pressure = 0
        paused_at: float | None = None
        nested = self._writing
        self._writing = True
        try:
            while True:
                try:
                    return fn()
                except SinkBackpressureError as e:
                    pressure += 1
                    self.stats.backpressure += 1
                    if self._max_backpressure is not None and pressure > self._max_backpressure:
                        raise SinkError(f"{what} still busy after {pressure} retries") from e
                    delay = min(self._max_backoff, e.retry_after * 2 ** (pressure - 1))
                    log.warning("%s pushes back (%s): pausing %.3g s", what, e, delay)
                except Exception as e:
                    failures += 1
                    self.stats.sink_failures += 1
                    if failures >= self._max_sink_attempts:
                        raise SinkError(f"{what} failed {failures} times: {e}") from e
                    delay = min(self._max_backoff, 0.1 * 2 ** failures)
                    log.warning("%s write failed (%s); retrying in %.3g s", what, e, delay)
                if paused_at is None:
                    paused_at = time.monotonic()
                    self.transport.pause()
                    self.stats.paused = 1
                    self._idle_since.clear()  # no evidence of silence while paused
                self._wait(delay, keepalive=not nested)
        finally:
            self._writing = nested
            if paused_at is not None and not nested:
                self.transport.resume()
                self.stats.paused = 0
                self.stats.paused_seconds += time.monotonic() - paused_at
                self._idle_since.clear()

    def _wait(self, seconds: float, keepalive: bool) -> None:
        """Sleep ``seconds`` in slices, polling the paused transport between them (so a
        Kafka consumer stays in its group); :class:`Stopped` if :meth:`stop` was called."""
        if self._sleep is not None:
            self._sleep(seconds)
            if self._stop_requested:
                raise Stopped("stopped while waiting for the sink")
            return
        end = time.monotonic() + seconds
        while True:
            if self._stop_requested:
                raise Stopped("stopped while waiting for the sink")
            left = end - time.monotonic()
            if left <= 0:
                return
            chunk = min(left, 0.5)
            if keepalive:
                got = self.transport.poll(self._max_messages, timeout=chunk)
                self._held.extend(got)  # none while paused; kept in order if any
            else:
                time.sleep(chunk)

    # ----------------------------------------------------------------------------- state

    def _job_state(self, st: _Job) -> dict[str, Any]:
        snap = getattr(st.analyzer, "snapshot", None)
        whatif_snap = getattr(st.whatif, "snapshot", None) if st.whatif is not None else None
        held = {k: base64.b64encode(encode(k, _concat(parts), "zstd")).decode()
                for k, parts in st.held.items() if parts}
        return {"meta": st.meta.to_row(), "partition": st.partition,
                "watermark": st.watermark, "last_tick": st.last_tick,
                "held": held, "kind_wm": dict(st.kind_wm),
                "version": st.version, "diag_version": st.diag_version,
                "anomalies": [a.to_dict() for a in st.anomalies.values()],
                "analyzer": snap() if callable(snap) else None,
                "whatif": whatif_snap() if callable(whatif_snap) else None}

    def _restore_job(self, job: str, d: Mapping[str, Any], partition: int | None = None
                     ) -> None:
        meta = events.parse_meta_row(d["meta"], "snapshot")
        analyzer = self._factory(meta)
        restore = getattr(analyzer, "restore", None)
        if d.get("analyzer") is not None and callable(restore):
            restore(d["analyzer"])
        whatif = self._whatif_factory(meta) if self._whatif_factory else None
        w_restore = getattr(whatif, "restore", None)
        if whatif is not None and d.get("whatif") is not None and callable(w_restore):
            try:
                w_restore(d["whatif"])
            except Exception:  # noqa: BLE001 - start the what-if analysis afresh
                log.exception("cannot restore the what-if state of job %s", job)
        number = int(d.get("partition", 0)) if partition is None else partition
        now = time.monotonic_ns()
        self._jobs[job] = _Job(
            meta, analyzer, number, watermark=int(d["watermark"]), advanced=now,
            last_tick=int(d["last_tick"]), seen=now, version=int(d.get("version", 0)),
            diag_version=int(d.get("diag_version", 0)),
            anomalies={a["id"]: Anomaly.from_dict(a) for a in d["anomalies"]}, whatif=whatif,
            kind_wm={str(k): int(v) for k, v in d.get("kind_wm", {}).items()},
            kind_seen={str(k): now for k in d.get("kind_wm", {})})
        st = self._jobs[job]
        for kind, text in d.get("held", {}).items():
            reader = ipc.open_stream(pa.BufferReader(base64.b64decode(text)))
            table = reader.read_all()
            if table.num_rows:
                st.held[kind] = [table]
                st.held_rows += table.num_rows
        self._part(number)
        self.stats.jobs = len(self._jobs)

    # ----------------------------------------------------------------------------- timing

    def _checkpoint_due(self) -> bool:
        if self._uncommitted >= self._checkpoint_messages:
            return True
        if sum(p.rows for p in self._parts.values()) >= self._checkpoint_rows:
            return True
        waiting = bool(self._uncommitted) or any(p.has_output() for p in self._parts.values())
        return waiting and (
            time.monotonic() - self._last_checkpoint >= self._checkpoint_interval)

    def _snapshot_due(self) -> bool:
        # at most ~5 % of the time goes to snapshots of large jobs
        interval = max(self._snapshot_interval, 20 * self._snapshot_cost)
        return time.monotonic() - self._last_snapshot >= interval and any(
            p.snapshot_seq != p.seq for p in self._parts.values())

    def _update_metrics(self) -> None:
        now = time.monotonic()
        elapsed = now - self._last_metrics
        if elapsed < self._metrics_interval:
            return
        self.stats.rows_per_s = round(self._metrics_rows / elapsed, 1)
        self._metrics_rows = 0
        self._last_metrics = now
        try:
            self.stats.lag = self.transport.lag()
        except Exception:  # noqa: BLE001 - metrics only
            self.stats.lag = None


def _windows(batch: EventBatch, window_ns: int) -> list[tuple[int, EventBatch]]:
    """``failslow.replay.replay`` of one batch (windows ``(edge - window_ns, edge]`` from the
    batch's first event time, ``now`` = the window's end or the last event time), without
    sorting kinds whose rows are already in time order (they usually are)."""
    timed = {k: t for k, t in batch.items() if k in TIME_COLUMN and t.num_rows}
    if not timed:
        return []
    times: dict[str, np.ndarray] = {}
    for kind, table in timed.items():
        column = table.column(TIME_COLUMN[kind])
        t = column.to_numpy() if column.null_count == 0 else \
            pc.fill_null(column, events.NULL_TIME).to_numpy()
        if t.size > 1 and bool((t[1:] < t[:-1]).any()):
            order = np.argsort(t, kind="stable")
            timed[kind] = table.take(pa.array(order))
            t = t[order]
        times[kind] = t
    t0 = min(int(t[0]) for t in times.values())
    t1 = max(int(t[-1]) for t in times.values())
    edges = np.arange(t0 - 1, t1 + window_ns, window_ns, dtype=np.int64)
    edges[-1] = max(edges[-1], t1)
    cuts = {k: np.searchsorted(t, edges, side="right") for k, t in times.items()}
    out: list[tuple[int, EventBatch]] = []
    for i in range(1, len(edges)):
        window: EventBatch = {}
        for kind, table in timed.items():
            lo, hi = int(cuts[kind][i - 1]), int(cuts[kind][i])
            if hi > lo:
                window[kind] = table.slice(lo, hi - lo)
        if window:
            out.append((min(int(edges[i]), t1), window))
    return out


def _split_at(table: pa.Table, column: str, horizon: int) -> tuple[pa.Table, pa.Table]:
    """Rows with ``column <= horizon`` and the others; zero-copy slices when the column is
    in order (it usually is: messages arrive in time order)."""
    t = table.column(column)
    if t.null_count == 0:
        values = t.to_numpy()
        if values.size < 2 or not bool((values[1:] < values[:-1]).any()):
            cut = int(np.searchsorted(values, horizon, side="right"))
            return table.slice(0, cut), table.slice(cut)
    mask = pc.fill_null(pc.less_equal(t, horizon), True)
    return table.filter(mask), table.filter(pc.invert(mask))


def _watermark(message: Message) -> int | None:
    """The producer's ``failslow-watermark`` header (ns), if any."""
    value = message.headers.get(H_WATERMARK)
    try:
        return int(value) if value else None
    except ValueError:
        return None


def _time_span(batch: EventBatch) -> tuple[int, int] | None:
    """Smallest and largest event time of ``batch`` (None: no timed rows)."""
    lows, highs = [], []
    for kind, table in batch.items():
        column = TIME_COLUMN.get(kind)
        if column and table.num_rows:
            mm = pc.min_max(table.column(column)).as_py()
            if mm["min"] is not None:
                lows.append(int(mm["min"]))
                highs.append(int(mm["max"]))
    return (min(lows), max(highs)) if lows else None


def _last_step(result: Mapping[str, Any], default: int) -> int:
    """The last step a what-if result covers (its ``steps`` list), else ``default``."""
    steps = result.get("steps") if isinstance(result, Mapping) else None
    if isinstance(steps, list) and steps:
        try:
            return int(max(steps))
        except (TypeError, ValueError):
            pass
    return int(default)


def _pending_state(p: _Pending) -> dict[str, Any]:
    m = p.message
    return {"topic": m.topic, "key": m.key, "offset": m.offset, "headers": m.headers,
            "value": base64.b64encode(m.value).decode()}


def _pending_message(d: Mapping[str, Any], partition: int) -> Message:
    return Message(d["topic"], d["key"], base64.b64decode(d["value"]), dict(d["headers"]),
                   int(d["offset"]), 0, partition)


def _concat(tables: list[pa.Table]) -> pa.Table:
    if len(tables) == 1:
        return tables[0]
    return pa.concat_tables(tables, promote_options="permissive")
