"""The dashboards' panels, variables, annotations and alert rules as data: their SQL, the
columns each query returns and how each is drawn. :mod:`failslow.dashboards.grafana` turns
them into Grafana JSON with grafana-foundation-sdk; the tests run every query (after the
plugin's macro expansion, :mod:`failslow.dashboards.macros`) against ClickHouse.

Every query reads the database named by the ``database`` template variable (default
``failslow``, what ``docker compose`` and ``failslow process`` use; ``failslow demo`` writes
``failslow_demo``, which the variable also offers). Panel SQL never writes a server macro
without arguments right before an opening bracket (see :mod:`failslow.dashboards.macros`).
Ranks map to DP x PP coordinates in Megatron's default order (tp fastest, then cp, dp, pp),
as the simulator and Megatron-LM lay them out.

What the dashboards show, and where it comes from in the papers:

* fleet overview: jobs, open anomalies and the time they cost (:mod:`.severity`);
* job detail: iteration time (MEGATRACE's per-step time) with the anomaly bands, change
  points and mitigation advice (Greyhound §5), CCL-D's slowdown ratio R and compute share P,
  round times per communicator, the what-if attribution per op type and worker (SMon);
* rank heatmap: SMon's DP x PP view (what-if paper §8) of the wait each rank imposes on its
  peers (the last rank to enter a collective holds the others up, CCL-D), of compute
  slowdown from spans and of the what-if attribution, and the per-step heatmaps;
* hangs: the halt point (CCL-D's H1-H3), operations in flight and their progress counters;
* links: bandwidth and in-flight work requests per NIC (the RDMA counters of events.md);
* GPUs: clocks, temperature, power and NVML throttle reasons;
* pipeline health: from ClickHouse, rows per second per table, data lag, detection delay,
  storage; from Prometheus (which scrapes the processor's ``/metrics``,
  :mod:`failslow.stream.metrics`), consumer lag, decoded rows per second by kind, errors,
  dead letters and dropped messages.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from failslow.dashboards.severity import sql_lost_fraction, sql_severity

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


# ---------------------------------------------------------------------------------------------
# the dashboards


def fleet() -> DashboardDef:
    lost = lost_seconds()
    lost_a = lost_seconds("a.")
    jobs_sql = f"""WITH
a AS (SELECT job, count() AS anomalies, countIf({anomaly_open()}) AS open,
             sum({lost}) AS lost_s
      FROM {ANOMALIES} WHERE {anomaly_overlaps()} GROUP BY job),
i AS (SELECT job, count() AS iterations, quantile(0.5)(duration_ns) / 1e6 AS median_ms
      FROM {DB}.iterations FINAL WHERE rank = -1 AND {in_range('t_end')} GROUP BY job)
SELECT m.job AS job, m.world_size AS ranks,
       concat('tp', toString(m.tp), ' pp', toString(m.pp), ' dp', toString(m.dp),
              ' cp', toString(m.cp)) AS parallelism,
       i.iterations AS iterations, round(i.median_ms, 1) AS median_iteration_ms,
       a.anomalies AS anomalies, a.open AS open,
       round(a.lost_s, 1) AS time_lost_s,
       round(a.lost_s * m.world_size / 3600, 3) AS gpu_hours_lost
FROM (SELECT job, world_size, tp, pp, dp, cp FROM {DB}.meta FINAL) AS m
LEFT JOIN i ON i.job = m.job
LEFT JOIN a ON a.job = m.job
WHERE i.iterations > 0 OR a.anomalies > 0
ORDER BY open DESC, time_lost_s DESC, job"""
    cost = "cost_gpu_h"
    anomalies_sql = f"""SELECT job, id, kind, cause, {who()} AS root_cause,
       coalesce(stage, '') AS stage_name, coalesce(comm_kind, '') AS comm_type,
       {ts('start_ns')} AS started, if(end_ns IS NULL, NULL, {ts('end_ns')}) AS ended,
       round(slowdown, 3) AS slowdown_x, round(R, 3) AS R_ratio, round(P, 3) AS P_share,
       round({cost}, 4) AS gpu_hours_lost, {sql_severity('kind', cost)} AS severity
FROM (SELECT a.*, {lost_a} * m.world_size / 3600 AS {cost}
      FROM (SELECT * FROM {ANOMALIES} WHERE {anomaly_overlaps()}) AS a
      LEFT JOIN (SELECT job, world_size FROM {DB}.meta FINAL) AS m ON a.job = m.job)
