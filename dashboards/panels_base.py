"""Shared pieces of the dashboards (:mod:`failslow.dashboards.panels`): datasource names, the
SQL building blocks every query uses, the panel, annotation, variable and dashboard
descriptions, and the template variables."""

from __future__ import annotations

from dataclasses import dataclass

from failslow.dashboards.severity import sql_lost_fraction

PLUGIN = "grafana-clickhouse-datasource"
DATASOURCE_UID = "failslow-clickhouse"
DEFAULT_DATABASE = "failslow"
#: Prometheus, which scrapes the stream processor's metrics (``failslow process``).
PROMETHEUS_PLUGIN = "prometheus"
PROMETHEUS_UID = "failslow-prometheus"
#: The scrape job of the processor (``job`` label of its series).
PROCESSOR_JOB = "failslow-processor"
#: Where ``failslow process`` serves its metrics by default (127.0.0.1 only).
METRICS_PORT = 9464

#: Query formats of the plugin (sqlutil FormatQueryOption).
TIMESERIES, TABLE = 0, 1

# ---------------------------------------------------------------------------------------------
# SQL building blocks

DB = "`${database}`"
JOB = "job = '${job}'"
#: The range as nanoseconds since the epoch (the tables' own time unit). The macro is
#: followed by ')' so the plugin does not read a later bracket as its arguments.
FROM_NS = "(toInt64(toUnixTimestamp($__fromTime)) * 1000000000)"
TO_NS = "((toInt64(toUnixTimestamp($__toTime)) + 1) * 1000000000)"


def ts(col: str) -> str:
    """A nanosecond column as DateTime64(9)."""
    return f"fromUnixTimestamp64Nano({col})"


def in_range(col: str) -> str:
    return f"$__timeFilter({ts(col)})"


#: The latest report of every anomaly. Not ``FINAL`` + WHERE: with the server setting
#: ``optimize_move_to_prewhere_if_final`` a condition on a non-key column runs before FINAL
#: collapses the versions, and an ended anomaly's older "open" report would pass
#: ``end_ns IS NULL``; ``LIMIT 1 BY`` keeps every filter after the choice of version.
ANOMALIES = f"(SELECT * FROM {DB}.anomalies ORDER BY version DESC LIMIT 1 BY job, id)"


def anomalies_of_job() -> str:
    return (f"(SELECT * FROM {DB}.anomalies WHERE {JOB} ORDER BY version DESC "
            f"LIMIT 1 BY job, id)")


def anomaly_overlaps() -> str:
    """An anomaly that overlaps the range."""
    return (f"coalesce(start_ns, 0) <= {TO_NS} "
            f"AND (end_ns IS NULL OR end_ns >= {FROM_NS})")


def anomaly_open() -> str:
    """Still open at the end of the range."""
    return f"(end_ns IS NULL OR end_ns > {TO_NS})"


def lost_seconds(t: str = "") -> str:
    """Job-seconds lost within the range (:mod:`failslow.dashboards.severity`); ``t`` is a
    table alias prefix such as ``"a."``."""
    return (f"greatest(0, least(coalesce({t}end_ns, {TO_NS}), {TO_NS}) - "
            f"greatest(coalesce({t}start_ns, {FROM_NS}), {FROM_NS})) / 1e9 * "
            f"{sql_lost_fraction(f'{t}kind', f'{t}slowdown')}")


def who() -> str:
    """Root-cause ranks or link of an anomaly as text."""
    return ("if(empty(link), arrayStringConcat(arrayMap(x -> toString(x), ranks), ','), "
            "concat('link ', arrayStringConcat(arrayMap(x -> toString(x), link), '-')))")


def rank_filter(col: str = "rank") -> str:
    return f"$__conditionalAll({col} IN (${{rank:csv}}), $rank)"


def comm_filter(col: str = "comm") -> str:
    return f"$__conditionalAll({col} IN (${{comm:csv}}), $comm)"


def meta_cte() -> str:
    """``m``: the job's description (one row)."""
    return (f"m AS (SELECT world_size, tp, pp, dp, cp, nodes, comms FROM {DB}.meta FINAL "
            f"WHERE {JOB} LIMIT 1)")


