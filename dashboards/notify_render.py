"""What a page says (:mod:`failslow.dashboards.notify`): the one-line summary, the mitigation
advice line, and the body for each receiver type (generic JSON, Slack incoming webhook,
PagerDuty Events API v2, the Alertmanager webhook body), each carrying the one-screen page of
:mod:`.notify_page` in the fields that service shows."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from failslow.dashboards.notify_config import Receiver
from failslow.dashboards.notify_page import (
    Page,
    build_page,
    culprits,
    revised_from,
    victims,
    when,
    zone,
)
from failslow.diagnosis import Anomaly


def _iso(ns: int | None) -> str:
    if ns is None:
        return "0001-01-01T00:00:00Z"
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _who(a: Anomaly, hosts: Mapping[str, str] | None = None) -> str:
    hosts = hosts or {}
    if a.link:
        names = [hosts.get(str(r), "") for r in a.link]
        on = f" ({' ↔ '.join(names)})" if any(names) else ""
        return "link " + "-".join(str(r) for r in a.link) + on
    shown = ",".join(str(r) for r in a.ranks[:8]) + ("…" if len(a.ranks) > 8 else "")
    names = sorted({hosts[str(r)] for r in a.ranks if str(r) in hosts})
    on = f" on {','.join(names[:3])}{'…' if len(names) > 3 else ''}" if names else ""
    return "rank" + ("s " if len(a.ranks) != 1 else " ") + shown + on


def summary(job: str, a: Anomaly, event: str, sev: str, cost: float,
            advice: Mapping[str, Any] | None = None,
            hosts: Mapping[str, str] | None = None, tz_name: str | None = None) -> str:
    """One line: severity, job, cause, where (with hosts), stage, since when, how bad. The
    end of a report another one took over (``superseded_by``: an absorbed link that now
    slows the job) says so instead of "resolved": the fault did not go away."""
    head = {"trigger": "", "escalate": "escalated: ", "resolve": "resolved: ",
            "advise": "mitigation advice: ", "revise": "revised: "}[event]
    if event == "resolve" and a.superseded_by:
        head = f"superseded by {a.superseded_by} (not recovered, follow that report): "
    parts = [f"{head}[{sev}] {job}: {a.kind}/{a.cause} at {_who(a, hosts)}"]
    prev = revised_from(a) if event == "revise" else None
    if prev is not None:
        parts.append(f"(was {prev.cause} at {_who(prev, hosts)})")
    if a.stage:
        parts.append(f"in {a.stage}")
    if a.slowdown is not None:
        parts.append(f"({a.slowdown:.2f}x)")
    if a.start_ns is not None:
        parts.append(f"since {when(a.start_ns, zone(tz_name))}")
    parts.append(f"~{cost:.3g} GPU-h lost")
    count = victims(a)[1]
    if count:
        parts[-1] += f", {count} ranks waiting"
    line = advice_text(advice, resolved=event == "resolve")
    return " ".join(parts) + (f"; {line}" if line else "")


def advice_text(advice: Mapping[str, Any] | None, resolved: bool = False) -> str:
    """One line for the anomaly's current advice ("" when none). Once the anomaly resolved,
    an applied reversible strategy (S2, S3) is to be reverted (the planner's next advice)."""
    if not advice:
        return ""
    strategy, action = advice.get("strategy", "?"), advice.get("action", "?")
    if resolved and action == "apply" and strategy in ("S2", "S3"):
        action = "revert"
    text = f"advice {strategy} {action}: {advice.get('description', '')}"
    if action == "apply" and advice.get("reason"):
        text += f" ({advice['reason']})"
    plan = advice.get("plan") or {}
    if action == "apply" and strategy == "S2" and isinstance(plan, Mapping) and plan.get("m"):
        text += f", micro-batches per DP group {' '.join(str(m) for m in plan['m'])}"
    return text


@dataclass(frozen=True)
class Notice:
    """What a page says, before it is shaped for a receiver type."""

    event: str  # trigger | escalate | resolve | advise | revise
    job: str
    anomaly: dict[str, Any]
    severity: str
    cost_gpu_hours: float
    dedup_key: str
    advice: dict[str, Any] | None = None  # the anomaly's current mitigation advice
    world_size: int = 0  # the job's ranks (from its meta; 0: unknown)
    hosts: dict[str, str] | None = None  # rank -> host of the ranks the page names
    grafana_url: str = ""  # base URL for the dashboard links ("" : none)
    timezone: str | None = None  # IANA zone of the local times (None: the machine's)
    now_ns: int | None = None  # when the notice was decided (wall clock)

    @property
    def a(self) -> Anomaly:
        return Anomaly.from_dict(dict(self.anomaly))

    @property
    def text(self) -> str:
        return summary(self.job, self.a, self.event, self.severity, self.cost_gpu_hours,
                       self.advice, self.hosts, self.timezone)

    @property
    def page(self) -> Page:
        a = self.a
        return build_page(self.text, self.event, self.job, a, self.cost_gpu_hours,
                          self.world_size or max(len(a.ranks), 1), self.hosts or {},
                          self.advice, self.grafana_url, self.timezone, self.now_ns)

    def brief_anomaly(self) -> dict[str, Any]:
        """The anomaly without its long lists (victims, blocked rounds): counts instead."""
        d = dict(self.anomaly)
        if "victims" in d:
            d["victims"] = (d.get("victims") or [])[:8]
        d.pop("blocked_rounds", None)
        return d


_PD_SEVERITY = {"info": "info", "warning": "warning", "error": "error", "critical": "critical"}
_SLACK_COLOR = {"info": "#439FE0", "warning": "#ECB22E", "error": "#E01E5A",
                "critical": "#8B0000", "resolve": "#2EB67D"}


def _labels(n: Notice, a: Anomaly) -> dict[str, str]:
    labels = {"alertname": f"failslow_{a.kind}", "job": n.job, "anomaly_id": a.id,
              "kind": a.kind, "cause": a.cause, "severity": n.severity}
    if a.stage:
        labels["stage"] = a.stage
    ranks = culprits(a)
    if ranks:
        labels["rank"] = ",".join(str(r) for r in ranks[:8])
        hosts = sorted({(n.hosts or {})[str(r)] for r in ranks if str(r) in (n.hosts or {})})
        if hosts:
            labels["instance"] = ",".join(hosts)
    return labels


def _page_dict(p: Page) -> dict[str, Any]:
    return {"title": p.title, "what": p.what, "where": p.where, "since": p.since,
            "resolved": p.resolved, "impact": p.impact, "evidence": p.evidence,
            "what_to_do": p.advice, "links": p.links}


def _details(n: Notice, p: Page | None = None) -> dict[str, Any]:
    p = p or n.page
    return {**{k: v for k, v in _page_dict(p).items() if k != "title" and v},
            "job": n.job, "cost_gpu_hours": round(n.cost_gpu_hours, 6),
            "severity": n.severity, "hosts": n.hosts or {}, "anomaly": n.brief_anomaly(),
            "advice": n.advice}


def pagerduty_payload(n: Notice, receiver: Receiver, env: Mapping[str, str]) -> dict[str, Any]:
    """PagerDuty Events API v2: a trigger (also for escalations and advice: the same dedup
    key updates the incident) or a resolve."""
    a = n.a
    body: dict[str, Any] = {
        "routing_key": receiver.routing_key(env),
        "event_action": "resolve" if n.event == "resolve" else "trigger",
        "dedup_key": n.dedup_key,
    }
    if n.event != "resolve":
        p = n.page
        body["payload"] = {
            "summary": n.text[:1024], "source": n.job, "severity": _PD_SEVERITY[n.severity],
            "timestamp": _iso(a.start_ns), "component": _who(a, n.hosts),
            "group": a.stage or a.comm_kind or "unknown", "class": f"{a.kind}/{a.cause}",
            "custom_details": _details(n, p)}
        body["client"] = "failslow"
        if p.links:
            body["client_url"] = next(iter(p.links.values()))
            body["links"] = [{"href": url, "text": name} for name, url in p.links.items()]
    return body


def slack_payload(n: Notice, receiver: Receiver, env: Mapping[str, str]) -> dict[str, Any]:
    """A Slack incoming webhook message: the summary and one attachment of fields."""
    a = n.a
    p = n.page
    color = _SLACK_COLOR["resolve" if n.event == "resolve" and not a.superseded_by
                         else n.severity]
    fields = [{"title": "job", "value": n.job, "short": True},
              {"title": "cause", "value": f"{a.kind}/{a.cause}", "short": True},
              {"title": "where", "value": p.where, "short": False},
              {"title": "since", "value": p.since, "short": False}]
    if p.resolved:
        fields.append({"title": "resolved", "value": p.resolved, "short": False})
    fields += [{"title": "impact", "value": p.impact, "short": False},
               {"title": "evidence", "value": "\n".join(p.evidence) or "-", "short": False},
               {"title": "what to do", "value": p.advice, "short": False}]
    advice_line = advice_text(n.advice, resolved=n.event == "resolve")
    if advice_line:
        fields.append({"title": "mitigation", "value": advice_line, "short": False})
    links = " | ".join(f"<{url}|{name}>" for name, url in p.links.items())
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": f"*{_slack_escape(p.title)}*"}},
        {"type": "section", "fields": [
            {"type": "mrkdwn", "text": f"*{k}*\n{_slack_escape(v)}"}
            for k, v in (("where", p.where), ("since", p.resolved or p.since),
                         ("impact", p.impact), ("advice", p.advice))]},
        {"type": "context", "elements": [
            {"type": "mrkdwn", "text": _slack_escape(e)} for e in p.evidence[:10]]
         or [{"type": "mrkdwn", "text": "no signal lines"}]},
    ]
    if p.links:
        blocks.append({"type": "actions", "elements": [
            {"type": "button", "text": {"type": "plain_text", "text": name[:75]}, "url": url}
            for name, url in list(p.links.items())[:5]]})
    attachment = {"color": color, "fields": fields, "footer": f"failslow {n.dedup_key}"}
    if links:
        attachment["text"] = links
    return {"text": n.text, "blocks": blocks, "attachments": [attachment]}


