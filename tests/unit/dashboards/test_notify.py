"""``failslow notify`` against a real HTTP receiver on 127.0.0.1: payload shapes, signatures,
de-duplication, resolve, routing and escalation by cost, retries on 500s, timeouts and 429s,
rate limits, and no page lost across a restart (outbox in the state file before the offsets
are committed)."""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO
from failslow import events
from failslow.dashboards import notify
from failslow.dashboards.notify import ConfigError, Notifier, Outcome, config_from_dict
from failslow.diagnosis import Anomaly
from failslow.stream.transport import (
    ANOMALIES_TOPIC,
    InProcessTransport,
    encode_anomaly,
    topic_for,
)

T0 = 1_750_000_000_000_000_000
SECRET = "s3cr3t-for-tests"


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Behaviour:
    """What the receiver answers on one path: a list of (status, delay_s) used in turn, the
    last one repeating."""

    answers: list[tuple[int, float]] = field(default_factory=lambda: [(200, 0.0)])
    headers: dict[str, str] = field(default_factory=dict)
    calls: int = 0


class Receiver:
    def __init__(self) -> None:
        self.received: list[Received] = []
        self.behaviour: dict[str, Behaviour] = {}
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with outer.lock:
                    b = outer.behaviour.setdefault(self.path, Behaviour())
                    status, delay = b.answers[min(b.calls, len(b.answers) - 1)]
                    b.calls += 1
                if 200 <= status < 300:  # processed, whether or not the answer arrives
                    with outer.lock:
                        outer.received.append(Received(self.path, dict(self.headers), body))
                time.sleep(delay)
                try:
                    self.send_response(status)
                    for k, v in b.headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"{}")
                except (BrokenPipeError, ConnectionResetError):
                    return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_port}{path}"

    def at(self, path: str) -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.path == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


def _env(rx: Receiver) -> dict[str, str]:
    return {"HOOK_URL": rx.url("/hook"), "HOOK_SECRET": SECRET, "SLACK_URL": rx.url("/slack"),
            "PD_URL": rx.url("/pd"), "PD_KEY": "routing-key-123", "AM_URL": rx.url("/am"),
            "FLAKY_URL": rx.url("/flaky")}


def _config(tmp_path: Path, rx: Receiver, **over: Any) -> notify.Config:
    d: dict[str, Any] = {
        "state_file": str(tmp_path / "state.json"),
        "retry": {"max_attempts": 6, "base_s": 0.02, "max_s": 0.1, "timeout_s": 0.5},
        "receivers": [
            {"name": "hook", "type": "generic", "url_env": "HOOK_URL",
             "secret_env": "HOOK_SECRET"},
            {"name": "slack", "type": "slack", "url_env": "SLACK_URL"},
            {"name": "pd", "type": "pagerduty", "url_env": "PD_URL",
             "routing_key_env": "PD_KEY"},
            {"name": "am", "type": "alertmanager", "url_env": "AM_URL"},
        ],
        "routes": [
            {"match": {"job": "prod-*", "min_severity": "error"}, "receivers": ["pd"],
             "continue": True},
            {"match": {"min_severity": "info"}, "receivers": ["hook", "slack", "am"]},
        ],
    }
    d.update(over)
    return config_from_dict(d, env=_env(rx))


def _slow(id_: str = "slow-0", end: int | None = None, slowdown: float = 1.25,
          evidence_s: float = 2.0) -> Anomaly:
    return Anomaly(id=id_, kind="slow", cause="compute", ranks=[21], comm=7, comm_kind="dp",
                   stage="dp_sync", start_ns=T0, detected_ns=T0 + int(evidence_s * 1e9),
                   end_ns=end,
                   slowdown=slowdown, R=0.5, P=0.9)


def _hang() -> Anomaly:
    return Anomaly(id="hang-1", kind="hang", cause="not_entered", ranks=[3], stage="forward",
                   start_ns=T0, detected_ns=T0 + 30 * 10**9)


def _publish(t: InProcessTransport, job: str, a: Anomaly, version: int) -> None:
    value, headers = encode_anomaly(job, a, version)
    t.produce(ANOMALIES_TOPIC, job, value, headers)


