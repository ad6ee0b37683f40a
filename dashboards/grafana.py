"""The Grafana side as code: the dashboards of :mod:`failslow.dashboards.panels` as Grafana
JSON (grafana-foundation-sdk, plus a small :class:`ClickHouseQuery` for the
``grafana-clickhouse-datasource`` plugin, which the SDK lacks), the datasource and dashboard
providers and the alert rules, written as the provisioning tree under ``infra/grafana`` by
``failslow dashboards`` (:mod:`failslow.cli.dashboards`)::

    failslow dashboards write infra/grafana   # regenerate
    failslow dashboards check infra/grafana   # exit 1 when stale
    failslow dashboards verify http://127.0.0.1:3000 [--log FILE]
        # a running Grafana (docker compose up) has all of it; user and password from the
        # settings (GRAFANA_USER / GRAFANA_ADMIN_PASSWORD, default admin / admin)
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import yaml
from grafana_foundation_sdk.builders import dashboard as gdb
from grafana_foundation_sdk.builders import heatmap, prometheus, stat, table, text, timeseries
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as gdm
from grafana_foundation_sdk.models import heatmap as heatmap_models
from grafana_foundation_sdk.models import text as text_models

from failslow.dashboards.panels import (
    DATASOURCE_UID,
    DEFAULT_DATABASE,
    METRICS_PORT,
    PLUGIN,
    PROCESSOR_JOB,
    PROMETHEUS_PLUGIN,
    PROMETHEUS_UID,
    TABLE,
    TIMESERIES,
    AnnotationDef,
    DashboardDef,
    PanelDef,
    VariableDef,
    alert_defs,
    dashboards,
    prometheus_alert_defs,
)

DATASOURCE = gdm.DataSourceRef(type_val=PLUGIN, uid=DATASOURCE_UID)
PROMETHEUS = gdm.DataSourceRef(type_val=PROMETHEUS_PLUGIN, uid=PROMETHEUS_UID)
#: Prometheus shares the processor's network namespace in docker-compose.yml (the metrics
#: endpoint listens on 127.0.0.1 only), so Grafana reaches it at the processor's name.
PROMETHEUS_URL = "http://processor:9090"
#: How often Prometheus scrapes the processor.
SCRAPE_INTERVAL = "15s"
FOLDER = "failslow"
TAG = "failslow"

# ---------------------------------------------------------------------------------------------
# the query class the SDK lacks


class ClickHouseQuery(cogvariants.Dataquery):
    """A raw-SQL query of the ClickHouse plugin."""

    def __init__(self, ref_id: str, sql: str, fmt: int = TABLE) -> None:
        self.ref_id = ref_id
        self.sql = sql
        self.fmt = fmt

    def to_json(self) -> dict[str, object]:
        return {
            "refId": self.ref_id,
            "datasource": {"type": PLUGIN, "uid": DATASOURCE_UID},
            "editorType": "sql",
            "queryType": "timeSeries" if self.fmt == TIMESERIES else "table",
            "format": self.fmt,
            "rawSql": self.sql,
        }


class ClickHouseQueryBuilder(cogbuilder.Builder[ClickHouseQuery]):
    def __init__(self, sql: str, fmt: int = TABLE, ref_id: str = "A") -> None:
        self._query = ClickHouseQuery(ref_id, sql, fmt)

    def build(self) -> ClickHouseQuery:
        return self._query


# ---------------------------------------------------------------------------------------------
# SDK translation


def _variable(v: VariableDef) -> gdb.QueryVariable:
    var = (gdb.QueryVariable(v.name).label(v.label).query(v.sql).datasource(DATASOURCE)
           .refresh(gdm.VariableRefresh.ON_TIME_RANGE_CHANGED).multi(v.multi)
           .include_all(v.include_all).sort(gdm.VariableSort.DISABLED))
    if v.include_all:
        var = var.current(gdm.VariableOption(selected=True, text=["All"], value=["$__all"]))
    elif v.default:
        var = var.current(gdm.VariableOption(selected=True, text=v.default, value=v.default))
    return var


def _prometheus_targets(p: PanelDef) -> list[prometheus.Dataquery]:
    return [prometheus.Dataquery().ref_id(chr(ord("A") + i)).expr(expr)
            .legend_format(legend).range().datasource(PROMETHEUS)
            for i, (expr, legend) in enumerate(p.promql)]


def _panel(p: PanelDef) -> cogbuilder.Builder[gdm.Panel]:
    target = ClickHouseQueryBuilder(p.sql, p.fmt)
    builder: Any
    if p.kind == "timeseries":
        builder = timeseries.Panel().line_width(1).fill_opacity(10)
        if p.points:
            builder = builder.draw_style(common.GraphDrawStyle.POINTS).point_size(8)
    elif p.kind in ("table", "matrix"):
        builder = table.Panel()
    elif p.kind == "stat":
        builder = stat.Panel().graph_mode(common.BigValueGraphMode.NONE)
    elif p.kind == "heatmap":
        builder = (heatmap.Panel().calculate(False)
                   .color(heatmap.HeatmapColorOptions().mode(heatmap_models.HeatmapColorMode.SCHEME).scheme("Oranges")
                          .min(0.9))
                   .rows_frame(heatmap.RowsHeatmapOptions().layout(
                       common.HeatmapCellLayout.AUTO))
                   .show_value(common.VisibilityMode.NEVER))
    elif p.kind == "text":
        return (text.Panel().title(p.title).content(p.content).mode(text_models.TextMode.MARKDOWN)
                .height(p.height).span(p.width))
    else:
        raise ValueError(f"unknown panel kind {p.kind!r}")
    builder = builder.title(p.title).description(p.description).height(p.height).span(p.width)
    if p.promql:
        builder = builder.datasource(PROMETHEUS)
        for t in _prometheus_targets(p):
            builder = builder.with_target(t)
    else:
        builder = builder.datasource(DATASOURCE).with_target(target)
    if p.unit:
        builder = builder.unit(p.unit)
    if p.thresholds:
        builder = builder.thresholds(gdb.ThresholdsConfig().mode(gdm.ThresholdsMode.ABSOLUTE)
                                     .steps([gdm.Threshold(value=v, color=c)
                                             for c, v in p.thresholds]))
    if p.kind == "matrix" and p.matrix is not None:
        row, col, value = p.matrix
        builder = (builder.with_transformation(gdm.DataTransformerConfig(
            id_val="groupingToMatrix",
            options={"rowField": row, "columnField": col, "valueField": value,
                     "emptyValue": "null"}))
            .cell_options(common.TableColoredBackgroundCellOptions(
                mode=common.TableCellBackgroundDisplayMode.GRADIENT))
            .color_scheme(gdb.FieldColor().mode(gdm.FieldColorModeId.CONTINUOUS_YL_RD)))
    for fld, url in p.links:
        builder = builder.override_by_name(fld, [gdm.DynamicConfigValue(
            id_val="links", value=[{"title": "open job detail", "url": url}])])
    return cast(cogbuilder.Builder[gdm.Panel], builder)


def _annotation(a: AnnotationDef) -> Any:
    built = (gdb.AnnotationQuery().name(a.name).datasource(DATASOURCE).enable(True)
             .icon_color(a.color)).build()
    built.target = ClickHouseQuery("Anno", a.sql, TABLE)  # type: ignore[assignment]
    return built


class _Built(cogbuilder.Builder[gdm.AnnotationQuery]):
    def __init__(self, value: gdm.AnnotationQuery) -> None:
        self._value = value

    def build(self) -> gdm.AnnotationQuery:
        return self._value


def build(d: DashboardDef) -> dict[str, Any]:
    """The dashboard JSON (a plain dict)."""
    b = (gdb.Dashboard(d.title).uid(d.uid).description(d.description)
         .tags([TAG, *d.tags]).time("now-6h", "now").refresh("1m").timezone("browser")
         .tooltip(gdm.DashboardCursorSync.CROSSHAIR).editable()
         .link(gdb.DashboardLink("failslow").type(gdm.DashboardLinkType.DASHBOARDS)
               .tags([TAG]).as_dropdown(True).include_vars(True).keep_time(True)))
    for v in d.variables:
        b = b.with_variable(_variable(v))
    for a in d.annotations:
        b = b.annotation(_Built(_annotation(a)))
    for p in d.panels:
        b = b.with_panel(_panel(p))
    out: dict[str, Any] = json.loads(json.dumps(b.build(), cls=JSONEncoder))
    for i, panel in enumerate(out.get("panels", []), start=1):
        panel["id"] = i
    return out


def dump_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


# ---------------------------------------------------------------------------------------------
# provisioning


def datasource_provisioning() -> dict[str, Any]:
    """The ClickHouse datasource (host, user and password from Grafana's environment) and
    the Prometheus that scrapes the processor (its URL from the environment too)."""
    return {
        "apiVersion": 1,
        "datasources": [{
            "name": "failslow ClickHouse",
            "uid": DATASOURCE_UID,
            "type": PLUGIN,
            "isDefault": True,
            "editable": False,
            "jsonData": {
                "host": "${FAILSLOW_CLICKHOUSE_HOST}",
                "port": 8123,
                "protocol": "http",
                "secure": False,
                "username": "${FAILSLOW_CLICKHOUSE_USER}",
                "defaultDatabase": DEFAULT_DATABASE,
            },
            "secureJsonData": {"password": "${FAILSLOW_CLICKHOUSE_PASSWORD}"},
        }, {
            "name": "failslow Prometheus",
            "uid": PROMETHEUS_UID,
            "type": PROMETHEUS_PLUGIN,
            "access": "proxy",
            "url": "${FAILSLOW_PROMETHEUS_URL}",
            "isDefault": False,
            "editable": False,
            "jsonData": {"httpMethod": "POST", "timeInterval": SCRAPE_INTERVAL},
        }],
    }


def prometheus_config(targets: Sequence[str] = (f"127.0.0.1:{METRICS_PORT}",),
                      scrape_interval: str = SCRAPE_INTERVAL) -> dict[str, Any]:
    """Prometheus' configuration: scrape the processor's ``/metrics``
    (:mod:`failslow.stream.metrics`) as job ``failslow-processor``."""
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": [{
            "job_name": PROCESSOR_JOB,
            "metrics_path": "/metrics",
            "static_configs": [{"targets": list(targets)}],
        }],
    }


def dashboard_provisioning() -> dict[str, Any]:
    return {
        "apiVersion": 1,
        "providers": [{
            "name": "failslow",
            "orgId": 1,
            "folder": FOLDER,
            "type": "file",
            "disableDeletion": True,
            "allowUiUpdates": False,
            "updateIntervalSeconds": 60,
            "options": {"path": "/var/lib/grafana/dashboards/failslow"},
        }],
    }


def alert_provisioning(database: str = DEFAULT_DATABASE) -> dict[str, Any]:
    """Grafana's file-provisioning format for alert rules: the ClickHouse ones
    (:func:`~failslow.dashboards.panels.alert_defs`) and the pipeline's on Prometheus
    (:func:`~failslow.dashboards.panels.prometheus_alert_defs`)."""
    rules = []
    for a in alert_defs(database):
        query = ClickHouseQuery("A", a.sql, TABLE).to_json()
        rules.append({
            "uid": a.uid,
            "title": a.title,
            "condition": "B",
            "data": [
                {"refId": "A", "relativeTimeRange": {"from": 600, "to": 0},
                 "datasourceUid": DATASOURCE_UID, "model": query},
                {"refId": "B", "relativeTimeRange": {"from": 0, "to": 0},
                 "datasourceUid": "__expr__",
                 "model": {"refId": "B", "type": "threshold", "expression": "A",
                           "datasource": {"type": "__expr__", "uid": "__expr__"},
                           "conditions": [{"evaluator": {"type": "gt",
                                                         "params": [a.threshold]}}]}},
            ],
            "noDataState": "OK",
            "execErrState": "Error",
            "for": a.for_,
            "annotations": {"summary": a.summary},
            "labels": {"severity": a.severity, "source": "failslow", **a.labels},
            "isPaused": False,
        })
    for p in prometheus_alert_defs():
        rules.append({
            "uid": p.uid,
            "title": p.title,
            "condition": "B",
            "data": [
                {"refId": "A", "relativeTimeRange": {"from": 600, "to": 0},
                 "datasourceUid": PROMETHEUS_UID,
                 "model": {"refId": "A", "expr": p.expr, "instant": True, "range": False,
                           "datasource": {"type": PROMETHEUS_PLUGIN, "uid": PROMETHEUS_UID}}},
                {"refId": "B", "relativeTimeRange": {"from": 0, "to": 0},
                 "datasourceUid": "__expr__",
                 "model": {"refId": "B", "type": "threshold", "expression": "A",
                           "datasource": {"type": "__expr__", "uid": "__expr__"},
                           "conditions": [{"evaluator": {"type": "gt",
                                                         "params": [p.threshold]}}]}},
            ],
            "noDataState": "OK",
            "execErrState": "Error",
            "for": p.for_,
            "annotations": {"summary": p.summary},
            "labels": {"severity": p.severity, "source": "failslow", "component": "pipeline"},
            "isPaused": False,
        })
    return {"apiVersion": 1, "groups": [{"orgId": 1, "name": "failslow", "folder": FOLDER,
                                         "interval": "1m", "rules": rules}]}


def _yaml(obj: Any, head: str) -> str:
    return head + yaml.safe_dump(obj, sort_keys=False, width=100, allow_unicode=True)


GENERATED = "# Generated by failslow dashboards write infra/grafana\n"
#: The provisioning tree of the repository (``verify``'s default).
REPO_TREE = Path(__file__).resolve().parents[1] / "infra" / "grafana"


def files() -> dict[str, str]:
    """Every generated file, path relative to ``infra/grafana`` -> content."""
    out = {f"dashboards/{d.uid}.json": dump_json(build(d)) for d in dashboards()}
    out["provisioning/datasources/failslow.yaml"] = _yaml(datasource_provisioning(), GENERATED)
    out["provisioning/dashboards/failslow.yaml"] = _yaml(dashboard_provisioning(), GENERATED)
    out["provisioning/alerting/failslow.yaml"] = _yaml(alert_provisioning(), GENERATED)
    out["prometheus/prometheus.yml"] = _yaml(prometheus_config(), GENERATED)
    return out


def check(root: str | Path) -> list[str]:
    """Differences between the generated files and those under ``root`` (unified diffs)."""
    diffs = []
    for rel, content in sorted(files().items()):
        path = Path(root) / rel
        old = path.read_text() if path.exists() else ""
        if old != content:
            diffs.append("".join(difflib.unified_diff(
                old.splitlines(keepends=True), content.splitlines(keepends=True),
                f"{path} (committed)", f"{path} (generated)", n=2)) or f"{path}: missing")
    return diffs


def write(root: str | Path) -> list[Path]:
    written = []
    for rel, content in sorted(files().items()):
        path = Path(root) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        written.append(path)
    return written


# ---------------------------------------------------------------------------------------------
# a running Grafana, provisioned from infra/grafana (docker compose up)

#: Grafana log lines that mean provisioning went wrong (logfmt: ``level=error`` from a
#: provisioning, plugin or alerting logger, or a failed provisioning step at any level).
_LOG_PROBLEM = re.compile(
    r"(level=(error|crit)\b.*logger=(provisioning|plugin|ngalert|datasources)"
    r"|logger=(provisioning|plugin|ngalert|datasources)\S*.*level=(error|crit)\b"
    r"|failed to provision|[Ff]ailed to load.*provisioning)")


def log_problems(log_text: str) -> list[str]:
    """The lines of a Grafana server log that report a provisioning, plugin or alerting
    error."""
    return [line.strip() for line in log_text.splitlines() if _LOG_PROBLEM.search(line)]


def verify_live(api: Any, root: str | Path, log_text: str | None = None) -> list[str]:
    """What a running Grafana (``api``: a ``grafana_client.GrafanaApi``) lacks of the
    provisioning tree under ``root``: every dashboard provisioned into the folder with its
    panels and variables, both datasources, every alert rule loaded; and, given the server's
    log, no provisioning errors. Empty: all there."""
    problems: list[str] = []
    root = Path(root)
    for path in sorted((root / "dashboards").glob("*.json")):
        want = json.loads(path.read_text())
        try:
            got = api.dashboard.get_dashboard(want["uid"])
        except Exception as e:  # noqa: BLE001 - report, go on with the next one
            problems.append(f"dashboard {want['uid']}: not found ({e})")
            continue
        meta, dash = got.get("meta", {}), got.get("dashboard", {})
        if not meta.get("provisioned"):
            problems.append(f"dashboard {want['uid']}: not provisioned from a file")
        if meta.get("folderTitle") != FOLDER:
            problems.append(f"dashboard {want['uid']}: in folder {meta.get('folderTitle')!r}, "
                            f"not {FOLDER!r}")
        titles = [p.get("title") for p in dash.get("panels", [])]
        expected = [p["title"] for p in want.get("panels", [])]
        if titles != expected:
            missing = sorted(set(expected) - set(titles))
            problems.append(f"dashboard {want['uid']}: panels differ"
                            + (f" (missing {missing})" if missing else ""))
        names = [v.get("name") for v in dash.get("templating", {}).get("list", [])]
        if names != [v["name"] for v in want.get("templating", {}).get("list", [])]:
            problems.append(f"dashboard {want['uid']}: template variables {names}")
    doc = yaml.safe_load((root / "provisioning/datasources/failslow.yaml").read_text())
    have = {d.get("uid"): d for d in api.datasource.list_datasources()}
    for ds in doc["datasources"]:
        got_ds = have.get(ds["uid"])
        if got_ds is None:
            problems.append(f"datasource {ds['uid']}: missing")
        elif got_ds.get("type") != ds["type"]:
            problems.append(f"datasource {ds['uid']}: type {got_ds.get('type')!r}, "
                            f"not {ds['type']!r}")
    doc = yaml.safe_load((root / "provisioning/alerting/failslow.yaml").read_text())
    rules = {r.get("uid"): r for r in api.alertingprovisioning.get_alertrules_all()}
    for group in doc["groups"]:
        for r in group["rules"]:
            got_rule = rules.get(r["uid"])
            if got_rule is None:
                problems.append(f"alert rule {r['uid']}: not loaded")
            elif got_rule.get("ruleGroup") != group["name"] or \
                    got_rule.get("condition") != r["condition"]:
                problems.append(f"alert rule {r['uid']}: group {got_rule.get('ruleGroup')!r}"
                                f", condition {got_rule.get('condition')!r}")
    if log_text is not None:
        problems += [f"log: {line}" for line in log_problems(log_text)]
    return problems


def connect(url: str) -> Any:
    """A ``grafana_client.GrafanaApi`` for the Grafana at ``url``, logged in with the
    settings' Grafana user and password (``GRAFANA_USER`` / ``GRAFANA_ADMIN_PASSWORD``)."""
    from grafana_client import GrafanaApi

    from failslow.settings import get_settings

    creds = get_settings().grafana
    return GrafanaApi.from_url(url, credential=(creds.user, creds.password.get_secret_value()))
