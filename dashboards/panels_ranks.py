"""The rank heatmap, hangs, links and GPUs dashboards (:mod:`failslow.dashboards.panels`)."""

from __future__ import annotations

from failslow.dashboards.panels_base import (
    ANOMALIES,
    COMPUTE_OPS,
    DB,
    FROM_NS,
    JOB,
    P2P,
    THROTTLE_NAMES,
    THROTTLE_SLOWDOWN_MASK,
    TIMESERIES,
    TO_NS,
    V_DATABASE,
    V_JOB,
    V_JOBS,
    V_RANK,
    AnnotationDef,
    DashboardDef,
    PanelDef,
    anomalies_of_job,
    anomaly_open,
    anomaly_overlaps,
    coords,
    in_range,
    job_link,
    meta_cte,
    rank_filter,
    ts,
    who,
)
from failslow.dashboards.panels_jobs import (
    whatif_grid_sql,
    whatif_steps_sql,
)


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