def kinds_cte() -> str:
    """``kinds``: communicator -> kind, from the job's meta.comms."""
    return (f"kinds AS (SELECT JSONExtractUInt(c, 'comm') AS comm_id, "
            f"JSONExtractString(c, 'kind') AS comm_kind FROM {DB}.meta FINAL "
            f"ARRAY JOIN JSONExtractArrayRaw(comms) AS c WHERE {JOB})")


def coords(rank: str = "rank") -> str:
    """``dp_i`` and ``pp_i`` of a global rank in Megatron's default order (tp fastest,
    then cp, dp, pp), with the degrees from ``m``."""
    return (f"intDiv({rank}, m.tp * m.cp) % m.dp AS dp_i, "
            f"intDiv({rank}, m.tp * m.cp * m.dp) AS pp_i")


P2P = "('send', 'recv')"
COMPUTE_OPS = "('forward-compute', 'backward-compute')"
#: NVML clocks-event reasons that slow a GPU down (not idle, not application clocks).
THROTTLE_SLOWDOWN_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
THROTTLE_NAMES = (
    (0, "gpu_idle"), (1, "applications_clocks"), (2, "sw_power_cap"), (3, "hw_slowdown"),
    (4, "sync_boost"), (5, "sw_thermal"), (6, "hw_thermal"), (7, "hw_power_brake"),
    (8, "display_clock"),
)


# ---------------------------------------------------------------------------------------------
# panel descriptions (what the tests check) and their translation to the SDK


@dataclass(frozen=True)
class PanelDef:
    """One panel: its SQL, the columns the SQL returns, and how it is drawn."""

    title: str
    kind: str  # timeseries | table | stat | heatmap | matrix | text
    sql: str = ""
    columns: tuple[str, ...] = ()
    description: str = ""
    unit: str = ""
    width: int = 12
    height: int = 8
    fmt: int = TABLE
    points: bool = False
    content: str = ""
    #: matrix: (row field, column field, value field) for Grafana's "grouping to matrix"
    matrix: tuple[str, str, str] | None = None
    links: tuple[tuple[str, str], ...] = ()  # (field, url) data links
    thresholds: tuple[tuple[str, float | None], ...] = ()
    #: PromQL targets (expression, legend) of the Prometheus datasource instead of ``sql``
    promql: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class AnnotationDef:
    name: str
    sql: str
    color: str
    columns: tuple[str, ...] = ("time", "timeEnd", "text", "tags")


@dataclass(frozen=True)
class VariableDef:
    name: str
    label: str
    sql: str
    multi: bool = False
    include_all: bool = False
    default: str = ""


@dataclass(frozen=True)
class DashboardDef:
    uid: str
    title: str
    description: str
    variables: tuple[VariableDef, ...]
    panels: tuple[PanelDef, ...]
    annotations: tuple[AnnotationDef, ...] = ()
    tags: tuple[str, ...] = ()


def job_link(dashboard_uid: str = "failslow-job") -> str:
    return (f"/d/{dashboard_uid}?var-database=${{database}}&var-job=${{__value.raw}}"
            "&${__url_time_range}")


# ---------------------------------------------------------------------------------------------
# variables

V_DATABASE = VariableDef(
    "database", "database",
    "SELECT DISTINCT database FROM system.tables WHERE name = 'anomalies' "
    "AND database LIKE 'failslow%' ORDER BY database != 'failslow', database",
    default=DEFAULT_DATABASE)
V_JOB = VariableDef(
    "job", "job",
    "SELECT job FROM `${database}`.meta FINAL ORDER BY t DESC")
V_JOBS = VariableDef(
    "job", "jobs",
    "SELECT job FROM `${database}`.meta FINAL ORDER BY t DESC", multi=True, include_all=True)
V_COMM = VariableDef(
    "comm", "communicator",
    "SELECT JSONExtractUInt(c, 'comm') AS value, concat(JSONExtractString(c, 'kind'), ' ', "
    "toString(JSONExtractUInt(c, 'comm'))) AS label FROM `${database}`.meta FINAL "
    "ARRAY JOIN JSONExtractArrayRaw(comms) AS c WHERE job = '${job}' ORDER BY label",
    multi=True, include_all=True)
V_RANK = VariableDef(
    "rank", "rank",
    "SELECT arrayJoin(range(toUInt32(world_size))) AS rank FROM `${database}`.meta FINAL "
    "WHERE job = '${job}'", multi=True, include_all=True)
