"""Paging: anomaly reports in, webhooks out (``failslow notify``).

The notifier consumes the processor's anomaly reports (topic ``failslow.anomalies``,
diagnosis.md's anomaly object per message, :func:`failslow.stream.transport.encode_anomaly`)
and the jobs' ``meta`` messages (for the number of ranks), and sends webhooks:

* **shapes**: generic JSON, Slack incoming webhook, PagerDuty Events API v2, and the body
  Alertmanager posts to webhook receivers (so anything that accepts Alertmanager accepts us);
* **routing** by job (glob), kind, cause and minimum severity, first match wins unless a route
  says ``continue: true``; the severity follows the anomaly's cost, ``world_size x duration
  x (1 - 1/slowdown)`` GPU-hours (:mod:`failslow.dashboards.severity`), a hang is critical.
  An open anomaly's cost grows with time: when it crosses into a higher severity the page is
  sent again (escalation), to the routes of the new severity;
* **de-duplication** by ``job/anomaly id``: the processor reports an anomaly when it opens and
  again when it ends (same id); repeats of the same state send nothing, the end sends one
  *resolve* to the receivers that got the trigger;
* **mitigation advice** (Greyhound §5.1: the processor's ski-rental planner, topic
  ``failslow.advice``): every payload carries the anomaly's current advice (generic JSON
  ``advice``, a Slack line and field, PagerDuty ``custom_details.advice``, an Alertmanager
  ``advice`` annotation); when the advice escalates (a strategy is applied: S2, then S3, then
  S4) an *advise* update goes to the receivers that got the trigger (PagerDuty: a trigger
  with the same dedup key, which updates the incident). Advice is de-duplicated by its id;
  advice that arrives before its anomaly waits for it and rides on the trigger;
* **delivery**: retries with exponential backoff and full jitter on timeouts, connection
  errors, 429 and 5xx (``Retry-After`` honoured), no retry on other 4xx; a token-bucket rate
  limit per receiver; an ``X-Failslow-Signature: sha256=HMAC(secret, timestamp + "." +
  body)`` header with ``X-Failslow-Timestamp`` when the receiver has a secret
  (:func:`verify_signature` checks one); ``X-Failslow-Delivery`` names the delivery, the
  same on every retry, so a receiver can drop duplicates;
* **never loses a page**: decisions go to an outbox in a local state file (written atomically:
  temporary file, fsync, rename) *before* the consumer offset is committed, and a delivery
  leaves the outbox only when the receiver acknowledged it. After a crash the outbox is sent
  again and re-read messages are recognised by the de-duplication state (at-least-once: a
  receiver may see a delivery twice, never zero times);
* **secrets only from the environment**: the config names environment variables
  (``url_env``, ``secret_env``, ``routing_key_env``); a literal secret in the config is an
  error.

The config is YAML or TOML::

    state_file: notify-state.json          # default $FAILSLOW_DATA_DIR/notify-state.json
    severity: {warning: 0.1, error: 1, critical: 10}   # GPU-hours lost
    retry: {max_attempts: 10, base_s: 1, max_s: 300, timeout_s: 10}
    receivers:
      - {name: oncall, type: pagerduty, routing_key_env: PAGERDUTY_ROUTING_KEY}
      - {name: team, type: slack, url_env: SLACK_WEBHOOK_URL, rate_per_minute: 20}
      - {name: hook, type: generic, url: "http://127.0.0.1:9000/hook",
         secret_env: FAILSLOW_WEBHOOK_SECRET}
    routes:
      - {match: {job: "prod-*", min_severity: error}, receivers: [oncall], continue: true}
      - {match: {min_severity: warning}, receivers: [team, hook]}
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import hmac
import json
import logging
import os
import random
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from failslow.dashboards.severity import (
    SEVERITIES,
    Thresholds,
    cost_gpu_hours,
    rank_of,
    severity,
)
from failslow.diagnosis import Anomaly

log = logging.getLogger(__name__)

STATE_VERSION = 1
TYPES = ("generic", "slack", "pagerduty", "alertmanager")
PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"
USER_AGENT = "failslow-notify/1"
SIGNATURE_HEADER = "X-Failslow-Signature"
TIMESTAMP_HEADER = "X-Failslow-Timestamp"
DELIVERY_HEADER = "X-Failslow-Delivery"
_SECRET_WORDS = ("secret", "token", "password", "routing_key", "api_key")


class ConfigError(ValueError):
    """A notifier config that cannot be used (the message names the field)."""


# ---------------------------------------------------------------------------------------------
# config


@dataclass(frozen=True)
class Receiver:
    name: str
    type: str
    url_env: str | None = None
    url: str | None = None
    secret_env: str | None = None
    routing_key_env: str | None = None
    rate_per_minute: float = 60.0
    burst: int = 10
    timeout_s: float | None = None

    def resolve_url(self, env: Mapping[str, str]) -> str:
        if self.url_env:
            value = env.get(self.url_env, "")
            if not value:
                raise ConfigError(f"receiver {self.name}: ${self.url_env} is not set")
            return value
        if self.url:
            return self.url
        if self.type == "pagerduty":
            return PAGERDUTY_URL
        raise ConfigError(f"receiver {self.name}: no url or url_env")

    def secret(self, env: Mapping[str, str]) -> bytes | None:
        if not self.secret_env:
            return None
        value = env.get(self.secret_env, "")
        if not value:
            raise ConfigError(f"receiver {self.name}: ${self.secret_env} is not set")
        return value.encode()

    def routing_key(self, env: Mapping[str, str]) -> str:
        value = env.get(self.routing_key_env or "", "")
        if not value:
            raise ConfigError(f"receiver {self.name}: pagerduty needs routing_key_env naming "
                              "a set environment variable")
        return value


@dataclass(frozen=True)
class Match:
    job: str = "*"
    kind: str | None = None
    cause: str | None = None
    min_severity: str = "info"

    def matches(self, job: str, a: Anomaly, sev: str) -> bool:
        return (fnmatch.fnmatchcase(job, self.job)
                and (self.kind is None or a.kind == self.kind)
                and (self.cause is None or a.cause == self.cause)
                and rank_of(sev) >= rank_of(self.min_severity))


@dataclass(frozen=True)
class Route:
    match: Match
    receivers: tuple[str, ...]
    continue_: bool = False


@dataclass(frozen=True)
class Retry:
    max_attempts: int = 10
    base_s: float = 1.0
    max_s: float = 300.0
    timeout_s: float = 10.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Full jitter: uniform in [0, min(max, base x 2^attempt)] (AWS architecture blog's
        "exponential backoff and jitter"), at least a tenth of the cap."""
        cap = min(self.max_s, self.base_s * (2.0 ** max(attempt - 1, 0)))
        return max(cap * 0.1, rng.uniform(0.0, cap))


