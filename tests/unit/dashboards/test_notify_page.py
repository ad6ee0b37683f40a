"""Pages an on-call engineer can act on (issue 18): against the real HTTP receiver on
127.0.0.1 of the notify tests, every receiver kind gets, in the fields that service
documents, what and where (ranks with hosts, a link with both hosts, communicator, stage),
since when in local time and UTC, how bad (slowdown, GPU-hours so far and per hour), one
evidence line per signal, what to do, Grafana links filtered on the job and the time range
(base URL from the settings), a short victims summary and a resolve message. Severity rules
live in the routes file; anomalies below the thresholds are kept and routable."""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from test_notify import T0, Receiver, _config, _env, _publish, _slow, _transport
from test_notify import receiver as receiver  # noqa: F401 - the fixture

from conftest import REPO
from failslow import events, settings
from failslow.dashboards import notify
from failslow.dashboards.notify import Notifier
from failslow.diagnosis import Anomaly
from failslow.stream.transport import InProcessTransport

JOB = "prod-hang"
GRAFANA = "http://grafana.example:3000"
NODES = {r: f"gpu-node-{r // 8:02d}" for r in range(48)}
VICTIMS = [r for r in range(40) if r not in (22, 24)][:35]


def _meta(t: InProcessTransport, job: str = JOB, world: int = 48) -> None:
    t.publish_meta(events.JobMeta(job=job, t=1, world_size=world, tp=1, pp=1, dp=world, cp=1,
                                  microbatches=1, schedule="1f1b", nodes=dict(NODES),
                                  comms=()))


def _hang(end: int | None = None) -> Anomaly:
    return Anomaly(id="hang-0", kind="hang", cause="hardware", ranks=[22, 24], link=[22, 24],
                   comm=99, comm_kind="dp", stage="dp_sync", start_ns=T0,
                   detected_ns=T0 + 40 * 10**9, end_ns=end,
                   extra={"victims": VICTIMS, "victims_count": len(VICTIMS),
                          "halt_point": {"op": "allreduce", "seq": 812, "t_enter": T0,
                                         "missing": [24], "entered": [22]},
                          "blocked_rounds": [{"comm": 99, "seq": 812}] * 20})


def _cfg(tmp_path: Path, rx: Receiver, **over: Any) -> notify.Config:
    over.setdefault("timezone", "Europe/Berlin")
    over.setdefault("grafana_url", GRAFANA)
    return _config(tmp_path, rx, **over)


def _query(url: str) -> dict[str, str]:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))


def _check_page_fields(page: dict[str, Any]) -> None:
    """The one screen, whatever the receiver."""
    assert "link 22-24 (gpu-node-02 ↔ gpu-node-03)" in page["where"]
    assert "dp communicator 99" in page["where"] and "stage dp_sync" in page["where"]
    # T0 = 2025-06-15 15:06:40 UTC = 17:06:40 in Berlin (CEST)
    assert "2025-06-15 17:06:40 CEST (15:06:40 UTC)" in page["since"]
    assert "GPU-h lost so far" in page["impact"] and "48 GPU-h per hour" in page["impact"]
    evidence = page["evidence"]
    assert any("halted at allreduce seq 812 waiting for rank 24 (gpu-node-03)" in e
               for e in evidence), evidence
    assert any(e.startswith("35 of 48 ranks wait on it on 5 host(s): ranks 0-21, 23, 25-36")
               for e in evidence), evidence
    assert "restart from the last checkpoint without gpu-node-02, gpu-node-03" in \
        page["what_to_do"]


