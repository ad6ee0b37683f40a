"""``failslow notify`` carries the mitigation planner's advice (issue 9; Greyhound §5.1):
against the real HTTP receiver on 127.0.0.1 of the notify tests, every payload shape holds
the anomaly's current advice, an applied strategy sends an update, repeats and skips do
not, advice that arrives before its anomaly rides on the trigger, also across a restart."""

from __future__ import annotations

import json
from pathlib import Path

from test_notify import SECRET, T0, Receiver, _config, _env, _meta, _publish, _slow
from test_notify import receiver as receiver  # noqa: F401 - the fixture

from failslow.dashboards import notify
from failslow.dashboards.notify import Notifier
from failslow.mitigation.planner import DESCRIPTIONS, Advice
from failslow.stream.sink import ADVICE_TOPIC, encode_advice
from failslow.stream.transport import ANOMALIES_TOPIC, InProcessTransport, topic_for

JOB = "prod-9"


def _advice(strategy: str, action: str, t_s: float = 70.0) -> Advice:
    plan = {"strategy": "S2", "feasible": True, "m": [3, 9, 7, 9]} if strategy == "S2" else None
    return Advice(JOB, "slow-0", strategy, action, T0 + int(t_s * 1e9), 6.0,
                  {"S2": 5.0, "S3": 60.0, "S4": 1800.0}[strategy], DESCRIPTIONS[strategy],
                  cause="compute", ranks=[21], reason=f"impact 6 s >= cost {strategy}",
                  plan=plan)


def _send(t: InProcessTransport, a: Advice) -> None:
    value, headers = encode_advice(a)
    t.produce(ADVICE_TOPIC, a.job, value, headers)


def _transport() -> InProcessTransport:
    return InProcessTransport(subscribe=(topic_for("meta"), ANOMALIES_TOPIC, ADVICE_TOPIC))


def test_advice_in_every_shape_and_an_update_when_it_escalates(tmp_path: Path,
                                                               receiver: Receiver) -> None:
    t = _transport()
    n = Notifier(_config(tmp_path, receiver), env=_env(receiver))
    _meta(t, JOB, 1024)
    _publish(t, JOB, _slow(slowdown=1.5, evidence_s=60), 1)  # 5.7 GPU-h: error, paged
    notify.run(n, t, until_idle=True)
    _send(t, _advice("S2", "apply"))
    _send(t, _advice("S2", "apply"))  # re-published after a processor restart: nothing
    notify.run(n, t, until_idle=True)
    _send(t, _advice("S3", "skip", 90))  # nothing to do differently: no page
    _send(t, _advice("S4", "apply", 400))
    notify.run(n, t, until_idle=True)
    _publish(t, JOB, _slow(slowdown=1.5, evidence_s=60, end=T0 + 600 * 10**9), 2)
    notify.run(n, t, until_idle=True)
    assert n.stats.advice == 3 and n.stats.duplicates >= 1 and not n.outbox

    hook = [r.json for r in receiver.at("/hook")]
    assert [(h["event"], (h["advice"] or {}).get("advice_id")) for h in hook] == [
        ("trigger", None), ("advise", "slow-0/S2/apply"), ("advise", "slow-0/S4/apply"),
        ("resolve", "slow-0/S4/apply")]
    s2 = hook[1]
    assert s2["dedup_key"] == f"{JOB}/slow-0" and s2["advice"]["plan"]["m"] == [3, 9, 7, 9]
    assert "mitigation advice: " in s2["summary"] and "advice S2 apply" in s2["summary"]
    assert "micro-batches per DP group 3 9 7 9" in s2["summary"]
    for r in receiver.at("/hook"):  # the updates are signed like every delivery
        assert notify.verify_signature(SECRET.encode(), r.headers["X-Failslow-Timestamp"],
                                       r.body, r.headers["X-Failslow-Signature"])

    slack = [r.json for r in receiver.at("/slack")]
    assert len(slack) == 4 and "advice S2 apply" in slack[1]["text"]
    mitigation = [f for f in slack[1]["attachments"][0]["fields"] if f["title"] == "mitigation"]
    assert mitigation and "re-balance micro-batches" in mitigation[0]["value"]
    assert not [f for f in slack[0]["attachments"][0]["fields"] if f["title"] == "mitigation"]

    pd = [r.json for r in receiver.at("/pd")]
    assert [p["event_action"] for p in pd] == ["trigger", "trigger", "trigger", "resolve"]
    assert {p["dedup_key"] for p in pd} == {f"{JOB}/slow-0"}  # updates the same incident
    assert pd[0]["payload"]["custom_details"]["advice"] is None
    assert pd[1]["payload"]["custom_details"]["advice"]["strategy"] == "S2"
    assert pd[2]["payload"]["custom_details"]["advice"]["strategy"] == "S4"

    am = [r.json["alerts"][0] for r in receiver.at("/am")]
    assert "advice" not in am[0]["annotations"]
    assert am[1]["annotations"]["advice"].startswith("advice S2 apply: re-balance")
    assert json.loads(am[1]["annotations"]["details"])["advice"]["action"] == "apply"
    assert am[3]["status"] == "resolved"


def test_resolve_says_to_revert_the_applied_strategy(tmp_path: Path,
                                                     receiver: Receiver) -> None:
    t = _transport()
    n = Notifier(_config(tmp_path, receiver, routes=[{"receivers": ["hook"]}]),
                 env=_env(receiver))
    _publish(t, "job-r", _slow(), 1)
    notify.run(n, t, until_idle=True)
    adv = Advice.from_dict({**_advice("S2", "apply").to_dict(), "job": "job-r"})
    _send(t, adv)
    notify.run(n, t, until_idle=True)
    _publish(t, "job-r", _slow(end=T0 + 100 * 10**9), 2)  # the revert advice comes later
    notify.run(n, t, until_idle=True)
    _send(t, Advice.from_dict({**adv.to_dict(), "action": "revert", "job": "job-r"}))
    notify.run(n, t, until_idle=True)
    hook = [r.json for r in receiver.at("/hook")]
    assert [h["event"] for h in hook] == ["trigger", "advise", "resolve"]  # no page on revert
    assert "advice S2 revert" in hook[2]["summary"]
    assert n.known["job-r/slow-0"].advice is not None
    assert n.known["job-r/slow-0"].advice["action"] == "revert"


def test_advice_before_its_anomaly_rides_on_the_trigger_across_a_restart(
        tmp_path: Path, receiver: Receiver) -> None:
    cfg = _config(tmp_path, receiver, routes=[{"receivers": ["hook"]}])
    t = _transport()
    adv = Advice.from_dict({**_advice("S2", "apply").to_dict(), "job": "job-p"})
    _send(t, adv)  # topics are read independently: the advice may come first
    first = Notifier(cfg, env=_env(receiver))
    notify.run(first, t, until_idle=True)
    assert receiver.at("/hook") == [] and first.stats.advice == 1
    del first  # restarted: the waiting advice is in the state file

    _publish(t, "job-p", _slow(), 1)
    _send(t, adv)  # and once more (at-least-once upstream)
    second = Notifier(cfg, env=_env(receiver))
    notify.run(second, t, until_idle=True)
    hook = [r.json for r in receiver.at("/hook")]
    assert [h["event"] for h in hook] == ["trigger"]  # no separate update
    assert hook[0]["advice"]["advice_id"] == "slow-0/S2/apply"
    assert "advice S2 apply" in hook[0]["summary"]
    assert second.stats.duplicates == 1 and not second.pending_advice
