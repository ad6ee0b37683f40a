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
  *resolve* to the receivers that got the trigger. A report that ends because another one
  took it over (``superseded_by``: a degraded link, reported while the job absorbed it, that
  now slows the job and has the slow-down detector's report) closes with a resolve that
  says so: "superseded by slow-1 (not recovered, ...)", ``superseded_by`` in the generic
  JSON and the Alertmanager annotations, the severity's colour in Slack. An open anomaly
  whose root changes (the slow-down detector replaced a root that met the onset by chance
  with the link that persists, or found a second straggler) sends a *revise* update to the
  receivers that got the trigger ("revised: ... (was compute at rank 18 ...)",
  ``revised_from`` in the generic JSON; Alertmanager: the first root's alert resolves and
  the new one fires) and a trigger to the receivers the new root routes to;
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
    severity_rules:                        # first match; default: a hang is critical
      - {match: {kind: hang}, severity: critical}
      - {match: {job: "test-*"}, at_most: warning}
    timezone: Europe/Berlin                # local times in pages (default: this machine's)
    grafana_url: https://grafana.example   # links (default: $FAILSLOW_GRAFANA_URL)
    retry: {max_attempts: 10, base_s: 1, max_s: 300, timeout_s: 10}
    receivers:
      - {name: oncall, type: pagerduty, routing_key_env: PAGERDUTY_ROUTING_KEY}
      - {name: team, type: slack, url_env: SLACK_WEBHOOK_URL, rate_per_minute: 20}
      - {name: hook, type: generic, url: "http://127.0.0.1:9000/hook",
         secret_env: FAILSLOW_WEBHOOK_SECRET}
    routes:
      - {match: {job: "prod-*", min_severity: error}, receivers: [oncall], continue: true}
      - {match: {min_severity: warning}, receivers: [team, hook]}
      - {match: {max_severity: info}, receivers: [team]}   # below the thresholds: kept

What a page says (one screen: what, where with hosts, since when in local time and UTC, how
bad, the evidence, what to do, dashboard links, the resolve) is :mod:`.notify_page`.

The parts: :mod:`.notify_config` (the config), :mod:`.notify_render` (the payloads per
receiver type), :mod:`.notify_delivery` (HTTP, signatures, rate limits); this module holds the
decisions, the durable outbox and the loop, and re-exports the public names of the others.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from failslow.dashboards.notify_config import (
    PAGERDUTY_URL,
    TYPES,
    Config,
    ConfigError,
    Match,
    Receiver,
    Retry,
    Route,
    config_from_dict,
    load_config,
)
from failslow.dashboards.notify_delivery import (
    DELIVERY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    USER_AGENT,
    Delivery,
    Outcome,
    Poster,
    TokenBucket,
    http_post,
    request_headers,
    sign,
    verify_signature,
)
from failslow.dashboards.notify_page import hosts_for
from failslow.dashboards.notify_render import Notice, advice_text, payload, summary
from failslow.dashboards.severity import cost_gpu_hours, rank_of
from failslow.diagnosis import Anomaly
from failslow.events import ContractError, parse_meta_row
from failslow.settings import environment, get_settings

__all__ = [
    "DELIVERY_HEADER", "PAGERDUTY_URL", "SIGNATURE_HEADER", "STATE_VERSION", "TIMESTAMP_HEADER",
    "TYPES", "USER_AGENT", "Config", "ConfigError", "Delivery", "Match", "Notice", "Notifier",
    "Outcome", "Poster", "Receiver", "Retry", "Route", "Stats", "TokenBucket", "advice_text",
    "config_from_dict", "http_post", "load_config", "payload", "run", "sign", "summary",
    "verify_signature",
]

log = logging.getLogger(__name__)

STATE_VERSION = 1


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
    unrouted: int = 0  # anomalies no route took (kept: they page if they escalate)
    revised: int = 0  # open anomalies whose root changed (a revise update was sent)

    def to_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def _root(anomaly: Mapping[str, Any]) -> dict[str, Any]:
    """What an anomaly report blames: its cause, ranks and link."""
    link = anomaly.get("link")
    return {"cause": anomaly.get("cause"), "ranks": sorted(anomaly.get("ranks") or []),
            "link": sorted(link) if link else None}


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
        self.env = dict(environment() if env is None else env)
        self.poster = poster
        self.clock = clock
        self.rng = rng or random.Random()
        self.stats = Stats()
        self.world: dict[str, int] = {}
        self.nodes: dict[str, dict[int, str]] = {}  # job -> rank -> host (from its meta)
        self.grafana_url = (config.grafana_url if config.grafana_url is not None
                            else get_settings().grafana.url)
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
        self.nodes = {job: {int(r): str(h) for r, h in m.items()}
                      for job, m in state.get("nodes", {}).items()}

    def save(self) -> None:
        """Write the state atomically (temporary file, fsync, rename, fsync the folder)."""
        path = self.config.state_file
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {"version": STATE_VERSION, "seq": self.seq, "world": self.world,
                 "known": {k: v.__dict__ for k, v in self.known.items()},
                 "outbox": [d.__dict__ for d in self.outbox],
                 "failed": [d.__dict__ for d in self.failed[-1000:]],
                 "pending_advice": self.pending_advice,
                 "nodes": {job: {str(r): h for r, h in m.items()}
                           for job, m in self.nodes.items()}}
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
                        None if k is None else k.advice,
                        world_size=self.world.get(job, 0),
                        hosts=hosts_for(a, self.nodes.get(job, {})),
                        grafana_url=self.grafana_url, timezone=self.config.timezone,
                        now_ns=int(self.clock() * 1e9))
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
        sev = self.config.severity(job, a, cost)
        ended = a.end_ns is not None
        if k is None:
            receivers = self.config.route(job, a, sev)
            if not receivers:  # kept: a later escalation still pages
                self.stats.unrouted += 1
                log.info("notify: %s %s (%s, %.3g GPU-h) matches no route; kept, it pages if "
                         "it escalates", key, sev, a.kind, cost)
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
        if _root(a.to_dict()) != _root(k.anomaly):
            self._revise(key, k, a, sev, cost)
            return
        if rank_of(sev) > rank_of(k.severity):
            self._escalate(key, k, a, sev, cost)
            return
        k.anomaly = a.to_dict()
        self.stats.duplicates += 1

    def _revise(self, key: str, k: _Known, a: Anomaly, sev: str, cost: float) -> None:
        """The open anomaly now names another root (cause, ranks or link): a *revise* update
        to the receivers that got the trigger, saying what it named before (a root that met
        the onset by chance, replaced by the one that persists; a second straggler or the
        link of a mixed slow-down found later), and a trigger to the ones the new root
        routes to (another cause may page another team)."""
        self.stats.revised += 1
        a.extra["revised"] = _root(k.anomaly)  # what the receivers were told last
        sev = sev if rank_of(sev) > rank_of(k.severity) else k.severity
        self._update("revise", k, a, sev, cost)

    def _escalate(self, key: str, k: _Known, a: Anomaly, sev: str, cost: float) -> None:
        self._update("escalate", k, a, sev, cost)

    def _update(self, event: str, k: _Known, a: Anomaly, sev: str, cost: float) -> None:
        """``event`` to the receivers that got the trigger, and a trigger to the ones the
        anomaly's routes now add (a higher severity, another cause)."""
        receivers = self.config.route(k.job, a, sev)
        new = [r for r in receivers if r not in k.receivers]
        self._enqueue(event, k.job, a, sev, cost, k.receivers)
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
            sev = self.config.severity(k.job, a, cost)
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
                    meta = parse_meta_row(row, message.topic)
                    if meta.nodes:
                        self.nodes[meta.job] = dict(meta.nodes)
        except (ValueError, KeyError, TypeError, ContractError) as e:
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
        headers = request_headers(d.id, body, rec.secret(self.env), self.clock())
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
        should_stop: Callable[[], bool] = lambda: False,
        sleep: Callable[[float], None] = time.sleep) -> Stats:
    """The loop: poll, decide, save the state, commit the offsets, deliver, re-evaluate.
    ``until_idle`` returns when nothing is left to read or send (tests, one-shot runs), and
    waits for the next retry with ``sleep`` (tests pass one that moves their clock)."""
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
            sleep(max(0.0, min(poll_timeout, due_at - notifier.clock())))
    return notifier.stats