def test_a_page_in_every_shape(tmp_path: Path, receiver: Receiver) -> None:
    t = _transport()
    _meta(t)
    _publish(t, JOB, _hang(), 1)
    _publish(t, JOB, _hang(end=T0 + 725 * 10**9), 2)
    n = Notifier(_cfg(tmp_path, receiver), env=_env(receiver))
    notify.run(n, t, until_idle=True)

    hook = [r.json for r in receiver.at("/hook")]
    assert [h["event"] for h in hook] == ["trigger", "resolve"]
    g = hook[0]
    assert g["summary"].startswith("[critical] prod-hang: hang/hardware at link 22-24 "
                                   "(gpu-node-02 ↔ gpu-node-03) in dp_sync since 2025-06-15 "
                                   "17:06:40 CEST (15:06:40 UTC)")
    assert "35 ranks waiting" in g["summary"]
    _check_page_fields(g["page"])
    assert g["hosts"]["24"] == "gpu-node-03" and g["hosts"]["22"] == "gpu-node-02"
    assert len(g["anomaly"]["victims"]) <= 8 and g["anomaly"]["victims_count"] == 35
    assert "blocked_rounds" not in g["anomaly"]
    job_link = g["page"]["links"]["job dashboard"]
    assert job_link.startswith(f"{GRAFANA}/d/failslow-job/?")
    q = _query(job_link)
    assert q["var-job"] == JOB
    assert int(q["from"]) <= T0 // 10**6 <= int(q["to"])
    assert _query(g["page"]["links"]["hangs"])["var-job"] == JOB
    assert "what_to_do" in g["text"] or "advice" in g["text"]
    resolved = hook[1]["page"]["resolved"]
    assert resolved == "ended 2025-06-15 17:18:45 CEST (15:18:45 UTC) after 12 min", resolved

    slack = [r.json for r in receiver.at("/slack")]
    body = slack[0]
    assert body["text"] == g["summary"]
    kinds = [b["type"] for b in body["blocks"]]
    assert kinds == ["section", "section", "context", "actions"]
    fields = {f["text"].split("\n", 1)[0]: f["text"] for f in body["blocks"][1]["fields"]}
    assert "gpu-node-03" in fields["*where*"] and "UTC" in fields["*since*"]
    assert "GPU-h" in fields["*impact*"] and "restart" in fields["*advice*"]
    buttons = body["blocks"][3]["elements"]
    assert buttons[0]["type"] == "button" and buttons[0]["url"] == job_link
    att = {f["title"]: f["value"] for f in body["attachments"][0]["fields"]}
    assert "gpu-node-02" in att["where"] and "35 of 48 ranks" in att["evidence"]
    assert "ended 2025-06-15 17:18:45 CEST" in {
        f["title"]: f["value"] for f in slack[1]["attachments"][0]["fields"]}["resolved"]

    [pd] = [r.json for r in receiver.at("/pd")][:1]
    assert pd["event_action"] == "trigger" and pd["dedup_key"] == f"{JOB}/hang-0"
    p = pd["payload"]
    assert p["severity"] == "critical" and p["source"] == JOB
    assert p["summary"] == g["summary"][:1024] and p["timestamp"].startswith("2025-06-15T15:06")
    assert "gpu-node-03" in p["component"]
    _check_page_fields(p["custom_details"])
    assert pd["links"][0] == {"href": job_link, "text": "job dashboard"}
    assert pd["client"] == "failslow" and pd["client_url"] == job_link
    assert receiver.at("/pd")[-1].json["event_action"] == "resolve"

    am = [r.json for r in receiver.at("/am")]
    alert = am[0]["alerts"][0]
    assert am[0]["version"] == "4" and am[0]["status"] == "firing"
    assert am[0]["externalURL"] == GRAFANA and alert["generatorURL"] == job_link
    assert alert["labels"]["instance"] == "gpu-node-02,gpu-node-03"
    assert alert["labels"]["rank"] == "22,24" and alert["labels"]["severity"] == "critical"
    ann = alert["annotations"]
    assert ann["summary"] == g["summary"] and "restart" in ann["what_to_do"]
    assert "gpu-node-03" in ann["description"] and "17:06:40 CEST" in ann["description"]
    assert am[1]["status"] == "resolved"
    assert am[1]["alerts"][0]["endsAt"].startswith("2025-06-15T15:18:45")


