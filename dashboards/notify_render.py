"""What a page says (:mod:`failslow.dashboards.notify`): the one-line summary, the mitigation
advice line, and the body for each receiver type (generic JSON, Slack incoming webhook,
PagerDuty Events API v2, the Alertmanager webhook body)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from failslow.dashboards.notify_config import Receiver
from failslow.diagnosis import Anomaly


def _iso(ns: int | None) -> str:
    if ns is None:
        return "0001-01-01T00:00:00Z"
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _who(a: Anomaly) -> str:
    if a.link:
        return "link " + "-".join(str(r) for r in a.link)
    return "rank" + ("s " if len(a.ranks) != 1 else " ") + ",".join(str(r) for r in a.ranks)


def summary(job: str, a: Anomaly, event: str, sev: str, cost: float,
            advice: Mapping[str, Any] | None = None) -> str:
    head = {"trigger": "", "escalate": "escalated: ", "resolve": "resolved: ",
            "advise": "mitigation advice: "}[event]
    parts = [f"{head}[{sev}] {job}: {a.kind}/{a.cause} at {_who(a)}"]
    if a.stage:
        parts.append(f"in {a.stage}")
    if a.slowdown is not None:
        parts.append(f"({a.slowdown:.2f}x)")
    parts.append(f"~{cost:.3g} GPU-h lost")
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

    event: str  # trigger | escalate | resolve
    job: str
    anomaly: dict[str, Any]
    severity: str
    cost_gpu_hours: float
    dedup_key: str
    advice: dict[str, Any] | None = None  # the anomaly's current mitigation advice

    @property
    def a(self) -> Anomaly:
        return Anomaly.from_dict(dict(self.anomaly))

    @property
    def text(self) -> str:
        return summary(self.job, self.a, self.event, self.severity, self.cost_gpu_hours,
                       self.advice)


_PD_SEVERITY = {"info": "info", "warning": "warning", "error": "error", "critical": "critical"}
_SLACK_COLOR = {"info": "#439FE0", "warning": "#ECB22E", "error": "#E01E5A",
                "critical": "#8B0000", "resolve": "#2EB67D"}


def _labels(n: Notice, a: Anomaly) -> dict[str, str]:
    labels = {"alertname": f"failslow_{a.kind}", "job": n.job, "anomaly_id": a.id,
              "kind": a.kind, "cause": a.cause, "severity": n.severity}
    if a.stage:
        labels["stage"] = a.stage
    return labels


def _details(n: Notice) -> dict[str, Any]:
    return {"job": n.job, "anomaly": n.anomaly, "cost_gpu_hours": round(n.cost_gpu_hours, 6),
            "severity": n.severity, "advice": n.advice}


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
        body["payload"] = {
            "summary": n.text[:1024], "source": n.job, "severity": _PD_SEVERITY[n.severity],
            "timestamp": _iso(a.start_ns), "component": _who(a),
            "group": a.stage or a.comm_kind or "unknown", "class": f"{a.kind}/{a.cause}",
            "custom_details": _details(n)}
    return body


def slack_payload(n: Notice, receiver: Receiver, env: Mapping[str, str]) -> dict[str, Any]:
    """A Slack incoming webhook message: the summary and one attachment of fields."""
    a = n.a
    advice_line = advice_text(n.advice, resolved=n.event == "resolve")
    color = _SLACK_COLOR["resolve" if n.event == "resolve" else n.severity]
    fields = [{"title": "job", "value": n.job, "short": True},
              {"title": "cause", "value": f"{a.kind}/{a.cause}", "short": True},
              {"title": "where", "value": _who(a), "short": True},
              {"title": "stage", "value": a.stage or "-", "short": True}]
    if advice_line:
        fields.append({"title": "mitigation", "value": advice_line, "short": False})
    return {"text": n.text, "attachments": [{"color": color, "fields": fields,
                                             "footer": f"failslow {n.dedup_key}"}]}


def alertmanager_payload(n: Notice, receiver: Receiver,
                         env: Mapping[str, str]) -> dict[str, Any]:
    """The body Alertmanager posts to webhook receivers (version 4), one alert."""
    a = n.a
    labels = _labels(n, a)
    advice_line = advice_text(n.advice, resolved=n.event == "resolve")
    resolved = n.event == "resolve"
    end = a.end_ns if resolved else None
    annotations = {"summary": n.text, "description": json.dumps(_details(n), sort_keys=True)}
    if advice_line:
        annotations["advice"] = advice_line
    alert = {"status": "resolved" if resolved else "firing", "labels": labels,
             "annotations": annotations,
             "startsAt": _iso(a.start_ns), "endsAt": _iso(end),
             "generatorURL": "", "fingerprint": hashlib.sha256(
                 n.dedup_key.encode()).hexdigest()[:16]}
    return {"version": "4", "groupKey": f"{{}}:{{job={n.job!r}}}", "truncatedAlerts": 0,
            "status": alert["status"], "receiver": receiver.name,
            "groupLabels": {"job": n.job}, "commonLabels": labels,
            "commonAnnotations": alert["annotations"], "externalURL": "",
            "alerts": [alert]}


def generic_payload(n: Notice, receiver: Receiver, env: Mapping[str, str]) -> dict[str, Any]:
    """failslow's own JSON (version 1): the notice as it is."""
    return {"version": 1, "event": n.event, "dedup_key": n.dedup_key, "job": n.job,
            "severity": n.severity, "cost_gpu_hours": round(n.cost_gpu_hours, 6),
            "summary": n.text, "anomaly": n.anomaly, "advice": n.advice}


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