ORDER BY end_ns IS NOT NULL, start_ns DESC
LIMIT 500"""
    return DashboardDef(
        "failslow-fleet", "failslow: fleet overview",
        "All jobs: which are slow or hung now and what it costs. Click a job for its detail.",
        (V_DATABASE,),
        (
            PanelDef("Jobs reporting", "stat",
                     f"SELECT count(DISTINCT job) AS jobs FROM {DB}.iterations FINAL "
                     f"WHERE rank = -1 AND {in_range('t_end')}",
                     ("jobs",), "Jobs with at least one completed iteration in the range.",
                     width=6, height=5),
            PanelDef("Open anomalies", "stat",
                     f"SELECT count() AS open_anomalies FROM {ANOMALIES} "
                     f"WHERE coalesce(start_ns, 0) <= {TO_NS} AND {anomaly_open()}",
                     ("open_anomalies",), "Anomalies still open at the end of the range.",
                     width=6, height=5, thresholds=(("green", None), ("red", 1))),
            PanelDef("Time lost", "stat",
                     f"SELECT round(sum(lost_s * world_size) / 3600, 3) AS gpu_hours_lost, "
                     f"round(sum(lost_s) / 3600, 3) AS job_hours_lost FROM "
                     f"(SELECT a.job AS job, {lost_a} AS lost_s, "
                     f"m.world_size AS world_size FROM (SELECT * FROM {ANOMALIES} "
                     f"WHERE {anomaly_overlaps()}) AS a LEFT JOIN (SELECT job, world_size "
                     f"FROM {DB}.meta FINAL) AS m ON a.job = m.job)",
                     ("gpu_hours_lost", "job_hours_lost"),
                     "Within the range: job time x (1 - 1/slowdown) for slow-downs, all of it "
                     "for hangs; GPU-hours multiply by the job's ranks.", width=12, height=5),
            PanelDef("Jobs", "table", jobs_sql,
                     ("job", "ranks", "parallelism", "iterations", "median_iteration_ms",
                      "anomalies", "open", "time_lost_s", "gpu_hours_lost"),
                     "Jobs seen in the range, the most troubled first.", width=24, height=8,
                     links=(("job", job_link()),)),
            PanelDef("Anomalies", "table", anomalies_sql,
                     ("job", "id", "kind", "cause", "root_cause", "stage_name", "comm_type",
                      "started", "ended", "slowdown_x", "R_ratio", "P_share",
                      "gpu_hours_lost", "severity"),
                     "Every anomaly overlapping the range, open ones first; severity as the "
                     "notifier pages it.", width=24, height=10,
                     links=(("job", job_link()),)),
            PanelDef("Mitigation advice", "table", fleet_advice_sql(),
                     ("job", "anomaly_id", "cause", "strategy", "last_action", "description",
                      "decided", "impact_s", "cost_s", "decisions"),
                     "The planner's latest decision per anomaly (Greyhound §5.1): apply = "
                     "the strategy should be in effect now, revert = undo it (the anomaly "
                     "ended), skip = not applicable to this job.", width=24, height=6,
                     links=(("job", job_link()),)),
            PanelDef("Iteration time by job", "timeseries",
                     f"SELECT $__timeInterval({ts('t_end')}) AS time, job AS job_name, "
                     f"avg(duration_ns) / 1e6 AS iteration_ms FROM {DB}.iterations FINAL "
                     f"WHERE rank = -1 AND {in_range('t_end')} GROUP BY time, job_name "
                     f"ORDER BY time",
                     ("time", "job_name", "iteration_ms"), "Mean iteration time per interval.",
                     unit="ms", width=24, fmt=TIMESERIES),
        ), tags=("overview",))


# ---------------------------------------------------------------------------------------------
# what-if results (ByteDance's what-if analysis / SMon, diagnosis.md ``whatif``): table
# ``whatif``, one row per result of the job's recent steps, the result as JSON


def worst_whatif() -> str:
    """The what-if result of the job with the largest slowdown whose computation falls in
    the range (the most slowed-down window of steps)."""
    return (f"(SELECT * FROM {DB}.whatif FINAL WHERE {JOB} AND {in_range('computed_ns')} "
            f"ORDER BY coalesce(slowdown, 0) DESC, computed_ns DESC LIMIT 1)")


def whatif_steps() -> str:
    """``'a-b'``: the steps a what-if row covers."""
    return ("concat(toString(arrayMin(JSONExtract(result, 'steps', 'Array(Int64)'))), '-', "
            "toString(step))")


def whatif_panels() -> tuple[PanelDef, ...]:
    """Job detail: what slowed the job down, by the what-if analysis (what-if paper §4-5:
    the step time simulated with one group of operations or workers made ideal)."""
    by_time = f"""SELECT {ts('computed_ns')} AS time, kv.1 AS op_type,
       round(kv.2, 4) AS slowdown_x
FROM {DB}.whatif FINAL
ARRAY JOIN arrayConcat([('all', coalesce(slowdown, 1.))],
                       JSONExtractKeysAndValues(result, 'by_op_type', 'Float64')) AS kv
WHERE {JOB} AND {in_range('computed_ns')}
ORDER BY time, op_type"""
    by_op = f"""SELECT kv.1 AS op_type, round(kv.2, 4) AS slowdown_x,
       round((kv.2 - 1) / greatest(coalesce(w.slowdown, 1.) - 1, 1e-9), 3) AS share_of_slowdown,
       {whatif_steps()} AS steps, round(w.slowdown, 4) AS step_slowdown_x
FROM {worst_whatif()} AS w
ARRAY JOIN JSONExtractKeysAndValues(w.result, 'by_op_type', 'Float64') AS kv
ORDER BY slowdown_x DESC, op_type"""
    workers = f"""SELECT JSONExtractInt(wk, 'rank') AS global_rank,
       JSONExtractInt(wk, 'dp') AS dp_coord, JSONExtractInt(wk, 'pp') AS pp_coord,
       round(JSONExtractFloat(wk, 'slowdown'), 4) AS slowdown_x,
       arrayStringConcat(arrayMap(x -> toString(x), JSONExtract(wk, 'ranks', 'Array(Int64)')),
                         ',') AS worker_ranks,
       {whatif_steps()} AS steps
FROM {worst_whatif()} AS w
ARRAY JOIN JSONExtractArrayRaw(w.result, 'workers') AS wk
ORDER BY slowdown_x DESC, global_rank"""
    per_worker = f"""SELECT {ts('computed_ns')} AS time,
       concat('rank ', toString(JSONExtractInt(wk, 'rank'))) AS worker,
       round(JSONExtractFloat(wk, 'slowdown'), 4) AS slowdown_x
