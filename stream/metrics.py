"""Prometheus metrics of the stream processor, in the text exposition format (version 0.0.4),
served on ``http://127.0.0.1:PORT/metrics`` by a small threaded HTTP server (no dependency).

The processor's loop is single-threaded; the server thread only reads
:class:`~failslow.stream.processor.ProcessorStats` and the transport's counters (copies of
dicts are atomic under the GIL), so scraping never blocks processing.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "failslow_processor_"
#: Reasons a message goes to the dead-letter topic: the ``DecodeError`` classes of
#: failslow.stream.transport, then the processor's own (records before their job's meta, an
#: analyzer that cannot be built).
DEAD_LETTER_REASONS = ("unknown_kind", "schema_version", "malformed", "contract", "key",
                       "no_meta", "analyzer")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float | int | None) -> str:
    if value is None:
        return "NaN"
    if isinstance(value, float) and math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if isinstance(value, float) else str(int(value))


class Exposition:
    """Builds one exposition text."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def metric(self, name: str, kind: str, help_text: str,
               samples: Iterable[tuple[Mapping[str, str], float | int | None]]) -> None:
        full = PREFIX + name
        self.lines.append(f"# HELP {full} {help_text}")
        self.lines.append(f"# TYPE {full} {kind}")
        for labels, value in samples:
            label = ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(labels.items()))
            self.lines.append(f"{full}{{{label}}} {_number(value)}" if label
                              else f"{full} {_number(value)}")

    def one(self, name: str, kind: str, help_text: str, value: float | int | None) -> None:
        self.metric(name, kind, help_text, [({}, value)])

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def render(stats: Any, transport_stats: Mapping[str, Any] | None = None,
           started: float | None = None) -> str:
    """The exposition of a processor's ``stats`` (ProcessorStats) and its transport's
    counters."""
    e = Exposition()
    e.one("messages_total", "counter", "Event messages decoded.", stats.messages)
    rows = dict(stats.rows)
    e.metric("rows_total", "counter", "Event rows decoded, per record kind.",
             [({"kind": k}, v) for k, v in sorted(rows.items())])
    e.one("rows_per_second", "gauge", "Event rows decoded per second (last interval).",
          stats.rows_per_s)
    written = dict(stats.rows_written)
    e.metric("rows_written_total", "counter", "Rows written to the store, per table.",
             [({"table": k}, v) for k, v in sorted(written.items())])
    e.one("lag_messages", "gauge",
          "Messages behind the end of the assigned partitions (NaN: unknown).", stats.lag)
    # every known reason from the start, at 0: rate() misses a series' first increment
    reasons = {**dict.fromkeys(DEAD_LETTER_REASONS, 0), **stats.dead_letter_reasons}
    e.metric("dead_letters_total", "counter",
             "Messages sent to the dead-letter topic, per reason.",
             [({"reason": k}, v) for k, v in sorted(reasons.items())])
    e.one("errors_total", "counter", "Analyzer failures (batches skipped by detection).",
          stats.errors)
    e.one("sink_failures_total", "counter", "Failed writes to the store (retried).",
          stats.sink_failures)
    e.one("backpressure_total", "counter", "Writes the store pushed back (retried later).",
          stats.backpressure)
    e.one("paused", "gauge", "1 while consumption is paused for the store.", stats.paused)
    e.one("paused_seconds_total", "counter", "Time consumption was paused.",
          stats.paused_seconds)
    e.one("anomaly_reports_total", "counter", "Anomaly reports made.", stats.anomaly_reports)
    e.one("anomalies_published_total", "counter", "Anomaly reports published.",
          stats.anomalies_published)
    e.one("advice_total", "counter", "Mitigation advice decided (planner, Greyhound §5.1).",
          stats.advice)
    e.one("advice_published_total", "counter", "Mitigation advice published.",
          stats.advice_published)
    e.one("whatif_results_total", "counter", "What-if results written.", stats.whatif_results)
    e.one("checkpoints_total", "counter", "Checkpoints (sink write, then commit).",
          stats.checkpoints)
    e.one("snapshots_total", "counter", "Detector-state snapshots saved.", stats.snapshots)
    e.one("replayed_cuts_total", "counter", "Logged cuts re-cut after a restart.",
          stats.replayed_cuts)
    e.one("jobs", "gauge", "Jobs with detector state in this processor.", stats.jobs)
    e.one("pending_messages", "gauge", "Messages waiting for their job's meta.",
          stats.pending_messages)
    seconds = dict(stats.seconds)
    e.metric("busy_seconds_total", "counter", "Processing time per phase.",
             [({"phase": k}, round(v, 6)) for k, v in sorted(seconds.items())])
    t = dict(transport_stats or {})
    e.one("dropped_total", "counter",
          "Messages this processor could not publish (anomaly reports, dead letters).",
          t.get("dropped", 0))
    e.one("produce_errors_total", "counter", "Published messages that failed delivery.",
          t.get("errors", 0))
    e.one("commit_errors_total", "counter", "Offset commits refused or skipped.",
          t.get("commit_errors", 0))
    if started is not None:
        e.one("uptime_seconds", "gauge", "Seconds since the processor started.",
              round(time.time() - started, 3))
    return e.text()


class MetricsServer:
    """Serves ``render_fn()`` on ``/metrics`` of ``127.0.0.1:port`` (port 0: any free port;
    :attr:`port` tells which) in a daemon thread. Loopback only."""

    def __init__(self, render_fn: Callable[[], str], port: int = 0,
                 host: str = "127.0.0.1") -> None:
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError("the metrics endpoint binds to the loopback interface only")
        render_ref = render_fn

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                if self.path.split("?")[0] not in ("/metrics", "/"):
                    self.send_error(404)
                    return
                try:
                    body = render_ref().encode()
                except Exception as exc:  # noqa: BLE001 - report, do not crash the server
                    log.exception("rendering metrics failed")
                    self.send_error(500, str(exc))
                    return
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                log.debug("metrics: " + format, *args)

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="failslow-metrics")
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
