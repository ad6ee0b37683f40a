"""``failslow dashboards verify URL``: checks through Grafana's HTTP API
(grafana-client) that a running Grafana has every dashboard of infra/grafana provisioned
with its panels and variables, both datasources and every alert rule, and that its log has
no provisioning errors.

No Grafana server can be installed on this machine (not in Debian, and the Go module proxy
refuses github.com/grafana/grafana), so with ``FAILSLOW_GRAFANA_URL`` set (e.g. after
``docker compose up``: http://127.0.0.1:3000) the check runs against that server; always,
it runs against a stand-in on 127.0.0.1 that answers the four API paths the way a
provisioned Grafana does, to show that each kind of gap is caught.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import REPO
from failslow import cli
from failslow.dashboards import grafana, panels

ROOT = REPO / "infra" / "grafana"
USER, PASSWORD = "admin", "s3cret"


def _provisioned() -> dict[str, Any]:
    """What Grafana serves after provisioning infra/grafana."""
    dashboards = {}
    for path in sorted((ROOT / "dashboards").glob("*.json")):
        d = json.loads(path.read_text())
        dashboards[d["uid"]] = {"dashboard": d, "meta": {
            "provisioned": True, "folderTitle": grafana.FOLDER,
            "provisionedExternalId": path.name}}
    ds_doc = yaml.safe_load((ROOT / "provisioning/datasources/failslow.yaml").read_text())
    datasources = [{"id": i + 1, "uid": d["uid"], "name": d["name"], "type": d["type"],
                    "access": "proxy", "isDefault": d.get("isDefault", False)}
                   for i, d in enumerate(ds_doc["datasources"])]
    al_doc = yaml.safe_load((ROOT / "provisioning/alerting/failslow.yaml").read_text())
    rules = [{**r, "ruleGroup": g["name"], "folderUID": "failslow-folder", "orgID": 1,
              "provenance": "file"} for g in al_doc["groups"] for r in g["rules"]]
    return {"dashboards": dashboards, "datasources": datasources, "rules": rules}


class _StandIn:
    """Grafana's /api/dashboards/uid/UID, /api/datasources, /api/v1/provisioning/alert-rules
    and /api/frontend/settings, with basic auth, on 127.0.0.1."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state
        stand_in = self
        token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                if self.headers.get("Authorization") != f"Basic {token}":
                    return self._send(401, {"message": "Unauthorized"})
                path = self.path.split("?")[0]
                st = stand_in.state
                if path.startswith("/api/dashboards/uid/"):
                    uid = path.rsplit("/", 1)[1]
                    if uid in st["dashboards"]:
                        return self._send(200, st["dashboards"][uid])
                    return self._send(404, {"message": "Dashboard not found"})
                if path == "/api/datasources":
                    return self._send(200, st["datasources"])
                if path == "/api/v1/provisioning/alert-rules":
                    return self._send(200, st["rules"])
                if path == "/api/frontend/settings":
                    return self._send(200, {"buildInfo": {"version": "stand-in"}})
                return self._send(404, {"message": "Not found"})

            def _send(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stand_in() -> Iterator[_StandIn]:
    s = _StandIn(_provisioned())
    try:
        yield s
    finally:
        s.close()


def _api(url: str, user: str = USER, password: str = PASSWORD) -> Any:
    from grafana_client import GrafanaApi

    return GrafanaApi.from_url(url, credential=(user, password))


@pytest.mark.skipif(not os.environ.get("FAILSLOW_GRAFANA_URL"),
                    reason="no running Grafana (set FAILSLOW_GRAFANA_URL after docker compose "
                           "up; GRAFANA_ADMIN_PASSWORD if not admin)")
def test_a_real_grafana_has_everything() -> None:
    url = os.environ["FAILSLOW_GRAFANA_URL"]
    api = _api(url, os.environ.get("GRAFANA_USER", "admin"),
               os.environ.get("GRAFANA_ADMIN_PASSWORD", "admin"))
    log = os.environ.get("FAILSLOW_GRAFANA_LOG")
    log_text = Path(log).read_text(errors="replace") if log else None
    assert grafana.verify_live(api, ROOT, log_text) == []


def test_a_fully_provisioned_grafana_passes(stand_in: _StandIn,
                                            monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert grafana.verify_live(_api(stand_in.url), ROOT) == []
    monkeypatch.setenv("GRAFANA_USER", USER)
    monkeypatch.setenv("GRAFANA_ADMIN_PASSWORD", PASSWORD)
    verify = ["dashboards", "verify", stand_in.url, "--root", str(ROOT)]
    assert cli.main(verify) == 0  # user and password from the settings
    assert "is provisioned" in capsys.readouterr().out
    monkeypatch.setenv("GRAFANA_ADMIN_PASSWORD", "wrong")
    assert cli.main(verify) == 1
    assert "unauthori" in capsys.readouterr().err.lower()


def test_each_gap_is_reported(stand_in: _StandIn) -> None:
    base = copy.deepcopy(stand_in.state)
    api = _api(stand_in.url)

    def problems(**change: Any) -> list[str]:
        stand_in.state = copy.deepcopy(base) | change
        return grafana.verify_live(api, ROOT)

    dashboards = copy.deepcopy(base["dashboards"])
    del dashboards["failslow-hangs"]
    job = dashboards["failslow-job"]
    job["dashboard"]["panels"] = [p for p in job["dashboard"]["panels"]
                                  if p["title"] != "Mitigation advice"]
    dashboards["failslow-pipeline"]["meta"]["provisioned"] = False
    found = problems(dashboards=dashboards)
    assert len(found) == 3
    assert any("failslow-hangs: not found" in p for p in found)
    assert any("failslow-job: panels differ (missing ['Mitigation advice'])" in p
               for p in found)
    assert any("failslow-pipeline: not provisioned" in p for p in found)

    found = problems(datasources=[d for d in base["datasources"]
                                  if d["uid"] != panels.PROMETHEUS_UID])
    assert found == [f"datasource {panels.PROMETHEUS_UID}: missing"]

    found = problems(rules=[r for r in base["rules"] if r["uid"] != "failslow-hang"])
    assert found == ["alert rule failslow-hang: not loaded"]


def test_provisioning_errors_in_the_log() -> None:
    clean = "\n".join([
        'logger=settings t=2026-01-01T00:00:00Z level=info msg="Starting Grafana"',
        'logger=provisioning.datasources t=2026-01-01T00:00:01Z level=info '
        'msg="inserting datasource from configuration" uid=failslow-clickhouse',
        'logger=provisioning.dashboard t=2026-01-01T00:00:02Z level=info '
        'msg="starting to provision dashboards"',
        'logger=ngalert.state.manager t=2026-01-01T00:00:03Z level=warn msg="Error evaluating"',
        ""])
    assert grafana.log_problems(clean) == []
    bad = clean + (
        'logger=provisioning.dashboard type=file name=failslow t=2026-01-01T00:00:04Z '
        'level=error msg="failed to load dashboard from " file=/var/lib/grafana/dashboards/'
        'failslow/failslow-job.json error="invalid character"\n'
        'logger=plugin.loader t=2026-01-01T00:00:05Z level=error msg="Could not load plugin" '
        'pluginId=grafana-clickhouse-datasource\n')
    found = grafana.log_problems(bad)
    assert len(found) == 2 and "failslow-job.json" in found[0] and "clickhouse" in found[1]
