"""The pipeline health dashboard (ClickHouse and Prometheus) and the alert rules
(:mod:`failslow.dashboards.panels`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from failslow.dashboards.panels_base import (
    DB,
    DEFAULT_DATABASE,
    PROCESSOR_JOB,
    TIMESERIES,
    V_DATABASE,
    DashboardDef,
    PanelDef,
    anomaly_overlaps,
    in_range,
    job_link,
    ts,
)


def pipeline() -> DashboardDef:
    def count(tbl: str, col: str) -> str:
        return (f"SELECT $__timeInterval({ts(col)}) AS time, '{tbl}' AS table_name, "
                f"count() / ($__interval_s) AS rows_per_s FROM {DB}.{tbl} "
                f"WHERE {in_range(col)} GROUP BY time")

    parts = [count("coll", "t"), count("progress", "t"), count("link", "t"),
             count("gpu", "t"), count("span", "t_start"), count("rounds", "t_end"),
             count("iterations", "t_end"), count("anomalies", "detected_ns"),
             count("advice", "t_ns"), count("whatif", "computed_ns")]
    rows_sql = ("SELECT time, table_name, rows_per_s FROM (\n"
                + "\nUNION ALL\n".join(parts) + "\n) ORDER BY time")
    def delay(tbl: str, col: str) -> str:
        return (f"SELECT $__timeInterval({ts(col)}) AS time, '{tbl}' AS table_name, "
                f"avg(dateDiff('millisecond', {ts(col)}, ingested_at)) / 1000 AS delay_s "
                f"FROM {DB}.{tbl} WHERE {in_range(col)} GROUP BY time")

    delay_sql = ("SELECT time, table_name, delay_s FROM (\n"
                 + "\nUNION ALL\n".join([delay("coll", "t"), delay("link", "t"),
                                          delay("gpu", "t"), delay("iterations", "t_end"),
                                          delay("anomalies", "detected_ns")])
                 + "\n) ORDER BY time")
    freshness = f"""SELECT job, {ts('max(t)')} AS last_event,
       dateDiff('second', {ts('max(t)')}, now64(9)) AS lag_s, count() AS coll_rows
FROM {DB}.coll WHERE {in_range('t')}
GROUP BY job ORDER BY lag_s DESC"""
    delays = f"""SELECT job, id, kind, count() AS reports,
       round((argMax(detected_ns, version) - argMax(start_ns, version)) / 1e9, 2)
           AS detection_delay_s,
       round((max(reported_ns) - argMax(detected_ns, version)) / 1e9, 2) AS processing_lag_s,
       {ts('max(reported_ns)')} AS last_report
FROM {DB}.anomalies WHERE {anomaly_overlaps()}
GROUP BY job, id, kind ORDER BY last_report DESC LIMIT 200"""
    storage = """SELECT table AS table_name, sum(rows) AS stored_rows,
       formatReadableSize(sum(bytes_on_disk)) AS size_on_disk, count() AS active_parts
FROM system.parts WHERE database = '${database}' AND active
GROUP BY table ORDER BY sum(bytes_on_disk) DESC"""
    return DashboardDef(
        "failslow-pipeline", "failslow: pipeline health",
        "Is telemetry arriving and being processed? The processor's consumer lag, rows per "
        "second, errors and dead letters (Prometheus); rows per second per table, data lag, "
        "detection delay and storage (ClickHouse).",
        (V_DATABASE,),
        (
            *processor_panels(),
            PanelDef("Rows per second by table", "timeseries", rows_sql,
                     ("time", "table_name", "rows_per_s"), "Rows per second of event time, "
                     "per table.", unit="rowsps", width=12, fmt=TIMESERIES),
            PanelDef("Ingestion delay by table", "timeseries", delay_sql,
                     ("time", "table_name", "delay_s"),
                     "When ClickHouse stored a row (ingested_at, wall clock) minus when it "
                     "happened (event time, the node's clock): the lag of the whole path "
                     "collector -> Kafka -> processor -> ClickHouse. A replayed trace lags by "
                     "its age.", unit="s", width=12, fmt=TIMESERIES),
            PanelDef("Data lag per job", "table", freshness,
                     ("job", "last_event", "lag_s", "coll_rows"),
                     "Newest operation of each job and how far it is behind now (a replayed "
                     "or finished job lags by its age).", width=12,
                     links=(("job", job_link()),)),
            PanelDef("Detection delay", "table", delays,
                     ("job", "id", "kind", "reports", "detection_delay_s", "processing_lag_s",
                      "last_report"),
                     "detection delay: onset to the evidence (trace time); processing lag: "
                     "evidence to the stored report (wall time, meaningful for live jobs).",
                     width=12),
            PanelDef("Storage", "table", storage,
                     ("table_name", "stored_rows", "size_on_disk", "active_parts"),
                     "Active parts of the database's tables.", width=12),
        ), tags=("pipeline",))


def _pm(name: str, match: str = "") -> str:
    """A processor metric's series (:mod:`failslow.stream.metrics`), scoped to its job."""
    return f'failslow_processor_{name}{{job="{PROCESSOR_JOB}"{match}}}'