@dataclass(frozen=True)
class Config:
    receivers: dict[str, Receiver]
    routes: tuple[Route, ...]
    thresholds: Thresholds = Thresholds()
    retry: Retry = Retry()
    state_file: Path = Path("notify-state.json")
    keep_resolved_s: float = 7 * 86400.0

    def route(self, job: str, a: Anomaly, sev: str) -> list[str]:
        out: list[str] = []
        for r in self.routes:
            if r.match.matches(job, a, sev):
                out.extend(x for x in r.receivers if x not in out)
                if not r.continue_:
                    break
        return out


def _check_no_literal_secrets(obj: Any, where: str) -> None:
    if isinstance(obj, dict):
        for k, v in obj.items():
            key = str(k).lower()
            if (any(w in key for w in _SECRET_WORDS) and not key.endswith("_env")
                    and v not in (None, "")):
                raise ConfigError(f"{where}.{k}: secrets come only from the environment; "
                                  f"name the variable with {k}_env")
            _check_no_literal_secrets(v, f"{where}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _check_no_literal_secrets(v, f"{where}[{i}]")


def _get(d: Mapping[str, Any], key: str, typ: type | tuple[type, ...], where: str,
         default: Any = None) -> Any:
    value = d.get(key, default)
    if value is not None and not isinstance(value, typ):
        raise ConfigError(f"{where}.{key}: expected {typ}, got {type(value).__name__}")
    return value


def config_from_dict(d: Mapping[str, Any], base_dir: Path | None = None,
                     env: Mapping[str, str] | None = None) -> Config:
    """Parse a config (see the module docstring)."""
    if not isinstance(d, Mapping):
        raise ConfigError("config: expected a mapping")
    _check_no_literal_secrets(dict(d), "config")
    env = os.environ if env is None else env
    unknown = set(d) - {"receivers", "routes", "severity", "retry", "state_file",
                        "keep_resolved_s"}
    if unknown:
        raise ConfigError(f"config: unknown key(s) {sorted(unknown)}")
    receivers: dict[str, Receiver] = {}
    for i, r in enumerate(_get(d, "receivers", list, "config", [])):
        where = f"receivers[{i}]"
        if not isinstance(r, Mapping):
            raise ConfigError(f"{where}: expected a mapping")
        extra = set(r) - set(Receiver.__dataclass_fields__)
        if extra:
            raise ConfigError(f"{where}: unknown key(s) {sorted(extra)}")
        name = _get(r, "name", str, where)
        typ = _get(r, "type", str, where, "generic")
        if not name or typ not in TYPES:
            raise ConfigError(f"{where}: needs a name and a type in {TYPES}")
        if name in receivers:
            raise ConfigError(f"{where}: duplicate receiver name {name!r}")
        rec = Receiver(**{k: v for k, v in r.items()})
        if rec.rate_per_minute <= 0 or rec.burst < 1:
            raise ConfigError(f"{where}: rate_per_minute > 0 and burst >= 1")
        if typ == "slack" and rec.url:
            raise ConfigError(f"{where}: a Slack webhook URL is a secret: use url_env")
        if typ == "pagerduty" and not rec.routing_key_env:
            raise ConfigError(f"{where}: pagerduty needs routing_key_env")
        receivers[name] = rec
    routes = []
    for i, r in enumerate(_get(d, "routes", list, "config", [])):
        where = f"routes[{i}]"
        m = _get(r, "match", dict, where, {}) or {}
        extra = set(m) - set(Match.__dataclass_fields__)
        if extra:
            raise ConfigError(f"{where}.match: unknown key(s) {sorted(extra)}")
        match = Match(**m)
        if match.min_severity not in SEVERITIES:
            raise ConfigError(f"{where}.match.min_severity: one of {SEVERITIES}")
        names = tuple(_get(r, "receivers", list, where, []))
        for n in names:
            if n not in receivers:
                raise ConfigError(f"{where}: unknown receiver {n!r}")
        routes.append(Route(match, names, bool(r.get("continue", False))))
    retry = Retry(**(_get(d, "retry", dict, "config", {}) or {}))
    if retry.max_attempts < 1 or retry.base_s <= 0 or retry.timeout_s <= 0:
        raise ConfigError("config.retry: max_attempts >= 1, base_s > 0, timeout_s > 0")
    thresholds = Thresholds.from_dict(_get(d, "severity", dict, "config", {}) or {})
    data_dir = Path(env.get("FAILSLOW_DATA_DIR", "") or (base_dir or Path.cwd()))
    state = Path(_get(d, "state_file", str, "config", "notify-state.json"))
    if not state.is_absolute():
        state = data_dir / state
    return Config(receivers, tuple(routes), thresholds, retry, state,
                  float(d.get("keep_resolved_s", 7 * 86400.0)))


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> Config:
    p = Path(path)
    text = p.read_text()
    try:
        data = tomllib.loads(text) if p.suffix.lower() == ".toml" else yaml.safe_load(text)
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{p}: cannot parse: {e}") from None
    return config_from_dict(data or {}, None, env)


# ---------------------------------------------------------------------------------------------
# payloads


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


def payload(n: Notice, receiver: Receiver, env: Mapping[str, str]) -> dict[str, Any]:
    """The body for ``receiver``'s type."""
    a = n.a
    labels = {"alertname": f"failslow_{a.kind}", "job": n.job, "anomaly_id": a.id,
              "kind": a.kind, "cause": a.cause, "severity": n.severity}
    if a.stage:
        labels["stage"] = a.stage
    details = {"job": n.job, "anomaly": n.anomaly, "cost_gpu_hours": round(n.cost_gpu_hours, 6),
               "severity": n.severity, "advice": n.advice}
    advice_line = advice_text(n.advice, resolved=n.event == "resolve")
    if receiver.type == "pagerduty":
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
                "custom_details": details}
        return body
    if receiver.type == "slack":
        color = _SLACK_COLOR["resolve" if n.event == "resolve" else n.severity]
        fields = [{"title": "job", "value": n.job, "short": True},
                  {"title": "cause", "value": f"{a.kind}/{a.cause}", "short": True},
                  {"title": "where", "value": _who(a), "short": True},
                  {"title": "stage", "value": a.stage or "-", "short": True}]
        if advice_line:
            fields.append({"title": "mitigation", "value": advice_line, "short": False})
        return {"text": n.text, "attachments": [{"color": color, "fields": fields,
                                                 "footer": f"failslow {n.dedup_key}"}]}
    if receiver.type == "alertmanager":
        resolved = n.event == "resolve"
        end = a.end_ns if resolved else None
        annotations = {"summary": n.text, "description": json.dumps(details, sort_keys=True)}
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
    return {"version": 1, "event": n.event, "dedup_key": n.dedup_key, "job": n.job,
            "severity": n.severity, "cost_gpu_hours": round(n.cost_gpu_hours, 6),
            "summary": n.text, "anomaly": n.anomaly, "advice": n.advice}


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    mac = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def verify_signature(secret: bytes, timestamp: str, body: bytes, signature: str,
                     max_age_s: float | None = 300.0, now: float | None = None) -> bool:
    """What a receiver does: constant-time compare, and reject stale timestamps."""
    if max_age_s is not None:
        try:
            age = abs((time.time() if now is None else now) - float(timestamp))
        except ValueError:
            return False
        if age > max_age_s:
            return False
    return hmac.compare_digest(sign(secret, timestamp, body), signature)


