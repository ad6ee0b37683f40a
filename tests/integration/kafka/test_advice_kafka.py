"""Mitigation advice on the real broker (issue 9; Greyhound §5.1): ``failslow replay`` ->
Kafka -> ``failslow process`` (a subprocess, embedded ClickHouse) with the planner's costs
from ``$FAILSLOW_PLANNER_COSTS``. The processor is killed with SIGKILL after it published
advice and restarted: the ``advice`` table holds every decision of ``failslow plan advice``
exactly once (physically, without FINAL), and ``failslow.advice`` carries all of them."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
from test_pipeline_kafka import (
    Store,
    Trace,
    TracePublisher,
    _checkpointed,
    _prefix,
    _start,
    _until,
)

from conftest import Broker
from failslow.cli.plan import trace_advice
from failslow.stream.kafka import KafkaTransport
from failslow.stream.sink import ADVICE_TOPIC, decode_advice

COSTS = "S2=0.2,S3=0.4,S4=30"  # the demo's: its job lasts 25 s (failslow.cli.demo.DEMO_COSTS)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Trace, list[Any]]:
    from failslow.simulator import load_scenario, simulate
    from failslow.simulator.output import write_sim

    path = tmp_path_factory.mktemp("advice-demo")
    sim = simulate(load_scenario("demo"), 0)
    write_sim(sim, path, "parquet")
    _, advice = trace_advice(str(path), {"S2": 0.2, "S3": 0.4, "S4": 30.0})
    ids = [a.advice_id for a in advice]
    assert ids[0] == "slow-0/S2/apply" and "slow-0/S2/revert" in ids, ids
    trace = Trace(path, sim.meta.job, {k: t.num_rows for k, t in sim.tables.items()}, [],
                  None)
    return trace, advice


class AdviceReader:
    """One consumer of ``failslow.advice`` (its own group) that keeps what it read."""

    def __init__(self, broker: Broker, prefix: str) -> None:
        self.sub = KafkaTransport(broker.bootstrap, topic_prefix=prefix, produce=False,
                                  subscribe=[ADVICE_TOPIC],
                                  group_id=f"adv-{prefix}{time.time_ns()}")
        self.got: list[str] = []

    def read(self, timeout: float = 0.3) -> list[str]:
        self.got += [decode_advice(m.value).advice_id
                     for m in self.sub.poll(50, timeout=timeout)]
        return self.got

    def close(self) -> None:
        self.sub.close()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_kill_9_after_advice_and_restart_stores_each_advice_once(
        broker: Broker, demo: tuple[Trace, list[Any]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The trace up to between the first decision (S2 applied) and the second is published
    and checkpointed (advice published, input committed, detector and planner state
    saved); the processor is killed with SIGKILL, the rest is published, and a new
    processor resumes from the checkpoint."""
    trace, advice = demo
    expected = [a.advice_id for a in advice]
    monkeypatch.setenv("FAILSLOW_PLANNER_COSTS", COSTS)  # the processors' settings
    prefix = _prefix()
    # event time: the pauses of this test (checkpoint, kill, restart) are no silence of the job
    args = ("--checkpoint-interval", "0.3", "--snapshot-interval", "1", "--clock", "event")
    first = _start(broker, tmp_path, prefix, *args, name="first")
    pub = TracePublisher(broker, trace, prefix)
    reader = AdviceReader(broker, prefix)
    second = None
    try:
        pub.publish(before_ns=(advice[0].t_ns + advice[1].t_ns) // 2)
        assert not pub.done

        def advised() -> bool:  # S2 is advised (published), later decisions still ahead
            # everything published is committed, then a snapshot after the last cut (the
            # gauge is set before the commit): it holds the job, which an earlier snapshot,
            # taken before the job's meta message was read, may not
            if expected[0] not in reader.read() or not _checkpointed(broker, prefix):
                return False
            m = first.metrics()
            return m.get("failslow_processor_snapshots_total", 0) >= 1 and \
                m.get("failslow_processor_cuts_since_snapshot") == 0
        _until(advised, 120, "the first advice and a checkpoint", first)
        first.popen.send_signal(signal.SIGKILL)
        assert first.popen.wait(10) == -signal.SIGKILL
        before = list(reader.got)
        assert set(before) == {expected[0]}, ("not killed mid-way", before)
        pub.publish()
        assert pub.done
        second = _start(broker, tmp_path, prefix, *args, "--exit-when-idle", "4",
                        name="second")
        assert second.wait(180) == 0, second.log.read_text()[-3000:]
        deadline = time.monotonic() + 30
        while set(reader.got) != set(expected) and time.monotonic() < deadline:
            reader.read(0.5)
        published = list(reader.got)
    finally:
        pub.close()
        if first.popen.poll() is None:
            first.popen.kill()
        if second is not None and second.popen.poll() is None:
            second.popen.kill()
        reader.close()
    assert second is not None
    stats = second.final_stats()
    assert stats["restored_jobs"] == 1 and stats["errors"] == 0
    with Store(tmp_path) as sink:
        rows = sink.client.query(
            "SELECT advice_id, count() FROM failslow.advice WHERE job = {j:String} "
            "GROUP BY advice_id", parameters={"j": trace.job}).result_rows
        stored = sink.read("advice", trace.job).to_pylist()
    assert {a: n for a, n in rows} == dict.fromkeys(expected, 1)  # each once, none lost
    s2 = next(r for r in stored if r["advice_id"] == "slow-0/S2/apply")
    assert s2["strategy"] == "S2" and s2["impact_s"] >= s2["cost_s"] == 0.2
    # every decision published; the restored planner remembered that S2 was applied (it
    # advised the revert); a decision is published again only at-least-once style, never
    # more than twice (a cut re-made after the restart)
    assert set(published) == set(expected)
    assert all(published.count(a) <= 2 for a in expected), published
