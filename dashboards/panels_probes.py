"""What active validation costs (issue 17): the ``probe`` rows (docs/events-v2.md) the node
agents wrote, counted per job and per anomaly (:mod:`failslow.dashboards.panels`).

The figures follow :func:`failslow.engine.probes.probe_cost`, the ``probe_cost`` of the
diagnosis: a probe's own time is its ``duration_ns`` (set-up, warm-up and every repeat, not
the wait for idle ranks); the training time it may have cost is the whole of that for a probe
that ran (the job is not stopped, so at most the time the probed GPU or link was shared with
it), nothing for a skipped probe.
"""

from __future__ import annotations

from failslow.dashboards.panels_base import (
    DB,
    JOB,
    PanelDef,
    anomalies_of_job,
    in_range,
    job_link,
    ts,
)

#: seconds a probe ran, and training seconds it may have cost (``probe_cost``)
PROBE_S = "round(sum(duration_ns) / 1e9, 3) AS probe_s"
LOST_S = "round(sumIf(duration_ns, status != 'skipped') / 1e9, 3) AS training_lost_s"


def probes_in_range(where: str = "") -> str:
    """The probe rows that ended within the range (``FINAL``: a re-delivered row once)."""
    cond = f"{where} AND " if where else ""
    return f"(SELECT * FROM {DB}.probe FINAL WHERE {cond}{in_range('t')})"


def request_anomaly(col: str = "request") -> str:
    """The anomaly a request answers: its id is ``anomaly/probe/rank/peer/role``
    (:func:`failslow.engine.probes.request_id`)."""
    parts = f"splitByChar('/', {col})"
    return f"arrayStringConcat(arraySlice({parts}, 1, length({parts}) - 4), '/')"


def fleet_probe_panel() -> PanelDef:
    sql = f"""SELECT job, count() AS probes, countIf(status = 'ok') AS ok,
       countIf(status = 'timeout') AS timed_out, countIf(status = 'failed') AS failed,
       countIf(status = 'skipped') AS skipped,
       uniqExact({request_anomaly()}) AS anomalies_probed, {PROBE_S}, {LOST_S}
FROM {probes_in_range()}
GROUP BY job
ORDER BY training_lost_s DESC, job"""
    return PanelDef(
        "Probe cost by job", "table", sql,
        ("job", "probes", "ok", "timed_out", "failed", "skipped", "anomalies_probed",
         "probe_s", "training_lost_s"),
        "Active validation probes run in the range (issue 17), by outcome: probe_s is their "
        "own time, training_lost_s the training time they may have cost (the measured "
        "operation shared the GPU or link with the job; a skipped probe costs nothing). The "
        "same figures as each anomaly's probe_cost; the planner counts them as cost.",
        width=24, height=6, links=(("job", job_link()),))


def job_probe_panel() -> PanelDef:
    probed = ("if(peer IS NULL, toString(rank), "
              "concat(toString(rank), '-', toString(assumeNotNull(peer))))")
    sql = f"""SELECT p.anomaly_id AS anomaly_id, p.probe AS probe_kind, p.status AS status,
       count() AS runs, arrayStringConcat(arraySort(groupUniqArray(p.probed)), ',') AS probed,
       {PROBE_S}, {LOST_S}, {ts('max(p.t)')} AS last_run,
       arrayStringConcat(arraySort(groupUniqArray(p.why)), '; ') AS reason,
       any(a.verdict) AS verdict
FROM (SELECT {request_anomaly()} AS anomaly_id, probe, status, duration_ns, elapsed_ns, t,
             {probed} AS probed,
             if(status = 'ok', '', coalesce(detail, status)) AS why
      FROM {probes_in_range(JOB)}) AS p
LEFT JOIN (SELECT id, JSONExtractString(extra, 'probe', 'verdict') AS verdict
           FROM {anomalies_of_job()}) AS a ON a.id = p.anomaly_id
GROUP BY anomaly_id, probe_kind, status
ORDER BY anomaly_id, probe_kind, status"""
    return PanelDef(
        "Probes and their cost", "table", sql,
        ("anomaly_id", "probe_kind", "status", "runs", "probed", "probe_s",
         "training_lost_s", "last_run", "reason", "verdict"),
        "The probes asked for this job's anomalies (gemm: one GPU's multiply time, p2p: a "
        "transfer between two ranks' nodes, rtt: a zero-payload round trip), by outcome; "
        "reason: why a probe timed out, failed or was skipped (the diagnosis is left as it "
        "was); verdict: what the probes made of the anomaly.", width=24, height=7)