FROM {DB}.whatif FINAL ARRAY JOIN JSONExtractArrayRaw(result, 'workers') AS wk
WHERE {JOB} AND {in_range('computed_ns')}
ORDER BY time, worker"""
    return (
        PanelDef("What-if slowdown by op type", "timeseries", by_time,
                 ("time", "op_type", "slowdown_x"),
                 "Per what-if result (the job's recent steps): 'all' is the traced step time "
                 "over the simulated straggler-free one; each op type is the step time with "
                 "only that type's stragglers left in, over the ideal.", width=12,
                 fmt=TIMESERIES, points=True),
        PanelDef("What-if: slowdown attributed per op type", "table", by_op,
                 ("op_type", "slowdown_x", "share_of_slowdown", "steps", "step_slowdown_x"),
                 "The most slowed-down what-if window in the range: per op type, the "
                 "slowdown it alone causes and its share of the step's slowdown.", width=12),
        PanelDef("What-if: slowest workers", "table", workers,
                 ("global_rank", "dp_coord", "pp_coord", "slowdown_x", "worker_ranks",
                  "steps"),
                 "The most slowed-down what-if window in the range: the workers (DP x PP "
                 "cells) whose stragglers alone cause the largest slowdown; rank: the member "
                 "that held its TP group up.", width=12),
        PanelDef("What-if slowdown per worker", "timeseries", per_worker,
                 ("time", "worker", "slowdown_x"),
                 "Per what-if result, the slowdown attributed to each of the slowest "
                 "workers.", width=12, fmt=TIMESERIES, points=True),
    )


def whatif_grid_sql() -> str:
    """The worst what-if window's per-worker slowdown as DP x PP cells."""
    return f"""SELECT d - 1 AS dp_i, p - 1 AS pp_i, concat('dp', toString(dp_i)) AS dp_rank,
       concat('pp', toString(pp_i)) AS pp_rank, round(v, 4) AS whatif_slowdown
FROM (SELECT JSONExtract(result, 'worker_grid', 'Array(Array(Float64))') AS grid
      FROM {worst_whatif()})
ARRAY JOIN grid AS grid_row, arrayEnumerate(grid) AS p
ARRAY JOIN grid_row AS v, arrayEnumerate(grid_row) AS d
ORDER BY dp_i, pp_i"""


def whatif_steps_sql() -> str:
    """Per step and worker, the step's slowdown with only that worker's stragglers left in
    (``per_step_worker_grid``), placed at the step's start (spans, else iterations)."""
    return f"""WITH
w AS (SELECT computed_ns, JSONExtract(result, 'steps', 'Array(Int64)') AS steps,
             JSONExtract(result, 'per_step_worker_grid', 'Array(Array(Array(Float64)))') AS g
      FROM {DB}.whatif FINAL
      WHERE {JOB} AND {in_range('computed_ns')} AND JSONHas(result, 'per_step_worker_grid')),
cells AS (SELECT steps[i] AS step, p - 1 AS pp_i, d - 1 AS dp_i, v, computed_ns FROM w
          ARRAY JOIN arrayEnumerate(steps) AS i
          ARRAY JOIN g[i] AS step_grid, arrayEnumerate(g[i]) AS p
          ARRAY JOIN step_grid AS v, arrayEnumerate(step_grid) AS d
          ORDER BY computed_ns DESC LIMIT 1 BY step, pp_i, dp_i),
t AS (SELECT step, argMin(t0, src) AS t0 FROM (
        SELECT step, min(t_start) AS t0, 0 AS src FROM {DB}.span WHERE {JOB} GROUP BY step
        UNION ALL
        SELECT iteration AS step, min(t_start) AS t0, 1 AS src FROM {DB}.iterations FINAL
        WHERE {JOB} AND rank = -1 GROUP BY step)
      GROUP BY step)
SELECT {ts('t.t0')} AS time,
       concat('pp', toString(cells.pp_i), ' dp', toString(cells.dp_i)) AS worker,
       round(cells.v, 4) AS whatif_slowdown
FROM cells INNER JOIN t ON t.step = cells.step
ORDER BY time, worker"""


# ---------------------------------------------------------------------------------------------
# mitigation advice (Greyhound §5.1, the ski-rental planner of failslow.mitigation.planner):
# table ``advice``, one row per decision, keyed by advice_id = anomaly/strategy/action


def advice_of_job() -> str:
    """The job's advice decided within the range (one row per decision)."""
    return f"(SELECT * FROM {DB}.advice FINAL WHERE {JOB} AND {in_range('t_ns')})"


def plan_number(key: str) -> str:
    return f"JSONExtract(coalesce(plan, '{{}}'), '{key}', 'Nullable(Float64)')"


def fleet_advice_sql() -> str:
    """Per anomaly of any job, the planner's latest decision within the range."""
    return f"""SELECT job, anomaly_id, any(cause) AS cause, argMax(strategy, t_ns) AS strategy,
       argMax(action, t_ns) AS last_action, argMax(description, t_ns) AS description,
       {ts('max(t_ns)')} AS decided, round(argMax(impact_s, t_ns), 2) AS impact_s,
       round(argMax(cost_s, t_ns), 2) AS cost_s, count() AS decisions
FROM {DB}.advice FINAL WHERE {in_range('t_ns')}
GROUP BY job, anomaly_id
ORDER BY last_action != 'apply', max(t_ns) DESC
LIMIT 200"""


def advice_panel() -> PanelDef:
    sql = f"""SELECT {ts('t_ns')} AS decided, anomaly_id, cause,
       if(empty(link), arrayStringConcat(arrayMap(x -> toString(x), ranks), ','),
          concat('link ', arrayStringConcat(arrayMap(x -> toString(x), link), '-')))
           AS root_cause,
       strategy, action, description, round(impact_s, 2) AS impact_s,
       round(cost_s, 2) AS cost_s, slow_iterations,
       round(t_slow_s, 4) AS t_slow_s, round(t_healthy_s, 4) AS t_healthy_s,
       round({plan_number('predicted_before_s')}, 4) AS predicted_before_s,
       round({plan_number('predicted_after_s')}, 4) AS predicted_after_s, reason
FROM {advice_of_job()}
ORDER BY t_ns, anomaly_id, strategy, action"""
    return PanelDef(
        "Mitigation advice", "table", sql,
        ("decided", "anomaly_id", "cause", "root_cause", "strategy", "action", "description",
         "impact_s", "cost_s", "slow_iterations", "t_slow_s", "t_healthy_s",
         "predicted_before_s", "predicted_after_s", "reason"),
        "Greyhound's ski-rental planner: an anomaly's accumulated impact (slow iterations x "
        "(t_slow - t_healthy)) is weighed against each strategy's cost; it escalates S2 "
        "re-balance micro-batches -> S3 adjust topology -> S4 checkpoint-and-restart when "
        "the impact reaches the next cost, and reverts when the anomaly ends. predicted: the "
        "iteration time before and after the plan (what-if simulator).", width=24, height=7)


