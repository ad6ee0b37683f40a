"""Mitigation advice on the real broker (issue 9; Greyhound §5.1): ``failslow replay`` ->
Kafka -> ``failslow process`` (a subprocess, embedded ClickHouse) with the planner's costs
from ``$FAILSLOW_PLANNER_COSTS``. The processor is killed with SIGKILL after it published
advice and restarted: the ``advice`` table holds every decision of ``failslow plan advice``
exactly once (physically, without FINAL), and ``failslow.advice`` carries all of them."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from test_pipeline_kafka import Store, Trace, _prefix, _replay, _replayed, _start, _until

from conftest import Broker
from failslow.cli.plan import trace_advice
from failslow.mitigation.planner import COSTS_ENV
from failslow.stream.kafka import KafkaTransport
from failslow.stream.sink import ADVICE_TOPIC, decode_advice

COSTS = "S2=0.2,S3=0.4,S4=30"  # the demo's: its job lasts 25 s (failslow.cli.demo.DEMO_COSTS)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Trace, list[str]]:
    from failslow.simulator import load_scenario, simulate
    from failslow.simulator.output import write_sim

    path = tmp_path_factory.mktemp("advice-demo")
    sim = simulate(load_scenario("demo"), 0)
    write_sim(sim, path, "parquet")
    _, advice = trace_advice(str(path), {"S2": 0.2, "S3": 0.4, "S4": 30.0})
    ids = [a.advice_id for a in advice]
    assert "slow-0/S2/apply" in ids and "slow-0/S2/revert" in ids, ids
    trace = Trace(path, sim.meta.job, {k: t.num_rows for k, t in sim.tables.items()}, [],
                  None)
    return trace, ids


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
        broker: Broker, demo: tuple[Trace, list[str]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    trace, expected = demo
    monkeypatch.setenv(COSTS_ENV, COSTS)  # the processors' environment
    prefix = _prefix()
    args = ("--checkpoint-interval", "0.3", "--snapshot-interval", "1")
    first = _start(broker, tmp_path, prefix, *args, name="first")
    replay = _replay(broker, trace, prefix, "--speed", "2")  # ~12 s of publishing
    reader = AdviceReader(broker, prefix)
    try:
        def advised() -> bool:  # S2 is advised (published), later decisions still ahead
            return first.metrics().get("failslow_processor_snapshots_total", 0) >= 2 \
                and bool(reader.read())
        _until(advised, 90, "the first advice", first)
        first.popen.send_signal(signal.SIGKILL)
        first.popen.wait(10)
        before = list(reader.read(1.0))
        assert before and set(before) < set(expected), ("not killed mid-way", before)
        second = _start(broker, tmp_path, prefix, *args, "--exit-when-idle", "4",
                        name="second")
        _replayed(replay, timeout=120)
        assert second.wait(120) == 0, second.log.read_text()[-3000:]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and set(reader.got) != set(expected):
            reader.read(0.5)
        published = list(reader.got)
    finally:
        if first.popen.poll() is None:
            first.popen.kill()
        reader.close()
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
    # more than twice (the uncommitted cut at the kill)
    assert set(published) == set(expected)
    assert all(published.count(a) <= 2 for a in expected), published
