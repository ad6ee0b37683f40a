"""Mitigation advice as an event (issue 9; Greyhound §5.1, Algorithm 1), in process: the
stream processor runs the job analyzer's ski-rental planner where the anomalies are made,
writes one ``advice`` row per decision next to the anomaly reports and publishes it on
``failslow.advice``; the planner's state rides in the checkpoint snapshot, so a processor
killed between a sink write and its commit and then restarted neither loses nor repeats
advice; ``failslow plan advice`` replays a trace offline and prints the same decisions."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from support import stream_synth as synth

from failslow import cli
from failslow.engine.analyzer import JobAnalyzer, JobConfig
from failslow.events import JobMeta
from failslow.mitigation.planner import ADVICE_SCHEMA, Advice, PlannerConfig
from failslow.replay import DEFAULT_WINDOW_NS, coalesce, replay
from failslow.simulator import simulate
from failslow.simulator.scenario import scenario_from_dict
from failslow.stream.processor import ProcessorConfig, StreamProcessor
from failslow.stream.sink import (
    ADVICE_TOPIC,
    MemorySink,
    decode_advice,
    encode_advice,
)
from failslow.stream.state import MemoryStateStore
from failslow.stream.transport import InProcessTransport

#: Costs scaled to a 12 s job of 0.2 s iterations (the defaults are Greyhound's seconds and
#: minutes): S2 after 0.1 s of lost time, S3 after 0.5 s.
COSTS = PlannerConfig(cost_s={"S2": 0.1, "S3": 0.5, "S4": 30.0})
SCENARIO = {"job": "adv", "parallel": {"tp": 1, "pp": 2, "dp": 4, "cp": 1},
            "microbatches": 4, "schedule": "1f1b", "iterations": 60,
            "faults": [{"cause": "compute", "ranks": [5], "start": 10, "duration": 30,
                        "severity": 2.0}]}


Crash, DedupSink = synth.Crash, synth.DedupSink


class CrashingBus(synth.CrashingBus):
    """:class:`stream_synth.CrashingBus` that also remembers which commit each advice message
    preceded, and can crash at the commit after a given advice."""

    def __init__(self) -> None:
        super().__init__()
        self.crash_after: str | None = None  # crash at the commit after this advice
        self.advice_at: list[tuple[int, str]] = []  # (commits done before it, advice_id)

    def produce(self, topic: str, key: str, value: bytes,
                headers: Mapping[str, str] | None = None) -> None:
        if topic == ADVICE_TOPIC:
            advice_id = decode_advice(value).advice_id
            self.advice_at.append((self.commits, advice_id))
            if advice_id == self.crash_after:
                self.crash_after, self.crash_at = None, self.commits + 1
        super().produce(topic, key, value, headers)


@pytest.fixture(scope="module")
def sim() -> Any:
    return simulate(scenario_from_dict(SCENARIO, "advice test"), 0)


def _factory(meta: JobMeta) -> JobAnalyzer:
    return JobAnalyzer(meta, JobConfig(planner=COSTS))


def _offline(sim: Any) -> list[Advice]:
    """What ``failslow analyze`` would decide: the analyzer over the replayed trace."""
    analyzer = _factory(sim.meta)
    out: list[Advice] = []
    for now, batch in coalesce(replay(sim.tables, DEFAULT_WINDOW_NS)):
        out += analyzer.update(batch).advice
        out += analyzer.on_tick(now).advice
    return out


def _key(a: Advice) -> tuple[str, int, float]:
    return a.advice_id, a.t_ns, round(a.impact_s, 9)


def _windows(sim: Any) -> list[Any]:
    return list(replay(sim.tables, DEFAULT_WINDOW_NS))


def test_offline_ladder_is_the_expected_one(sim: Any) -> None:
    """The scenario escalates S2 then S3 while rank 5 is slow, and reverts both after."""
    advice = _offline(sim)
    assert [(a.strategy, a.action) for a in advice] == [
        ("S2", "apply"), ("S3", "apply"), ("S3", "revert"), ("S2", "revert")]
    s2 = advice[0]
    assert s2.cause == "compute" and 5 in s2.ranks and s2.impact_s >= s2.cost_s
    assert s2.plan is not None and sum(s2.plan["m"]) == 4 * 4
    slow_dp = 5 % 4  # rank 5 = stage 1, dp 1 (pp-major Megatron order)
    assert s2.plan["m"][slow_dp] == min(s2.plan["m"])  # fewer micro-batches for it


def test_processor_stores_and_publishes_the_advice(sim: Any) -> None:
    bus, sink = InProcessTransport(), MemorySink()
    processor = StreamProcessor(bus, sink, ProcessorConfig(clock="event"),
                                analyzer_factory=_factory)
    bus.publish_meta(sim.meta)
    windows = _windows(sim)
    for i in range(0, len(windows), 15):  # several checkpoints along the way
        for _, batch in windows[i:i + 15]:
            bus.publish_batch(sim.meta.job, batch)
        processor.run()
    expected = [_key(a) for a in _offline(sim)]
    table = sink.table("advice")
    assert table is not None and table.schema.equals(ADVICE_SCHEMA)
    assert [_key(a) for a in sink.advice()] == expected
    assert table.num_rows == len(expected)  # written once each
    published = [decode_advice(m.value) for m in bus.messages(ADVICE_TOPIC)]
    assert [_key(a) for a in published] == expected
    assert all(m.key == sim.meta.job and m.headers["failslow-kind"] == "advice"
               for m in bus.messages(ADVICE_TOPIC))
    assert processor.stats.advice == processor.stats.advice_published == len(expected)
    # the advice of an anomaly names it, and that anomaly is stored with it
    anomalies = {a.id for (_, a) in [(k, v) for k, v in sink.anomalies().items()]}
    assert {a.anomaly_id for a in published} <= anomalies


@pytest.mark.parametrize("crash", ["long after S3", "right after S3"])
def test_kill_between_write_and_commit_restart_repeats_and_loses_no_advice(
        sim: Any, crash: str) -> None:
    bus, sink, store = CrashingBus(), DedupSink(), MemoryStateStore()
    windows = _windows(sim)
    expected = [_key(a) for a in _offline(sim)]
    bus.publish_meta(sim.meta)
    first_part = 25  # 2.5 s: S2 applied (impact 0.1 s), S3 not yet (0.5 s)
    for _, batch in windows[:first_part]:
        bus.publish_batch(sim.meta.job, batch)
    first = StreamProcessor(bus, sink, ProcessorConfig(clock="event", max_messages=4,
                                                       checkpoint_messages=4,
                                                       snapshot_interval_s=1e9), state=store,
                            analyzer_factory=_factory)
    first.run()
    first.snapshot_all()  # the planner's open anomaly and impact go into the snapshot
    assert [a.advice_id for a in sink.advice()] == [expected[0][0]]
    for _, batch in windows[first_part:]:
        bus.publish_batch(sim.meta.job, batch)
    if crash == "long after S3":  # S3's cut is committed, the reverts are not reached
        bus.crash_at = bus.commits + 30
    else:  # S3 was written and published, its cut not committed
        bus.crash_after = "slow-0/S3/apply"
    with pytest.raises(Crash):
        first.run()
    crashed_commit = bus.commits - 1  # advice published after this many commits: uncommitted
    before = list(bus.advice_at)
    assert len(before) >= 2, "the crash should come after S3 was advised"

    bus.reassign()
    second = StreamProcessor(bus, sink, ProcessorConfig(clock="event", max_messages=3,
                                                        checkpoint_messages=1,
                                                        snapshot_interval_s=1e9), state=store,
                             analyzer_factory=_factory)
    second.run()
    assert second.stats.restored_jobs == 1 and second.stats.replayed_cuts >= 1
    # stored: every decision exactly once, identical to an uninterrupted run
    table = sink.table("advice")
    assert table is not None
    assert Counter(table.column("advice_id").to_pylist()) == Counter(k[0] for k in expected)
    assert sorted(_key(a) for a in sink.advice()) == sorted(expected)
    # published: every decision; again only what the crashed (uncommitted) cut had published
    after = bus.advice_at[len(before):]
    assert {i for _, i in bus.advice_at} == {k[0] for k in expected}
    repeated = {i for _, i in after} & {i for _, i in before}
    assert repeated <= {i for c, i in before if c == crashed_commit}
    counts = Counter(i for _, i in bus.advice_at)
    assert all(n == 1 for i, n in counts.items() if i not in repeated)
    # S3 is published again exactly when its cut had not been committed (at-least-once)
    assert ("slow-0/S3/apply" in repeated) == (crash == "right after S3")
    assert {i for _, i in after} >= {"slow-0/S3/revert", "slow-0/S2/revert"}


def test_advice_message_round_trip() -> None:
    a = Advice("j", "slow-3", "S3", "apply", 5, 1.5, 1.0, "adjust", cause="communication",
               ranks=[3, 4], link=[3, 4], plan={"placement": [1, 0], "feasible": True})
    value, headers = encode_advice(a)
    assert headers["content-type"] == "application/json"
    back = decode_advice(value)
    assert back.to_dict() == a.to_dict()
    assert json.loads(value)["kind"] == "mitigation_advice"
    with pytest.raises(ValueError):
        decode_advice(b'{"kind": "anomaly"}')


def test_plan_advice_command_replays_a_trace(sim: Any, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from failslow.tracedir import write_trace

    trace = tmp_path / "trace"
    write_trace(trace, [sim.meta], sim.tables, "parquet")
    costs = "S2=0.1,S3=0.5,S4=30"
    assert cli.main(["plan", "advice", str(trace), "--cost", costs, "--json"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.strip()]
    assert [(d["advice_id"], d["t_ns"]) for d in lines] == [(k[0], k[1])
                                                           for k in _expected_keys(sim)]
    assert all(d["kind"] == "mitigation_advice" for d in lines)
    assert cli.main(["plan", "advice", str(trace), "--cost", costs]) == 0
    text = capsys.readouterr().out
    assert "S2 apply" in text and "S3 revert" in text
    # with Greyhound's default costs (5 s, 60 s, 30 min) this short job needs no action
    assert cli.main(["plan", "advice", str(trace), "--json"]) == 0
    assert capsys.readouterr().out.strip() == ""
    with pytest.raises(SystemExit):
        cli.main(["plan", "advice", str(trace), "--cost", "S9=1"])


def _expected_keys(sim: Any) -> list[tuple[str, int, float]]:
    return [_key(a) for a in _offline(sim)]