def s2_plan_panel() -> PanelDef:
    """The latest S2 plan in the range: micro-batches per DP group (Greyhound §5.2)."""
    m = "JSONExtract(assumeNotNull(a.plan), 'm', 'Array(Int64)')"
    sql = f"""SELECT dp - 1 AS dp_rank, mb AS microbatches, round(t, 4) AS relative_time,
       round(mb * t, 4) AS relative_load, a.anomaly_id AS anomaly_id,
       {ts('a.t_ns')} AS decided
FROM (SELECT * FROM {advice_of_job()} WHERE strategy = 'S2' AND action = 'apply'
      AND plan IS NOT NULL ORDER BY t_ns DESC LIMIT 1) AS a
ARRAY JOIN {m} AS mb, JSONExtract(assumeNotNull(a.plan), 'times_s', 'Array(Float64)') AS t,
           arrayEnumerate({m}) AS dp
ORDER BY dp_rank"""
    return PanelDef(
        "S2 plan: micro-batches per DP group", "table", sql,
        ("dp_rank", "microbatches", "relative_time", "relative_load", "anomaly_id",
         "decided"),
        "The latest S2 advice: how many micro-batches each DP group should run (sum "
        "unchanged) so the slowest group's load, micro-batches x its relative time per "
        "micro-batch, is as small as possible.", width=12)


def advice_annotation() -> AnnotationDef:
    return AnnotationDef(
        "mitigation advice",
        f"SELECT {ts('t_ns')} AS time, {ts('t_ns')} AS timeEnd, "
        f"concat(strategy, ' ', action, ': ', description, ' (', anomaly_id, ', impact ', "
        f"toString(round(impact_s, 1)), ' s, cost ', toString(round(cost_s, 1)), ' s)') "
        f"AS text, concat('advice,', strategy, ',', action) AS tags "
        f"FROM {advice_of_job()} ORDER BY time", "green")


def job_detail() -> DashboardDef:
    anomalies_sql = f"""SELECT id, kind, cause, {who()} AS root_cause,
       coalesce(comm_kind, '') AS comm_type, coalesce(stage, '') AS stage_name,
       toString(comm) AS communicator,
       {ts('start_ns')} AS started, {ts('detected_ns')} AS detected,
       if(end_ns IS NULL, NULL, {ts('end_ns')}) AS ended,
       round((detected_ns - start_ns) / 1e9, 2) AS detection_delay_s,
       round(slowdown, 3) AS slowdown_x, round(R, 3) AS R_ratio, round(P, 3) AS P_share
FROM {anomalies_of_job()} WHERE {anomaly_overlaps()}
ORDER BY start_ns"""
    comm_table = f"""WITH {kinds_cte()}
SELECT toString(r.comm) AS communicator, k.comm_kind AS comm_type,
       arrayStringConcat(arraySort(groupUniqArray(r.op)), ',') AS ops, count() AS rounds,
       round(quantile(0.5)(r.duration_max_ns) / 1e6, 3) AS p50_ms,
       round(quantile(0.99)(r.duration_max_ns) / 1e6, 3) AS p99_ms,
       round(max(r.duration_max_ns) / 1e6, 3) AS max_ms,
       round(sum(r.t_last_enter - r.t_first_enter) / 1e6, 1) AS arrival_spread_ms,
       topK(1)(r.last_rank)[1] AS most_often_last
FROM {DB}.rounds AS r LEFT JOIN kinds AS k ON r.comm = k.comm_id
WHERE r.{JOB} AND {in_range('r.t_end')} AND {comm_filter('r.comm')}
GROUP BY communicator, comm_type
ORDER BY p99_ms / greatest(p50_ms, 0.001) DESC
LIMIT 200"""
    return DashboardDef(
        "failslow-job", "failslow: job detail",
        "One job: iteration time with the anomalies and change points, CCL-D's R and P, "
        "round times per communicator.",
        (V_DATABASE, V_JOB, V_COMM, V_RANK),
        (
            PanelDef("Iteration time", "timeseries",
                     f"SELECT {ts('t_end')} AS time, duration_ns / 1e6 AS iteration_ms, "
                     f"median(duration_ns) OVER () / 1e6 AS median_ms "
                     f"FROM {DB}.iterations FINAL WHERE {JOB} AND rank = -1 AND "
                     f"{in_range('t_end')} ORDER BY time",
                     ("time", "iteration_ms", "median_ms"),
                     "The job's iteration time (slowest rank); bands: anomalies; markers: "
                     "change points where a slow-down began.", unit="ms", width=24, height=9),
            PanelDef("Anomalies of this job", "table", anomalies_sql,
                     ("id", "kind", "cause", "root_cause", "comm_type", "stage_name",
                      "communicator", "started", "detected", "ended", "detection_delay_s",
                      "slowdown_x", "R_ratio", "P_share"),
                     "R: CCL-D's slowdown ratio of the slow communicator's rounds; P: the "
                     "share of the delay that is compute (late arrival) rather than transfer.",
                     width=24, height=7),
            advice_panel(),
            s2_plan_panel(),
            PanelDef("Slowdown, R and P per anomaly", "timeseries",
                     f"SELECT {ts('detected_ns')} AS time, id AS anomaly, "
                     f"slowdown AS slowdown_x, R AS R_ratio, P AS P_share "
                     f"FROM {anomalies_of_job()} WHERE kind = 'slow' AND "
                     f"{anomaly_overlaps()} ORDER BY time",
                     ("time", "anomaly", "slowdown_x", "R_ratio", "P_share"),
                     "Each anomaly's values at the time it was detected.", width=12,
                     fmt=TIMESERIES, points=True),
            PanelDef("Round time by communicator kind", "timeseries",
                     f"WITH {kinds_cte()} SELECT $__timeInterval({ts('r.t_end')}) AS time, "
                     f"if(k.comm_kind = '', 'other', k.comm_kind) AS comm_type, "
                     f"quantile(0.9)(r.duration_max_ns) / 1e6 AS round_p90_ms "
                     f"FROM {DB}.rounds AS r LEFT JOIN kinds AS k ON r.comm = k.comm_id "
                     f"WHERE r.{JOB} AND {in_range('r.t_end')} GROUP BY time, comm_type "
                     f"ORDER BY time",
                     ("time", "comm_type", "round_p90_ms"),
                     "90th percentile of the round duration (enter to completion, slowest "
                     "member) per communicator kind.", unit="ms", width=12, fmt=TIMESERIES),
            PanelDef("Round time per communicator", "timeseries",
                     f"WITH {kinds_cte()} SELECT $__timeInterval({ts('r.t_end')}) AS time, "
                     f"concat(k.comm_kind, ' ', toString(r.comm)) AS communicator, "
                     f"max(r.duration_max_ns) / 1e6 AS round_max_ms "
                     f"FROM {DB}.rounds AS r LEFT JOIN kinds AS k ON r.comm = k.comm_id "
                     f"WHERE r.{JOB} AND {in_range('r.t_end')} AND {comm_filter('r.comm')} "
                     f"GROUP BY time, communicator ORDER BY time",
                     ("time", "communicator", "round_max_ms"),
                     "Slowest round per interval of each selected communicator.", unit="ms",
                     width=12, fmt=TIMESERIES),
            PanelDef("Communicators", "table", comm_table,
                     ("communicator", "comm_type", "ops", "rounds", "p50_ms", "p99_ms",
                      "max_ms", "arrival_spread_ms", "most_often_last"),
                     "Tail over median first: a slow link or straggler shows in its "
                     "communicator's tail. arrival spread: first to last member entering.",
                     width=24),
            PanelDef("Iteration time per rank", "timeseries",
                     f"SELECT {ts('t_end')} AS time, concat('rank ', toString(rank)) AS "
                     f"rank_label, duration_ns / 1e6 AS iteration_ms FROM {DB}.iterations "
                     f"FINAL WHERE {JOB} AND rank >= 0 AND {rank_filter()} AND "
                     f"{in_range('t_end')} ORDER BY time",
                     ("time", "rank_label", "iteration_ms"), "The selected ranks.",
                     unit="ms", width=24, fmt=TIMESERIES),
            *whatif_panels(),
        ),
        annotations=(
            AnnotationDef(
                "anomalies",
                f"SELECT {ts('start_ns')} AS time, {ts(f'coalesce(end_ns, {TO_NS})')} AS "
                f"timeEnd, concat(id, ': ', kind, '/', cause, ' ', {who()}, "
                f"if(stage IS NULL, '', concat(' in ', stage)), "
                f"if(slowdown IS NULL, '', concat(', ', toString(round(slowdown, 2)), 'x'))) "
                f"AS text, concat(kind, ',', cause) AS tags FROM {anomalies_of_job()} "
                f"WHERE {anomaly_overlaps()}", "red"),
            AnnotationDef(
                "change points",
                f"SELECT {ts('start_ns')} AS time, {ts('start_ns')} AS timeEnd, "
                f"concat('change point of ', id, if(JSONHas(extra, 'onset_iteration'), "
                f"concat(' at iteration ', toString(JSONExtractInt(extra, "
                f"'onset_iteration'))), '')) AS text, 'change-point' AS tags "
                f"FROM {anomalies_of_job()} WHERE kind = 'slow' AND "
                f"{anomaly_overlaps()}", "orange"),
            advice_annotation(),
        ), tags=("job",))