NAMED_REASON = ', reason!=""'


def _since(name: str, window: str = "$__range") -> str:
    """How much a counter grew over ``window``, counting series born inside it from zero:
    ``increase()`` needs two samples of a series, so it misses the first count of a label
    value that appears already non-zero (the processor exports a dead-letter reason only
    once it happened). A processor restart inside the window undercounts, never below 0."""
    return (f"clamp_min(sum({_pm(name)}) - (sum({_pm(name)} offset {window}) "
            f"or vector(0)), 0)")


def _increase(name: str, by: str = "", window: str = "$__rate_interval") -> str:
    agg = f"sum by ({by}) " if by else "sum "
    return f"{agg}(increase({_pm(name)}[{window}]))"


def processor_panels() -> tuple[PanelDef, ...]:
    """The stream processor's own counters, from Prometheus: they are not rows in
    ClickHouse. Messages it could not decode are also on the Kafka topic
    ``failslow.deadletter`` (reason in the ``failslow-error`` header)."""
    def prom(title: str, kind: str, targets: tuple[tuple[str, str], ...], desc: str,
             unit: str = "", width: int = 12, height: int = 8,
             thresholds: tuple[tuple[str, float | None], ...] = ()) -> PanelDef:
        return PanelDef(title, kind, description=desc, unit=unit, width=width, height=height,
                        promql=targets, thresholds=thresholds)

    return (
        prom("Processor up", "stat", ((f'up{{job="{PROCESSOR_JOB}"}}', "{{instance}}"),),
             "1 while Prometheus can scrape the processor's /metrics.", width=4, height=5,
             thresholds=(("red", None), ("green", 1))),
        prom("Consumer lag now", "stat", ((f"sum({_pm('lag_messages')})", "lag"),),
             "Kafka messages behind the end of the processor's partitions.", width=4,
             height=5, thresholds=(("green", None), ("orange", 1000), ("red", 100000))),
        prom("Dead letters in range", "stat", ((_since("dead_letters_total"), "dead letters"),),
             "Messages sent to failslow.deadletter within the range.", width=4, height=5,
             thresholds=(("green", None), ("red", 1))),
        prom("Dropped in range", "stat", ((_since("dropped_total"), "dropped"),),
             "Anomaly reports or dead letters the processor could not publish.", width=4,
             height=5, thresholds=(("green", None), ("red", 1))),
        prom("Errors in range", "stat",
             ((f"{_increase('errors_total', window='$__range')} + "
               f"{_increase('sink_failures_total', window='$__range')}", "errors"),),
             "Analyzer failures plus failed store writes within the range.", width=4,
             height=5, thresholds=(("green", None), ("red", 1))),
        prom("Paused for the store", "stat", ((f"max({_pm('paused')})", "paused"),),
             "1 while consumption is paused because ClickHouse pushes back.", width=4,
             height=5, thresholds=(("green", None), ("orange", 1))),
        prom("Consumer lag", "timeseries", ((_pm("lag_messages"), "{{instance}}"),),
             "Messages behind the end of the assigned partitions (consumer lag).",
             unit="short"),
        prom("Rows decoded per second by kind", "timeseries",
             ((f"sum by (kind) (rate({_pm('rows_total')}[$__rate_interval]))", "{{kind}}"),),
             "Event rows the processor decodes per second (wall clock), per record kind.",
             unit="rowsps"),
        prom("Rows written per second by table", "timeseries",
             ((f"sum by (table) (rate({_pm('rows_written_total')}[$__rate_interval]))",
               "{{table}}"),),
             "Rows written to ClickHouse per second, per table.", unit="rowsps"),
        prom("Errors", "timeseries",
             ((_increase("errors_total"), "analyzer failures"),
              (_increase("sink_failures_total"), "store write failures"),
              (_increase("produce_errors_total"), "publish failures"),
              (_increase("commit_errors_total"), "offset commit errors"),
              (_increase("backpressure_total"), "store backpressure")),
             "Failures per interval: analyzer (batch skipped by detection, still stored), "
             "store writes (retried), publishing, offset commits; backpressure (retried "
             "later)."),
        prom("Dead letters by reason", "timeseries",
             ((f"sum by (reason) ({_pm('dead_letters_total', NAMED_REASON)})",
               "{{reason}}"),
              (f"sum({_pm('dropped_total')})", "dropped (not published)")),
             "Messages sent to the dead-letter topic since the processor started, by reason "
             "(a step up is a new dead letter), and messages it could not publish at all. "
             "Counts, not rates: a reason's series only starts with its first dead letter."),
    )


