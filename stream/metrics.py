"""Prometheus metrics of the stream processor, with prometheus_client: a collector
(:class:`ProcessorCollector`) that reads a processor's
:class:`~failslow.stream.stats.ProcessorStats` and its transport's counters at each scrape,
in a registry of its own (:func:`processor_registry`, never the global one), served on
``http://127.0.0.1:PORT/metrics`` by prometheus_client's WSGI server
(:class:`MetricsServer`).

The processor's loop is single-threaded; the server thread only reads the statistics (copies
of dicts are atomic under the GIL), so scraping never blocks processing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from failslow.stream.stats import ProcessorStats

PREFIX = "failslow_processor_"
#: Reasons a message goes to the dead-letter topic: the ``DecodeError`` classes of
#: failslow.stream.transport, then the processor's own (records before their job's meta, an
#: analyzer that cannot be built).
DEAD_LETTER_REASONS = ("unknown_kind", "schema_version", "malformed", "contract", "key",
                       "no_meta", "analyzer")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _value(value: float | int | None) -> float:
    return math.nan if value is None else float(value)


def _counter(name: str, help_text: str, value: float | int | None) -> Metric:
    return CounterMetricFamily(PREFIX + name, help_text, value=_value(value))


def _gauge(name: str, help_text: str, value: float | int | None) -> Metric:
    return GaugeMetricFamily(PREFIX + name, help_text, value=_value(value))


def _labelled(name: str, help_text: str, label: str, values: Mapping[str, float | int]
              ) -> Metric:
    family = CounterMetricFamily(PREFIX + name, help_text, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], _value(value))
    return family


class ProcessorCollector(Collector):
    """The metrics of ``stats()`` (a processor's statistics) and ``transport_stats()`` (its
    transport's counters), read at each scrape; ``started``: the processor's start (Unix
    seconds) for ``uptime_seconds``."""

    def __init__(self, stats: Callable[[], ProcessorStats],
                 transport_stats: Callable[[], Mapping[str, Any]] | None = None,
                 started: float | None = None) -> None:
        self._stats = stats
        self._transport_stats = transport_stats
        self._started = started

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        yield _counter("messages_total", "Event messages decoded.", stats.messages)
        yield _labelled("rows_total", "Event rows decoded, per record kind.", "kind",
                        dict(stats.rows))
        yield _gauge("rows_per_second", "Event rows decoded per second (last interval).",
                     stats.rows_per_s)
        yield _labelled("rows_written_total", "Rows written to the store, per table.",
                        "table", dict(stats.rows_written))
        yield _gauge("lag_messages",
                     "Messages behind the end of the assigned partitions (NaN: unknown).",
                     stats.lag)
        # every known reason from the start, at 0: rate() misses a series' first increment
        reasons = {**dict.fromkeys(DEAD_LETTER_REASONS, 0), **stats.dead_letter_reasons}
        yield _labelled("dead_letters_total",
                        "Messages sent to the dead-letter topic, per reason.", "reason",
                        reasons)
        yield _counter("errors_total", "Analyzer failures (batches skipped by detection).",
                       stats.errors)
        yield _counter("sink_failures_total", "Failed writes to the store (retried).",
                       stats.sink_failures)
        yield _counter("backpressure_total", "Writes the store pushed back (retried later).",
                       stats.backpressure)
        yield _gauge("paused", "1 while consumption is paused for the store.", stats.paused)
        yield _counter("paused_seconds_total", "Time consumption was paused.",
                       stats.paused_seconds)
        yield _counter("anomaly_reports_total", "Anomaly reports made.",
                       stats.anomaly_reports)
        yield _counter("anomalies_published_total", "Anomaly reports published.",
                       stats.anomalies_published)
        yield _counter("advice_total", "Mitigation advice decided (planner, Greyhound §5.1).",
                       stats.advice)
        yield _counter("advice_published_total", "Mitigation advice published.",
                       stats.advice_published)
        yield _counter("probe_requests_published_total",
                       "Probe requests sent to the node agents (active validation).",
                       stats.probe_requests_published)
        yield _counter("whatif_results_total", "What-if results written.",
                       stats.whatif_results)
        yield _counter("checkpoints_total", "Checkpoints (sink write, then commit).",
                       stats.checkpoints)
        yield _counter("snapshots_total", "Detector-state snapshots saved.", stats.snapshots)
        yield _gauge("cuts_since_snapshot",
                     "Logged cuts after the last snapshots: what a restart would re-cut.",
                     stats.cuts_since_snapshot)
        yield _counter("replayed_cuts_total", "Logged cuts re-cut after a restart.",
                       stats.replayed_cuts)
        yield _gauge("jobs", "Jobs with detector state in this processor.", stats.jobs)
        yield _counter("jobs_retired_total", "Silent jobs whose detector state was let go.",
                       stats.jobs_retired)
        yield _gauge("pending_messages", "Messages waiting for their job's meta.",
                     stats.pending_messages)
        yield _labelled("busy_seconds_total", "Processing time per phase.", "phase",
                        {k: round(v, 6) for k, v in dict(stats.seconds).items()})
        t = dict(self._transport_stats() if self._transport_stats is not None else {})
        yield _counter("dropped_total",
                       "Messages this processor could not publish (anomaly reports, dead "
                       "letters).", t.get("dropped", 0))
        yield _counter("produce_errors_total", "Published messages that failed delivery.",
                       t.get("errors", 0))
        yield _counter("commit_errors_total", "Offset commits refused or skipped.",
                       t.get("commit_errors", 0))
        if self._started is not None:
            yield _gauge("uptime_seconds", "Seconds since the processor started.",
                         round(time.time() - self._started, 3))


def processor_registry(stats: Callable[[], ProcessorStats],
                       transport_stats: Callable[[], Mapping[str, Any]] | None = None,
                       started: float | None = None) -> CollectorRegistry:
    """A registry of its own holding one :class:`ProcessorCollector`."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ProcessorCollector(stats, transport_stats, started))
    return registry


def render(stats: ProcessorStats, transport_stats: Mapping[str, Any] | None = None,
           started: float | None = None) -> str:
    """The text exposition (format 0.0.4) of ``stats`` and the transport's counters."""
    counters = dict(transport_stats) if transport_stats is not None else None
    registry = processor_registry(lambda: stats,
                                  None if counters is None else (lambda: counters), started)
    return generate_latest(registry).decode()


class MetricsServer:
    """Serves ``registry`` on ``/metrics`` of ``host:port`` (port 0: any free port;
    :attr:`port` tells which) with prometheus_client's WSGI server, in a daemon thread.
    Loopback only."""

    def __init__(self, registry: CollectorRegistry, port: int = 0,
                 host: str = "127.0.0.1") -> None:
        if host not in LOOPBACK:
            raise ValueError("the metrics endpoint binds to the loopback interface only")
        self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        self.port = int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
