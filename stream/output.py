"""Where the processor's results go (:class:`Writer`): one sink write per partition and cut,
with a deduplication token derived from the cut, the anomaly reports and the advice
published, the input offsets committed; a busy or failing sink (or state store) is retried
while consumption is paused."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

import pyarrow as pa

from failslow.engine.probes import PROBE_REQUESTS_TOPIC
from failslow.mitigation.planner import advice_table
from failslow.stream.config import ProcessorConfig
from failslow.stream.exports import encode_export, export_topic
from failslow.stream.partitions import Partition
from failslow.stream.sink import (
    ADVICE_TOPIC,
    Sink,
    SinkBackpressureError,
    SinkBatch,
    anomalies_table,
    concat,
    encode_advice,
    whatif_table,
)
from failslow.stream.state import Cut
from failslow.stream.stats import ProcessorStats
from failslow.stream.transport import ANOMALIES_TOPIC, Message, Transport, encode_anomaly

log = logging.getLogger(__name__)

T = TypeVar("T")


class SinkError(RuntimeError):
    """The sink kept failing; nothing of the current checkpoint was committed."""


class Stopped(RuntimeError):
    """:meth:`StreamProcessor.stop` was called while the processor waited for its sink."""


class Writer:
    """Writes a partition's buffered output to ``sink``, publishes its reports on
    ``transport`` and commits offsets. ``on_pause`` is called when consumption pauses and
    resumes (the silence of a paused stream is no evidence); ``sleep`` replaces the paused
    waiting (tests)."""

    def __init__(self, transport: Transport, sink: Sink | None, config: ProcessorConfig,
                 stats: ProcessorStats, on_pause: Callable[[], None],
                 sleep: Callable[[float], None] | None = None) -> None:
        self.transport = transport
        self.sink = sink
        self.config = config
        self.stats = stats
        self._on_pause = on_pause
        self._sleep = sleep
        #: inside :meth:`retrying` (a nested call does not poll while it waits)
        self.writing = False
        #: :meth:`StreamProcessor.stop` was called: stop waiting for the sink
        self.stop_requested = False
        #: messages polled while paused (should not happen), processed next
        self.held: list[Message] = []
        #: the analysis time at the last CPU sample
        self._analyzed_s = 0.0

    def flush(self, part: Partition, cut: Cut | None, publish: bool) -> None:
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
            self.write(SinkBatch(tables, token=self.token(part.number, cut, tables)))
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
            for job, name, table, wm in part.exports:
                value, headers = encode_export(
                    name, table, wm, getattr(self.transport, "ipc_compression", None),
                    source=self.config.evidence_shard if name == "evidence" else None)
                self.transport.produce(export_topic(name), job, value, headers)
                self.stats.exports_published += 1
            for ask in part.probe_requests:
                # stamped now: an agent does not run a request older than its max age
                ask = dataclasses.replace(ask, t=time.time_ns())
                self.transport.produce(PROBE_REQUESTS_TOPIC, ask.job, ask.to_json(), {})
                self.stats.probe_requests_published += 1
            self.stats.seconds["publish"] += time.perf_counter() - t0
        # a checkpoint that did work samples the CPU time: one that wrote rows or published
        # exports, or one after analysis (a group may analyse much and write little)
        analyzed = self.stats.seconds.get("analyze", 0.0)
        if tables or part.exports or analyzed != self._analyzed_s:
            self._analyzed_s = analyzed
            self.stats.last_checkpoint_ns = time.time_ns()
            self.stats.cpu_last_checkpoint_s = time.process_time()
            self.stats.cpu_samples.append((round(self.stats.cpu_last_checkpoint_s, 4),
                                           sum(self.stats.rows.values())))
            del self.stats.cpu_samples[:-1000]
        part.clear_output()

    def token(self, number: int, cut: Cut | None, tables: Mapping[str, pa.Table]) -> str:
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

    def commit(self, offsets: dict[tuple[str, int], int]) -> None:
        t0 = time.perf_counter()
        if offsets:
            self.transport.commit(offsets)
        self.stats.seconds["commit"] += time.perf_counter() - t0

    def write(self, batch: SinkBatch) -> None:
        assert self.sink is not None
        sink = self.sink
        t0 = time.perf_counter()
        self.retrying("sink", lambda: sink.write(batch))
        self.stats.seconds["sink"] += time.perf_counter() - t0
        self.stats.sink_writes += 1
        for name, table in batch.tables.items():
            self.stats.rows_written[name] += table.num_rows

    def retrying(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()``, retried while it pushes back (consumption paused meanwhile, with a
        growing delay up to ``max_backoff_s``) and up to ``max_sink_attempts`` times when it
        fails otherwise."""
        config = self.config
        failures = pressure = 0
        paused_at: float | None = None
        nested = self.writing
        self.writing = True
        try:
            while True:
                try:
                    return fn()
                except SinkBackpressureError as e:
                    pressure += 1
                    self.stats.backpressure += 1
                    limit = config.max_backpressure_retries
                    if limit is not None and pressure > limit:
                        raise SinkError(f"{what} still busy after {pressure} retries") from e
                    delay = min(config.max_backoff_s, e.retry_after * 2 ** (pressure - 1))
                    log.warning("%s pushes back (%s): pausing %.3g s", what, e, delay)
                except Exception as e:
                    failures += 1
                    self.stats.sink_failures += 1
                    if failures >= config.max_sink_attempts:
                        raise SinkError(f"{what} failed {failures} times: {e}") from e
                    delay = min(config.max_backoff_s, 0.1 * 2 ** failures)
                    log.warning("%s write failed (%s); retrying in %.3g s", what, e, delay)
                if paused_at is None:
                    paused_at = time.monotonic()
                    self.transport.pause()
                    self.stats.paused = 1
                    self._on_pause()
                self._wait(delay, keepalive=not nested)
        finally:
            self.writing = nested
            if paused_at is not None and not nested:
                self.transport.resume()
                self.stats.paused = 0
                self.stats.paused_seconds += time.monotonic() - paused_at
                self._on_pause()

    def _wait(self, seconds: float, keepalive: bool) -> None:
        """Sleep ``seconds`` in slices, polling the paused transport between them (so a
        Kafka consumer stays in its group); :class:`Stopped` if :meth:`stop` was called."""
        if self._sleep is not None:
            self._sleep(seconds)
            if self.stop_requested:
                raise Stopped("stopped while waiting for the sink")
            return
        end = time.monotonic() + seconds
        while True:
            if self.stop_requested:
                raise Stopped("stopped while waiting for the sink")
            left = end - time.monotonic()
            if left <= 0:
                return
            chunk = min(left, 0.5)
            if keepalive:
                got = self.transport.poll(self.config.max_messages, timeout=chunk)
                self.held.extend(got)  # none while paused; kept in order if any
            else:
                time.sleep(chunk)