def rank_heatmap() -> DashboardDef:
    iters = (f"(SELECT greatest(count(), 1) FROM {DB}.iterations FINAL WHERE {JOB} AND "
             f"rank = -1 AND {in_range('t_end')})")
    wait_long = f"""WITH {meta_cte()},
w AS (SELECT last_rank AS r, sum(t_last_enter - t_first_enter) AS wait_ns
      FROM {DB}.rounds WHERE {JOB} AND op NOT IN {P2P} AND {in_range('t_end')}
      GROUP BY r),
g AS (SELECT arrayJoin(range(toUInt32(world_size))) AS rk FROM m)
SELECT {coords('g.rk')},
       concat('dp', toString(dp_i)) AS dp_rank, concat('pp', toString(pp_i)) AS pp_rank,
       round(max(w.wait_ns) / 1e6 / {iters}, 2) AS wait_ms_per_iteration
FROM g CROSS JOIN m LEFT JOIN w ON w.r = g.rk
GROUP BY dp_i, pp_i, dp_rank, pp_rank ORDER BY dp_i, pp_i"""
    compute_long = f"""WITH {meta_cte()},
c AS (SELECT rank AS r, step, sum(t_end - t_start) AS ns FROM {DB}.span
      WHERE {JOB} AND op IN {COMPUTE_OPS} AND $__timeFilter({ts('t_start')})
      GROUP BY r, step),
s AS (SELECT c.r AS r, c.ns / median(c.ns) OVER (PARTITION BY c.step,
             intDiv(c.r, m.tp * m.cp * m.dp)) AS ratio FROM c CROSS JOIN m),
x AS (SELECT r, avg(ratio) AS slow FROM s GROUP BY r)
SELECT {coords('x.r')},
       concat('dp', toString(dp_i)) AS dp_rank, concat('pp', toString(pp_i)) AS pp_rank,
       round(max(x.slow), 3) AS compute_slowdown
FROM x CROSS JOIN m
GROUP BY dp_i, pp_i, dp_rank, pp_rank ORDER BY dp_i, pp_i"""
    per_step = f"""WITH {meta_cte()},
c AS (SELECT rank AS r, step, min(t_start) AS t0, sum(t_end - t_start) AS ns FROM {DB}.span
      WHERE {JOB} AND op IN {COMPUTE_OPS} AND $__timeFilter({ts('t_start')})
            AND {rank_filter()}
      GROUP BY r, step)
SELECT {ts('min(c.t0) OVER (PARTITION BY c.step)')} AS time,
       concat('r', leftPad(toString(c.r), 5, '0')) AS rank_label,
       round(c.ns / median(c.ns) OVER (PARTITION BY c.step,
             intDiv(c.r, m.tp * m.cp * m.dp)), 3) AS compute_slowdown
FROM c CROSS JOIN m
ORDER BY time, rank_label"""
    top = f"""WITH {meta_cte()},
w AS (SELECT last_rank AS r, sum(t_last_enter - t_first_enter) AS wait_ns, count() AS last_n
      FROM {DB}.rounds WHERE {JOB} AND op NOT IN {P2P} AND {in_range('t_end')} GROUP BY r)
SELECT w.r AS global_rank, JSONExtractString(m.nodes, toString(w.r)) AS node_name,
       intDiv(w.r, m.tp * m.cp) % m.dp AS dp_coord,
       intDiv(w.r, m.tp * m.cp * m.dp) AS pp_coord, w.r % m.tp AS tp_coord,
       w.last_n AS last_arrivals,
       round(w.wait_ns / 1e6 / {iters}, 2) AS wait_ms_per_iteration
FROM w CROSS JOIN m
ORDER BY wait_ms_per_iteration DESC
LIMIT 20"""
    return DashboardDef(
        "failslow-ranks", "failslow: rank heatmap",
        "SMon's view: which worker in the DP x PP grid slows the job, and in which steps.",
        (V_DATABASE, V_JOB, V_RANK),
        (
            PanelDef("Wait imposed on peers (DP x PP)", "matrix", wait_long,
                     ("dp_i", "pp_i", "dp_rank", "pp_rank", "wait_ms_per_iteration"),
                     "For every collective round (point-to-point left out) the time between "
                     "the first and the last member entering is charged to the last one "
                     "(CCL-D: the straggler arrives last); ms per iteration, largest over the "
                     "TP/CP ranks of a cell.", unit="ms", width=12, height=9,
                     matrix=("dp_rank", "pp_rank", "wait_ms_per_iteration")),
            PanelDef("Compute slowdown (DP x PP)", "matrix", compute_long,
                     ("dp_i", "pp_i", "dp_rank", "pp_rank", "compute_slowdown"),
                     "From framework spans: a rank's forward+backward compute per step over "
                     "the median of its pipeline stage, averaged over the steps (SMon's "
                     "worker heatmap). Empty when the job reports no spans.", width=12,
                     height=9, matrix=("dp_rank", "pp_rank", "compute_slowdown")),
            PanelDef("Per-step compute slowdown by rank", "heatmap", per_step,
                     ("time", "rank_label", "compute_slowdown"),
                     "Each step (x) and rank (y): compute time over its stage's median in "
                     "that step. A straggler is a bright row during its anomaly.", width=24,
                     height=12, fmt=TIMESERIES),
            PanelDef("What-if slowdown per worker (DP x PP)", "matrix", whatif_grid_sql(),
                     ("dp_i", "pp_i", "dp_rank", "pp_rank", "whatif_slowdown"),
                     "SMon's worker heatmap from the what-if analysis: the step slowdown with "
                     "only that worker's stragglers left in, for the most slowed-down what-if "
                     "window in the range.", width=12, height=9,
                     matrix=("dp_rank", "pp_rank", "whatif_slowdown")),
            PanelDef("What-if per-step slowdown by worker", "heatmap", whatif_steps_sql(),
                     ("time", "worker", "whatif_slowdown"),
                     "SMon's per-step heatmap: each step (x) and worker (y, DP x PP cell), the "
                     "step's slowdown with only that worker's stragglers left in.", width=12,
                     height=9, fmt=TIMESERIES),
            PanelDef("Top stragglers", "table", top,
                     ("global_rank", "node_name", "dp_coord", "pp_coord", "tp_coord",
                      "last_arrivals", "wait_ms_per_iteration"),
                     "Ranks that most often entered collectives last, by the wait they "
                     "imposed.", width=24),
        ), tags=("ranks",))