def test_grafana_base_url_comes_from_the_settings(tmp_path: Path, receiver: Receiver,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAILSLOW_GRAFANA_URL", "https://grafana.corp/")
    settings.reload_settings()
    try:
        t = _transport()
        _meta(t)
        _publish(t, JOB, _hang(), 1)
        n = Notifier(_config(tmp_path, receiver), env=_env(receiver))
        notify.run(n, t, until_idle=True)
    finally:
        monkeypatch.delenv("FAILSLOW_GRAFANA_URL")
        settings.reload_settings()
    links = receiver.at("/hook")[0].json["page"]["links"]
    assert links["job dashboard"].startswith("https://grafana.corp/d/failslow-job/?var-job=")


def test_advice_with_its_cost_and_why_there_is_none(tmp_path: Path, receiver: Receiver) -> None:
    t = _transport()
    _publish(t, "job-s", _slow(), 1)
    n = Notifier(_cfg(tmp_path, receiver, routes=[{"receivers": ["hook"]}]),
                 env=_env(receiver))
    notify.run(n, t, until_idle=True)
    page = receiver.at("/hook")[0].json["page"]
    assert page["what_to_do"].startswith("none yet: the impact so far is below the cheapest "
                                         "action's cost")
    assert page["evidence"] == ["iteration time 1.25x its baseline",
                                "slowest collective 50% over its baseline time (CCL-D R)",
                                "90% of the extra time is late arrival (compute) (CCL-D P)"]
    assert page["where"] == "rank 21; dp communicator 7; stage dp_sync"
    n.offer_advice({"kind": "mitigation_advice", "job": "job-s", "anomaly_id": "slow-0",
                    "advice_id": "slow-0/S2/apply", "strategy": "S2", "action": "apply",
                    "t_ns": T0, "impact_s": 600.0, "cost_s": 5.0,
                    "description": "re-balance micro-batches", "plan": {"m": [3, 5]}})
    notify.run(n, t, until_idle=True)
    advise = receiver.at("/hook")[-1].json
    assert advise["event"] == "advise"
    assert advise["page"]["what_to_do"] == ("S2 apply: re-balance micro-batches, micro-batches "
                                            "per DP group 3 5; costs 5 s of training, against "
                                            "10 min lost so far")


def test_below_threshold_kept_and_routed_to_a_low_urgency_channel(tmp_path: Path,
                                                                  receiver: Receiver) -> None:
    routes = [{"match": {"min_severity": "warning"}, "receivers": ["pd"]},
              {"match": {"max_severity": "info"}, "receivers": ["slack"]}]
    t = _transport()
    _publish(t, "job-x", _slow(), 1)  # 1 rank x 2 s: info
    n = Notifier(_cfg(tmp_path, receiver, routes=routes), env=_env(receiver))
    notify.run(n, t, until_idle=True)
    assert [r.json["text"][:6] for r in receiver.at("/slack")] == ["[info]"]
    assert receiver.at("/pd") == [] and n.stats.unrouted == 0

    # without a route for it: kept (counted, logged), and it pages once it escalates
    clock = [1000.0]
    m = Notifier(_cfg(tmp_path / "b", receiver, routes=routes[:1]), env=_env(receiver),
                 clock=lambda: clock[0])
    t2 = _transport()
    _meta(t2, "job-y", 512)
    _publish(t2, "job-y", _slow(), 1)
    notify.run(m, t2, until_idle=True)
    assert m.stats.unrouted == 1 and "job-y/slow-0" in m.known and receiver.at("/pd") == []
    clock[0] += 3600.0  # 512 GPUs x 1 h x 0.2: 102 GPU-h, critical
    m.tick()
    m.deliver_due()
    [pd] = [r.json for r in receiver.at("/pd")]
    assert pd["payload"]["severity"] == "critical" and pd["dedup_key"] == "job-y/slow-0"


def test_severity_rules_in_the_routes_file(tmp_path: Path, receiver: Receiver) -> None:
    rules = [{"match": {"cause": "compute", "job": "train-*"}, "at_least": "error"},
             {"match": {"kind": "hang", "job": "test-*"}, "severity": "warning"},
             {"match": {"kind": "hang"}, "severity": "critical"}]
    cfg = _cfg(tmp_path, receiver, severity_rules=rules)
    small = _slow()
    assert cfg.severity("train-1", small, 0.0) == "error"
    assert cfg.severity("other", small, 0.0) == "info"
    assert cfg.severity("test-1", _hang(), 0.0) == "warning"
    assert cfg.severity("prod", _hang(), 0.0) == "critical"
    assert _cfg(tmp_path, receiver).severity("x", _hang(), 0.0) == "critical"  # the default
    with pytest.raises(notify.ConfigError, match="severity_rules"):
        _cfg(tmp_path, receiver, severity_rules=[{"match": {}, "severity": "loud"}])
    with pytest.raises(notify.ConfigError, match="timezone"):
        _cfg(tmp_path, receiver, timezone="Mars/Olympus")
    example = notify.load_config(REPO / "infra" / "notify" / "routes.yaml",
                                 env={"FAILSLOW_WEBHOOK_URL": "http://127.0.0.1:1/",
                                      "FAILSLOW_WEBHOOK_SECRET": "x"})
    assert example.severity_rules and example.severity("j", _hang(), 0.0) == "critical"
    assert any(r.match.max_severity == "info" for r in example.routes)
