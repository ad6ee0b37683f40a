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

The descriptions live in modules by theme and are all importable from here:
:mod:`.panels_base` (datasources, SQL building blocks, the description classes, variables),
:mod:`.panels_jobs` (fleet overview, job detail), :mod:`.panels_ranks` (rank heatmap, hangs,
links, GPUs) and :mod:`.panels_pipeline` (pipeline health, alert rules).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from failslow.dashboards.panels_base import (
    ANOMALIES,
    COMPUTE_OPS,
    DATASOURCE_UID,
    DB,
    DEFAULT_DATABASE,
    FROM_NS,
    JOB,
    METRICS_PORT,
    P2P,
    PLUGIN,
    PROCESSOR_JOB,
    PROMETHEUS_PLUGIN,
    PROMETHEUS_UID,
    TABLE,
    THROTTLE_NAMES,
    THROTTLE_SLOWDOWN_MASK,
    TIMESERIES,
    TO_NS,
    V_COMM,
    V_DATABASE,
    V_JOB,
    V_JOBS,
    V_RANK,
    AnnotationDef,
    DashboardDef,
    PanelDef,
    VariableDef,
    anomalies_of_job,
    anomaly_open,
    anomaly_overlaps,
    comm_filter,
    coords,
    in_range,
    job_link,
    kinds_cte,
    lost_seconds,
    meta_cte,
    rank_filter,
    ts,
    who,
)
from failslow.dashboards.panels_jobs import (
    advice_annotation,
    advice_of_job,
    advice_panel,
    fleet,
    fleet_advice_sql,
    job_detail,
    plan_number,
    s2_plan_panel,
    whatif_grid_sql,
    whatif_panels,
    whatif_steps,
    whatif_steps_sql,
    worst_whatif,
)
from failslow.dashboards.panels_pipeline import (
    NAMED_REASON,
    AlertDef,
    PromAlertDef,
    alert_defs,
    pipeline,
    processor_panels,
    prometheus_alert_defs,
)
from failslow.dashboards.panels_ranks import (
    gpus,
    hangs,
    links,
    rank_heatmap,
)


def dashboards() -> tuple[DashboardDef, ...]:
    """Every dashboard, in menu order."""
    return (fleet(), job_detail(), rank_heatmap(), hangs(), links(), gpus(), pipeline())



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


__all__ = [
    "ANOMALIES",
    "AlertDef",
    "AnnotationDef",
    "COMPUTE_OPS",
    "DATASOURCE_UID",
    "DB",
    "DEFAULT_DATABASE",
    "DashboardDef",
    "FROM_NS",
    "JOB",
    "METRICS_PORT",
    "NAMED_REASON",
    "P2P",
    "PLUGIN",
    "PROCESSOR_JOB",
    "PROMETHEUS_PLUGIN",
    "PROMETHEUS_UID",
    "PanelDef",
    "PromAlertDef",
    "Query",
    "THROTTLE_NAMES",
    "TABLE",
    "THROTTLE_SLOWDOWN_MASK",
    "TIMESERIES",
    "TO_NS",
    "V_COMM",
    "V_DATABASE",
    "V_JOB",
    "V_JOBS",
    "V_RANK",
    "VariableDef",
    "advice_annotation",
    "advice_of_job",
    "advice_panel",
    "alert_defs",
    "anomalies_of_job",
    "anomaly_open",
    "anomaly_overlaps",
    "comm_filter",
    "coords",
    "dashboards",
    "expected_columns",
    "fleet",
    "fleet_advice_sql",
    "gpus",
    "hangs",
    "in_range",
    "job_detail",
    "job_link",
    "kinds_cte",
    "links",
    "lost_seconds",
    "meta_cte",
    "pipeline",
    "plan_number",
    "processor_panels",
    "prometheus_alert_defs",
    "queries",
    "rank_filter",
    "rank_heatmap",
    "s2_plan_panel",
    "ts",
    "whatif_grid_sql",
    "whatif_panels",
    "whatif_steps",
    "whatif_steps_sql",
    "who",
    "worst_whatif",
]