def hangs() -> DashboardDef:
    jobs = "$__conditionalAll(job IN (${job:sqlstring}), $job)"
    hang_table = f"""SELECT job, id, cause, {who()} AS root_cause,
       coalesce(stage, '') AS stage_name, coalesce(comm_kind, '') AS comm_type,
       JSONExtractString(extra, 'halt_point', 'op') AS halt_op,
       JSONExtractUInt(extra, 'halt_point', 'seq') AS halt_seq,
       toString(JSONExtractUInt(extra, 'halt_point', 'comm')) AS halt_comm,
       arrayStringConcat(arrayMap(x -> toString(x),
           JSONExtract(extra, 'halt_point', 'entered', 'Array(Int64)')), ',') AS entered,
       arrayStringConcat(arrayMap(x -> toString(x),
           JSONExtract(extra, 'halt_point', 'missing', 'Array(Int64)')), ',') AS missing,
       JSONExtractInt(extra, 'victims_count') AS waiting_ranks,
       {ts('start_ns')} AS started, {ts('detected_ns')} AS detected,
       if(end_ns IS NULL, NULL, {ts('end_ns')}) AS ended, {anomaly_open()} AS is_open
FROM {ANOMALIES}
WHERE kind = 'hang' AND {jobs} AND {anomaly_overlaps()}
ORDER BY is_open DESC, start_ns DESC"""
    in_flight = f"""SELECT job, rank AS global_rank, toString(comm) AS communicator, seq, op,
       bytes, {ts('t_enter')} AS entered, round(({TO_NS} - t_enter) / 1e9, 2) AS in_flight_s
FROM (SELECT job, rank, comm, seq, any(op) AS op, any(bytes) AS bytes,
             minIf(t, phase = 'enter') AS t_enter, countIf(phase = 'enter') AS enters,
             countIf(phase = 'end') AS ends
      FROM {DB}.coll
      WHERE {jobs} AND t >= {FROM_NS} AND t <= {TO_NS}
      GROUP BY job, rank, comm, seq)
WHERE enters > 0 AND ends = 0
ORDER BY t_enter, job, rank
LIMIT 1000"""
    last_op = f"""SELECT job, rank AS global_rank,
       argMaxIf(op, t, phase = 'enter') AS last_op,
       toString(argMaxIf(comm, t, phase = 'enter')) AS communicator,
       argMaxIf(seq, t, phase = 'enter') AS last_seq,
       {ts("maxIf(t, phase = 'enter')")} AS last_enter,
       maxIf(t, phase = 'end') >= maxIf(t, phase = 'enter') AS completed,
       round(({TO_NS} - max(t)) / 1e9, 2) AS idle_s
FROM {DB}.coll
WHERE {jobs} AND t >= {FROM_NS} AND t <= {TO_NS}
GROUP BY job, rank
ORDER BY completed, last_enter, job, rank
LIMIT 5000"""
    progress = f"""SELECT $__timeInterval(time) AS time,
       concat(job, ' r', toString(rank), ' seq ', toString(seq)) AS operation,
       max(send_count + recv_count) AS steps
FROM {DB}.progress
WHERE {jobs} AND $__timeFilter(time)
GROUP BY time, operation
ORDER BY time"""
    return DashboardDef(
        "failslow-hangs", "failslow: hangs",
        "Hung jobs: where they halted (CCL-D H1 not entered, H2 inconsistent, H3 hardware), "
        "which operations are in flight and whether their progress counters still move.",
        (V_DATABASE, V_JOBS),
        (
            PanelDef("Hangs", "table", hang_table,
                     ("job", "id", "cause", "root_cause", "stage_name", "comm_type", "halt_op",
                      "halt_seq", "halt_comm", "entered", "missing", "waiting_ranks",
                      "started", "detected", "ended", "is_open"),
                     "The halt point: the operation where the job stopped, who entered it and "
                     "who is missing.", width=24, height=8, links=(("job", job_link()),)),
            PanelDef("Operations in flight", "table", in_flight,
                     ("job", "global_rank", "communicator", "seq", "op", "bytes", "entered",
                      "in_flight_s"),
                     "Entered and not completed by the end of the range; the oldest first.",
                     width=12, height=10),
            PanelDef("Last operation per rank", "table", last_op,
                     ("job", "global_rank", "last_op", "communicator", "last_seq",
                      "last_enter", "completed", "idle_s"),
                     "A rank stuck elsewhere (never entered the halted collective) shows a "
                     "different last operation.", width=12, height=10),
            PanelDef("Progress of in-flight operations", "timeseries", progress,
                     ("time", "operation", "steps"),
                     "Kernel-level send + receive steps of in-flight operations: a flat line "
                     "is a stall (H3), zeros are a member waiting for its peers.", width=24,
                     fmt=TIMESERIES),
        ),
        annotations=(AnnotationDef(
            "hangs",
            f"SELECT {ts('start_ns')} AS time, {ts(f'coalesce(end_ns, {TO_NS})')} AS timeEnd, "
            f"concat(job, ' ', id, ': hang/', cause, ' ', {who()}) AS text, "
            f"concat('hang,', cause) AS tags FROM {ANOMALIES} "
            f"WHERE kind = 'hang' AND {jobs} AND {anomaly_overlaps()}", "purple"),),
        tags=("hangs",))