def _slack_escape(text: str) -> str:
    """Slack's three control characters (its "escaping text" rules)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def alertmanager_payload(n: Notice, receiver: Receiver,
                         env: Mapping[str, str]) -> dict[str, Any]:
    """The body Alertmanager posts to webhook receivers (version 4), one alert."""
    a = n.a
    p = n.page
    labels = _labels(n, a)
    resolved = n.event == "resolve"
    end = a.end_ns if resolved else None
    annotations = {"summary": n.text, "description": p.text(), "what_to_do": p.advice,
                   "impact": p.impact, "since": p.since, "where": p.where,
                   "evidence": "\n".join(p.evidence),
                   "details": json.dumps(_details(n, p), sort_keys=True)}
    advice_line = advice_text(n.advice, resolved=resolved)
    if advice_line:
        annotations["advice"] = advice_line
    if resolved and a.superseded_by:
        annotations["superseded_by"] = str(a.superseded_by)
    if p.links:
        annotations["dashboard"] = next(iter(p.links.values()))
    alert = {"status": "resolved" if resolved else "firing", "labels": labels,
             "annotations": annotations,
             "startsAt": _iso(a.start_ns), "endsAt": _iso(end),
             "generatorURL": annotations.get("dashboard", ""), "fingerprint": hashlib.sha256(
                 n.dedup_key.encode()).hexdigest()[:16]}
    alerts = [alert]
    prev = revised_from(a) if n.event == "revise" else None
    if prev is not None:
        # Alertmanager tells alerts apart by their labels: the alert of the root first
        # reported ends here, the revised one fires in its place
        old = _labels(n, prev)
        annotations["revised_from"] = f"{prev.kind}/{prev.cause} at {_who(prev, n.hosts)}"
        alerts.append({"status": "resolved", "labels": old,
                       "annotations": {**annotations, "summary": "revised: " + n.text},
                       "startsAt": _iso(a.start_ns), "endsAt": _iso(n.now_ns),
                       "generatorURL": alert["generatorURL"],
                       "fingerprint": hashlib.sha256(
                           (n.dedup_key + "#revised").encode()).hexdigest()[:16]})
    return {"version": "4", "groupKey": f"{{}}:{{job={n.job!r}}}", "truncatedAlerts": 0,
            "status": alert["status"], "receiver": receiver.name,
            "groupLabels": {"job": n.job}, "commonLabels": labels,
            "commonAnnotations": alert["annotations"], "externalURL": n.grafana_url,
            "alerts": alerts}


def generic_payload(n: Notice, receiver: Receiver, env: Mapping[str, str]) -> dict[str, Any]:
    """failslow's own JSON (version 1): the notice as it is."""
    p = n.page
    return {"version": 1, "event": n.event, "dedup_key": n.dedup_key, "job": n.job,
            "severity": n.severity, "cost_gpu_hours": round(n.cost_gpu_hours, 6),
            "summary": n.text, "page": _page_dict(p), "text": p.text(),
            "hosts": n.hosts or {}, "anomaly": n.brief_anomaly(), "advice": n.advice,
            "superseded_by": n.a.superseded_by if n.event == "resolve" else None,
            "revised_from": (n.a.extra.get("revised") if n.event == "revise" else None)}


Render = Callable[[Notice, Receiver, Mapping[str, str]], dict[str, Any]]
#: Receiver type -> its body.
RENDERERS: dict[str, Render] = {
    "pagerduty": pagerduty_payload,
    "slack": slack_payload,
    "alertmanager": alertmanager_payload,
    "generic": generic_payload,
}


def payload(n: Notice, receiver: Receiver, env: Mapping[str, str]) -> dict[str, Any]:
    """The body for ``receiver``'s type."""
    return RENDERERS.get(receiver.type, generic_payload)(n, receiver, env)
