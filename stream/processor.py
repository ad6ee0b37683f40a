"""The stream processor: messages in, detector results out (README, Architecture; issue 6).

A single-threaded consume loop in the shape of a checkpointing stream processor:

1. poll a batch of messages; decode and validate each (a bad one goes to the dead-letter
   topic with its reason and is counted; the loop goes on);
2. feed every job's records to that job's :class:`~failslow.engine.analyzer.JobAnalyzer`
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
5. every ``snapshot_interval_s`` (and at shutdown) save the detector state of each
   partition's jobs with the offsets it corresponds to.

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

The processor is configured by one :class:`~failslow.stream.config.ProcessorConfig`; its
parts live in their own modules: the jobs and their analyzers (:mod:`failslow.stream.jobs`),
event-time windows (:mod:`failslow.stream.windows`), the per-partition bookkeeping
(:mod:`failslow.stream.partitions`), the writer of results and offsets
(:mod:`failslow.stream.output`) and the assignment of partitions with their recovery
(:mod:`failslow.stream.processor_recovery`). This module is the consume loop and
checkpoints.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import pyarrow as pa

from failslow import events
from failslow.diagnosis import Anomaly, Diagnosis
from failslow.events import ContractError, JobMeta
from failslow.stream.config import (
    Analyzer,
    AnalyzerFactory,
    ProcessorConfig,
    WhatIfFactory,
    default_analyzer,
    default_whatif,
)
from failslow.stream.exports import decode_export, exported_of, source_of
from failslow.stream.jobs import Jobs
from failslow.stream.output import SinkError, Stopped, Writer
from failslow.stream.partitions import Partition, PendingMessage
from failslow.stream.processor_recovery import PartitionRecovery
from failslow.stream.sink import Sink, select_schema
from failslow.stream.state import Cut, PartitionSnapshot, StateStore
from failslow.stream.stats import ProcessorStats
from failslow.stream.transport import (
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
)
from failslow.stream.windows import post_mortem_end, watermark

__all__ = ["ProcessorConfig", "ProcessorStats", "SinkError", "Stopped", "StreamProcessor",
           "default_analyzer", "default_whatif"]

log = logging.getLogger(__name__)

STATE_VERSION = 2
#: ``run(idle_timeout=...)`` waits at least this long for a first partition assignment.
UNASSIGNED_WAIT_S = 60.0


class StreamProcessor(PartitionRecovery):
    """Consumes event messages from ``transport`` and writes results to ``sink``, as
    ``config`` says (default: :class:`~failslow.stream.config.ProcessorConfig()`).

    Collaborators: ``state`` keeps checkpoints (None: offsets are committed to the transport
    only; a restart then relearns the jobs); ``analyzer_factory`` builds the per-job
    analyzer from its meta (default: :func:`~failslow.stream.config.default_analyzer` with
    the config's planner costs and detectors); ``whatif_factory`` the per-job what-if
    analyzer (None: no what-if results; :func:`~failslow.stream.config.default_whatif` for
    the real one); ``sleep`` replaces the waiting for a busy sink (tests).
    """

    def __init__(self, transport: Transport, sink: Sink | None = None,
                 config: ProcessorConfig | None = None, *,
                 state: StateStore | None = None,
                 analyzer_factory: AnalyzerFactory | None = None,
                 whatif_factory: WhatIfFactory | None = None,
                 sleep: Callable[[float], None] | None = None) -> None:
        self.config = config = config if config is not None else ProcessorConfig()
        self.transport = transport
        self.sink = sink
        self.state = state
        self.stats = ProcessorStats()
        self._parts: dict[int, Partition] = {}
        self._idle_since: dict[int, int] = {}  # partition -> caught up since (monotonic ns)
        factory = analyzer_factory or partial(default_analyzer,
                                              planner_costs=config.planner_costs,
                                              detectors=config.detectors,
                                              imported=config.imports,
                                              evidence_shard=config.evidence_shard,
                                              window_ns=config.window_ns)
        align = (not transport.ordered) if config.align is None else config.align
        self._jobs = Jobs(config, self.stats, factory, whatif_factory, self._parts,
                          self._idle_since, align)
        # no evidence of silence while consumption is paused for the sink
        self._writer = Writer(transport, sink, config, self.stats,
                              on_pause=self._idle_since.clear, sleep=sleep)
        self._to_load: set[int] = set()
        self._uncommitted = 0
        self._last_checkpoint = time.monotonic()
        self._last_snapshot = time.monotonic()
        self._snapshot_cost = 0.0
        self._last_metrics = time.monotonic()
        self._metrics_rows = 0
        self._running = False
        self.last_message = time.monotonic()
        transport.set_listener(self)

    # ----------------------------------------------------------------------------- public

    def run(self, until_idle: bool = True, max_polls: int | None = None,
            idle_timeout: float | None = None) -> ProcessorStats:
        """Consume until the transport is idle (``until_idle``: a poll returned nothing),
        ``idle_timeout`` seconds passed without a message, :meth:`stop` is called or
        ``max_polls`` polls were made; then checkpoint."""
        self._running = True
        self._writer.stop_requested = False
        polls = 0
        started = time.monotonic()
        self.last_message = max(self.last_message, started)
        abandoned = drained = False
        try:
            while self._running and (max_polls is None or polls < max_polls):
                n = self.step(timeout=0.0 if until_idle else self.config.poll_timeout)
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
            # everything read so far is analysed before the last checkpoint (a graceful stop
            # commits no input that no detector saw); when everything available was read,
            # the jobs are also told the stream is drained
            self._jobs.run_batches(force=True)
            if drained:
                self._jobs.tick_all(drained=True)
            self.checkpoint()
        return self.stats

    def stop(self) -> None:
        """Ask :meth:`run` to return after the current poll (or wait for the sink)."""
        self._running = False
        self._writer.stop_requested = True

    def step(self, timeout: float = 0.0) -> int:
        """One poll: process its messages, tick every job, checkpoint when due. Returns the
        number of messages polled (including those of a newly assigned partition, which are
        dropped and fetched again from where its state ends)."""
        t0 = time.perf_counter()
        polled_at = time.monotonic_ns()
        messages = self._writer.held + self.transport.poll(self.config.max_messages, timeout)
        self._writer.held = []
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
        self._jobs.run_batches()
        self._check_cut_timeouts()
        self._jobs.tick_all()
        self._jobs.retire_idle()
        if self._checkpoint_due():
            self.checkpoint()
        if self.state is not None and self._snapshot_due():
            self.snapshot_all()
        self._update_metrics()
        return polled

    def _observe_idle(self, messages: list[Message], polled_at: int) -> None:
        """Note which partitions this consumer has read to their end: only for those does
        the absence of new events count, as time passing (the ``"wall"`` clock) and as a
        record kind having nothing more (:meth:`Jobs.horizon`)."""
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
        self._jobs.run_batches()
        chosen = list(self._parts.values()) if partitions is None else [
            self._parts[p] for p in partitions if p in self._parts]
        # a partition still re-cutting its logged cuts writes at their ends, with their tokens
        chosen = [p for p in chosen if not p.cuts]
        self._jobs.diagnosis_rows(chosen)
        work = [p for p in chosen if p.messages or p.has_output()]
        if not work:
            return
        now = time.time_ns()
        cuts = {part.number: part.next_cut(now) for part in work}
        self._count_cuts_since_snapshot()  # before the commit that makes them visible
        logged = [c for c in cuts.values() if c is not None]
        if self.state is not None and logged:
            state = self.state
            self._writer.retrying("state", lambda: state.log_cuts(self.transport.group,
                                                                  logged))
        offsets: dict[tuple[str, int], int] = {}
        for part in work:
            cut = cuts[part.number]
            self._flush(part, cut, publish=True)
            # revoked while the sink was retried: its next owner commits
            if cut is not None and self._parts.get(part.number) is part:
                offsets.update({(t, part.number): end for t, end in cut.ends().items()})
        self._writer.commit(offsets)
        self.stats.checkpoints += 1
        self._last_checkpoint = time.monotonic()

    def _count_cuts_since_snapshot(self) -> None:
        self.stats.cuts_since_snapshot = 0 if self.state is None else sum(
            p.seq - p.snapshot_seq for p in self._parts.values())

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
            part = self._parts.get(number)
            if part is None or part.cuts or (part.snapshot_seq == part.seq and not part.pending):
                continue  # still re-cutting, or nothing new since the last snapshot
            jobs = {job: self._jobs.state_of(st) for job, st in self._jobs.states.items()
                    if st.partition == number}
            pending = {job: [p.to_state() for p in items]
                       for job, items in part.pending.items()}
            snaps.append(PartitionSnapshot(number, part.seq, dict(part.positions),
                                           {"version": STATE_VERSION, "jobs": jobs,
                                            "pending": pending}, time.time_ns()))
        if snaps:
            state = self.state
            self._writer.retrying("state", lambda: state.save_snapshots(self.transport.group,
                                                                        snaps))
            for s in snaps:
                if s.partition in self._parts:
                    self._parts[s.partition].snapshot_seq = s.seq
            self.stats.snapshots += len(snaps)
        self._snapshot_cost = time.perf_counter() - started
        self.stats.seconds["snapshot"] += self._snapshot_cost
        self._last_snapshot = time.monotonic()
        self._count_cuts_since_snapshot()

    def jobs(self) -> list[str]:
        return list(self._jobs.states)

    def meta(self, job: str) -> JobMeta:
        return self._jobs.states[job].meta

    def analyzer(self, job: str) -> Analyzer:
        return self._jobs.states[job].analyzer

    def anomalies(self, job: str) -> list[Anomaly]:
        """The latest report of each anomaly of ``job`` seen by this processor."""
        return list(self._jobs.states[job].anomalies.values())

    def diagnosis(self, job: str) -> Diagnosis:
        return self._jobs.states[job].analyzer.diagnosis()

    def snapshot(self) -> dict[str, Any]:
        """Detection state of every job (JSON-friendly when the analyzers' snapshots are):
        take it right after :meth:`checkpoint`, so that it matches the committed offsets."""
        return {"version": STATE_VERSION,
                "jobs": {job: self._jobs.state_of(st)
                         for job, st in self._jobs.states.items()}}

    def restore(self, state: dict[str, Any]) -> None:
        """Recreate the jobs of :meth:`snapshot` (analyzers from the factory, then their
        ``restore``), replacing the current ones."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported processor snapshot version {state.get('version')!r}")
        self._jobs.states.clear()
        for job, d in state["jobs"].items():
            self._part(self._jobs.restore(job, d).partition)
        self.stats.jobs = len(self._jobs.states)

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

    # ----------------------------------- assignment (listener), recovery: PartitionRecovery

    # ----------------------------------------------------------------------------- messages

    def _part(self, number: int) -> Partition:
        part = self._parts.get(number)
        if part is None:  # a transport without assignment callbacks
            part = self._parts[number] = Partition(number)
        return part

    def _admit(self, message: Message) -> None:
        part = self._part(message.partition)
        if part.cuts:
            rng = part.cuts[0].ranges.get(message.topic)
            if rng is None or message.offset > rng[1]:
                part.deferred.append(message)  # after the logged cut being re-cut
                self.stats.deferred_messages += 1
                return
        self._process(message, part)
        while part.cuts and part.cut_complete(part.cuts[0]):
            self._complete_cut(part)

    def _process(self, message: Message, part: Partition) -> None:
        part.note(message)
        self._uncommitted += 1
        t0 = time.perf_counter()
        try:
            source = None
            if exported_of(message.topic):
                kind, table = decode_export(message)
                source = source_of(message)
            else:
                kind, table = decode(message)
        except DecodeError as e:
            self.stats.seconds["decode"] += time.perf_counter() - t0
            self._dead_letter(message, e.reason_class, str(e))
            return
        self.stats.seconds["decode"] += time.perf_counter() - t0
        job = self._jobs.states.get(message.key)
        if job is not None:
            job.seen = time.monotonic_ns()
        self.stats.messages += 1
        self.stats.rows[kind] += table.num_rows
        self._metrics_rows += table.num_rows
        if (self.config.store_events or kind == "meta") and table.num_rows \
                and kind in events.SCHEMAS:  # (not a table imported from another stage)
            part.out[kind].append(select_schema(table, events.SCHEMAS[kind]))
            part.rows += table.num_rows
        if kind == "meta":
            self._on_meta(message, table, part)
        elif message.key in self._jobs or self._jobs.revive(message.key):
            self._jobs.add(message.key, kind, table, watermark(message),
                           post_mortem_end(message), source)
        else:
            self._hold_pending(part, message.key, message, kind, table)

    def _hold_pending(self, part: Partition, job: str, message: Message, kind: str,
                      table: pa.Table) -> None:
        count = part.pending_count()
        if count >= self.config.max_pending_messages or part.pending_bytes + len(
                message.value) > self.config.max_pending_bytes:
            self._dead_letter(message, "no_meta",
                              f"no meta message for job {job!r} after {count} messages")
            return
        part.pending.setdefault(job, []).append(PendingMessage(message, kind, table))
        part.pending_bytes += len(message.value)
        self.stats.pending_messages += 1

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

    def _on_meta(self, message: Message, table: pa.Table, part: Partition) -> None:
        for i, row in enumerate(table.to_pylist()):
            try:
                meta = events.parse_meta_row(row, f"{message.topic}@{message.offset}", i)
            except ContractError as e:
                self._dead_letter(message, "contract", str(e))
                return
            if meta.job in self._jobs:
                self._jobs.states[meta.job].meta = meta  # a newer description; topology kept
                continue
            self._jobs.retired.pop(meta.job, None)  # described again: a fresh start
            try:
                self._jobs.create(meta, part.number)
            except Exception as e:
                if self.config.strict:
                    raise
                self.stats.errors += 1
                log.exception("cannot create the analyzer of job %s", meta.job)
                self._dead_letter(message, "analyzer", f"cannot create analyzer: {e}")
                return
            pending = part.pending.pop(meta.job, [])
            if pending:
                self.stats.pending_messages -= len(pending)
                part.pending_bytes -= sum(len(p.message.value) for p in pending)
                for item in pending:
                    self._jobs.add(meta.job, item.kind, item.table, watermark(item.message),
                                   post_mortem_end(item.message))

    # ----------------------------------------------------------------------------- output

    def _flush(self, part: Partition, cut: Cut | None, publish: bool) -> None:
        messages = part.messages
        self._jobs.export_messages(part)
        self._writer.flush(part, cut, publish)
        self._uncommitted = max(0, self._uncommitted - messages)

    def _checkpoint_due(self) -> bool:
        config = self.config
        if self._uncommitted >= config.checkpoint_messages:
            return True
        if sum(p.rows for p in self._parts.values()) >= config.checkpoint_rows:
            return True
        waiting = bool(self._uncommitted) or any(p.has_output() for p in self._parts.values())
        return waiting and (
            time.monotonic() - self._last_checkpoint >= config.checkpoint_interval_s)

    def _snapshot_due(self) -> bool:
        # at most ~5 % of the time goes to snapshots of large jobs
        interval = max(self.config.snapshot_interval_s, 20 * self._snapshot_cost)
        return time.monotonic() - self._last_snapshot >= interval and any(
            p.snapshot_seq != p.seq for p in self._parts.values())

    def _update_metrics(self) -> None:
        now = time.monotonic()
        elapsed = now - self._last_metrics
        if elapsed < self.config.metrics_interval_s:
            return
        self.stats.rows_per_s = round(self._metrics_rows / elapsed, 1)
        self._metrics_rows = 0
        self._last_metrics = now
        try:
            self.stats.lag = self.transport.lag()
        except Exception:  # noqa: BLE001 - metrics only
            self.stats.lag = None