# ---------------------------------------------------------------------------------------------
# sending


@dataclass
class Delivery:
    """One notice for one receiver, in the outbox until acknowledged."""

    id: str
    receiver: str
    key: str
    event: str
    notice: dict[str, Any]
    attempts: int = 0
    next_at: float = 0.0
    created: float = 0.0
    last_error: str = ""


@dataclass(frozen=True)
class Outcome:
    ok: bool
    retry: bool
    status: int | None
    error: str = ""
    retry_after: float | None = None


def http_post(url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> Outcome:
    """POST with urllib; classify the result for the retry policy."""
    req = urllib.request.Request(url, data=body, method="POST", headers=dict(headers))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310
            resp.read()
            return Outcome(True, False, resp.status)
    except urllib.error.HTTPError as e:
        retry_after = _retry_after(e.headers.get("Retry-After") if e.headers else None)
        retry = e.code == 429 or e.code >= 500 or e.code == 408
        return Outcome(False, retry, e.code, f"HTTP {e.code}", retry_after)
    except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
        reason = getattr(e, "reason", e)
        return Outcome(False, True, None, f"{type(reason).__name__}: {reason}")


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


class TokenBucket:
    """``rate_per_minute`` tokens per minute, at most ``burst`` saved up."""

    def __init__(self, rate_per_minute: float, burst: int, now: float) -> None:
        self.rate = rate_per_minute / 60.0
        self.burst = float(burst)
        self.tokens = float(burst)
        self.t = now

    def take(self, now: float) -> float:
        """0 when a token was taken, else seconds until one is available."""
        self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
        self.t = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


Poster = Callable[[str, bytes, Mapping[str, str], float], Outcome]


# ---------------------------------------------------------------------------------------------
# the notifier


@dataclass
class Stats:
    messages: int = 0
    anomaly_reports: int = 0
    duplicates: int = 0
    enqueued: int = 0
    delivered: int = 0
    retries: int = 0
    failed: int = 0
    rate_limited: int = 0
    bad_messages: int = 0
    advice: int = 0  # advice messages taken (new ones)

    def to_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class _Known:
    job: str
    anomaly: dict[str, Any]
    severity: str
    receivers: list[str]
    resolved: bool
    updated: float
    first_seen: float
    advice: dict[str, Any] | None = None  # the current advice (last apply or revert)
    advice_ids: list[str] = field(default_factory=list)  # every advice taken


class Notifier:
    """The decisions (dedup, routing, severity, escalation), the durable outbox and the
    delivery loop. Feed it with :meth:`handle` (anomaly and meta messages) or :meth:`offer`,
    persist with :meth:`save`, send with :meth:`deliver_due`; :func:`run` ties it to a
    transport."""

    def __init__(self, config: Config, env: Mapping[str, str] | None = None,
                 poster: Poster = http_post, clock: Callable[[], float] = time.time,
                 rng: random.Random | None = None) -> None:
        self.config = config
        self.env = dict(os.environ if env is None else env)
        self.poster = poster
        self.clock = clock
        self.rng = rng or random.Random()
        self.stats = Stats()
        self.world: dict[str, int] = {}
        self.known: dict[str, _Known] = {}
        self.outbox: list[Delivery] = []
        self.failed: list[Delivery] = []
        self.pending_advice: dict[str, list[dict[str, Any]]] = {}  # before their anomaly
        self.seq = 0
        now = clock()
        self.buckets = {n: TokenBucket(r.rate_per_minute, r.burst, now)
                        for n, r in config.receivers.items()}
        for r in config.receivers.values():  # fail at start, not at 3 am
            r.resolve_url(self.env)
            r.secret(self.env)
            if r.type == "pagerduty":
                r.routing_key(self.env)
        self.load()

    # --- state -------------------------------------------------------------------------

    def load(self) -> None:
        path = self.config.state_file
        if not path.exists():
            return
        state = json.loads(path.read_text())
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"{path}: unsupported state version {state.get('version')!r}")
        self.seq = int(state["seq"])
        self.world = {k: int(v) for k, v in state["world"].items()}
        self.known = {k: _Known(**v) for k, v in state["known"].items()}
        self.outbox = [Delivery(**d) for d in state["outbox"]]
        self.failed = [Delivery(**d) for d in state["failed"]]
        self.pending_advice = {k: list(v) for k, v in state.get("pending_advice", {}).items()}

    def save(self) -> None:
        """Write the state atomically (temporary file, fsync, rename, fsync the folder)."""
        path = self.config.state_file
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {"version": STATE_VERSION, "seq": self.seq, "world": self.world,
                 "known": {k: v.__dict__ for k, v in self.known.items()},
                 "outbox": [d.__dict__ for d in self.outbox],
                 "failed": [d.__dict__ for d in self.failed[-1000:]],
                 "pending_advice": self.pending_advice}
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump(state, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        with contextlib.suppress(OSError):
            fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    # --- decisions ---------------------------------------------------------------------

    def _cost(self, job: str, a: Anomaly, open_for_s: float = 0.0) -> float:
        """GPU-hours lost: over ``start..end`` for an ended anomaly; for an open one, from
        its start to the evidence (trace time) plus ``open_for_s`` of wall time since the
        notifier first saw it (no cross-clock arithmetic, and replays cost what they
        cost)."""
        start = a.start_ns if a.start_ns is not None else (a.detected_ns or a.end_ns or 0)
        if a.end_ns is not None:
            duration = (a.end_ns - start) / 1e9
        else:
            duration = ((a.detected_ns or start) - start) / 1e9 + max(open_for_s, 0.0)
        world = self.world.get(job, max(len(a.ranks), 1))
        return cost_gpu_hours(a.kind, a.slowdown, world, duration)

    def _enqueue(self, event: str, job: str, a: Anomaly, sev: str, cost: float,
                 receivers: Iterable[str]) -> None:
        key = f"{job}/{a.id}"
        k = self.known.get(key)
        notice = Notice(event, job, a.to_dict(), sev, cost, key,
                        None if k is None else k.advice)
        for r in receivers:
            self.seq += 1
            self.outbox.append(Delivery(f"{key}#{event}#{self.seq}", r, key, event,
                                        notice.__dict__, created=self.clock()))
            self.stats.enqueued += 1

    def offer(self, job: str, a: Anomaly) -> None:
        """Decide what one anomaly report sends (nothing for a repeat)."""
        self.stats.anomaly_reports += 1
        key = f"{job}/{a.id}"
        k = self.known.get(key)
        cost = self._cost(job, a, 0.0 if k is None else self.clock() - k.first_seen)
        sev = severity(a.kind, cost, self.config.thresholds)
        ended = a.end_ns is not None
        if k is None:
            receivers = self.config.route(job, a, sev)
            k = self.known[key] = _Known(job, a.to_dict(), sev, receivers, ended,
                                         self.clock(), self.clock())
            for adv in self.pending_advice.pop(key, []):  # arrived first: rides along
                self._take_advice(k, adv)
            self._enqueue("trigger", job, a, sev, cost, receivers)
            if ended:
                self._enqueue("resolve", job, a, sev, cost, receivers)
            return
        if k.resolved:
            self.stats.duplicates += 1
            return
        if ended:
            k.resolved, k.anomaly, k.updated = True, a.to_dict(), self.clock()
            self._enqueue("resolve", job, a, k.severity, cost, k.receivers)
            return
        if rank_of(sev) > rank_of(k.severity):
            self._escalate(key, k, a, sev, cost)
            return
        k.anomaly = a.to_dict()
        self.stats.duplicates += 1

    def _escalate(self, key: str, k: _Known, a: Anomaly, sev: str, cost: float) -> None:
        receivers = self.config.route(k.job, a, sev)
        new = [r for r in receivers if r not in k.receivers]
        self._enqueue("escalate", k.job, a, sev, cost, k.receivers)
        self._enqueue("trigger", k.job, a, sev, cost, new)
        k.severity, k.anomaly, k.updated = sev, a.to_dict(), self.clock()
        k.receivers = k.receivers + new

    def offer_advice(self, advice: Mapping[str, Any]) -> None:
        """Take one mitigation advice (``mitigation_advice`` object): it becomes the
        anomaly's current advice; an *applied* strategy of an open anomaly that was paged
        sends an ``advise`` update to the receivers that got the trigger. Repeats (same
        ``advice_id``) send nothing; advice of an anomaly not seen yet waits for it."""
        job, anomaly_id = str(advice["job"]), str(advice["anomaly_id"])
        advice_id = str(advice["advice_id"])
        key = f"{job}/{anomaly_id}"
        k = self.known.get(key)
        if k is None:
            waiting = self.pending_advice.setdefault(key, [])
            if any(w.get("advice_id") == advice_id for w in waiting):
                self.stats.duplicates += 1
                return
            waiting.append(dict(advice))
            del waiting[:-20]
            self.stats.advice += 1
            return
        if advice_id in k.advice_ids:
            self.stats.duplicates += 1
            return
        self.stats.advice += 1
        self._take_advice(k, advice)
        if advice.get("action") == "apply" and not k.resolved and k.receivers:
            a = Anomaly.from_dict(dict(k.anomaly))
            cost = self._cost(job, a, self.clock() - k.first_seen)
            self._enqueue("advise", job, a, k.severity, cost, k.receivers)

    @staticmethod
    def _take_advice(k: _Known, advice: Mapping[str, Any]) -> None:
        k.advice_ids.append(str(advice["advice_id"]))
        if advice.get("action") in ("apply", "revert"):  # a skip changes nothing to do
            k.advice = dict(advice)

    def tick(self) -> None:
        """Re-evaluate the open anomalies: their cost grows while they last."""
        for key, k in list(self.known.items()):
            if k.resolved:
                if self.clock() - k.updated > self.config.keep_resolved_s:
                    del self.known[key]
                continue
            a = Anomaly.from_dict(dict(k.anomaly))
            cost = self._cost(k.job, a, self.clock() - k.first_seen)
            sev = severity(a.kind, cost, self.config.thresholds)
            if rank_of(sev) > rank_of(k.severity):
                self._escalate(key, k, a, sev, cost)

    def handle(self, message: Any) -> None:
        """One transport message: an anomaly report or a job's meta."""
        from failslow.stream.sink import ADVICE_TOPIC
        from failslow.stream.transport import ANOMALIES_TOPIC, decode, decode_anomaly, kind_of

        self.stats.messages += 1
        try:
            if message.topic == ANOMALIES_TOPIC:
                job, _, a = decode_anomaly(message)
                self.offer(job, a)
            elif message.topic == ADVICE_TOPIC:
                body = json.loads(message.value)
                if not isinstance(body, dict) or body.get("kind") != "mitigation_advice":
                    raise ValueError("not a mitigation_advice message")
                self.offer_advice(body)
            elif kind_of(message.topic) == "meta":
                _, table = decode(message)
                for row in table.to_pylist():
                    self.world[row["job"]] = int(row["world_size"])
        except (ValueError, KeyError, TypeError) as e:
            self.stats.bad_messages += 1
            log.warning("notify: cannot use %s@%s: %s", message.topic, message.offset, e)

    # --- delivery ----------------------------------------------------------------------

    def _due(self, now: float) -> dict[str, list[Delivery]]:
        """Per receiver, the deliveries that may go now: due, and no earlier delivery of the
        same anomaly to the same receiver still waiting (a resolve never overtakes its
        trigger)."""
        blocked: set[tuple[str, str]] = set()
        out: dict[str, list[Delivery]] = {}
        for d in self.outbox:
            pair = (d.receiver, d.key)
            if pair in blocked:
                continue
            if d.next_at <= now:
                out.setdefault(d.receiver, []).append(d)
            else:
                blocked.add(pair)
        return out

    def _send(self, d: Delivery) -> Outcome:
        rec = self.config.receivers[d.receiver]
        notice = Notice(**d.notice)
        body = json.dumps(payload(notice, rec, self.env), sort_keys=True).encode()
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT,
                   DELIVERY_HEADER: d.id}
        secret = rec.secret(self.env)
        if secret is not None:
            stamp = str(int(self.clock()))
            headers[TIMESTAMP_HEADER] = stamp
            headers[SIGNATURE_HEADER] = sign(secret, stamp, body)
        timeout = rec.timeout_s or self.config.retry.timeout_s
        return self.poster(rec.resolve_url(self.env), body, headers, timeout)

    def _deliver_receiver(self, items: list[Delivery], now: float
                          ) -> list[tuple[Delivery, Outcome | None, float]]:
        """Send one receiver's due deliveries in order; stop at the first failure or when
        the rate limit runs out. Returns (delivery, outcome or None if rate limited, wait)."""
        results: list[tuple[Delivery, Outcome | None, float]] = []
        bucket = self.buckets[items[0].receiver]
        for d in items:
            wait = bucket.take(self.clock())
            if wait > 0:
                results.append((d, None, wait))
                break
            outcome = self._send(d)
            results.append((d, outcome, 0.0))
            if not outcome.ok:
                break
        return results

    def deliver_due(self) -> int:
        """Send what is due (receivers in parallel, each in order); returns deliveries done.
        The state is saved afterwards."""
        now = self.clock()
        due = self._due(now)
        if not due:
            return 0
        done = 0
        with ThreadPoolExecutor(max_workers=max(1, len(due))) as pool:
            futures = [pool.submit(self._deliver_receiver, items, now)
                       for items in due.values()]
            results = [r for f in futures for r in f.result()]
        retry = self.config.retry
        for d, outcome, wait in results:
            if outcome is None:
                d.next_at = self.clock() + wait
                self.stats.rate_limited += 1
                continue
            d.attempts += 1
            if outcome.ok:
                self.outbox.remove(d)
                self.stats.delivered += 1
                done += 1
                continue
            d.last_error = outcome.error
            if outcome.retry and d.attempts < retry.max_attempts:
                delay = retry.delay(d.attempts, self.rng)
                if outcome.retry_after is not None:
                    delay = max(delay, outcome.retry_after)
                d.next_at = self.clock() + delay
                self.stats.retries += 1
                log.info("notify: %s to %s failed (%s); retry %d in %.1f s", d.id, d.receiver,
                         outcome.error, d.attempts, delay)
            else:
                self.outbox.remove(d)
                self.failed.append(d)
                self.stats.failed += 1
                log.error("notify: giving up on %s to %s after %d attempt(s): %s", d.id,
                          d.receiver, d.attempts, outcome.error)
        self.save()
        return done

    def next_due(self) -> float | None:
        """When the earliest waiting delivery is due (clock seconds), None when empty."""
        return min((d.next_at for d in self.outbox), default=None)


def run(notifier: Notifier, transport: Any, *, max_messages: int = 100,
        poll_timeout: float = 1.0, until_idle: bool = False,
        should_stop: Callable[[], bool] = lambda: False) -> Stats:
    """The loop: poll, decide, save the state, commit the offsets, deliver, re-evaluate.
    ``until_idle`` returns when nothing is left to read or send (tests, one-shot runs)."""
    while not should_stop():
        due_at = notifier.next_due()
        wait = poll_timeout if due_at is None else max(0.0, min(poll_timeout,
                                                                 due_at - notifier.clock()))
        messages = transport.poll(max_messages, timeout=0.0 if until_idle else wait)
        for m in messages:
            notifier.handle(m)
        notifier.tick()
        if messages:
            notifier.save()  # the outbox is durable before the offsets move
            transport.commit()
        notifier.deliver_due()
        if until_idle and not messages:
            due_at = notifier.next_due()
            if due_at is None:
                break
            time.sleep(max(0.0, min(poll_timeout, due_at - notifier.clock())))
    return notifier.stats