def _meta(t: InProcessTransport, job: str, world: int) -> None:
    meta = events.JobMeta(job=job, t=1, world_size=world, tp=1, pp=1, dp=world, cp=1,
                          microbatches=1, schedule="1f1b", nodes={}, comms=())
    t.publish_meta(meta)


def _transport() -> InProcessTransport:
    return InProcessTransport(subscribe=(topic_for("meta"), ANOMALIES_TOPIC))


class Clock:
    """The notifier's clock in the retry tests: ``sleep`` moves it, nothing waits for real
    backoff (the HTTP requests and their timeouts are real)."""

    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += max(seconds, 1e-6)  # a wait rounded to nothing would never end


def _wait_for(pred: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


# ---------------------------------------------------------------------------------------------


def test_trigger_and_resolve_in_every_shape(tmp_path: Path, receiver: Receiver) -> None:
    t = _transport()
    _meta(t, "job-a", 64)
    _publish(t, "job-a", _slow(), 1)
    _publish(t, "job-a", _slow(), 2)  # the same state again: nothing new
    _publish(t, "job-a", _slow(end=T0 + 600 * 10**9), 3)
    n = Notifier(_config(tmp_path, receiver), env=_env(receiver))
    stats = notify.run(n, t, until_idle=True)
    assert stats.delivered == 6 and stats.duplicates == 1 and not n.outbox
    hook = receiver.at("/hook")
    assert [r.json["event"] for r in hook] == ["trigger", "resolve"]
    body = hook[0].json
    assert body["dedup_key"] == "job-a/slow-0" and body["anomaly"]["ranks"] == [21]
    # when first seen: 64 ranks x 2 s x (1 - 1/1.25) = 0.0007 GPU-h: info; at the end:
    # 600 s, 2.13 GPU-h; the resolve keeps the severity of the trigger (same receivers)
    assert body["cost_gpu_hours"] == pytest.approx(64 * 2 * 0.2 / 3600, rel=1e-3)
    assert hook[1].json["cost_gpu_hours"] == pytest.approx(64 * 600 * 0.2 / 3600, rel=1e-3)
    assert hook[1].json["severity"] == "info" == body["severity"]
    for r in hook:  # signed, verifiable, and a delivery id for receiver-side dedup
        ts, sig = r.headers["X-Failslow-Timestamp"], r.headers["X-Failslow-Signature"]
        assert notify.verify_signature(SECRET.encode(), ts, r.body, sig)
        assert not notify.verify_signature(b"wrong", ts, r.body, sig)
        assert not notify.verify_signature(SECRET.encode(), ts, r.body + b" ", sig)
        assert r.headers["Content-Type"] == "application/json"
    assert hook[0].headers["X-Failslow-Delivery"] != hook[1].headers["X-Failslow-Delivery"]
    slack = receiver.at("/slack")
    assert slack[0].json["text"].startswith("[info] job-a: slow/compute at rank 21")
    assert slack[1].json["text"].startswith("resolved: ")
    assert slack[0].json["attachments"][0]["fields"][0] == {"title": "job", "value": "job-a",
                                                           "short": True}
    am = [r.json for r in receiver.at("/am")]
    assert [b["status"] for b in am] == ["firing", "resolved"]
    alert = am[0]["alerts"][0]
    assert alert["labels"]["alertname"] == "failslow_slow" and alert["labels"]["job"] == "job-a"
    assert alert["startsAt"].startswith("2025-06-15T") and am[0]["version"] == "4"
    assert am[1]["alerts"][0]["endsAt"] > am[1]["alerts"][0]["startsAt"]
    assert receiver.at("/pd") == []  # job-a is not prod-*
    assert t.committed(ANOMALIES_TOPIC) == 3


def test_a_superseded_report_closes_without_saying_resolved(tmp_path: Path,
                                                           receiver: Receiver) -> None:
    """The link-rate detector's report of an absorbed link ends when the slow-down detector
    names the link (``superseded_by``): its receivers learn that it got worse, not better."""
    t = _transport()
    _meta(t, "job-a", 64)
    link = Anomaly(id="linkrate-0", kind="slow", cause="communication", ranks=[13, 15],
                   link=[13, 15], comm=7, comm_kind="dp", stage="dp_sync", start_ns=T0,
                   detected_ns=T0 + 2 * 10**9, slowdown=1.004)
    _publish(t, "job-a", link, 1)
    _publish(t, "job-a", _slow("slow-1", slowdown=1.3), 2)
    ended = Anomaly.from_dict({**link.to_dict(), "end_ns": T0 + 9 * 10**9,
                               "superseded_by": "slow-1"})
    _publish(t, "job-a", ended, 3)
    n = Notifier(_config(tmp_path, receiver), env=_env(receiver))
    notify.run(n, t, until_idle=True)
    hook = [r.json for r in receiver.at("/hook")]
    assert [(b["event"], b["dedup_key"]) for b in hook] == [
        ("trigger", "job-a/linkrate-0"), ("trigger", "job-a/slow-1"),
        ("resolve", "job-a/linkrate-0")]
    closed = hook[2]
    assert closed["superseded_by"] == "slow-1" and hook[0]["superseded_by"] is None
    assert closed["summary"].startswith("superseded by slow-1 (not recovered")
    assert closed["page"]["resolved"].startswith("not recovered: it now slows the job and "
                                                 "slow-1 reports it")
    assert closed["page"]["what_to_do"] == "follow slow-1"
    slack = [r.json for r in receiver.at("/slack")]
    assert slack[2]["text"].startswith("superseded by slow-1")
    assert slack[2]["attachments"][0]["color"] != "#2EB67D"  # not the colour of good news
    am = [r.json for r in receiver.at("/am")]
    assert am[2]["status"] == "resolved"
    assert am[2]["alerts"][0]["annotations"]["superseded_by"] == "slow-1"
    # an ordinary end still reads "resolved"
    assert "superseded_by" not in am[0]["alerts"][0]["annotations"]


def test_a_revised_root_is_sent_as_an_update_with_what_it_was(tmp_path: Path,
                                                             receiver: Receiver) -> None:
    """An open anomaly reported again with another root (the slow-down detector replaced
    a rank that met the onset by chance with the link that persists): the receivers that
    got the trigger get a *revise* update that says what it named before, in every shape;
    the same root reported again sends nothing, and the end resolves as usual."""
    t = _transport()
    _meta(t, "job-a", 64)
    first = _slow("slow-0")
    _publish(t, "job-a", first, 1)
    revised = Anomaly.from_dict({**first.to_dict(), "cause": "communication",
                                 "ranks": [28, 36], "link": [28, 36], "comm_kind": "pp",
                                 "stage": "pp_p2p"})
    _publish(t, "job-a", revised, 2)
    _publish(t, "job-a", revised, 3)  # a repeat
    _publish(t, "job-a", Anomaly.from_dict({**revised.to_dict(), "end_ns": T0 + 9 * 10**9}), 4)
    n = Notifier(_config(tmp_path, receiver), env=_env(receiver))
    notify.run(n, t, until_idle=True)
    assert n.stats.revised == 1
    hook = [r.json for r in receiver.at("/hook")]
    assert [b["event"] for b in hook] == ["trigger", "revise", "resolve"]
    update = hook[1]
    assert update["summary"].startswith("revised: [")
    assert "slow/communication at link 28-36" in update["summary"]
    assert "(was compute at rank 21)" in update["summary"]
    assert update["revised_from"]["cause"] == "compute"
    assert update["revised_from"]["ranks"] == [21]
    assert "revised, was slow/compute at rank 21" in update["page"]["what"]
    assert hook[0]["revised_from"] is None
    slack = [r.json for r in receiver.at("/slack")]
    assert slack[1]["text"] == update["summary"]
    am = [r.json for r in receiver.at("/am")]
    firing, ended = am[1]["alerts"]
    assert (firing["status"], firing["labels"]["cause"]) == ("firing", "communication")
    assert (ended["status"], ended["labels"]["cause"]) == ("resolved", "compute")
    assert ended["labels"]["rank"] == "21" and firing["labels"]["rank"] == "28,36"


def test_pagerduty_events_v2_and_hangs_are_critical(tmp_path: Path, receiver: Receiver) -> None:
    t = _transport()
    _publish(t, "prod-7", _hang(), 1)
    n = Notifier(_config(tmp_path, receiver), env=_env(receiver))
    notify.run(n, t, until_idle=True)
    [pd] = [r.json for r in receiver.at("/pd")]
    assert pd["routing_key"] == "routing-key-123" and pd["event_action"] == "trigger"
    assert pd["dedup_key"] == "prod-7/hang-1"
    assert pd["payload"]["severity"] == "critical" and pd["payload"]["source"] == "prod-7"
    assert pd["payload"]["class"] == "hang/not_entered"
    assert pd["payload"]["timestamp"].startswith("2025-06-15T")
    _publish(t, "prod-7", Anomaly.from_dict({**_hang().to_dict(), "end_ns": T0 + 10**11}), 2)
    notify.run(n, t, until_idle=True)
    pd = receiver.at("/pd")[-1].json
    assert pd == {"routing_key": "routing-key-123", "event_action": "resolve",
                  "dedup_key": "prod-7/hang-1"}


def test_routing_by_job_and_severity(tmp_path: Path, receiver: Receiver) -> None:
    cfg = _config(tmp_path, receiver)
    small, big = _slow(end=T0 + 10**9), _slow(end=T0 + 3600 * 10**9, slowdown=2.0)
    n = Notifier(cfg, env=_env(receiver), poster=lambda *a: Outcome(True, False, 200))
    n.world["prod-1"] = 128
    for job, a, want in [("prod-1", small, ["hook", "slack", "am"]),
                         ("prod-1", big, ["pd", "hook", "slack", "am"]),
                         ("dev-1", big, ["hook", "slack", "am"])]:
        n.outbox.clear()
        n.known.clear()
        n.offer(job, a)
        assert [d.receiver for d in n.outbox if d.event == "trigger"] == want


def test_open_anomaly_escalates_as_its_cost_grows(tmp_path: Path, receiver: Receiver) -> None:
    now = [1000.0]
    sent: list[dict[str, Any]] = []

    def poster(url: str, body: bytes, headers: Any, timeout: float) -> Outcome:
        sent.append({"url": url, **json.loads(body)})
        return Outcome(True, False, 200)

    n = Notifier(_config(tmp_path, receiver), env=_env(receiver), poster=poster,
                 clock=lambda: now[0])
    n.world["prod-2"] = 1024
    n.offer("prod-2", _slow(slowdown=1.5, evidence_s=60))  # 1024 x 60 s x 1/3 = 5.7 GPU-h
    n.deliver_due()
    # receivers are sent to in parallel: their order in ``sent`` is the threads'
    assert sorted((s["url"].rsplit("/", 1)[1], s.get("event", s.get("event_action")) or "")
                  for s in sent) \
        == [("am", ""), ("hook", "trigger"), ("pd", "trigger"), ("slack", "")]
    sent.clear()
    now[0] += 30  # 8.5 GPU-h: still error
    n.tick()
    assert n.deliver_due() == 0
    now[0] += 60  # 14 GPU-h: critical, sent again to everybody who had it
    n.tick()
    n.deliver_due()
    hook = [s for s in sent if s["url"].endswith("/hook")]
    assert [(h["event"], h["severity"]) for h in hook] == [("escalate", "critical")]
    pd = [s for s in sent if s["url"].endswith("/pd")]
    assert pd[0]["payload"]["severity"] == "critical"  # same dedup key: PagerDuty updates it
    n.offer("prod-2", _slow(slowdown=1.5, evidence_s=60, end=T0 + 150 * 10**9))
    sent.clear()
    n.deliver_due()
    assert sorted(s["url"].rsplit("/", 1)[1] for s in sent) == ["am", "hook", "pd", "slack"]


def test_retries_500s_with_backoff_until_delivered(tmp_path: Path, receiver: Receiver) -> None:
    receiver.behaviour["/hook"] = Behaviour([(500, 0.0), (503, 0.0), (502, 0.0), (200, 0.0)])
    cfg = _config(tmp_path, receiver, routes=[{"receivers": ["hook"]}])
    t = _transport()
    _publish(t, "job-b", _slow(), 1)
    clock = Clock()
    n = Notifier(cfg, env=_env(receiver), clock=clock)
    stats = notify.run(n, t, until_idle=True, sleep=clock.sleep)
    assert stats.delivered == 1 and stats.retries == 3 and stats.failed == 0
    assert receiver.behaviour["/hook"].calls == 4 and len(receiver.at("/hook")) == 1
    # one wait before each retry: exponential (base 0.02 s, doubling, at most max_s 0.1 s)
    # with full jitter, never below a tenth of the cap
    waits = [s for s in clock.slept if s > 0]
    assert len(waits) == 3
    for attempt, wait in enumerate(waits, start=1):
        cap = min(0.1, 0.02 * 2 ** (attempt - 1))
        assert cap * 0.1 - 1e-6 <= wait <= cap  # the floor, up to float rounding


def test_timeouts_and_a_slow_receiver(tmp_path: Path, receiver: Receiver) -> None:
    # first answer after 1.5 s (> the 0.3 s timeout), then promptly but slowly (0.1 s)
    receiver.behaviour["/hook"] = Behaviour([(200, 1.5), (200, 0.1)])
    receiver.behaviour["/slack"] = Behaviour([(200, 0.0)])
    cfg = _config(tmp_path, receiver, routes=[{"receivers": ["hook", "slack"]}],
                  retry={"max_attempts": 5, "base_s": 0.05, "max_s": 0.2, "timeout_s": 0.3})
    events: list[tuple[str, str]] = []

    def poster(url: str, body: bytes, headers: Any, timeout: float) -> Outcome:
        name = url.rsplit("/", 1)[1]
        events.append((name, "sent"))
        try:
            return notify.http_post(url, body, headers, timeout)
        finally:
            events.append((name, "answered"))

    clock = Clock()
    n = Notifier(cfg, env=_env(receiver), poster=poster, clock=clock)
    n.offer("job-c", _slow())
    n.deliver_due()
    # the slow receiver does not hold up the other one: slack was sent while hook waited
    assert len(receiver.at("/slack")) == 1
    assert events.index(("slack", "sent")) < events.index(("hook", "answered"))
    assert n.stats.retries == 1 and [d.receiver for d in n.outbox] == ["hook"]
    assert "timed out" in n.outbox[0].last_error or "Timeout" in n.outbox[0].last_error
    assert n.deliver_due() == 0  # not due yet
    clock.sleep((n.next_due() or 0) - clock())
    n.deliver_due()
    assert not n.outbox and n.stats.delivered == 2
    # the timed-out request still reached the receiver later: the same delivery id twice
    _wait_for(lambda: len(receiver.at("/hook")) == 2)
    ids = {r.headers["X-Failslow-Delivery"] for r in receiver.at("/hook")}
    assert len(ids) == 1


def test_429_honours_retry_after_and_400_is_not_retried(tmp_path: Path,
                                                        receiver: Receiver) -> None:
    receiver.behaviour["/hook"] = Behaviour([(429, 0.0), (200, 0.0)], {"Retry-After": "0.3"})
    receiver.behaviour["/slack"] = Behaviour([(400, 0.0)])
    cfg = _config(tmp_path, receiver, routes=[{"receivers": ["hook", "slack"]}])
    clock = Clock()
    n = Notifier(cfg, env=_env(receiver), clock=clock)
    n.offer("job-d", _slow())
    n.deliver_due()
    assert n.stats.failed == 1 and n.failed[0].receiver == "slack"
    assert n.failed[0].last_error == "HTTP 400" and receiver.behaviour["/slack"].calls == 1
    waiting = n.outbox[0]
    # the backoff would be at most 0.02 s; the receiver asked for 0.3 s
    assert waiting.receiver == "hook" and waiting.next_at - clock() == pytest.approx(0.3)
    clock.sleep(0.29)
    assert n.deliver_due() == 0  # not yet
    clock.sleep(0.02)
    assert n.deliver_due() == 1


def test_rate_limit_per_receiver(tmp_path: Path, receiver: Receiver) -> None:
    now = [1000.0]
    calls: list[str] = []

    def poster(url: str, body: bytes, headers: Any, timeout: float) -> Outcome:
        calls.append(json.loads(body)["dedup_key"])
        return Outcome(True, False, 200)

    cfg = config_from_dict({
        "state_file": str(tmp_path / "s.json"),
        "receivers": [{"name": "hook", "type": "generic", "url_env": "HOOK_URL",
                       "rate_per_minute": 6, "burst": 2}],
        "routes": [{"receivers": ["hook"]}]}, env=_env(receiver))
    n = Notifier(cfg, env=_env(receiver), poster=poster, clock=lambda: now[0])
    for i in range(5):
        n.offer("job-e", _slow(f"s{i}"))
    n.deliver_due()
    assert calls == ["job-e/s0", "job-e/s1"] and n.stats.rate_limited == 1
    assert n.outbox[0].next_at == pytest.approx(1010.0)  # 6 per minute: one every 10 s
    now[0] += 10
    n.deliver_due()
    assert len(calls) == 3
    now[0] += 30
    n.deliver_due()
    assert calls == [f"job-e/s{i}" for i in range(5)]  # in order, none lost


def test_restart_mid_retry_loses_no_page(tmp_path: Path, receiver: Receiver) -> None:
    receiver.behaviour["/hook"] = Behaviour([(500, 0.0)])
    cfg = _config(tmp_path, receiver, routes=[{"receivers": ["hook"]}],
                  retry={"max_attempts": 50, "base_s": 0.02, "max_s": 0.05, "timeout_s": 0.5})
    t = _transport()
    _publish(t, "job-f", _slow("a"), 1)
    _publish(t, "job-f", _slow("b"), 1)
    clock = Clock()
    first = Notifier(cfg, env=_env(receiver), clock=clock)
    for m in t.poll(10):
        first.handle(m)
    first.save()
    t.commit()  # the outbox is on disk before the offsets move
    first.deliver_due()
    first.deliver_due()
    assert first.stats.retries >= 2 and len(first.outbox) == 2
    assert t.committed(ANOMALIES_TOPIC) == 2
    del first  # killed mid-retry

    # a report that arrives while it is down, polled by the next one but not committed when
    # it crashes again
    _publish(t, "job-f", _slow("a", end=T0 + 10**10), 2)
    second = Notifier(cfg, env=_env(receiver), clock=clock)
    assert [d.key for d in second.outbox] == ["job-f/a", "job-f/b"]
    for m in t.poll(10):
        second.handle(m)
    second.save()
    del second  # crashed before commit
    t.seek_to_committed()

    receiver.behaviour["/hook"] = Behaviour([(200, 0.0)])
    third = Notifier(cfg, env=_env(receiver), clock=clock)
    stats = notify.run(third, t, until_idle=True, sleep=clock.sleep)
    assert stats.duplicates == 1  # the re-read resolve was already in the outbox
    got = [(r.json["dedup_key"], r.json["event"]) for r in receiver.at("/hook")]
    assert sorted(got) == [("job-f/a", "resolve"), ("job-f/a", "trigger"), ("job-f/b", "trigger")]
    assert got.index(("job-f/a", "trigger")) < got.index(("job-f/a", "resolve"))
    assert json.loads(cfg.state_file.read_text())["outbox"] == []


def test_gives_up_after_max_attempts_and_keeps_the_record(tmp_path: Path,
                                                         receiver: Receiver) -> None:
    receiver.behaviour["/hook"] = Behaviour([(503, 0.0)])
    cfg = _config(tmp_path, receiver, routes=[{"receivers": ["hook"]}],
                  retry={"max_attempts": 3, "base_s": 0.01, "max_s": 0.02, "timeout_s": 0.5})
    t = _transport()
    _publish(t, "job-g", _slow(), 1)
    clock = Clock()
    stats = notify.run(Notifier(cfg, env=_env(receiver), clock=clock), t, until_idle=True,
                       sleep=clock.sleep)
    assert stats.failed == 1 and receiver.behaviour["/hook"].calls == 3
    state = json.loads(cfg.state_file.read_text())
    assert state["failed"][0]["attempts"] == 3 and state["outbox"] == []


def test_backoff_is_exponential_with_full_jitter() -> None:
    r = notify.Retry(base_s=1.0, max_s=60.0)
    rng = random.Random(1)
    for attempt, cap in [(1, 1.0), (2, 2.0), (3, 4.0), (6, 32.0), (9, 60.0)]:
        delays = [r.delay(attempt, rng) for _ in range(200)]
        assert max(delays) <= cap and min(delays) >= cap * 0.1
        assert max(delays) - min(delays) > cap * 0.5  # jittered, not fixed


def test_secrets_only_from_the_environment(tmp_path: Path, receiver: Receiver) -> None:
    base = {"receivers": [{"name": "h", "type": "generic", "url": "http://127.0.0.1:1/x",
                           "secret": "literal"}], "routes": []}
    with pytest.raises(ConfigError, match="environment"):
        config_from_dict(base, env={})
    with pytest.raises(ConfigError, match="Slack webhook URL is a secret"):
        config_from_dict({"receivers": [{"name": "s", "type": "slack",
                                         "url": "https://hooks.example/T/B/x"}]}, env={})
    with pytest.raises(ConfigError, match="unknown receiver"):
        config_from_dict({"receivers": [], "routes": [{"receivers": ["nope"]}]}, env={})
    with pytest.raises(ConfigError, match="routing_key_env"):
        config_from_dict({"receivers": [{"name": "p", "type": "pagerduty"}]}, env={})
    cfg = _config(tmp_path, receiver)
    with pytest.raises(ConfigError, match="HOOK_SECRET"):  # named but not set: fail at start
        Notifier(cfg, env={k: v for k, v in _env(receiver).items() if k != "HOOK_SECRET"})


def test_bad_messages_are_skipped(tmp_path: Path, receiver: Receiver) -> None:
    t = _transport()
    t.produce(ANOMALIES_TOPIC, "job-h", b"not json", {})
    t.produce(ANOMALIES_TOPIC, "job-h", json.dumps({"job": "job-h", "version": 1, "id": "x",
                                                     "kind": "weird", "cause": "?"}).encode())
    _publish(t, "job-h", _slow(), 1)
    n = Notifier(_config(tmp_path, receiver, routes=[{"receivers": ["hook"]}]),
                 env=_env(receiver))
    stats = notify.run(n, t, until_idle=True)
    assert stats.bad_messages == 2 and stats.delivered == 1


def test_cli_check_and_toml_config(tmp_path: Path, receiver: Receiver,
                                   monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    from failslow.cli import notify as notify_cli

    for k, v in _env(receiver).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("FAILSLOW_DATA_DIR", str(tmp_path))
    cfg = tmp_path / "routes.toml"
    cfg.write_text('[[receivers]]\nname = "hook"\ntype = "generic"\nurl_env = "HOOK_URL"\n'
                   '[[routes]]\nreceivers = ["hook"]\n[routes.match]\nmin_severity = "error"\n')
    args = argparse.Namespace(config=cfg, state=None, check=True, kafka=None,
                              group="g", topic_prefix="", once=True)
    assert notify_cli.run(args) == 0
    assert "1 receiver(s), 1 route(s)" in capsys.readouterr().out
    cfg.write_text('[[receivers]]\nname = "hook"\ntype = "generic"\ntoken = "abc"\n')
    assert notify_cli.run(args) == 2
    assert "environment" in capsys.readouterr().err
    root = REPO
    shipped = notify.load_config(root / "infra" / "notify" / "routes.yaml",
                                 env={"FAILSLOW_DATA_DIR": "/data"})
    assert shipped.state_file == Path("/data/notify-state.json")
    assert shipped.receivers["webhook"].secret_env == "FAILSLOW_WEBHOOK_SECRET"
