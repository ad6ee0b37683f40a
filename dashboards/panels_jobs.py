"""The fleet overview and job detail dashboards, with the what-if and mitigation-advice
panels they share (:mod:`failslow.dashboards.panels`)."""

from __future__ import annotations

from failslow.dashboards.panels_base import (
    ANOMALIES,
    DB,
    JOB,
    TIMESERIES,
    TO_NS,
    V_COMM,
    V_DATABASE,
    V_JOB,
    V_RANK,
    AnnotationDef,
    DashboardDef,
    PanelDef,
    anomalies_of_job,
    anomaly_open,
    anomaly_overlaps,
    comm_filter,
    in_range,
    job_link,
    kinds_cte,
    lost_seconds,
    rank_filter,
    ts,
    who,
)
from failslow.dashboards.panels_probes import fleet_probe_panel, job_probe_panel
from failslow.dashboards.severity import sql_severity


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
            fleet_probe_panel(),
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
       round(slowdown, 3) AS slowdown_x, round(R, 3) AS R_ratio, round(P, 3) AS P_share,
       nullIf(JSONExtractString(extra, 'superseded_by'), '') AS superseded_by,
       if(JSONHas(extra, 'revised'), concat(JSONExtractString(extra, 'revised', 'cause'),
          ' on ', arrayStringConcat(arrayMap(x -> toString(x),
          JSONExtract(extra, 'revised', 'ranks', 'Array(Int64)')), ',')), NULL)
          AS revised_from
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
                      "slowdown_x", "R_ratio", "P_share", "superseded_by", "revised_from"),
                     "R: CCL-D's slowdown ratio of the slow communicator's rounds; P: the "
                     "share of the delay that is compute (late arrival) rather than transfer; "
                     "superseded_by: the report that took this one over (an absorbed link "
                     "that now slows the job); revised_from: what the report blamed before "
                     "its root was revised (a rank that met the onset by chance).",
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
            job_probe_panel(),
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