@dataclass(frozen=True)
class AlertDef:
    uid: str
    title: str
    sql: str
    columns: tuple[str, ...]
    threshold: float
    severity: str
    summary: str
    for_: str = "0s"
    labels: dict[str, str] = field(default_factory=dict)


def alert_defs(database: str = DEFAULT_DATABASE) -> tuple[AlertDef, ...]:
    """Alert rules; their SQL reads ``database`` directly (rules have no dashboard
    variables). Only reports of the last day count, so a finished job's leftover open
    anomaly does not page forever."""
    db = f"`{database}`"
    recent = "reported_ns >= toUnixTimestamp64Nano(now64(9)) - 86400000000000"
    latest = f"(SELECT * FROM {db}.anomalies ORDER BY version DESC LIMIT 1 BY job, id)"
    return (
        AlertDef("failslow-open-anomaly", "failslow: open slow-down",
                 f"SELECT job, cause, count() AS open_anomalies FROM {latest} "
                 f"WHERE kind = 'slow' AND end_ns IS NULL AND {recent} GROUP BY job, cause",
                 ("job", "cause", "open_anomalies"), 0, "warning",
                 "{{ $labels.job }}: {{ $values.A }} open {{ $labels.cause }} slow-down(s)",
                 for_="1m"),
        AlertDef("failslow-hang", "failslow: job hung",
                 f"SELECT job, cause, count() AS open_hangs FROM {latest} "
                 f"WHERE kind = 'hang' AND end_ns IS NULL AND {recent} GROUP BY job, cause",
                 ("job", "cause", "open_hangs"), 0, "critical",
                 "{{ $labels.job }} is hung ({{ $labels.cause }})"),
        AlertDef("failslow-pipeline-lag", "failslow: telemetry lagging",
                 f"SELECT job, dateDiff('second', max(time), now()) AS lag_s FROM {db}.coll "
                 f"WHERE time >= now() - INTERVAL 1 HOUR GROUP BY job",
                 ("job", "lag_s"), 120, "warning",
                 "{{ $labels.job }}: newest operation is {{ $values.A }} s old (collector, "
                 "Kafka or processor behind, or the job stopped)", for_="2m"),
    )


@dataclass(frozen=True)
class PromAlertDef:
    """An alert rule on the processor's own metrics (Prometheus, instant query): fires while
    the expression's value exceeds ``threshold``."""

    uid: str
    title: str
    expr: str
    threshold: float
    severity: str
    summary: str
    for_: str = "0s"


def prometheus_alert_defs() -> tuple[PromAlertDef, ...]:
    """The pipeline's health as alerts: the processor not scraped (down: no detection at
    all), dead letters (telemetry lost to decoding), consumer lag (detection behind)."""
    return (
        PromAlertDef("failslow-processor-down", "failslow: stream processor down",
                     f'1 - (max(up{{job="{PROCESSOR_JOB}"}}) or vector(0))', 0, "critical",
                     "Prometheus cannot scrape the stream processor: no anomaly detection "
                     "is running", for_="2m"),
        PromAlertDef("failslow-dead-letters", "failslow: dead letters",
                     _since("dead_letters_total", "10m"), 0, "warning",
                     "{{ $values.A }} message(s) sent to failslow.deadletter in the last "
                     "10 minutes (undecodable telemetry)"),
        PromAlertDef("failslow-consumer-lag", "failslow: processor lagging",
                     f"sum({_pm('lag_messages')})", 10000, "warning",
                     "The processor is {{ $values.A }} Kafka messages behind", for_="5m"),
    )