def links() -> DashboardDef:
    rates = f"""SELECT t, node, device, peer,
       (toInt64(bytes) - toInt64(lagInFrame(bytes) OVER w)) / greatest(t - lagInFrame(t)
           OVER w, 1) AS gbps,
       toInt64(posted) - toInt64(completed) AS wr_in_flight,
       row_number() OVER w AS n
FROM (SELECT t, node, device, coalesce(peer_node, '') AS peer, bytes, posted, completed
      FROM {DB}.link WHERE {JOB} AND {in_range('t')} AND {rank_filter()})
WINDOW w AS (PARTITION BY node, device, peer ORDER BY t
             ROWS BETWEEN 1 PRECEDING AND CURRENT ROW)"""
    bandwidth = f"""SELECT time, nic, sum(qp_gbps) AS GBps FROM (
  SELECT $__timeInterval({ts('t')}) AS time, concat(node, '/', device) AS nic, peer,
         avg(gbps) AS qp_gbps
  FROM ({rates}) WHERE n > 1 GROUP BY time, nic, peer)
GROUP BY time, nic ORDER BY time"""
    inflight = f"""SELECT time, nic, sum(qp_wr) AS work_requests FROM (
  SELECT $__timeInterval({ts('t')}) AS time, concat(node, '/', device) AS nic, peer,
         max(wr_in_flight) AS qp_wr
  FROM ({rates}) GROUP BY time, nic, peer)
GROUP BY time, nic ORDER BY time"""
    link_table = f"""SELECT node AS node_name, device AS nic, peer AS peer_node,
       round(avg(gbps), 3) AS avg_GBps, round(quantile(0.5)(wr_in_flight), 1) AS p50_in_flight,
       max(wr_in_flight) AS max_in_flight,
       round(avg(wr_in_flight) / greatest(avg(gbps), 1e-9), 1) AS in_flight_per_GBps
FROM ({rates}) WHERE n > 1
GROUP BY node, device, peer
ORDER BY in_flight_per_GBps DESC
LIMIT 200"""
    link_anoms = f"""WITH {meta_cte()}
SELECT a.id AS id, a.cause AS cause, arrayStringConcat(arrayMap(x -> toString(x), a.link),
       '-') AS link_ranks,
       concat(JSONExtractString(m.nodes, toString(a.link[1])), ' - ',
              JSONExtractString(m.nodes, toString(a.link[2]))) AS link_nodes,
       coalesce(a.stage, '') AS stage_name, coalesce(a.comm_kind, '') AS comm_type,
       {ts('a.start_ns')} AS started,
       if(a.end_ns IS NULL, NULL, {ts('a.end_ns')}) AS ended,
       round(a.slowdown, 3) AS slowdown_x
FROM (SELECT * FROM {anomalies_of_job()} WHERE notEmpty(link)
      AND {anomaly_overlaps()}) AS a CROSS JOIN m
ORDER BY a.start_ns"""
    return DashboardDef(
        "failslow-links", "failslow: links",
        "RDMA work-request counters per NIC: bandwidth (slope of the bytes counter) and work "
        "requests in flight (posted - completed). A degraded link moves less per in-flight "
        "request.",
        (V_DATABASE, V_JOB, V_RANK),
        (
            PanelDef("Link anomalies", "table", link_anoms,
                     ("id", "cause", "link_ranks", "link_nodes", "stage_name", "comm_type",
                      "started", "ended", "slowdown_x"),
                     "Anomalies that name a link, with the nodes at its ends.", width=24,
                     height=5),
            PanelDef("Bandwidth per NIC", "timeseries", bandwidth, ("time", "nic", "GBps"),
                     "Sum over the NIC's queue pairs of the bytes counter's slope.",
                     unit="GBs", width=12, fmt=TIMESERIES),
            PanelDef("Work requests in flight per NIC", "timeseries", inflight,
                     ("time", "nic", "work_requests"), "posted - completed, summed over the "
                     "NIC's queue pairs (largest per interval).", width=12, fmt=TIMESERIES),
            PanelDef("Links", "table", link_table,
                     ("node_name", "nic", "peer_node", "avg_GBps", "p50_in_flight",
                      "max_in_flight", "in_flight_per_GBps"),
                     "Per queue-pair direction; a congested or degraded link keeps many "
                     "requests in flight for little bandwidth (first rows).", width=24,
                     height=9),
        ),
        annotations=(AnnotationDef(
            "link anomalies",
            f"SELECT {ts('start_ns')} AS time, {ts(f'coalesce(end_ns, {TO_NS})')} AS timeEnd, "
            f"concat(id, ': ', cause, ' ', {who()}) AS text, concat(kind, ',', cause) AS tags "
            f"FROM {anomalies_of_job()} WHERE notEmpty(link) AND "
            f"{anomaly_overlaps()}", "blue"),),
        tags=("links",))


def gpus() -> DashboardDef:
    def series(col: str, agg: str, title: str, unit: str, desc: str) -> PanelDef:
        return PanelDef(title, "timeseries",
                        f"SELECT $__timeInterval(time) AS time, concat(node, ' gpu', "
                        f"toString(gpu)) AS device, {agg}({col}) AS {col}_value "
                        f"FROM {DB}.gpu WHERE {JOB} AND $__timeFilter(time) AND "
                        f"{rank_filter()} GROUP BY time, device ORDER BY time",
                        ("time", "device", f"{col}_value"), desc, unit=unit, width=12,
                        fmt=TIMESERIES)

    names = ", ".join(f"'{n}'" for _, n in THROTTLE_NAMES)
    bits = ", ".join(str(b) for b, _ in THROTTLE_NAMES)
    events = f"""SELECT node AS node_name, gpu AS gpu_index, any(rank) AS global_rank,
       {ts('min(t)')} AS first_seen, {ts('max(t)')} AS last_seen, count() AS samples,
       min(sm_clock_mhz) AS min_sm_clock_mhz, max(temp_c) AS max_temp_c,
       arrayStringConcat(arrayFilter((n, b) -> bitTest(groupBitOr(throttle_reasons), b),
                                     [{names}], [{bits}]), ',') AS reasons
FROM {DB}.gpu
WHERE {JOB} AND $__timeFilter(time) AND {rank_filter()}
      AND bitAnd(throttle_reasons, {THROTTLE_SLOWDOWN_MASK}) != 0
GROUP BY node, gpu
ORDER BY samples DESC"""
    return DashboardDef(
        "failslow-gpus", "failslow: GPUs",
        "NVML samples: SM clock, temperature, power, utilization and throttling. A GPU that "
        "throttles is a compute straggler's usual cause.",
        (V_DATABASE, V_JOB, V_RANK),
        (
            PanelDef("Throttled GPUs", "timeseries",
                     f"SELECT $__timeInterval(time) AS time, uniqExactIf((node, gpu), "
                     f"bitAnd(throttle_reasons, {THROTTLE_SLOWDOWN_MASK}) != 0) AS "
                     f"throttled_gpus FROM {DB}.gpu WHERE {JOB} AND $__timeFilter(time) AND "
                     f"{rank_filter()} GROUP BY time ORDER BY time",
                     ("time", "throttled_gpus"), "GPUs reporting a power, thermal or hardware "
                     "slowdown reason.", width=12, fmt=TIMESERIES),
            PanelDef("Throttle events", "table", events,
                     ("node_name", "gpu_index", "global_rank", "first_seen", "last_seen",
                      "samples", "min_sm_clock_mhz", "max_temp_c", "reasons"),
                     "Per GPU, the samples with a slowdown reason.", width=12),
            series("sm_clock_mhz", "min", "SM clock", "rotmhz", "Lowest SM clock per interval."),
            series("temp_c", "max", "Temperature", "celsius", "Hottest sample per interval."),
            series("power_w", "avg", "Power", "watt", "Mean power draw."),
            series("util_pct", "avg", "Utilization", "percent", "Mean GPU utilization."),
        ), tags=("gpus",))


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


def dashboards() -> tuple[DashboardDef, ...]:
    """Every dashboard, in menu order."""
    return (fleet(), job_detail(), rank_heatmap(), hangs(), links(), gpus(), pipeline())


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


# ---------------------------------------------------------------------------------------------
# reading dashboards back (tests, --check)


@dataclass(frozen=True)
class Query:
    """One SQL query of a dashboard JSON: a panel target, an annotation or a variable."""

    dashboard: str
    where: str  # "panel" | "annotation" | "variable"
    name: str
    sql: str
    fmt: int


def queries(dashboard_json: dict[str, Any]) -> Iterator[Query]:
    uid = dashboard_json["uid"]
    for v in dashboard_json.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v["query"]
            yield Query(uid, "variable", v["name"], q if isinstance(q, str) else q["rawSql"],
                        TABLE)
    for a in dashboard_json.get("annotations", {}).get("list", []):
        t = a.get("target") or {}
        if "rawSql" in t:
            yield Query(uid, "annotation", a["name"], t["rawSql"], int(t.get("format", 1)))
    for p in dashboard_json.get("panels", []):
        for t in p.get("targets", []):
            if "rawSql" in t:
                yield Query(uid, "panel", p["title"], t["rawSql"], int(t.get("format", 1)))


def expected_columns() -> dict[tuple[str, str, str], tuple[str, ...]]:
    """(dashboard uid, where, name) -> the columns the query returns."""
    out: dict[tuple[str, str, str], tuple[str, ...]] = {}
    for d in dashboards():
        for p in d.panels:
            if p.sql:
                out[(d.uid, "panel", p.title)] = p.columns
        for a in d.annotations:
            out[(d.uid, "annotation", a.name)] = a.columns
    return out


